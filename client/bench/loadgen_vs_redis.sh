#!/usr/bin/env bash
# loadgen_vs_redis.sh: flatkv-server against Redis through flatkv-loadgen,
# the load generator that is not FlatKV's own (issue 13's server target):
# THREADS threads (default 50), each with one blocking connection, the
# Thrift-generated C++ client for FlatKV and hiredis for Redis. Durability
# as bench_vs_redis.sh: FlatKV storage.sync=interval (an fdatasync every
# second), write_mode=safe; Redis appendonly with appendfsync everysec.
#
#   client/bench/loadgen_vs_redis.sh [BUILD_DIR] [--set section.key=value ...]
#
# BUILD_DIR (default: build) holds a Release build of flatkv-server and
# flatkv-loadgen; --set arguments go to flatkv-server. Environment: OPS
# (calls per put or get run, default 200000), KEYSPACE (default 100000),
# THREADS (default 50), ROUNDS (default 3), SIZES (default "100 1024").
#
# Both servers start empty and are filled once per value size (every key
# written once); then each round runs put and get on FlatKV and on Redis,
# alternating which goes first, so a slow minute of the machine lands on
# both. Prints every run, then per size and call the median ops/s and p99
# of the rounds, their ratio, and each server's CPU time per call (from
# /proc: the load generator shares the two cores, so a server's CPU per
# call decides how much is left for the clients).
#
# Not part of the tests (tests/client/bench/loadgen_smoke_test.py checks the
# tool). Needs redis-server (deploy/install-deps.sh installs it).
set -euo pipefail

BUILD=build
if [[ $# -gt 0 && $1 != --* ]]; then
  BUILD=$1
  shift
fi
OPS=${OPS:-200000}
KEYSPACE=${KEYSPACE:-100000}
THREADS=${THREADS:-50}
ROUNDS=${ROUNDS:-3}
read -r -a SIZES <<<"${SIZES:-100 1024}"

SERVER_BIN=$BUILD/server/flatkv-server
LOADGEN_BIN=$BUILD/client/flatkv-loadgen
for bin in "$SERVER_BIN" "$LOADGEN_BIN"; do
  [[ -x $bin ]] || { echo "loadgen_vs_redis: $bin not found (build it first)" >&2; exit 2; }
done
command -v redis-server >/dev/null || {
  echo "loadgen_vs_redis: redis-server missing: apt-get install -y redis-server" >&2
  exit 2
}

TMP=$(mktemp -d /tmp/flatkv-loadgen.XXXXXX)
FLATKV_PID=
REDIS_PID=
stop_servers() {
  [[ -n $FLATKV_PID ]] && kill "$FLATKV_PID" 2>/dev/null && wait "$FLATKV_PID" 2>/dev/null
  [[ -n $REDIS_PID ]] && kill "$REDIS_PID" 2>/dev/null && wait "$REDIS_PID" 2>/dev/null
  FLATKV_PID=
  REDIS_PID=
}
cleanup() {
  stop_servers || true
  rm -rf "$TMP"
}
trap cleanup EXIT

BENCH_NAME=loadgen_vs_redis
# shellcheck source=client/bench/bench_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/bench_lib.sh"

cpu_ticks() {  # pid: user + system CPU clock ticks so far
  awk '{ print $14 + $15 }' "/proc/$1/stat"
}

# One loadgen run; appends its JSON line, with the server's CPU ticks, to
# $TMP/runs.jsonl.
run() {  # target port pid size round workload
  local before after
  before=$(cpu_ticks "$3")
  "$LOADGEN_BIN" --target "$1" --port "$2" --threads "$THREADS" --ops "$OPS" \
    --num "$KEYSPACE" --value-size "$4" --workload "$6" --seed "$5" >"$TMP/line"
  after=$(cpu_ticks "$3")
  sed "s/}\$/, \"round\": $5, \"server_cpu_ticks\": $((after - before))}/" "$TMP/line" \
    | tee -a "$TMP/runs.jsonl"
}

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 min); $(nproc) CPUs"
echo "calls $OPS per run, keyspace $KEYSPACE, $THREADS threads, $ROUNDS rounds;" \
  "flatkv-server storage.sync=interval, redis appendfsync everysec"

for size in "${SIZES[@]}"; do
  stop_servers
  FLATKV_PORT=$(free_port)
  REDIS_PORT=$(free_port)
  rm -rf "$TMP/flatkv" "$TMP/redis"
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
  run flatkv "$FLATKV_PORT" "$FLATKV_PID" "$size" 0 fill
  run redis "$REDIS_PORT" "$REDIS_PID" "$size" 0 fill
  for round in $(seq "$ROUNDS"); do
    for workload in put get; do
      if ((round % 2)); then
        run flatkv "$FLATKV_PORT" "$FLATKV_PID" "$size" "$round" "$workload"
        run redis "$REDIS_PORT" "$REDIS_PID" "$size" "$round" "$workload"
      else
        run redis "$REDIS_PORT" "$REDIS_PID" "$size" "$round" "$workload"
        run flatkv "$FLATKV_PORT" "$FLATKV_PID" "$size" "$round" "$workload"
      fi
    done
  done
done
stop_servers
echo "load after:  $(cut -d' ' -f1-3 /proc/loadavg)"

/usr/bin/python3 - "$TMP/runs.jsonl" "$(getconf CLK_TCK)" <<'EOF'
import json
import statistics
import sys

runs = [json.loads(line) for line in open(sys.argv[1])]
hz = float(sys.argv[2])
bad = [r for r in runs if r["errors"]]
for r in bad:
    print("warning: %s %s %d B round %d: %d errors" %
          (r["target"], r["workload"], r["value_size"], r["round"], r["errors"]))


def med(target, size, workload, field):
    return statistics.median(r[field] for r in runs if r["target"] == target and
                             r["value_size"] == size and r["workload"] == workload and
                             r["round"] > 0)


def cpu_us(target, size, workload):
    rs = [r for r in runs if r["target"] == target and r["value_size"] == size and
          r["workload"] == workload and r["round"] > 0]
    return sum(r["server_cpu_ticks"] for r in rs) / hz * 1e6 / sum(r["ops"] for r in rs)


head = ("call", "value", "flatkv ops/s", "flatkv p50 us", "flatkv p99 us", "redis ops/s",
        "redis p50 us", "redis p99 us", "flatkv/redis", "server CPU us/call flatkv/redis")
print("| " + " | ".join(head) + " |")
print("|" + "---|" * len(head))
for size in sorted({r["value_size"] for r in runs}):
    for w in ("put", "get"):
        f, r = med("flatkv", size, w, "ops_per_sec"), med("redis", size, w, "ops_per_sec")
        print("| %s | %d B | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.2f | %.1f / %.1f |" %
              (w, size, f, med("flatkv", size, w, "p50_us"), med("flatkv", size, w, "p99_us"),
               r, med("redis", size, w, "p50_us"), med("redis", size, w, "p99_us"), f / r,
               cpu_us("flatkv", size, w), cpu_us("redis", size, w)))
print("medians of the rounds; p50/p99 per call, ops/s over all threads")
sys.exit(1 if bad else 0)
EOF
