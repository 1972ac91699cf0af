#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/*_fuzz.cc: clang, ASan + UBSan,
# -DFLATKV_FUZZ=ON) in build-fuzz/ and runs each for SECONDS (default 60)
# from its checked-in seeds plus the corpus it grew before (build-fuzz/corpus/).
# Each run also watches memory: -rss_limit_mb=1024 and -malloc_limit_mb=512
# (one allocation), so an input that makes the server read or hold hundreds
# of MiB is a finding like a crash. Prints executions and coverage per
# target; exits 1 if any target found something: the input is saved in
# build-fuzz/crashes/<target>/, and once fixed it belongs in
# tests/fuzz/<target>/regressions/ (replayed by ctest in every build).
# Usage: bash deploy/fuzz.sh [SECONDS] [TARGET...]
#        bash deploy/fuzz.sh --smoke [TARGET...]
#        bash deploy/fuzz.sh --build   (configure and build only)
# --smoke (the README's test command, so CI): -seed=1 and a fixed number of
# runs per target (about 5 s each on a 2-core VM) instead of a time, from
# the checked-in seeds only: the same work on every machine and mostly the
# same inputs (libFuzzer's schedule is not exactly deterministic). New bugs
# are hunted by timed runs, not met by chance in CI.
set -euo pipefail
cd "$(dirname "$0")/.."

smoke=0
build_only=0
if [[ "${1:-}" == "--build" ]]; then
  build_only=1
elif [[ "${1:-}" == "--smoke" ]]; then
  smoke=1
  secs=0
else
  secs=${1:-60}
fi
shift || true
# Runs per target in --smoke: ~30% of what 15 s gave on the 2-core VM.
declare -A smoke_runs=([record_fuzz]=18000 [flat_index_fuzz]=45000 [bucket_fuzz]=145000
  [generation_fuzz]=3300 [config_fuzz]=14500 [ring_fuzz]=175000 [server_fuzz]=3350
  [peer_fuzz]=54000 [http_fuzz]=22000 [chain_fuzz]=20000)
targets=("$@")
if ((${#targets[@]} == 0)); then
  targets=(record_fuzz flat_index_fuzz bucket_fuzz generation_fuzz config_fuzz ring_fuzz
           server_fuzz peer_fuzz http_fuzz chain_fuzz)
fi

CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DFLATKV_FUZZ=ON -DFLATKV_TESTS=OFF > build-fuzz.configure.log 2>&1 \
  || { cat build-fuzz.configure.log; exit 1; }
rm -f build-fuzz.configure.log
cmake --build build-fuzz --target fuzzers -j "$(nproc)"
((build_only)) && exit 0

mkdir -p build-fuzz/logs
failed=()
summary=()
for t in "${targets[@]}"; do
  corpus=build-fuzz/corpus/$t
  crashes=build-fuzz/crashes/$t
  if ((smoke)); then
    corpus=build-fuzz/smoke-corpus/$t  # fresh each time: only the seeds count
    rm -rf "$corpus"
  fi
  mkdir -p "$corpus" "$crashes"
  args=(-rss_limit_mb=1024 -malloc_limit_mb=512 -timeout=20
        -print_final_stats=1 -artifact_prefix="$crashes/")
  if ((smoke)); then
    args+=(-seed=1 -runs="${smoke_runs[$t]:-20000}")
  else
    args+=(-max_total_time="$secs")
  fi
  [[ -f tests/fuzz/$t.dict ]] && args+=(-dict="tests/fuzz/$t.dict")
  log=build-fuzz/logs/$t.log
  if ((smoke)); then echo "== $t: -seed=1 -runs=${smoke_runs[$t]:-20000}"; else echo "== $t: ${secs}s"; fi
  if ASAN_OPTIONS=detect_leaks=0 "build-fuzz/tests/fuzz/$t" "${args[@]}" "$corpus" \
       "tests/fuzz/$t/seeds" > "$log" 2>&1; then
    status=ok
  else
    status=FAILED
    failed+=("$t")
    grep -E "ERROR|SUMMARY|Test unit written|==[0-9]+==" "$log" | head -20 || true
  fi
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<< "$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<< "$last")
  summary+=("$(printf '%-16s %-7s execs %-9s edges(cov) %-6s features %s' "$t" "$status" \
    "${execs:-?}" "${cov:-?}" "${ft:-?}")")
done
if ((smoke)); then echo "== fuzz summary (--smoke: -seed=1, fixed runs)"; else echo "== fuzz summary (${secs}s each)"; fi
printf '%s\n' "${summary[@]}"
if ((${#failed[@]})); then
  echo "fuzz: findings in ${failed[*]} (inputs in build-fuzz/crashes/, logs in build-fuzz/logs/)"
  exit 1
fi
