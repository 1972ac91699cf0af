#!/usr/bin/env bash
# Installs dependencies, builds FlatKV and runs every test (the README's test
# command; CI runs exactly this). With --sanitize the build uses
# AddressSanitizer + UndefinedBehaviorSanitizer in build-asan/. Then (not
# with --sanitize) every libFuzzer target runs a short reproducible smoke
# (deploy/fuzz.sh --smoke; FLATKV_FUZZ_SECONDS=N: N timed seconds each, 0
# skips it).
set -euo pipefail
cd "$(dirname "$0")/.."

build=build
flags=(-DCMAKE_BUILD_TYPE=Release)
if [[ "${1:-}" == "--sanitize" ]]; then
  build=build-asan
  flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DFLATKV_SANITIZE=ON)
fi

bash deploy/install-deps.sh
cmake -S . -B "$build" -G Ninja "${flags[@]}"
cmake --build "$build" -j "$(nproc)"
ctest --test-dir "$build" --output-on-failure --no-tests=error -j 2
# The fuzz smoke: reproducible (deploy/fuzz.sh --smoke: -seed=1, fixed
# runs); FLATKV_FUZZ_SECONDS=N runs each target N seconds instead, 0 skips.
fuzz_seconds=${FLATKV_FUZZ_SECONDS:-smoke}
if [[ "$build" == build && "$fuzz_seconds" != 0 ]]; then
  if [[ "$fuzz_seconds" == smoke ]]; then
    bash deploy/fuzz.sh --smoke
  else
    bash deploy/fuzz.sh "$fuzz_seconds"
  fi
fi
