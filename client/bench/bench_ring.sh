#!/usr/bin/env bash
# bench_ring.sh: what a ring costs and gains, in one run on this machine:
# the same load against
#
#   standalone  one flatkv-server (no ZooKeeper)
#   direct      a ring of P marks x 1 member, each key sent straight to its
#               owner (flatkv-bench server --zk: the RingClient's routing)
#   entry       the same ring, every call sent to one instance, which serves
#               its own keys and forwards the rest (what a plain Thrift
#               client of any language does)
#   redis       redis-server (AOF everysec) with redis-benchmark, if installed
#
#   client/bench/bench_ring.sh [BUILD_DIR]
#
# Environment: PARTITIONS (default 3), NUM (keys, default 300000; the marks
# split [0, NUM) evenly: deploy/ring.sh --key-max), OPS (per test, default
# 200000), CLIENTS (default 50), SIZE (value bytes, default 100), ROUNDS
# (default 3: the targets take turns, each reported as its median), ZK_PORT
# (default 2291), BASE_PORT (default 9931).
#
# Every FlatKV instance runs storage.sync=interval (an fdatasync a second),
# Redis appendfsync everysec. Each store is filled once (untimed), then each
# round runs get and put (uniform keys over [0, NUM), one call in flight per
# client) against each target in turn. The client shares the CPU with the
# servers: a ring of 3 and one standalone server compete for the same cores,
# so "direct / standalone" says what routing costs, not what more machines
# would gain. Not part of the tests.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=${1:-$REPO/build}
PARTITIONS=${PARTITIONS:-3}
NUM=${NUM:-300000}
OPS=${OPS:-200000}
CLIENTS=${CLIENTS:-50}
SIZE=${SIZE:-100}
ROUNDS=${ROUNDS:-3}
ZK_PORT=${ZK_PORT:-2291}
BASE_PORT=${BASE_PORT:-9931}
SERVER_BIN=$BUILD/server/flatkv-server
BENCH_BIN=$BUILD/client/flatkv-bench
PY=/usr/bin/python3
for bin in "$SERVER_BIN" "$BENCH_BIN"; do
  [[ -x $bin ]] || { echo "bench_ring: $bin not found (build it first)" >&2; exit 2; }
done
HAVE_REDIS=1
command -v redis-benchmark >/dev/null && command -v redis-server >/dev/null || HAVE_REDIS=0

TMP=$(mktemp -d /tmp/flatkv-bench-ring.XXXXXX)
STANDALONE_PID=
REDIS_PID=
cleanup() {
  FLATKV_SERVER=$SERVER_BIN FLATKV_CLI=$BUILD/client/flatkv \
    bash "$REPO/deploy/ring.sh" down --dir "$TMP/ring" >/dev/null 2>&1 || true
  [[ -n $STANDALONE_PID ]] && kill "$STANDALONE_PID" 2>/dev/null && wait "$STANDALONE_PID" 2>/dev/null
  [[ -n $REDIS_PID ]] && kill "$REDIS_PID" 2>/dev/null && wait "$REDIS_PID" 2>/dev/null
  rm -rf "$TMP"
}
trap cleanup EXIT

BENCH_NAME=bench_ring
# shellcheck source=client/bench/bench_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/bench_lib.sh"

FLATKV_SERVER=$SERVER_BIN FLATKV_CLI=$BUILD/client/flatkv \
  bash "$REPO/deploy/ring.sh" up --dir "$TMP/ring" --partitions "$PARTITIONS" \
  --key-max "$NUM" --zk-port "$ZK_PORT" --base-port "$BASE_PORT" \
  --set storage.sync=interval --set log.level=warn >"$TMP/ring.log"
STANDALONE_PORT=$(free_port)
"$SERVER_BIN" --set server.host=127.0.0.1 --set server.port="$STANDALONE_PORT" \
  --set storage.path="$TMP/standalone" --set storage.sync=interval --set log.level=warn \
  2>"$TMP/standalone.log" &
STANDALONE_PID=$!
wait_port "$STANDALONE_PORT" flatkv-server
if ((HAVE_REDIS)); then
  REDIS_PORT=$(free_port)
  mkdir -p "$TMP/redis"
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --appendonly yes --appendfsync everysec \
    --save '' --dir "$TMP/redis" --daemonize no --logfile "$TMP/redis/log" &
  REDIS_PID=$!
  wait_port "$REDIS_PORT" redis-server
fi

bench() {  # label, then flatkv-bench server target flags
  local label=$1
  shift
  "$BENCH_BIN" server "$@" --clients "$CLIENTS" --ops "$OPS" --num "$NUM" \
    --value-size "$SIZE" --json --workload "$WORKLOADS" 2>>"$TMP/bench.log" |
    sed "s/^{/{\"target\":\"$label\",/" >>"$TMP/results.json"
}
STANDALONE=(--port "$STANDALONE_PORT")
DIRECT=(--zk "127.0.0.1:$ZK_PORT")
ENTRY=(--port "$BASE_PORT")

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 min); $(nproc) CPUs"
echo "$PARTITIONS marks x 1 member, keys [0, $NUM), $OPS ops a test, $CLIENTS clients, $SIZE B," \
  "$ROUNDS rounds; storage.sync=interval, redis appendfsync everysec"
WORKLOADS=fill
bench fill-standalone "${STANDALONE[@]}"
bench fill-ring "${DIRECT[@]}"
if ((HAVE_REDIS)); then
  awk -v n="$NUM" -v size="$SIZE" 'BEGIN {
        v = sprintf("%*s", size, ""); gsub(/ /, "x", v)
        for (i = 0; i < n; i++) {
          k = sprintf("key:%012d", i)
          printf "*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n", length(k), k, size, v
        }
      }' | redis-cli -p "$REDIS_PORT" --pipe >/dev/null
fi
WORKLOADS=get,put
for ((round = 0; round < ROUNDS; round++)); do
  bench standalone "${STANDALONE[@]}"
  bench direct "${DIRECT[@]}"
  bench entry "${ENTRY[@]}"
  if ((HAVE_REDIS)); then
    redis-benchmark -p "$REDIS_PORT" -c "$CLIENTS" -n "$OPS" -d "$SIZE" -t set,get \
      -r "$NUM" --csv >>"$TMP/redis.csv"
  fi
done
echo "load after:  $(cut -d' ' -f1-3 /proc/loadavg)"
if grep -q '"errors":[1-9]' "$TMP/results.json"; then
  echo "bench_ring: some calls failed:" >&2
  grep '"errors":[1-9]' "$TMP/results.json" >&2
  cat "$TMP/bench.log" >&2
fi

"$PY" - "$TMP/results.json" "$TMP/redis.csv" <<'EOF'
import csv
import json
import os
import statistics
import sys

runs = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    runs.setdefault((r["target"], r["workload"]), []).append(r)


def median(target, op, field):
    return statistics.median(r[field] for r in runs[(target, op)])


redis = {}
if os.path.exists(sys.argv[2]):
    for r in csv.DictReader(open(sys.argv[2])):
        if r["test"] in ("SET", "GET"):
            redis.setdefault(r["test"], []).append(r)

print("| op | target | ops/s | p50 us | p99 us | vs standalone | vs direct | vs redis |")
print("|---|---|---|---|---|---|---|---|")
for op, redis_op in (("get", "GET"), ("put", "SET")):
    rops = statistics.median(float(r["rps"]) for r in redis[redis_op]) if redis else None
    base = median("standalone", op, "ops_per_sec")
    direct = median("direct", op, "ops_per_sec")
    for target in ("standalone", "direct", "entry"):
        ops = median(target, op, "ops_per_sec")
        print("| %s | %s | %.0f | %.0f | %.0f | %.2f | %.2f | %s |" % (
            op, target, ops, median(target, op, "p50_us"), median(target, op, "p99_us"),
            ops / base, ops / direct, "%.2f" % (ops / rops) if rops else "-"))
    if rops:
        p50 = statistics.median(float(r["p50_latency_ms"]) * 1000 for r in redis[redis_op])
        p99 = statistics.median(float(r["p99_latency_ms"]) * 1000 for r in redis[redis_op])
        print("| %s | redis %s | %.0f | %.0f | %.0f | %.2f | %.2f | 1.00 |" % (
            op, redis_op, rops, p50, p99, rops / base, rops / direct))
print("targets: direct >= 0.9 x standalone, entry >= 0.5 x direct")
EOF
