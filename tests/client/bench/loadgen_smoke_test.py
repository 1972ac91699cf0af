#!/usr/bin/python3
"""Smoke test of flatkv-loadgen against a real flatkv-server and a real Redis.

For each target: fill, put and get over 4 threads (each its own connection)
on 300 keys. Checks the JSON contract (every field, ops counts, no errors,
every get found since fill wrote every key, ordered positive percentiles),
that the server did the work (FlatKV's calls.put/calls.get counters grew by
exactly the ops reported; Redis's INFO commandstats calls of SET and GET
likewise), and that a wrong value is caught: key 0 is overwritten with other
bytes, and a get run over key 0 alone exits 1 naming it. Then the failures
every target shares: a bad command line exits 2, an unreachable server 1.

redis-server comes from deploy/install-deps.sh; it is started here on a free
loopback port with no persistence (the smoke test checks the tool, not
Redis's durability).

Usage: loadgen_smoke_test.py --loadgen L --server S --cli C
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "integration"))
import harness  # noqa: E402
from harness import free_port  # noqa: E402

FIELDS = ["tool", "target", "workload", "threads", "ops", "seconds", "ops_per_sec",
          "p50_us", "p99_us", "p999_us", "max_us", "mean_us", "errors", "found",
          "value_size", "num"]
THREADS = 4
NUM = 300
OPS = 1200
VALUE_SIZE = 100


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def run(cmd, timeout=120):
    print("+ " + " ".join(cmd), file=sys.stderr)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    sys.stderr.write(p.stderr)
    sys.stderr.write(p.stdout)
    return p


def resp(port, *args):
    """One Redis command over a raw socket; returns the reply's bytes."""
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(out)
        data = b""
        s.settimeout(0.5)
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        except socket.timeout:
            pass
    return data


class Flat:
    name = "flatkv"

    def __init__(self, server_bin, cli, tmp):
        self.cli = cli
        self.port = free_port()
        self.proc = harness.start(server_bin, self.port, tmp + "/flatkv",
                                  "--set", "log.level=warn", stderr=None)

    def calls(self):
        p = run([self.cli, "--port", str(self.port), "admin", "stats"])
        stats = dict(line.split() for line in p.stdout.splitlines() if line.strip())
        return int(stats["calls.put"]), int(stats["calls.get"])

    def overwrite_key0(self):
        p = run([self.cli, "--port", str(self.port), "put", "0", "x" * VALUE_SIZE])
        if p.returncode != 0:
            fail("flatkv put 0 failed")

    def stop(self):
        harness.stop(self.proc, timeout=30)


class Redis:
    name = "redis"

    def __init__(self, tmp):
        self.port = free_port()
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind",
                                      "127.0.0.1", "--save", "", "--appendonly", "no",
                                      "--dir", tmp, "--daemonize", "no", "--logfile",
                                      tmp + "/redis.log"])
        harness.wait_port(self.port, self.proc, name="redis-server")

    def calls(self):
        info = resp(self.port, "INFO", "commandstats").decode()
        counts = {}
        for line in info.splitlines():
            if line.startswith("cmdstat_"):
                name, rest = line.split(":", 1)
                fields = dict(kv.split("=") for kv in rest.split(","))
                counts[name[len("cmdstat_"):]] = int(fields["calls"])
        return counts.get("set", 0), counts.get("get", 0)

    def overwrite_key0(self):
        if not resp(self.port, "SET", "0", "x" * VALUE_SIZE).startswith(b"+OK"):
            fail("redis SET 0 failed")

    def stop(self):
        harness.stop(self.proc, timeout=30)


def check_target(loadgen, target):
    puts0, gets0 = target.calls()
    p = run([loadgen, "--target", target.name, "--port", str(target.port), "--threads",
             str(THREADS), "--num", str(NUM), "--ops", str(OPS), "--value-size",
             str(VALUE_SIZE), "--workload", "fill,put,get"])
    if p.returncode != 0:
        fail("%s: exit %d" % (target.name, p.returncode))
    lines = [json.loads(line) for line in p.stdout.splitlines()]
    if [r["workload"] for r in lines] != ["fill", "put", "get"]:
        fail("%s: workloads %s" % (target.name, [r["workload"] for r in lines]))
    for r in lines:
        missing = [f for f in FIELDS if f not in r]
        if missing:
            fail("%s %s: fields missing: %s" % (target.name, r["workload"], missing))
        want = NUM if r["workload"] == "fill" else OPS
        if (r["tool"], r["target"], r["threads"], r["ops"], r["errors"], r["value_size"],
                r["num"]) != ("flatkv-loadgen", target.name, THREADS, want, 0, VALUE_SIZE, NUM):
            fail("%s: unexpected line %s" % (target.name, r))
        if not 0 < r["p50_us"] <= r["p99_us"] <= r["p999_us"] <= r["max_us"]:
            fail("%s %s: percentiles out of order: %s" % (target.name, r["workload"], r))
        if not r["seconds"] > 0 or not r["ops_per_sec"] > 0:
            fail("%s %s: no time or rate: %s" % (target.name, r["workload"], r))
        if r["found"] != (OPS if r["workload"] == "get" else 0):
            fail("%s %s: found %d" % (target.name, r["workload"], r["found"]))
    puts1, gets1 = target.calls()
    if (puts1 - puts0, gets1 - gets0) != (NUM + OPS, OPS):
        fail("%s: the server counted %d puts and %d gets, the tool %d and %d" %
             (target.name, puts1 - puts0, gets1 - gets0, NUM + OPS, OPS))

    # A value that is not the one the tool writes for its key is an error.
    target.overwrite_key0()
    p = run([loadgen, "--target", target.name, "--port", str(target.port), "--threads", "2",
             "--num", "1", "--ops", "10", "--value-size", str(VALUE_SIZE), "--workload", "get"])
    if p.returncode != 1 or "get 0: a wrong value" not in p.stderr:
        fail("%s: a wrong value for key 0 was not reported (exit %d)" %
             (target.name, p.returncode))
    r = json.loads(p.stdout)
    if (r["errors"], r["found"]) != (10, 10):
        fail("%s: wrong-value run: %s" % (target.name, r))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loadgen", required=True)
    ap.add_argument("--server", required=True)
    ap.add_argument("--cli", required=True)
    args = ap.parse_args()
    if shutil.which("redis-server") is None:
        fail("redis-server not found: run deploy/install-deps.sh")

    tmp = harness.workdir("loadgen-smoke-")
    targets = []
    try:
        targets.append(Flat(args.server, args.cli, tmp))
        targets.append(Redis(tmp))
        for t in targets:
            check_target(args.loadgen, t)

        # Failures shared by both targets.
        for bad in (["--target", "memcached"], ["--workload", "get"],
                    ["--target", "redis", "--threads", "0"],
                    ["--target", "redis", "--workload", "scan"],
                    ["--target", "flatkv", "--value-size", "4"]):
            p = run([args.loadgen] + bad)
            if p.returncode != 2 or "usage:" not in p.stderr:
                fail("%s: exit %d, want 2 with the usage" % (bad, p.returncode))
        for name in ("flatkv", "redis"):
            p = run([args.loadgen, "--target", name, "--port", str(free_port()), "--threads",
                     "2", "--ops", "4", "--workload", "put"])
            if p.returncode != 1 or "connect" not in p.stderr:
                fail("%s: an unreachable server gave exit %d" % (name, p.returncode))
    finally:
        for t in targets:
            t.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print("PASS")


if __name__ == "__main__":
    main()
