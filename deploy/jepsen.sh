#!/usr/bin/env bash
# Runs the fault-injection suite (tests/jepsen) over a set of scenarios and
# modes, N times each (run i uses seed K+i-1, K=1 by default, so a later
# sweep can go on where one stopped), and writes a markdown report table.
#
#   deploy/jepsen.sh [--runs N] [--first-seed K] [--seconds S] [--scenarios a,b] [--modes sync,async]
#                    [--server BIN] [--clock-server BIN] [--set KEY=VALUE]... [--out DIR]
#
# --set gives every member a setting (flatkv-server --set), e.g.
# --set storage.sparse_tier=on runs the suite's keys through the sparse tier.
# Needs root, nft, go and Java (deploy/install-deps.sh). The server defaults
# to build/server/flatkv-server (or $FLATKV_SERVER). The clock scenario runs a
# server under libfaketime, which deadlocks jemalloc at start-up, so it takes
# --clock-server: a build with -DFLATKV_JEMALLOC=OFF (default
# build-nojemalloc/server/flatkv-server, or $FLATKV_CLOCK_SERVER; made by
#   cmake -S . -B build-nojemalloc -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLATKV_JEMALLOC=OFF
#   cmake --build build-nojemalloc --target flatkv-server flatkv
# which this script runs itself when the default is used, so that the clock
# scenario never runs a server older than the tree). Each run's line goes to
# DIR/results.jsonl; DIR/report.md is the table; a run with an anomaly keeps
# its history, Porcupine's HTML and every log in a directory of DIR.
# Exit status: 0 if no run found an anomaly, 1 otherwise, 2 if it could not run.
set -uo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
runs=1
first_seed=1
seconds=30
scenarios=none,zk-cut-tail,zk-cut-head,zk-cut-any,peer-cut,isolate,asym,loss,pause,kill,zk-restart,zk-follower-cut,ring-change,ring-change-mix,clock
modes=sync,async
server=${FLATKV_SERVER:-$repo/build/server/flatkv-server}
clock_server=${FLATKV_CLOCK_SERVER:-}
out=$repo/build/jepsen-$(date +%Y%m%d-%H%M%S)
settings=()

while (($#)); do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --first-seed) first_seed=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --scenarios) scenarios=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    --server) server=$2; shift 2 ;;
    --clock-server) clock_server=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --set) settings+=(--set "$2"); shift 2 ;;
    *) sed -n '2,22p' "$0" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"

# The default clock server: built, or brought up to date (a binary older
# than the tree may refuse a setting the suite passes).
if [[ ,$scenarios, == *,clock,* && -z $clock_server ]]; then
  nojemalloc=$repo/build-nojemalloc
  clock_server=$nojemalloc/server/flatkv-server
  if ! { [[ -f $nojemalloc/build.ninja ]] ||
         cmake -S "$repo" -B "$nojemalloc" -G Ninja -DCMAKE_BUILD_TYPE=Release \
           -DFLATKV_JEMALLOC=OFF >"$out/clock-server-build.log" 2>&1; } ||
     ! cmake --build "$nojemalloc" --target flatkv-server flatkv >>"$out/clock-server-build.log" 2>&1; then
    echo "jepsen.sh: cannot build the clock scenario's server in $nojemalloc (see $out/clock-server-build.log)" >&2
    exit 2
  fi
fi

status=0
for ((i = 1; i <= runs; i++)); do
  for mode in ${modes//,/ }; do
    for sc in ${scenarios//,/ }; do
      bin=$server
      [[ $sc == clock ]] && bin=$clock_server
      /usr/bin/python3 "$repo/tests/jepsen/run.py" --scenario "$sc" --mode "$mode" \
        --seconds "$seconds" --server "$bin" --out "$out" --seed "$((first_seed + i - 1))" \
        "${settings[@]}" 2>&1 \
        | tee -a "$out/run.log" | grep -E '^(==|ANOMALY|  evidence|[a-z-]+ +(sync|async) +ops)'
      rc=${PIPESTATUS[0]}
      ((rc == 2)) && { echo "jepsen.sh: the suite could not run (see $out/run.log)" >&2; exit 2; }
      ((rc != 0)) && status=1
    done
  done
done
/usr/bin/python3 "$repo/tests/jepsen/report.py" "$out/results.jsonl" >"$out/report.md"
cat "$out/report.md"
echo "report: $out/report.md"
exit $status
