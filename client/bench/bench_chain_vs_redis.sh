#!/usr/bin/env bash
# bench_chain_vs_redis.sh: a FlatKV chain under storage.sync: always against
# its anchor, in one run on this machine:
#
#   flatkv R=N  deploy/ring.sh up --partitions 1 --replicas N with
#               storage.sync=always on every member (each has fdatasynced
#               its chain log before the head answers), driven by
#               flatkv-bench server --zk --workload put
#   redis+WAIT  redis-server primary + one replica, both appendonly with
#               appendfsync always, each SET followed by WAIT 1 0
#               (flatkv-redis-bench: the replica has received the write,
#               not fsynced it), the same load shape
#
#   client/bench/bench_chain_vs_redis.sh [BUILD_DIR]
#
# Environment: REPLICAS (FlatKV chain lengths, default "1 3"), SIZES (value
# bytes, default "100 1024"), OPS (puts per test, default 100000), NUM
# (key space, default 200000), CLIENTS (default 50), ROUNDS (default 3: the
# targets take turns; each reported as its median, with min and max),
# ZK_PORT (default 2391), BASE_PORT (default 9951).
# Every process (servers and client) shares this machine's cores, as the
# issue's anchors were measured. Not part of the tests. Needs redis-server
# and redis-cli (apt-get install -y redis-server redis-tools).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=${1:-$REPO/build}
REPLICAS=${REPLICAS:-"1 3"}
SIZES=${SIZES:-"100 1024"}
OPS=${OPS:-100000}
NUM=${NUM:-200000}
CLIENTS=${CLIENTS:-50}
ROUNDS=${ROUNDS:-3}
ZK_PORT=${ZK_PORT:-2391}
BASE_PORT=${BASE_PORT:-9951}
BENCH_NAME=bench_chain_vs_redis
# shellcheck source=bench_lib.sh
source "$REPO/client/bench/bench_lib.sh"
export FLATKV_SERVER=$BUILD/server/flatkv-server FLATKV_CLI=$BUILD/client/flatkv
for bin in "$FLATKV_SERVER" "$BUILD/client/flatkv-bench" "$BUILD/client/flatkv-redis-bench"; do
  [[ -x $bin ]] || { echo "$BENCH_NAME: $bin not found (build it first)" >&2; exit 2; }
done
for bin in redis-server redis-cli; do
  command -v "$bin" >/dev/null || {
    echo "$BENCH_NAME: $bin missing: apt-get install -y redis-server redis-tools" >&2
    exit 2
  }
done

TMP=$(mktemp -d /tmp/flatkv-chain-vs-redis.XXXXXX)
PIDS=()
cleanup() {
  bash "$REPO/deploy/ring.sh" down --dir "$TMP/ring" >/dev/null 2>&1 || true
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
  rm -rf "$TMP"
}
trap cleanup EXIT

# One FlatKV run: prints "ops p50 p99" (ops/s, microseconds).
flatkv_run() {  # replicas size
  bash "$REPO/deploy/ring.sh" up --partitions 1 --replicas "$1" --dir "$TMP/ring" \
    --key-max "$NUM" --zk-port "$ZK_PORT" --base-port "$BASE_PORT" \
    --set storage.sync=always >"$TMP/ring.out" 2>&1 || { cat "$TMP/ring.out" >&2; exit 1; }
  local line
  line=$("$BUILD/client/flatkv-bench" server --zk "127.0.0.1:$ZK_PORT" --workload put \
    --num "$NUM" --ops "$OPS" --value-size "$2" --clients "$CLIENTS" 2>/dev/null | grep '^put')
  bash "$REPO/deploy/ring.sh" down --dir "$TMP/ring" >/dev/null 2>&1
  rm -rf "$TMP/ring"
  awk '{print $3, $8, $10}' <<<"$line"
}

# One Redis run: a primary and a replica, fresh each time.
redis_run() {  # size
  local p r
  p=$(free_port)
  r=$(free_port)
  mkdir -p "$TMP/rp" "$TMP/rr"
  redis-server --port "$p" --bind 127.0.0.1 --appendonly yes --appendfsync always --save '' \
    --dir "$TMP/rp" --daemonize no --logfile "$TMP/rp/log" &
  PIDS+=($!)
  local primary=$!
  redis-server --port "$r" --bind 127.0.0.1 --appendonly yes --appendfsync always --save '' \
    --dir "$TMP/rr" --daemonize no --logfile "$TMP/rr/log" --replicaof 127.0.0.1 "$p" &
  PIDS+=($!)
  local replica=$!
  wait_port "$p" redis-primary
  wait_port "$r" redis-replica
  for _ in $(seq 100); do
    redis-cli -p "$r" info replication | grep -q 'master_link_status:up' && break
    sleep 0.1
  done
  local line
  line=$("$BUILD/client/flatkv-redis-bench" --port "$p" --clients "$CLIENTS" --ops "$OPS" \
    --num "$NUM" --value-size "$1" --wait 1 | grep '^put')
  kill "$primary" "$replica"
  wait "$primary" "$replica" 2>/dev/null || true
  rm -rf "$TMP/rp" "$TMP/rr"
  awk '{print $3, $8, $10}' <<<"$line"
}

# "min-max (median)" of a list of numbers.
summary() {
  tr ' ' '\n' <<<"$*" | sort -n | awk '{v[NR] = $1} END {
    m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
    printf "%s-%s (median %s)", v[1], v[NR], m }'
}
median() { summary "$@" | sed 's/.*median \(.*\))/\1/'; }

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) CPUs; $OPS puts per test," \
     "$CLIENTS connections, $ROUNDS rounds"
for size in $SIZES; do
  declare -A OPS_OF=() P99_OF=()
  targets=()
  for r in $REPLICAS; do targets+=("flatkv-R$r"); done
  targets+=(redis+WAIT)
  for round in $(seq "$ROUNDS"); do
    for t in "${targets[@]}"; do
      if [[ $t == redis+WAIT ]]; then out=$(redis_run "$size"); else out=$(flatkv_run "${t#flatkv-R}" "$size"); fi
      read -r ops p50 p99 <<<"$out"
      printf '%5s B round %d %-11s %8.0f puts/s  p50 %7.1f us  p99 %8.1f us\n' \
        "$size" "$round" "$t" "$ops" "$p50" "$p99"
      OPS_OF[$t]+="${ops%.*} "
      P99_OF[$t]+="${p99%.*} "
    done
  done
  redis_median=$(median ${OPS_OF[redis+WAIT]})
  for t in "${targets[@]}"; do
    m=$(median ${OPS_OF[$t]})
    printf '%5s B %-11s puts/s %s  p99 us %s  x redis+WAIT (medians) %.2f\n' "$size" "$t" \
      "$(summary ${OPS_OF[$t]})" "$(summary ${P99_OF[$t]})" \
      "$(awk -v a="$m" -v b="$redis_median" 'BEGIN {print a / b}')"
  done
  unset OPS_OF P99_OF
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
