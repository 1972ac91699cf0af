#!/usr/bin/env bash
# bench_tls.sh: what TLS on the Thrift port costs: flatkv-server plaintext
# against flatkv-server with a certificate (server.tls_cert_file), and
# Redis plaintext against Redis's --tls-port, in the same run.
#
#   client/bench/bench_tls.sh [BUILD_DIR] [--server-cpus LIST] [--client-cpus LIST]
#       [--set section.key=value ...]
#
# BUILD_DIR (default: build) holds a Release flatkv-server and flatkv-bench
# (FLATKV_SERVER overrides the server; BASELINE=PATH adds another build of
# it to every round, shown as "baseline", to compare two builds); --set
# arguments go to flatkv-server. The servers are pinned to --server-cpus
# and the load generators to --client-cpus (taskset lists; defaults 1 and
# 0), so the server's CPU per call is its own. Environment: OPS (calls per
# test, default 200000), CLIENTS (connections, default 50), ROUNDS (default
# 3, interleaved: plain, TLS, plain, TLS, ...), SIZES (default "100 4096").
#
# For each round and value size, every server starts empty (storage.sync
# interval for FlatKV; Redis without persistence: neither waits for a disk),
# the keys are written once (untimed), then put and get each run OPS calls
# over CLIENTS connections with one call in flight each (flatkv-bench
# server; redis-benchmark -c CLIENTS without -P). Printed per size and call:
# the median calls/s and the server's CPU microseconds per call (user +
# system of all its threads, /proc/<pid>/stat) for each server and mode,
# and TLS as a share of plaintext for both.
#
# Certificates: a P-256 CA and server certificate made with openssl in the
# temporary directory. Not part of the tests. Needs redis-server,
# redis-tools, openssl and util-linux's taskset.
set -euo pipefail

BENCH_NAME=bench_tls
# shellcheck source=client/bench/bench_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/bench_lib.sh"
SERVER_CPUS=1
CLIENT_CPUS=0
parse_server_bench_args "$@"
OPS=${OPS:-200000}
CLIENTS=${CLIENTS:-50}
ROUNDS=${ROUNDS:-3}
read -r -a SIZE_LIST <<<"${SIZES:-100 4096}"
SERVER_BIN=${FLATKV_SERVER:-$BUILD/server/flatkv-server}
BENCH_BIN=$BUILD/client/flatkv-bench
for bin in "$SERVER_BIN" "$BENCH_BIN"; do
  [[ -x $bin ]] || { echo "bench_tls: $bin not found (build it first)" >&2; exit 2; }
done
for bin in redis-server redis-benchmark redis-cli openssl taskset; do
  command -v "$bin" >/dev/null || { echo "bench_tls: $bin missing" >&2; exit 2; }
done

TMP=$(mktemp -d /tmp/flatkv-bench-tls.XXXXXX)
PID=
cleanup() {
  [[ -n $PID ]] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null
  rm -rf "$TMP"
}
trap cleanup EXIT


make_certs() {
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$TMP/ca.key" \
    -out "$TMP/ca.pem" -days 2 -subj /CN=bench-ca 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$TMP/server.key" \
    -out "$TMP/server.csr" -subj /CN=127.0.0.1 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1\n' >"$TMP/ext"
  openssl x509 -req -in "$TMP/server.csr" -CA "$TMP/ca.pem" -CAkey "$TMP/ca.key" \
    -CAcreateserial -days 2 -extfile "$TMP/ext" -out "$TMP/server.pem" 2>/dev/null
}
make_certs

cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

stop_server() {
  kill "$PID" 2>/dev/null || true
  wait "$PID" 2>/dev/null || true
  PID=
}

# One timed test: prints "server mode size op round ops seconds ticks".
record() {  # server mode size op round seconds-of-run ops ticks
  echo "$*" >>"$TMP/results"
}

flatkv_round() {  # mode size round [name binary]
  local mode=$1 size=$2 round=$3 name=${4:-flatkv} bin=${5:-$SERVER_BIN} port tls=() client=()
  port=$(free_port)
  rm -rf "$TMP/data"
  if [[ $mode == tls ]]; then
    tls=(--set server.tls_cert_file="$TMP/server.pem" --set server.tls_key_file="$TMP/server.key")
    client=(--tls-ca "$TMP/ca.pem")
  fi
  taskset -c "$SERVER_CPUS" "$bin" --set server.port="$port" \
    --set storage.path="$TMP/data" --set storage.sync=interval --set log.level=warn \
    "${tls[@]}" "${SETS[@]}" 2>"$TMP/flatkv.log" &
  PID=$!
  wait_port "$port" flatkv-server
  taskset -c "$CLIENT_CPUS" "$BENCH_BIN" server --port "$port" "${client[@]}" --clients "$CLIENTS" \
    --ops "$OPS" --value-size "$size" --workload fill >/dev/null
  for op in put get; do
    local before after line
    before=$(cpu_ticks "$PID")
    line=$(taskset -c "$CLIENT_CPUS" "$BENCH_BIN" server --port "$port" "${client[@]}" \
      --clients "$CLIENTS" --ops "$OPS" --value-size "$size" --workload "$op" --json)
    after=$(cpu_ticks "$PID")
    /usr/bin/python3 -c 'import json, sys; r = json.loads(sys.argv[1]); print(r["ops"], r["ops_per_sec"])' \
      "$line" | { read -r ops rate; record "$name" "$mode" "$size" "$op" "$round" "$ops" "$rate" $((after - before)); }
  done
  stop_server
}

redis_round() {  # mode size round
  local mode=$1 size=$2 round=$3 port cli=() args
  port=$(free_port)
  if [[ $mode == tls ]]; then
    args=(--port 0 --tls-port "$port" --tls-cert-file "$TMP/server.pem"
      --tls-key-file "$TMP/server.key" --tls-ca-cert-file "$TMP/ca.pem" --tls-auth-clients no)
    cli=(--tls --cacert "$TMP/ca.pem")
  else
    args=(--port "$port")
  fi
  taskset -c "$SERVER_CPUS" redis-server "${args[@]}" --bind 127.0.0.1 --save '' \
    --appendonly no --daemonize no --logfile "$TMP/redis.log" &
  PID=$!
  wait_port "$port" redis-server
  taskset -c "$CLIENT_CPUS" redis-benchmark -p "$port" "${cli[@]}" -c "$CLIENTS" -n "$OPS" \
    -d "$size" -t set -r "$OPS" -q >/dev/null
  for op in put get; do
    local before after rate test=SET
    [[ $op == get ]] && test=GET
    before=$(cpu_ticks "$PID")
    rate=$(taskset -c "$CLIENT_CPUS" redis-benchmark -p "$port" "${cli[@]}" -c "$CLIENTS" \
      -n "$OPS" -d "$size" -t "${test,,}" -r "$OPS" --csv | awk -F'"' -v t="$test" '$2 == t { print $4 }')
    after=$(cpu_ticks "$PID")
    record redis "$mode" "$size" "$op" "$round" "$OPS" "$rate" $((after - before))
  done
  stop_server
}

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 min); servers on CPUs" \
  "$SERVER_CPUS, generators on $CLIENT_CPUS; $OPS calls per test, $CLIENTS connections," \
  "$ROUNDS rounds; server $SERVER_BIN${BASELINE:+, baseline $BASELINE}"
for ((round = 1; round <= ROUNDS; round++)); do
  for size in "${SIZE_LIST[@]}"; do
    for mode in plain tls; do
      flatkv_round "$mode" "$size" "$round"
      [[ -n ${BASELINE:-} ]] && flatkv_round "$mode" "$size" "$round" baseline "$BASELINE"
      redis_round "$mode" "$size" "$round"
    done
  done
done
echo "load after:  $(cut -d' ' -f1-3 /proc/loadavg)"

/usr/bin/python3 - "$TMP/results" "$(getconf CLK_TCK)" <<'EOF'
import statistics
import sys

rows = [line.split() for line in open(sys.argv[1])]
hz = float(sys.argv[2])
by = {}
for server, mode, size, op, _round, ops, rate, ticks in rows:
    by.setdefault((server, mode, int(size), op), []).append(
        (float(rate), float(ticks) / hz * 1e6 / float(ops)))


def med(key, i):
    return statistics.median(v[i] for v in by[key])


head = ("value", "call", "server", "plain calls/s", "TLS calls/s", "TLS cost",
        "plain CPU us/call", "TLS CPU us/call")
print("| " + " | ".join(head) + " |")
print("|" + "---|" * len(head))
for size in sorted({k[2] for k in by}):
    for op in ("put", "get"):
        for server in ("flatkv", "baseline", "redis"):
            p, t = (server, "plain", size, op), (server, "tls", size, op)
            if p not in by or t not in by:
                continue
            print("| %d B | %s | %s | %.0f | %.0f | %.0f %% | %.1f | %.1f |" % (
                size, op, server, med(p, 0), med(t, 0), 100 * (1 - med(t, 0) / med(p, 0)),
                med(p, 1), med(t, 1)))
print("medians of the rounds; TLS cost = 1 - TLS calls/s / plaintext calls/s")
EOF
