#!/usr/bin/env bash
# Installs dependencies, builds FlatKV and runs every test (the README's test
# command; CI runs exactly this). With --sanitize the build uses
# AddressSanitizer + UndefinedBehaviorSanitizer in build-asan/. Then (not
# with --sanitize) every libFuzzer target runs for a short smoke,
# FLATKV_FUZZ_SECONDS each (default 15; 0 skips it): deploy/fuzz.sh.
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
fuzz_seconds=${FLATKV_FUZZ_SECONDS:-15}
if [[ "$build" == build && "$fuzz_seconds" != 0 ]]; then
  bash deploy/fuzz.sh "$fuzz_seconds"
fi
