#!/usr/bin/env bash
# Runs flatkv-bench for every key distribution, engine, value size and
# thread count and writes one JSON line per workload to OUT (default
# bench-matrix.jsonl); then prints flat's ops/s as a ratio of each peer's
# (client/bench/bench_report.py).
#   client/bench/bench_matrix.sh [BUILD_DIR] [OUT] [DIR]
# KEY_DISTS (default "dense random snowflake") picks the --key-dist values;
# FLAT_FLAGS (default "--sparse-tier on") is given to flat alone.
# Each fill starts from an empty directory; the read, overwrite and delete
# workloads run on the database the fillrandom run just wrote.
set -euo pipefail
build=${1:-build}
out=${2:-bench-matrix.jsonl}
dir=${3:-/tmp/flatkv-bench-matrix}
bench="$build/client/flatkv-bench"
: > "$out"
# value size -> key count (about 100 MB to 1 GB of data each)
sizes=("100:1000000" "1024:500000" "4096:200000" "102400:10000")
read -r -a flat_flags <<< "${FLAT_FLAGS---sparse-tier on}"
for dist in ${KEY_DISTS:-dense random snowflake}; do
  for threads in 1 2; do
    for sz in "${sizes[@]}"; do
      vs=${sz%%:*}
      num=${sz##*:}
      for engine in flat rocksdb leveldb kyotocabinet; do
        # Dense runs as before (an explicit --key-dist also times each put).
        extra=()
        if [ "$dist" != dense ]; then extra=(--key-dist "$dist"); fi
        if [ "$engine" = flat ]; then extra+=("${flat_flags[@]}"); fi
        for list in fillseq fillrandom,overwrite,readrandom,readmissing,deleterandom; do
          "$bench" engine --engine "$engine" --workload "$list" --num "$num" \
            --value-size "$vs" --threads "$threads" "${extra[@]}" \
            --dir "$dir/$engine" --fresh --json \
            >> "$out" || echo "failed: $dist $engine $list $vs $threads" >&2
        done
      done
    done
  done
done
rm -rf "$dir"
/usr/bin/python3 "$(dirname "$0")/bench_report.py" "$out"
