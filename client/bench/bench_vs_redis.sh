#!/usr/bin/env bash
# bench_vs_redis.sh: flatkv-server against Redis on this machine: 50 clients, each with one request in flight, 100 B
# and 1 KiB values, comparable durability (FlatKV storage.sync=interval, an
# fdatasync every second; Redis appendonly with appendfsync everysec).
#
#   client/bench/bench_vs_redis.sh [BUILD_DIR] [--set section.key=value ...]
#
# BUILD_DIR (default: build) must hold a Release build of flatkv-server and
# flatkv-bench; the --set arguments go to flatkv-server after the script's
# own. Environment: OPS (ops per test, default 200000), KEYSPACE (keys,
# default 100000), CLIENTS (default 50), BATCH_OPS (keys per batch test,
# default 5 x OPS), BATCH (keys per multiGet/multiPut,
# default 100).
#
# Both servers start empty in a temporary directory on free loopback ports
# and are stopped at the end. For each value size:
#
#   FlatKV  flatkv-bench server --workload fill,put,get --clients 50
#           (fill writes every key once, untimed in the table; put and get
#           draw uniform keys), then put,get with --batch 100 (multiPut /
#           multiGet; the table counts keys/s against Redis's unbatched ops/s)
#   Redis   every key SET once through redis-cli --pipe (the same fill),
#           then redis-benchmark -c 50 -n OPS -d SIZE -t set,get -r KEYSPACE
#           --csv (no -P: one request in flight per client, like FlatKV)
#
# The client and the servers share the CPU, so the load average (printed
# before and after) matters: other work on the machine lowers both sides.
# Not part of the tests. Needs redis-server, redis-tools
# (apt-get install -y redis-server redis-tools) and /usr/bin/python3.
set -euo pipefail

BUILD=build
if [[ $# -gt 0 && $1 != --* ]]; then
  BUILD=$1
  shift
fi
OPS=${OPS:-200000}
KEYSPACE=${KEYSPACE:-100000}
CLIENTS=${CLIENTS:-50}
BATCH=${BATCH:-100}
BATCH_OPS=${BATCH_OPS:-$((OPS * 5))}
SIZES=(100 1024)

SERVER_BIN=$BUILD/server/flatkv-server
BENCH_BIN=$BUILD/client/flatkv-bench
for bin in "$SERVER_BIN" "$BENCH_BIN"; do
  [[ -x $bin ]] || { echo "bench_vs_redis: $bin not found (build it first)" >&2; exit 2; }
done
for bin in redis-server redis-cli redis-benchmark; do
  command -v "$bin" >/dev/null || {
    echo "bench_vs_redis: $bin missing: apt-get install -y redis-server redis-tools" >&2
    exit 2
  }
done
build_type=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$BUILD/CMakeCache.txt" 2>/dev/null || true)
if [[ $build_type != Release ]]; then
  echo "bench_vs_redis: warning: $BUILD is a '${build_type:-unknown}' build, not Release" >&2
fi

TMP=$(mktemp -d /tmp/flatkv-vs-redis.XXXXXX)
FLATKV_PID=
REDIS_PID=
cleanup() {
  [[ -n $FLATKV_PID ]] && kill "$FLATKV_PID" 2>/dev/null && wait "$FLATKV_PID" 2>/dev/null
  [[ -n $REDIS_PID ]] && kill "$REDIS_PID" 2>/dev/null && wait "$REDIS_PID" 2>/dev/null
  rm -rf "$TMP"
}
trap cleanup EXIT

BENCH_NAME=bench_vs_redis
# shellcheck source=client/bench/bench_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/bench_lib.sh"

cpu_seconds() {  # pid: user + system CPU seconds so far
  awk -v hz="$(getconf CLK_TCK)" '{ printf "%.1f", ($14 + $15) / hz }' "/proc/$1/stat"
}

FLATKV_PORT=$(free_port)
REDIS_PORT=$(free_port)
mkdir -p "$TMP/flatkv" "$TMP/redis"

"$SERVER_BIN" --set server.port="$FLATKV_PORT" --set storage.path="$TMP/flatkv/data" \
  --set storage.sync=interval --set storage.sync_interval_ms=1000 --set write_mode=safe \
  --set log.level=warn "$@" 2>"$TMP/flatkv/log" &
FLATKV_PID=$!
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --appendonly yes --appendfsync everysec \
  --save '' --dir "$TMP/redis" --daemonize no --logfile "$TMP/redis/log" &
REDIS_PID=$!
wait_port "$FLATKV_PORT" flatkv-server
wait_port "$REDIS_PORT" redis-server

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 min); $(nproc) CPUs"
echo "ops $OPS per test, keyspace $KEYSPACE, $CLIENTS clients, batch $BATCH;" \
  "flatkv-server storage.sync=interval, redis appendfsync everysec"

for size in "${SIZES[@]}"; do
  "$BENCH_BIN" server --port "$FLATKV_PORT" --clients "$CLIENTS" --ops "$OPS" \
    --num "$KEYSPACE" --value-size "$size" --workload fill,put,get --json \
    >"$TMP/flat-$size.json"
  # Batches run BATCH_OPS keys (default 5 x OPS): OPS keys in calls of 100
  # are only 40 calls per client, too few to measure.
  "$BENCH_BIN" server --port "$FLATKV_PORT" --clients "$CLIENTS" --ops "$BATCH_OPS" \
    --num "$KEYSPACE" --value-size "$size" --workload put,get --batch "$BATCH" --json \
    >"$TMP/flat-batch-$size.json"
  # redis-benchmark -r names keys key:%012d; SET each once, as fill does.
  awk -v n="$KEYSPACE" -v size="$size" 'BEGIN {
        v = sprintf("%*s", size, ""); gsub(/ /, "x", v)
        for (i = 0; i < n; i++) {
          k = sprintf("key:%012d", i)
          printf "*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n", length(k), k, size, v
        }
      }' | redis-cli -p "$REDIS_PORT" --pipe >/dev/null
  redis-benchmark -p "$REDIS_PORT" -c "$CLIENTS" -n "$OPS" -d "$size" -t set,get \
    -r "$KEYSPACE" --csv >"$TMP/redis-$size.csv"
done

echo "load after:  $(cut -d' ' -f1-3 /proc/loadavg)"
echo "server CPU seconds: flatkv-server $(cpu_seconds "$FLATKV_PID"), redis-server $(cpu_seconds "$REDIS_PID")"

/usr/bin/python3 - "$TMP" "$BATCH" "${SIZES[@]}" <<'EOF'
import csv
import json
import sys

tmp, batch, sizes = sys.argv[1], int(sys.argv[2]), sys.argv[3:]


def flat(path):
    return {r["workload"]: r for r in map(json.loads, open(path))}


def redis(path):
    return {r["test"]: r for r in csv.DictReader(open(path))}


rows = []
for size in sizes:
    f, fb, r = (flat("%s/flat-%s.json" % (tmp, size)),
                flat("%s/flat-batch-%s.json" % (tmp, size)),
                redis("%s/redis-%s.csv" % (tmp, size)))
    for op, redis_op in (("put", "SET"), ("get", "GET")):
        red = r[redis_op]
        rps, rp99 = float(red["rps"]), float(red["p99_latency_ms"]) * 1000
        for label, row in ((op, f[op]), ("multi%s x%d" % (op.capitalize(), batch), fb[op])):
            if row["errors"]:
                print("warning: %s %s B: %d errors" % (label, size, row["errors"]))
            rows.append((label, size, row["ops_per_sec"], row["p50_us"], row["p99_us"],
                         redis_op, rps, rp99, row["ops_per_sec"] / rps))

head = ("flatkv", "value", "flat keys/s", "flat p50 us", "flat p99 us", "redis",
        "redis ops/s", "redis p99 us", "flat/redis")
print("| " + " | ".join(head) + " |")
print("|" + "---|" * len(head))
for label, size, fops, fp50, fp99, rop, rops, rp99, ratio in rows:
    print("| %s | %s B | %.0f | %.0f | %.0f | %s | %.0f | %.0f | %.2f |" %
          (label, size, fops, fp50, fp99, rop, rops, rp99, ratio))
print("multiGet/multiPut rows count keys/s (%d keys a call, p50/p99 per call)"
      " against Redis's unbatched ops/s." % batch)
EOF
