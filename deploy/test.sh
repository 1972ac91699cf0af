#!/usr/bin/env bash
# Installs dependencies, builds FlatKV and runs every test (the README's test
# command; CI runs exactly this). With --sanitize the build uses
# AddressSanitizer + UndefinedBehaviorSanitizer in build-asan/. Then (not
# with --sanitize) every libFuzzer target runs a short reproducible smoke
# (deploy/fuzz.sh --smoke; FLATKV_FUZZ_SECONDS=N: N timed seconds each, 0
# skips it); the targets are built while the process tests run.
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

# The fuzz smoke: reproducible (deploy/fuzz.sh --smoke: -seed=1, fixed
# runs); FLATKV_FUZZ_SECONDS=N runs each target N seconds instead, 0 skips.
fuzz_seconds=${FLATKV_FUZZ_SECONDS:-smoke}
fuzz=0
[[ "$build" == build && "$fuzz_seconds" != 0 ]] && fuzz=1
# The tests in two passes: the in-process ones (unit, sim, fuzz replay:
# CPU- and fsync-bound) first on a quiet machine, then the process tests,
# which mostly wait on servers, timeouts and ZooKeeper, while the fuzz
# targets' own clang build uses the CPU they leave idle: nice 19 in a
# session of its own whose scheduling group is nice 19 too (with autogroup
# on, a task's nice counts only inside its session's group, and the tests'
# servers and ZooKeeper run in sessions of their own).
tests_rc=0
quick="^(unit|sim|fuzz)$"
ctest --test-dir "$build" --output-on-failure --no-tests=error -j 2 -L "$quick" || tests_rc=$?
if ((fuzz)); then
  setsid -w bash -c '[[ -w /proc/self/autogroup ]] && echo 19 > /proc/self/autogroup
                     exec nice -n 19 ionice -c 3 bash deploy/fuzz.sh --build' \
    > "$build/fuzz-build.log" 2>&1 &
  fuzz_build=$!
fi
ctest --test-dir "$build" --output-on-failure --no-tests=error -j 2 -LE "$quick" || tests_rc=$?
if ((fuzz)); then
  if ! wait "$fuzz_build"; then
    tail -50 "$build/fuzz-build.log"
    echo "test.sh: the fuzz targets did not build (whole log: $build/fuzz-build.log)" >&2
    exit 1
  fi
fi
((tests_rc == 0)) || exit "$tests_rc"
if ((fuzz)); then
  if [[ "$fuzz_seconds" == smoke ]]; then
    bash deploy/fuzz.sh --smoke
  else
    bash deploy/fuzz.sh "$fuzz_seconds"
  fi
fi
