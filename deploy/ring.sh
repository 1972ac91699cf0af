#!/usr/bin/env bash
# A FlatKV ring on one machine, for trying ring mode and for demos: one
# loopback ZooKeeper (deploy/zookeeper.sh, Debian's `zookeeper` package) and
# P x R flatkv-server instances on 127.0.0.1, each registered under /flatkv.
#
#   bash deploy/ring.sh up     [--partitions P] [--replicas R] [--dir D] [--base-port N]
#                              [--zk-port Z] [--replication sync|async] [--key-max K]
#                              [--zk-auth-file F] [--set section.key=value ...]
#   bash deploy/ring.sh status [--dir D]
#   bash deploy/ring.sh down   [--dir D]
#
# Defaults: P=3, R=1, D=/tmp/flatkv-ring, instance ports N, N+1, ... from
# 9911, ZooKeeper on 127.0.0.1:2191, replication sync. The binary is
# build/server/flatkv-server of this repository, or $FLATKV_SERVER; the CLI
# build/client/flatkv or $FLATKV_CLI.
#
# Marks. Integer keys are range-partitioned (hash(k) = k) and lie in
# [storage.key_min, storage.key_max) = [0, 2^63-1) by default; string keys
# hash to [0, cluster.hash_bound) = [0, 2^63-1). So the P marks split
# [0, 2^63-1] evenly, the last one being 2^63-1 itself:
#   mark_i = floor((2^63-1) * (i+1) / P), i = 0..P-1
# Mark i owns the hashes [mark_(i-1), mark_i) (mark_0 owns [0, mark_0), and by
# the ring's wraparound also everything >= mark_(P-1), which no key reaches).
# For P=3: 3074457345618258602, 6148914691236517204, 9223372036854775807.
# --set (repeatable) passes a setting to every instance after the script's
# own, e.g. --set storage.sync=interval. --zk-auth-file F gives every
# instance the ZooKeeper credentials in F (user:password;
# cluster.zookeeper_auth_file): the ring's nodes are then writable by them
# only (docs/operating.md, "Securing the ring").
#
# With --key-max K the marks split [0, K) instead, mark_i = floor(K*(i+1)/P),
# so integer keys 0..K-1 spread evenly: for benchmarks over a small key
# space (`--key-max 300000` gives 100000, 200000, 300000 for
# `flatkv-bench server --zk ... --num 300000`).
# `up` prints the integer key range of each mark. (Marks spread over the
# whole signed i64 space would leave the negative marks owning no key.)
#
# Replicas: R > 1 starts R members per mark: a chain (head first, in start
# order) replicating every write (cluster.replication, sync by default). A
# member that restarts catches up from the tail and rejoins at the tail.
# To add a mark later, start an instance with a new cluster.mark: it imports
# its range from the mark that owns it, then registers (docs/ring.md, "Adding a
# mark"); `flatkv admin remove-mark M` removes one.
#
# Files under D: zk/ (ZooKeeper's config, data and log), ring.env (the
# layout, read by status and down), and per instance node-<p>-<r>/ with data/
# (its storage.path: an ordinary store a standalone flatkv-server opens),
# server.log and server.pid. `up` on an existing D keeps the data: it starts
# whatever is not running.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SERVER=${FLATKV_SERVER:-$REPO/build/server/flatkv-server}
CLI=${FLATKV_CLI:-$REPO/build/client/flatkv}
ZK_SH=${FLATKV_ZOOKEEPER_SH:-$REPO/deploy/zookeeper.sh}
PY=/usr/bin/python3  # sees Debian's python3-kazoo
REGISTER_TIMEOUT_S=30
STOP_TIMEOUT_S=60

PARTITIONS=3
REPLICAS=1
DIR=/tmp/flatkv-ring
BASE_PORT=9911
ZK_PORT=2191
REPLICATION=sync
KEY_MAX=9223372036854775807
SETS=()
SERVICE_PATH=/flatkv

usage() {
  # The header comment: usage, marks, and what replicas mean.
  awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0" >&2
  exit 2
}

die() {
  echo "ring.sh: $*" >&2
  exit 1
}

[[ $# -ge 1 ]] || usage
cmd=$1
shift
given_layout=0
while [[ $# -gt 0 ]]; do
  [[ $# -ge 2 ]] || usage
  case "$1" in
    --partitions) PARTITIONS=$2; given_layout=1 ;;
    --replicas) REPLICAS=$2; given_layout=1 ;;
    --dir) DIR=$2 ;;
    --base-port) BASE_PORT=$2; given_layout=1 ;;
    --zk-port) ZK_PORT=$2; given_layout=1 ;;
    --replication) REPLICATION=$2; given_layout=1 ;;
    --key-max) KEY_MAX=$2; given_layout=1 ;;
    --set) SETS+=(--set "$2"); given_layout=1 ;;
    --zk-auth-file)
      [[ -r $2 ]] || die "--zk-auth-file: cannot read '$2'"
      SETS+=(--set "cluster.zookeeper_auth_file=$(realpath "$2")"); given_layout=1 ;;
    *) usage ;;
  esac
  shift 2
done
for n in "$PARTITIONS" "$REPLICAS" "$BASE_PORT" "$ZK_PORT" "$KEY_MAX"; do
  [[ $n =~ ^[0-9]+$ && $n -gt 0 ]] || die "not a positive integer: '$n'"
done
[[ $REPLICATION == sync || $REPLICATION == async ]] || die "--replication is sync or async"
((BASE_PORT + PARTITIONS * REPLICAS <= 65536)) || die "ports run past 65535"
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)

# status and down (and a second up without options) use the layout `up` saved.
if [[ -f "$DIR/ring.env" && ($cmd != up || $given_layout -eq 0) ]]; then
  # shellcheck disable=SC1091
  source "$DIR/ring.env"
fi

# The P marks, one a line (see the header).
marks() {
  "$PY" -c '
import sys
p = int(sys.argv[1]); top = int(sys.argv[2])
if top > 2**63 - 1 or top < p:
    sys.exit("--key-max must be in [partitions, 2^63-1]")
for i in range(p):
    print(top * (i + 1) // p)' "$PARTITIONS" "$KEY_MAX"
}

# Instance j = p*R + r: "p r mark port dir", one a line.
instances() {
  local p=0 r mark
  while read -r mark; do
    for ((r = 0; r < REPLICAS; r++)); do
      echo "$p $r $mark $((BASE_PORT + p * REPLICAS + r)) $DIR/node-$p-$r"
    done
    p=$((p + 1))
  done < <(marks)
}

running() {
  local st
  st=$(ps -o stat= -p "$1" 2>/dev/null) || return 1
  [[ $st != Z* ]]
}

pid_of() {
  [[ -f "$1/server.pid" ]] && cat "$1/server.pid"
}

# Registered member nodes under the service path (ZooKeeper's view).
members() {
  "$PY" - "127.0.0.1:$ZK_PORT" "$SERVICE_PATH" <<'EOF'
import logging, sys
logging.disable(logging.CRITICAL)
from kazoo.client import KazooClient
zk = KazooClient(hosts=sys.argv[1], timeout=2.0)
try:
    zk.start(timeout=3)
    for c in sorted(zk.get_children(sys.argv[2])):
        if c.startswith("thriftbinary"):
            print(c)
except Exception:
    pass
finally:
    zk.stop()
EOF
}

# Starts replica $1 of every mark (those not running).
start_replica() {
  local p r mark port dir pid
  while read -r p r mark port dir; do
    [[ $r == "$1" ]] || continue
    if pid=$(pid_of "$dir") && running "$pid"; then
      echo "node-$p-$r already running (pid $pid)"
      continue
    fi
    mkdir -p "$dir"
    # setsid: the instance outlives this shell and its terminal.
    setsid "$SERVER" --set server.host=127.0.0.1 --set "server.port=$port" \
      --set "storage.path=$dir/data" \
      --set "cluster.zookeeper=127.0.0.1:$ZK_PORT" --set "cluster.service_path=$SERVICE_PATH" \
      --set "cluster.mark=$mark" --set "cluster.replication=$REPLICATION" \
      ${SETS[@]+"${SETS[@]}"} >>"$dir/server.log" 2>&1 </dev/null &
    echo $! >"$dir/server.pid"
  done < <(instances)
}

# Waits until replica $1 of every mark is registered: it created its member
# node (cluster.registrations in its stats). Counting ZooKeeper's children
# is not enough: after a kill -9 the old node of the same name stays until
# its session expires.
wait_replica() {
  local p r mark port dir pid got deadline=$((SECONDS + REGISTER_TIMEOUT_S))
  while :; do
    got=0
    while read -r p r mark port dir; do
      [[ $r == "$1" ]] || continue
      pid=$(pid_of "$dir") || true
      if ! running "$pid"; then
        echo "ring.sh: node-$p-$r exited; the end of $dir/server.log:" >&2
        tail -n 15 "$dir/server.log" >&2
        exit 1
      fi
      if "$CLI" $(cli_tls) --host 127.0.0.1 --port "$port" --timeout-ms 1000 admin stats 2>/dev/null |
        awk '$1 == "cluster.registrations" && $2 >= 1 { found = 1 } END { exit !found }'; then
        got=$((got + 1))
      fi
    done < <(instances)
    ((got >= PARTITIONS)) && return
    ((SECONDS < deadline)) ||
      die "only $got of $PARTITIONS replicas #$1 registered after ${REGISTER_TIMEOUT_S}s (logs: $DIR/node-*/server.log)"
    sleep 0.2
  done
}

# The CLI's TLS flags for instances started with a certificate (--set
# server.tls_cert_file=... and the like): the script's own calls to them
# speak TLS, presenting the instances' certificate (which a ring with
# cluster.peer_tls has for client authentication too).
cli_tls() {
  local s ca="" cert="" key=""
  for s in ${SETS[@]+"${SETS[@]}"}; do
    case $s in
      server.tls_ca_file=*) ca=${s#*=} ;;
      server.tls_cert_file=*) cert=${s#*=} ;;
      server.tls_key_file=*) key=${s#*=} ;;
    esac
  done
  [[ -n $cert ]] || return 0
  # Without a CA file of their own, the instances' certificate chains to a
  # CA the caller must name: the certificate itself is tried (self-signed).
  printf '%s\n' --tls-ca "${ca:-$cert}"
  [[ -n $key ]] && printf '%s\n' --tls-cert "$cert" --tls-key "$key"
  return 0
}

up() {
  [[ -x $SERVER ]] || die "no flatkv-server at $SERVER (build it, or set FLATKV_SERVER)"
  [[ -x $CLI ]] || die "no flatkv CLI at $CLI (build it, or set FLATKV_CLI)"
  [[ -f $ZK_SH ]] || die "no $ZK_SH"
  cat >"$DIR/ring.env" <<EOF
PARTITIONS=$PARTITIONS
REPLICAS=$REPLICAS
BASE_PORT=$BASE_PORT
ZK_PORT=$ZK_PORT
REPLICATION=$REPLICATION
KEY_MAX=$KEY_MAX
$(declare -p SETS)
EOF
  if bash "$ZK_SH" status "$DIR/zk" 2>/dev/null; then
    echo "ZooKeeper already serves on 127.0.0.1:$ZK_PORT"
  else
    bash "$ZK_SH" start "$DIR/zk" "$ZK_PORT"
    echo "ZooKeeper serves on 127.0.0.1:$ZK_PORT (data in $DIR/zk)"
  fi
  # Replica r of every mark starts only once replica r-1 of every mark is
  # registered, so each chain's order (by registration) is the start order.
  local r
  for ((r = 0; r < REPLICAS; r++)); do
    start_replica "$r"
    wait_replica "$r"
  done
  echo "all $((PARTITIONS * REPLICAS)) members registered under $SERVICE_PATH"
  echo
  describe
  echo
  echo "Any instance serves every key (it forwards what it does not own):"
  echo "  $CLI --host 127.0.0.1 --port $BASE_PORT put 1 x"
  echo "  $CLI --host 127.0.0.1 --port $((BASE_PORT + PARTITIONS * REPLICAS - 1)) get 1"
  echo "  $CLI --port $BASE_PORT admin info      # mark and role"
  echo "  $CLI --port $BASE_PORT ring            # the ring as that instance sees it"
  echo "  bash $0 status --dir $DIR"
  echo "  bash $0 down --dir $DIR"
}

# Each mark, the integer keys it owns, and its instances.
describe() {
  local prev="" p r mark port dir
  while read -r p r mark port dir; do
    if ((r == 0)); then
      if [[ -z $prev ]]; then
        echo "mark $mark owns integer keys [0, $mark)  (and, wrapping, hashes >= the last mark)"
      else
        echo "mark $mark owns integer keys [$prev, $mark)"
      fi
      prev=$mark
    fi
    echo "    node-$p-$r  127.0.0.1:$port  data $dir/data  log $dir/server.log$( ((r == 0)) && ((REPLICAS > 1)) && echo "  (starts as head)")"
  done < <(instances)
}

status() {
  if bash "$ZK_SH" status "$DIR/zk" 2>/dev/null; then
    echo "ZooKeeper: serving on 127.0.0.1:$ZK_PORT"
  else
    echo "ZooKeeper: not serving (127.0.0.1:$ZK_PORT)"
  fi
  local p r mark port dir pid state role
  while read -r p r mark port dir; do
    pid=$(pid_of "$dir") || pid=""
    if [[ -n $pid ]] && running "$pid"; then
      state="pid $pid alive"
      role=$("$CLI" $(cli_tls) --host 127.0.0.1 --port "$port" --timeout-ms 1000 admin info 2>/dev/null |
        awk '$1 == "role" { print $2 }') || true
    else
      state="not running"
      role=""
    fi
    printf 'node-%s-%s  127.0.0.1:%-5s  mark %-20s  %-16s  role %s\n' "$p" "$r" "$port" "$mark" \
      "$state" "${role:-?}"
  done < <(instances)
  echo
  if ! "$CLI" $(cli_tls) --host 127.0.0.1 --port "$BASE_PORT" --timeout-ms 1000 ring 2>/dev/null; then
    echo "registered members (ZooKeeper $SERVICE_PATH):"
    members | sed 's/^/  /'
  fi
}

down() {
  local p r mark port dir pid pids=()
  while read -r p r mark port dir; do
    pid=$(pid_of "$dir") || continue
    if running "$pid"; then
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$pid")
    fi
    rm -f "$dir/server.pid"
  done < <(instances)
  local deadline=$((SECONDS + STOP_TIMEOUT_S))
  for pid in "${pids[@]}"; do
    while running "$pid"; do
      ((SECONDS < deadline)) || die "pid $pid still running ${STOP_TIMEOUT_S}s after SIGTERM"
      sleep 0.05
    done
  done
  echo "stopped ${#pids[@]} instance(s)"
  bash "$ZK_SH" stop "$DIR/zk"
  echo "stopped ZooKeeper (data kept in $DIR; rm -rf it to start afresh)"
}

case "$cmd" in
  up) up ;;
  status) status ;;
  down) down ;;
  *) usage ;;
esac
