#!/usr/bin/env bash
# loadgen_vs_redis.sh: flatkv-server against Redis through flatkv-loadgen,
# the load generator that is not FlatKV's own: THREADS threads (default
# 50), each with one blocking connection, the Thrift-generated C++ client
# for FlatKV and hiredis for Redis. Durability as bench_vs_redis.sh: FlatKV
# storage.sync=interval (an fdatasync every second), write_mode=safe; Redis
# appendonly with appendfsync everysec.
#
#   client/bench/loadgen_vs_redis.sh [BUILD_DIR] [--server-cpus LIST]
#       [--client-cpus LIST] [--set section.key=value ...]
#
# BUILD_DIR (default: build) holds a Release build of flatkv-server and
# flatkv-loadgen; --set arguments go to flatkv-server. --server-cpus and
# --client-cpus (taskset CPU lists, such as 1 or 0,2-3) pin each server, all
# its threads, and the load generator: on a small machine, the server on a
# core of its own and the generator on the others is the one fair way to
# compare servers (a generator sharing the server's cores takes CPU from the
# server in proportion to its own cost per call, which differs between the
# Thrift client and hiredis). Without them nothing is pinned.
#
# Environment: OPS (calls per put or get run, default 200000), BATCH_CALLS
# (calls per mput or mget run, default OPS / 5), BATCH (keys per mput / mget
# call: multiPut / MSET, multiGet / MGET; default 10), KEYSPACE (default
# 100000), THREADS (default 50), ROUNDS (default 3), SIZES (default
# "100 1024 4096"), WORKLOADS (default "put get mput mget"), RUNS (a file
# that gets every run's JSON line; default none).
#
# Both servers start empty and are filled once per value size (every key
# written once); then each round runs every workload on FlatKV and on Redis,
# alternating which goes first, so a slow minute of the machine lands on
# both. Prints every run, then per size and workload the medians of the
# rounds: calls/s, p50/p99/p999 of a call, each server's CPU time per call
# (user + system of all its threads, from /proc/<pid>/stat, over all rounds)
# and the generator's CPU use as a share of its CPUs (near 100 %: the
# generator, not the server, was the limit).
#
# Not part of the tests (tests/client/bench/loadgen_vs_redis_smoke_test.py
# runs it small; loadgen_smoke_test.py checks the tool). Needs redis-server
# (deploy/install-deps.sh installs it) and util-linux's taskset.
set -euo pipefail

BENCH_NAME=loadgen_vs_redis
# shellcheck source=client/bench/bench_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/bench_lib.sh"
SERVER_CPUS=
CLIENT_CPUS=
parse_server_bench_args "$@"
OPS=${OPS:-200000}
BATCH_CALLS=${BATCH_CALLS:-$((OPS / 5))}
BATCH=${BATCH:-10}
KEYSPACE=${KEYSPACE:-100000}
THREADS=${THREADS:-50}
ROUNDS=${ROUNDS:-3}
read -r -a SIZES <<<"${SIZES:-100 1024 4096}"
read -r -a WORKLOADS <<<"${WORKLOADS:-put get mput mget}"

SERVER_BIN=$BUILD/server/flatkv-server
LOADGEN_BIN=$BUILD/client/flatkv-loadgen
for bin in "$SERVER_BIN" "$LOADGEN_BIN"; do
  [[ -x $bin ]] || { echo "loadgen_vs_redis: $bin not found (build it first)" >&2; exit 2; }
done
command -v redis-server >/dev/null || {
  echo "loadgen_vs_redis: redis-server missing: apt-get install -y redis-server" >&2
  exit 2
}
# The pinning prefixes (empty: not pinned).
SERVER_PIN=()
CLIENT_PIN=()
[[ -n $SERVER_CPUS ]] && SERVER_PIN=(taskset -c "$SERVER_CPUS")
[[ -n $CLIENT_CPUS ]] && CLIENT_PIN=(taskset -c "$CLIENT_CPUS")
for pin in "$SERVER_CPUS" "$CLIENT_CPUS"; do
  if [[ -n $pin ]] && ! taskset -c "$pin" true 2>/dev/null; then
    echo "loadgen_vs_redis: cannot pin to CPUs '$pin' (taskset -c $pin)" >&2
    exit 2
  fi
done
# How many CPUs the generator may use: its CPU share is per CPU.
if [[ -n $CLIENT_CPUS ]]; then
  CLIENT_NCPU=$(taskset -c "$CLIENT_CPUS" nproc)
else
  CLIENT_NCPU=$(nproc)
fi

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


cpu_ticks() {  # pid: user + system CPU clock ticks so far, all threads
  awk '{ print $14 + $15 }' "/proc/$1/stat"
}

# One loadgen run; appends its JSON line, with the server's CPU ticks, to
# $TMP/runs.jsonl.
run() {  # target port pid size round workload
  local before after calls=$OPS
  [[ $6 == fill ]] && calls=1
  [[ $6 == mput || $6 == mget ]] && calls=$BATCH_CALLS
  before=$(cpu_ticks "$3")
  "${CLIENT_PIN[@]}" "$LOADGEN_BIN" --target "$1" --port "$2" --threads "$THREADS" \
    --ops "$calls" --num "$KEYSPACE" --value-size "$4" --workload "$6" --batch "$BATCH" \
    --seed "$5" >"$TMP/line"
  after=$(cpu_ticks "$3")
  sed "s/}\$/, \"round\": $5, \"server_cpu_ticks\": $((after - before))}/" "$TMP/line" \
    | tee -a "$TMP/runs.jsonl"
}

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 min); $(nproc) CPUs"
echo "calls $OPS per run ($BATCH_CALLS of $BATCH keys for mput/mget), keyspace $KEYSPACE," \
  "$THREADS threads, $ROUNDS rounds; flatkv-server storage.sync=interval, redis appendfsync" \
  "everysec; servers on CPUs ${SERVER_CPUS:-any}, generator on CPUs ${CLIENT_CPUS:-any}"

for size in "${SIZES[@]}"; do
  stop_servers
  FLATKV_PORT=$(free_port)
  REDIS_PORT=$(free_port)
  rm -rf "$TMP/flatkv" "$TMP/redis"
  mkdir -p "$TMP/flatkv" "$TMP/redis"
  "${SERVER_PIN[@]}" "$SERVER_BIN" --set server.port="$FLATKV_PORT" \
    --set storage.path="$TMP/flatkv/data" --set storage.sync=interval \
    --set storage.sync_interval_ms=1000 --set write_mode=safe --set log.level=warn \
    "${SETS[@]}" 2>"$TMP/flatkv/log" &
  FLATKV_PID=$!
  "${SERVER_PIN[@]}" redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --appendonly yes \
    --appendfsync everysec --save '' --dir "$TMP/redis" --daemonize no \
    --logfile "$TMP/redis/log" &
  REDIS_PID=$!
  wait_port "$FLATKV_PORT" flatkv-server
  wait_port "$REDIS_PORT" redis-server
  run flatkv "$FLATKV_PORT" "$FLATKV_PID" "$size" 0 fill
  run redis "$REDIS_PORT" "$REDIS_PID" "$size" 0 fill
  for round in $(seq "$ROUNDS"); do
    for workload in "${WORKLOADS[@]}"; do
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
[[ -n ${RUNS:-} ]] && cp "$TMP/runs.jsonl" "$RUNS"

/usr/bin/python3 - "$TMP/runs.jsonl" "$(getconf CLK_TCK)" "$CLIENT_NCPU" <<'EOF'
import json
import statistics
import sys

runs = [json.loads(line) for line in open(sys.argv[1])]
hz = float(sys.argv[2])
client_cpus = float(sys.argv[3])
bad = [r for r in runs if r["errors"]]
for r in bad:
    print("warning: %s %s %d B round %d: %d errors" %
          (r["target"], r["workload"], r["value_size"], r["round"], r["errors"]))


def timed(target, size, workload):
    return [r for r in runs if r["target"] == target and r["value_size"] == size and
            r["workload"] == workload and r["round"] > 0]


def med(target, size, workload, field):
    return statistics.median(r[field] for r in timed(target, size, workload))


def cpu_us(target, size, workload):  # server CPU per call, over all rounds
    rs = timed(target, size, workload)
    return sum(r["server_cpu_ticks"] for r in rs) / hz * 1e6 / sum(r["ops"] for r in rs)


def client_share(target, size, workload):  # generator CPU / (wall time x its CPUs)
    rs = timed(target, size, workload)
    return 100 * sum(r["client_cpu_us"] / 1e6 for r in rs) / sum(
        r["seconds"] * client_cpus for r in rs)


NAMES = {"put": "put / SET", "get": "get / GET", "mput": "multiPut / MSET",
         "mget": "multiGet / MGET"}
head = ("call", "value", "FlatKV calls/s", "p50 / p99 / p999 us", "Redis calls/s",
        "p50 / p99 / p999 us", "calls/s FlatKV/Redis", "server CPU us/call FlatKV / Redis",
        "CPU ratio", "generator CPU FlatKV / Redis")
print("| " + " | ".join(head) + " |")
print("|" + "---|" * len(head))
for size in sorted({r["value_size"] for r in runs}):
    for w in ("put", "get", "mput", "mget"):
        if not timed("flatkv", size, w) or not timed("redis", size, w):
            continue
        batch = timed("flatkv", size, w)[0]["batch"]
        name = NAMES[w] + (" x %d" % batch if batch > 1 else "")
        f, r = med("flatkv", size, w, "ops_per_sec"), med("redis", size, w, "ops_per_sec")
        lat = {t: " / ".join("%.0f" % med(t, size, w, p) for p in ("p50_us", "p99_us",
                                                                    "p999_us"))
               for t in ("flatkv", "redis")}
        cf, cr = cpu_us("flatkv", size, w), cpu_us("redis", size, w)
        print("| %s | %d B | %.0f | %s | %.0f | %s | %.2f | %.1f / %.1f | %.2f | %.0f %% / %.0f %% |"
              % (name, size, f, lat["flatkv"], r, lat["redis"], f / r if r else 0, cf, cr,
                 cf / cr if cr else 0, client_share("flatkv", size, w),
                 client_share("redis", size, w)))
print("medians of the rounds; latency per call, calls/s over all threads; server CPU over "
      "all rounds; generator CPU as a share of its %d CPUs" % client_cpus)
sys.exit(1 if bad else 0)
EOF
