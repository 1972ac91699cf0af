#!/usr/bin/env bash
# Installs dependencies, builds FlatKV and runs every test (the README's test
# command; CI runs exactly this). With --sanitize the build uses
# AddressSanitizer + UndefinedBehaviorSanitizer in build-asan/.
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
