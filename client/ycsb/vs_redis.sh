#!/usr/bin/env bash
# vs_redis.sh: YCSB against flatkv-server and Redis on this machine, in the
# same run, with comparable durability (FlatKV storage.sync=interval, an
# fdatasync every second; Redis appendonly with appendfsync everysec).
#
#   client/ycsb/vs_redis.sh [BUILD_DIR]
#
# BUILD_DIR (default: build) holds a Release flatkv-server and the binding
# (build/client/ycsb). Environment: RECORDS (100000), OPS (100000), THREADS
# (8), WORKLOADS (workloada workloadb workloadc workloadf writeonly-1k
# readheavy-1k writeheavy-1k writeonly-4k readheavy-4k writeheavy-4k),
# KEYS (int or string, FlatKV's key mode; default int).
#
# For each workload both servers start empty (fresh directories, free
# loopback ports), client/ycsb/run.sh loads RECORDS and runs OPS on each,
# and the table gives ops/s of both phases and their ratio (FlatKV / Redis),
# and the run's p99 per operation. Client and servers share the CPUs: other
# work on the machine lowers both sides. Not part of the tests. Needs
# redis-server (apt-get install -y redis-server).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
BUILD=$(cd "${1:-build}" && pwd)
RECORDS=${RECORDS:-100000} OPS=${OPS:-100000} THREADS=${THREADS:-8} KEYS=${KEYS:-int}
WORKLOADS=${WORKLOADS:-workloada workloadb workloadc workloadf writeonly-1k readheavy-1k writeheavy-1k writeonly-4k readheavy-4k writeheavy-4k}
SERVER_BIN=$BUILD/server/flatkv-server
export FLATKV_YCSB_BUILD=$BUILD/client/ycsb FLATKV_YCSB_KEYS=$KEYS
[[ -x $SERVER_BIN && -f $FLATKV_YCSB_BUILD/flatkv-ycsb.jar ]] ||
  { echo "vs_redis: build flatkv-server and the binding first ($BUILD)" >&2; exit 2; }
command -v redis-server >/dev/null || { echo "vs_redis: apt-get install -y redis-server" >&2; exit 2; }

BENCH_NAME=vs_redis
# shellcheck source=client/bench/bench_lib.sh
source "$here/../bench/bench_lib.sh"
TMP=$(mktemp -d /tmp/flatkv-ycsb-vs-redis.XXXXXX)
PIDS=()
stop_servers() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true; done
  PIDS=()
}
trap 'stop_servers; rm -rf "$TMP"' EXIT

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) CPUs; $RECORDS records, $OPS ops," \
  "$THREADS threads, $KEYS keys; flatkv sync=interval, redis appendfsync everysec"
for w in $WORKLOADS; do
  rm -rf "$TMP/run" && mkdir -p "$TMP/run/redis"
  fport=$(free_port) rport=$(free_port)
  "$SERVER_BIN" --set server.port="$fport" --set storage.path="$TMP/run/flatkv" \
    --set storage.sync=interval --set log.level=warn 2>"$TMP/run/flatkv.log" &
  PIDS+=($!)
  redis-server --port "$rport" --bind 127.0.0.1 --appendonly yes --appendfsync everysec \
    --save '' --dir "$TMP/run/redis" --daemonize no --logfile "$TMP/run/redis/log" &
  PIDS+=($!)
  wait_port "$fport" flatkv-server
  wait_port "$rport" redis-server
  bash "$here/run.sh" "127.0.0.1:$fport" "$w" "$RECORDS" "$OPS" "$THREADS" >"$TMP/$w.flatkv"
  FLATKV_YCSB_DB=redis bash "$here/run.sh" "127.0.0.1:$rport" "$w" "$RECORDS" "$OPS" "$THREADS" \
    >"$TMP/$w.redis"
  stop_servers
done
echo "load after:  $(cut -d' ' -f1-3 /proc/loadavg)"

/usr/bin/python3 - "$TMP" $WORKLOADS <<'PY'
import re
import sys

tmp, workloads = sys.argv[1], sys.argv[2:]


def parse(path):
    """{phase: {(section, metric): value}} of run.sh's output."""
    out, phase = {}, None
    for line in open(path):
        m = re.match(r"# (load|run):", line)
        if m:
            phase = out.setdefault(m.group(1), {})
        m = re.match(r"\[(\w+)\], ([^,]+), ([-\d.]+)$", line.strip())
        if m and phase is not None:
            phase[(m.group(1), m.group(2))] = float(m.group(3))
    return out


print("| workload | load FlatKV | load Redis | ratio | run FlatKV | run Redis | ratio | run p99 FlatKV / Redis (us) |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for w in workloads:
    f, r = parse("%s/%s.flatkv" % (tmp, w)), parse("%s/%s.redis" % (tmp, w))
    cells = [w]
    for phase in ("load", "run"):
        a = f[phase][("OVERALL", "Throughput(ops/sec)")]
        b = r[phase][("OVERALL", "Throughput(ops/sec)")]
        cells += ["%.0f" % a, "%.0f" % b, "%.2f" % (a / b)]
    p99 = []
    for op in ("READ", "UPDATE", "INSERT", "READ-MODIFY-WRITE", "SCAN"):
        key = (op, "99thPercentileLatency(us)")
        if key in f["run"] and key in r["run"]:
            p99.append("%s %d / %d" % (op.lower(), f["run"][key], r["run"][key]))
    errors = [k for p in (f, r) for ph in p.values() for k in ph if k[1].startswith("Return=") and k[1] != "Return=OK"]
    cells.append(", ".join(p99) + (" (not OK: %s)" % errors if errors else ""))
    print("| " + " | ".join(cells) + " |")
PY
