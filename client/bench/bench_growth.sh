#!/usr/bin/env bash
# Runs `flatkv-bench growth` for every engine, mix and value size, appending
# one JSON line per point to OUT (default bench-growth.jsonl), then prints the
# growth table and draws OUT's charts into PNG (default bench-growth.png) with
# bench_report.py --plot: the ZDB paper's Figures 5-10 on this machine.
#   client/bench/bench_growth.sh [BUILD_DIR] [OUT] [PNG] [DIR]
# Environment (defaults in brackets):
#   NUM      records at the end of each run [500000]
#   POINTS   points per run [20]
#   MIXES    [writeonly readheavy writeheavy]
#   SIZES    value sizes in bytes [1024 4096]
#   ENGINES  [flat rocksdb leveldb kyotocabinet]
#   THREADS  client threads [1]
# Each run starts from an empty DIR/ENGINE (default /tmp/flatkv-bench-growth),
# removed at the end. A readheavy run does about 10 x NUM ops.
set -euo pipefail
build=${1:-build}
out=${2:-bench-growth.jsonl}
png=${3:-bench-growth.png}
dir=${4:-/tmp/flatkv-bench-growth}
bench="$build/client/flatkv-bench"
[[ -x $bench ]] || { echo "bench_growth: $bench not found (build it first)" >&2; exit 2; }
NUM=${NUM:-500000}
POINTS=${POINTS:-20}
read -r -a mixes <<<"${MIXES:-writeonly readheavy writeheavy}"
read -r -a sizes <<<"${SIZES:-1024 4096}"
read -r -a engines <<<"${ENGINES:-flat rocksdb leveldb kyotocabinet}"
: >"$out"
for mix in "${mixes[@]}"; do
  for vs in "${sizes[@]}"; do
    for engine in "${engines[@]}"; do
      start=$SECONDS
      "$bench" growth --engine "$engine" --mix "$mix" --num "$NUM" --points "$POINTS" \
        --value-size "$vs" --threads "${THREADS:-1}" --dir "$dir/$engine" --fresh --json \
        >>"$out" || echo "bench_growth: failed: $engine $mix $vs" >&2
      echo "bench_growth: $engine $mix $vs B: $((SECONDS - start)) s" >&2
      rm -rf "${dir:?}/$engine"
    done
  done
done
rm -rf "$dir"
/usr/bin/python3 "$(dirname "$0")/bench_report.py" --plot "$png" "$out"
