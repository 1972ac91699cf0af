# Shell helpers the server benchmark scripts share (bench_vs_redis.sh,
# bench_ring.sh); source it. The caller sets BENCH_NAME for messages.

# A free loopback TCP port.
free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Waits up to 10 s for 127.0.0.1:$1 to accept; exits 1 naming $2 otherwise.
wait_port() {  # port name
  for _ in $(seq 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "${BENCH_NAME:-bench}: $2 did not start on port $1" >&2
  exit 1
}

# The arguments of the pinned server benchmarks (loadgen_vs_redis.sh,
# bench_tls.sh): [BUILD_DIR] [--server-cpus LIST] [--client-cpus LIST]
# [--set section.key=value ...]. Sets BUILD (default build), SERVER_CPUS
# and CLIENT_CPUS (kept if given none; the caller sets the defaults first)
# and SETS (--set pairs for flatkv-server); exits 2 on anything else.
parse_server_bench_args() {
  BUILD=build
  SETS=()
  if [[ $# -gt 0 && $1 != --* ]]; then
    BUILD=$1
    shift
  fi
  while [[ $# -gt 0 ]]; do
    case $1 in
      --server-cpus) SERVER_CPUS=${2:?--server-cpus needs a CPU list}; shift 2 ;;
      --client-cpus) CLIENT_CPUS=${2:?--client-cpus needs a CPU list}; shift 2 ;;
      --set) SETS+=(--set "${2:?--set needs section.key=value}"); shift 2 ;;
      *) echo "${BENCH_NAME:-bench}: unknown argument $1" >&2; exit 2 ;;
    esac
  done
}
