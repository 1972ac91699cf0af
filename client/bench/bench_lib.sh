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
