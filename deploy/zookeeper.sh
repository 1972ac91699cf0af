#!/usr/bin/env bash
# Starts or stops a standalone ZooKeeper server from Debian's `zookeeper`
# package, with its own config and data in DIR, listening on 127.0.0.1:PORT.
# Used by the registry tests and by deploy/ring.sh; not for production (one
# server, no ensemble). ZK_HOST (default 127.0.0.1) is the address it listens
# on and is probed at: the fault-injection suite runs it inside a network
# namespace on that namespace's address. ZK_MAX_CLIENT_CNXNS (default 60,
# ZooKeeper's own; 0 = no limit) caps the connections from one address, and
# ZK_HEAP (default 256m) is the JVM's heap: the registry benchmark runs a
# thousand sessions from loopback.
#
#   bash deploy/zookeeper.sh start DIR PORT   # returns once it serves (<= ~20 s)
#   bash deploy/zookeeper.sh stop DIR         # SIGTERM, SIGKILL after 5 s
#   bash deploy/zookeeper.sh kill DIR         # SIGKILL at once (a crash; tests)
#   bash deploy/zookeeper.sh status DIR       # exit 0 if it answers srvr
#
# With ZK_OWNER_PID set, start also leaves a watcher that kills the server
# once that process is gone (a test that crashes does not leak a JVM).
#
# Restarting with the same DIR keeps the data (znodes, and sessions until
# they expire). tickTime=200 lets clients use session timeouts of 400 ms to
# 20 s. Files in DIR: zoo.cfg, data/, zookeeper.log, zookeeper.pid, port.
#
# An ensemble member instead: ZK_SERVERS holds the ensemble's server lines,
# space-separated ("server.1=127.0.0.1:QUORUM:ELECTION;CLIENT server.2=..."),
# ZK_MYID this server's number, ZK_SYNC_LIMIT (default 10) its syncLimit in
# ticks: how long a follower goes on answering its clients from its own copy
# after it last heard from the leader. start then returns once the JVM runs,
# not once it serves: a lone member serves only when a majority is up (wait
# with status).
set -euo pipefail

ZK_HOST=${ZK_HOST:-127.0.0.1}
JAVA_CP=/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar
START_TIMEOUT_S=20

usage() {
  echo "usage: $0 start DIR PORT | stop DIR | kill DIR | status DIR" >&2
  exit 2
}

# Sends a four-letter word to $ZK_HOST:$1 and prints the answer (empty if
# the server does not answer within 1 s).
four_letter() {
  local port=$1 word=$2
  timeout 1 bash -c "exec 3<>/dev/tcp/$ZK_HOST/$port && printf '%s' '$word' >&3 && cat <&3" \
    2>/dev/null || true
}

serving() {
  four_letter "$1" srvr | grep -q "Zookeeper version"
}

write_config() {
  local dir=$1 port=$2
  cat >"$dir/zoo.cfg" <<EOF
tickTime=200
dataDir=$dir/data
clientPort=$port
clientPortAddress=$ZK_HOST
admin.enableServer=false
4lw.commands.whitelist=ruok,srvr,stat,mntr
minSessionTimeout=400
maxSessionTimeout=20000
maxClientCnxns=${ZK_MAX_CLIENT_CNXNS:-60}
EOF
  if [[ -n "${ZK_SERVERS:-}" ]]; then
    printf 'initLimit=25\nsyncLimit=%d\n' "${ZK_SYNC_LIMIT:-10}" >>"$dir/zoo.cfg"
    local line
    for line in $ZK_SERVERS; do echo "$line" >>"$dir/zoo.cfg"; done
    echo "$ZK_MYID" >"$dir/data/myid"
  fi
  echo "$port" >"$dir/port"
}

# True while pid $1 runs. A zombie counts as gone: the server is reparented
# to init, which may reap it only seconds later, but its port is free.
running() {
  local st
  st=$(ps -o stat= -p "$1" 2>/dev/null) || return 1
  [[ $st != Z* ]]
}

alive() {
  [[ -f "$1/zookeeper.pid" ]] && running "$(cat "$1/zookeeper.pid")"
}

# Kills server $2 once process $1 is gone (polled every second).
watch_owner() {
  setsid bash -c "while kill -0 $1 2>/dev/null && kill -0 $2 2>/dev/null; do sleep 1; done
                  kill -KILL $2 2>/dev/null" >/dev/null 2>&1 </dev/null &
}

start() {
  local dir port
  [[ $# -eq 2 ]] || usage
  mkdir -p "$1/data"
  dir=$(cd "$1" && pwd)
  port=$2
  if alive "$dir"; then
    echo "zookeeper.sh: already running in $dir (pid $(cat "$dir/zookeeper.pid"))" >&2
    exit 1
  fi
  write_config "$dir" "$port"
  # setsid: the server leaves the caller's process group, so a test runner's
  # Ctrl-C or group kill does not take it down mid-test; stop() ends it.
  local main=org.apache.zookeeper.server.ZooKeeperServerMain
  [[ -z "${ZK_SERVERS:-}" ]] || main=org.apache.zookeeper.server.quorum.QuorumPeerMain
  setsid java -Xmx${ZK_HEAP:-256m} -cp "$JAVA_CP" "$main" \
    "$dir/zoo.cfg" >>"$dir/zookeeper.log" 2>&1 </dev/null &
  echo $! >"$dir/zookeeper.pid"
  [[ -z "${ZK_OWNER_PID:-}" ]] || watch_owner "$ZK_OWNER_PID" "$!"
  [[ -z "${ZK_SERVERS:-}" ]] || return 0
  local deadline=$((SECONDS + START_TIMEOUT_S))
  until serving "$port"; do
    if ! alive "$dir"; then
      echo "zookeeper.sh: server exited during start-up; see $dir/zookeeper.log:" >&2
      tail -n 20 "$dir/zookeeper.log" >&2
      exit 1
    fi
    if ((SECONDS >= deadline)); then
      echo "zookeeper.sh: no answer on $ZK_HOST:$port after ${START_TIMEOUT_S}s" >&2
      stop "$dir"
      exit 1
    fi
    sleep 0.05
  done
}

# Waits up to $2 × 50 ms for pid $1 to exit; false if it is still there.
wait_exit() {
  local i
  for ((i = 0; i < $2; i++)); do
    running "$1" || return 0
    sleep 0.05
  done
  return 1
}

stop() {
  [[ $# -eq 1 ]] || usage
  local dir=$1 pid i
  [[ -f "$dir/zookeeper.pid" ]] || return 0
  pid=$(cat "$dir/zookeeper.pid")
  kill -TERM "$pid" 2>/dev/null || true
  wait_exit "$pid" 100 || { kill -KILL "$pid" 2>/dev/null || true; wait_exit "$pid" 100 || true; }
  rm -f "$dir/zookeeper.pid"
}

# SIGKILL: what a crash looks like to clients. Acknowledged writes survive
# (the server syncs its log before it answers).
kill_now() {
  [[ $# -eq 1 ]] || usage
  [[ -f "$1/zookeeper.pid" ]] || return 0
  local pid
  pid=$(cat "$1/zookeeper.pid")
  kill -KILL "$pid" 2>/dev/null || true
  wait_exit "$pid" 200 || true
  rm -f "$1/zookeeper.pid"
}

status() {
  [[ $# -eq 1 ]] || usage
  [[ -f "$1/port" ]] && serving "$(cat "$1/port")"
}

[[ $# -ge 1 ]] || usage
cmd=$1
shift
case "$cmd" in
  start) start "$@" ;;
  stop) stop "$@" ;;
  kill) kill_now "$@" ;;
  status) status "$@" ;;
  *) usage ;;
esac
