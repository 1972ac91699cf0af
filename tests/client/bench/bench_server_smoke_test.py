#!/usr/bin/python3
"""Smoke test of `flatkv-bench server` against a real flatkv-server.

Starts flatkv-server on a free loopback port with a temporary data directory
and runs `fill,get,readheavy` over 4 connections, one call at a time and
with --batch 10, then Zipf keys on 2 threads. Checks the JSON contract (every
field, ops and calls counts, no errors, every get found, ordered positive
percentiles) and that the server really did the work: its stats counters
(calls.put, calls.get, calls.multiPut, calls.multiGet) grew by exactly the
calls the bench reports, and a multiGet from Python finds every filled key
with --value-size bytes. Then the failures: a bad command line exits 2, an
unreachable server and a connection the server drops (a request over its
server.max_frame_bytes) exit 1 with a message.

Needs Debian's python3-thrift (run with /usr/bin/python3) and the Thrift
compiler, for the Python client of flatkv.thrift (`thrift --gen py`).

Usage: bench_server_smoke_test.py --bench B --server S --thrift T --idl I
"""
import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

FIELDS = ["mode", "workload", "keys", "clients", "threads", "batch", "ops",
          "calls", "seconds", "ops_per_sec", "calls_per_sec", "mb_per_sec",
          "p50_us", "p99_us", "p999_us", "max_us", "errors", "value_size",
          "host", "port", "num", "gets", "puts", "found", "min_us", "mean_us"]
OPS = 2000
CLIENTS = 4
VALUE_SIZE = 100
WORKLOADS = ["fill", "get", "readheavy"]


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def run(cmd, timeout=120):
    print("+ " + " ".join(cmd), file=sys.stderr)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    sys.stderr.write(p.stderr)
    sys.stderr.write(p.stdout)
    return p


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start_server(server_bin, port, data, *extra):
    proc = subprocess.Popen([server_bin, "--set", "server.port=%d" % port,
                             "--set", "storage.path=" + data,
                             "--set", "log.level=warn", *extra])
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return proc
        except OSError:
            if proc.poll() is not None:
                fail("flatkv-server exited with %d" % proc.returncode)
            time.sleep(0.05)
    proc.kill()
    fail("flatkv-server did not start")


def stop_server(proc):
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        fail("flatkv-server did not stop on SIGTERM")


class Server:
    """A Python Thrift client of the server, for stats and multiGet."""

    def __init__(self, port):
        from thrift.protocol import TBinaryProtocol
        from thrift.transport import TSocket, TTransport
        from flatkv import FlatKV
        self.transport = TTransport.TFramedTransport(
            TSocket.TSocket("127.0.0.1", port))
        self.transport.open()
        self.client = FlatKV.Client(
            TBinaryProtocol.TBinaryProtocol(self.transport))

    def close(self):
        self.transport.close()


def parse(stdout, expected):
    lines = [line for line in stdout.splitlines() if line.strip()]
    if len(lines) != len(expected):
        fail("expected %d lines, got %d" % (len(expected), len(lines)))
    rows = {}
    for line, workload in zip(lines, expected):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            fail("not JSON (%s): %r" % (e, line))
        missing = [f for f in FIELDS if f not in row]
        if missing:
            fail("%s: missing fields %s" % (workload, missing))
        if row["mode"] != "server" or row["workload"] != workload:
            fail("expected server/%s, got %s/%s" %
                 (workload, row["mode"], row["workload"]))
        rows[workload] = row
    return rows


def check_row(row, clients, threads, batch, keys, port):
    w = row["workload"]
    echo = (row["clients"], row["threads"], row["batch"], row["keys"],
            row["value_size"], row["host"], row["port"], row["num"])
    if echo != (clients, threads, batch, keys, VALUE_SIZE, "127.0.0.1", port,
                OPS):
        fail("%s: echoed parameters wrong: %r" % (w, row))
    if row["errors"] != 0:
        fail("%s: %d errors" % (w, row["errors"]))
    if row["ops"] != OPS:
        fail("%s: %d ops, expected %d" % (w, row["ops"], OPS))
    if row["gets"] + row["puts"] != row["ops"]:
        fail("%s: gets %d + puts %d != ops" % (w, row["gets"], row["puts"]))
    # Each thread's share (OPS / threads) is a multiple of the batch here.
    if row["calls"] != OPS // batch:
        fail("%s: %d calls, expected %d" % (w, row["calls"], OPS // batch))
    if row["found"] != row["gets"]:
        fail("%s: found %d of %d after fill" % (w, row["found"], row["gets"]))
    if not 0 < row["p50_us"] <= row["p99_us"] <= row["p999_us"] <= row["max_us"]:
        fail("%s: percentiles out of order: %r" % (w, row))
    if not row["min_us"] <= row["p50_us"]:
        fail("%s: min above p50: %r" % (w, row))
    if row["seconds"] <= 0 or row["ops_per_sec"] <= 0 or row["mb_per_sec"] <= 0:
        fail("%s: no time measured: %r" % (w, row))
    # Both are printed with one decimal.
    ratio = row["ops_per_sec"] / row["calls_per_sec"]
    if abs(ratio - batch) > 1e-3 * batch:
        fail("%s: ops_per_sec / calls_per_sec = %r, expected %d" %
             (w, ratio, batch))


def check_mix(rows):
    if rows["fill"]["puts"] != OPS or rows["get"]["gets"] != OPS:
        fail("fill/get: wrong op mix: %r / %r" % (rows["fill"], rows["get"]))
    share = rows["readheavy"]["gets"] / OPS
    if not 0.8 <= share <= 0.97:
        fail("readheavy: %.3f of ops are gets, expected about 0.9" % share)


def delta(before, after, key):
    return after.get(key, 0) - before.get(key, 0)


def run_and_check(args, port, server, batch):
    stats_before = server.client.stats()
    p = run([args.bench, "server", "--port", str(port), "--workload",
             ",".join(WORKLOADS), "--clients", str(CLIENTS), "--ops", str(OPS),
             "--value-size", str(VALUE_SIZE), "--batch", str(batch), "--json"])
    if p.returncode != 0:
        fail("batch %d: exit status %d" % (batch, p.returncode))
    rows = parse(p.stdout, WORKLOADS)
    for row in rows.values():
        check_row(row, CLIENTS, 1, batch, "uniform", port)
    check_mix(rows)
    stats_after = server.client.stats()
    put_calls = sum(r["puts"] for r in rows.values()) // batch
    get_calls = sum(r["gets"] for r in rows.values()) // batch
    put_name, get_name = ("put", "get") if batch == 1 else ("multiPut", "multiGet")
    for name, calls in ((put_name, put_calls), (get_name, get_calls)):
        grew = delta(stats_before, stats_after, "calls." + name)
        if grew != calls:
            fail("batch %d: calls.%s grew by %d, the bench reports %d" %
                 (batch, name, grew, calls))
        if delta(stats_before, stats_after, "errors." + name) != 0:
            fail("batch %d: the server counted errors.%s" % (batch, name))
    # The filled keys are really there, with the bench's value size.
    results = server.client.multiGet(list(range(OPS)))
    missing = [k for k, r in enumerate(results)
               if not r.found or len(r.value) != VALUE_SIZE]
    if missing:
        fail("batch %d: %d filled keys missing or of the wrong size, first %d" %
             (batch, len(missing), missing[0]))


def check_zipf(args, port):
    p = run([args.bench, "server", "--port", str(port), "--workload",
             "put,get,writeheavy", "--keys", "zipf", "--threads", "2",
             "--clients", str(CLIENTS), "--ops", str(OPS), "--value-size",
             str(VALUE_SIZE), "--json"])
    if p.returncode != 0:
        fail("zipf: exit status %d" % p.returncode)
    rows = parse(p.stdout, ["put", "get", "writeheavy"])
    for row in rows.values():
        if (row["keys"], row["threads"], row["errors"], row["ops"]) != \
                ("zipf", 2, 0, OPS):
            fail("zipf: %r" % row)
    # Every key was filled before, so every get finds one.
    if rows["get"]["found"] != OPS:
        fail("zipf get: found %d of %d" % (rows["get"]["found"], OPS))


def check_key_dists(args, work):
    """--key-dist sends each index as a random or Snowflake key: a server
    with the sparse tier keeps them there (no segment directory) and every
    get of a written key finds it."""
    for dist in ("random", "snowflake"):
        data = os.path.join(work, "data-" + dist)
        port = free_port()
        proc = start_server(args.server, port, data, "--set", "storage.sparse_tier=on")
        try:
            p = run([args.bench, "server", "--port", str(port), "--workload", "fill,get",
                     "--key-dist", dist, "--clients", str(CLIENTS), "--ops", str(OPS),
                     "--value-size", str(VALUE_SIZE), "--json"])
            if p.returncode != 0:
                fail("--key-dist %s: exit status %d" % (dist, p.returncode))
            rows = parse(p.stdout, ["fill", "get"])
            for row in rows.values():
                if (row["key_dist"], row["errors"], row["ops"]) != (dist, 0, OPS):
                    fail("--key-dist %s: %r" % (dist, row))
            if rows["get"]["found"] != OPS:
                fail("--key-dist %s get: found %d of %d" % (dist, rows["get"]["found"], OPS))
        finally:
            if stop_server(proc) != 0:
                fail("flatkv-server did not exit 0 on SIGTERM")
        segments = [n for n in os.listdir(data) if n.startswith("seg-")]
        if segments or not os.path.isdir(os.path.join(data, "sparse")):
            fail("--key-dist %s: %d segment directories, sparse tier %s" %
                 (dist, len(segments), os.listdir(data)))
        print("ok: flatkv-bench server --key-dist %s" % dist)


def check_failures(args, port, work):
    base = [args.bench, "server", "--port", str(port), "--clients", "2",
            "--ops", "10"]
    for bad in (["--workload", "fill,scan"], ["--keys", "latest"],
                ["--threads", "3"], ["--batch", "0"], ["--engine", "flat"],
                ["--port", "0"]):
        p = run(base + bad)
        if p.returncode != 2:
            fail("%s: expected exit 2, got %d" % (bad, p.returncode))
    if "unknown workload 'scan'" not in run(base + ["--workload", "scan"]).stderr:
        fail("unknown workload: no message naming it")

    closed = free_port()  # nothing listens there
    p = run([args.bench, "server", "--port", str(closed), "--ops", "10",
             "--clients", "2"])
    if p.returncode != 1 or "cannot connect to 127.0.0.1:%d" % closed not in p.stderr:
        fail("unreachable server: expected exit 1 and a message, got %d" %
             p.returncode)

    # A request over the server's frame limit makes it drop the connection:
    # a transport failure, which stops the run with exit 1.
    small = free_port()
    proc = start_server(args.server, small, os.path.join(work, "small"),
                        "--set", "server.max_frame_bytes=4096")
    try:
        p = run([args.bench, "server", "--port", str(small), "--workload", "put",
                 "--ops", "10", "--clients", "2", "--value-size", "10000"])
    finally:
        stop_server(proc)
    if p.returncode != 1 or "connection" not in p.stderr or p.stdout.strip():
        fail("dropped connection: expected exit 1, a message and no line, got %d" %
             p.returncode)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    ap.add_argument("--server", required=True)
    ap.add_argument("--thrift", required=True)
    ap.add_argument("--idl", required=True)
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="flatkv-bench-server-")
    try:
        subprocess.run([args.thrift, "--gen", "py", "-out", work, args.idl],
                       check=True)
        sys.path.insert(0, work)
        port = free_port()
        proc = start_server(args.server, port, os.path.join(work, "data"))
        try:
            server = Server(port)
            run_and_check(args, port, server, 1)
            run_and_check(args, port, server, 10)
            check_zipf(args, port)
            server.close()
        finally:
            if stop_server(proc) != 0:
                fail("flatkv-server did not exit 0 on SIGTERM")
        check_failures(args, port, work)
        check_key_dists(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("ok: flatkv-bench server")


if __name__ == "__main__":
    main()
