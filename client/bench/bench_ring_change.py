#!/usr/bin/python3
"""Measures a live add of a mark (docs/ring.md, "Adding a mark"): a ring of
one mark A = 1e9 holding MEAS_KEYS (default 100,000) values of 10 kB in
[A, A + N), which a new mark M = 2e9 imports; the import rate, the time
from starting M's instance to the change being done, and a flatkv-bench
load (readheavy, 50 connections) on 200k keys that do not move, before and
during the change (MEAS_DURING_OPS ops, 0 for no load). A real ZooKeeper
and real servers, as the tests start them. Not a test: it prints figures.

Usage: client/bench/bench_ring_change.py [BUILD_DIR]   (default: build)"""
import json
import os
import subprocess
import sys
import threading
import time

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(root, "tests", "integration"))
import harness  # noqa: E402

B = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "build"))
server_bin = B + "/server/flatkv-server"
bench = B + "/client/flatkv-bench"
work = harness.workdir("flatkv-meas-", "/usr/bin/thrift", os.path.join(root, "thrift", "flatkv.thrift"))
from flatkv.ttypes import KvPair  # noqa

A, M = 10**9, 2 * 10**9
N, VAL = int(os.environ.get("MEAS_KEYS", "100000")), 10000
zk = harness.ZooKeeper(work)
common = ("--set", "storage.key_max=%d" % (3 * 10**9), "--set", "cluster.migrate_mb_per_sec=0")
a0 = harness.Member(work, server_bin, zk, "a0", A, *common, session_timeout_ms=6000)
assert harness.wait_ring([a0.port], {A: ["127.0.0.1:%d" % a0.port]}, 30) is not None
t0 = time.monotonic()
val = b"v" * VAL
def load(lo, hi):
    c, t = harness.client(a0.port, 60000)
    for i in range(lo, hi, 100):
        c.multiPut([KvPair(A + k, val) for k in range(i, min(i + 100, hi))])
    t.close()
th = [threading.Thread(target=load, args=(i * N // 4, (i + 1) * N // 4)) for i in range(4)]
for t in th:
    t.start()
for t in th:
    t.join()
print("preloaded %d x %d B into [A, A+N) in %.1f s" % (N, VAL, time.monotonic() - t0), flush=True)

def run_bench(workload, ops, extra=()):
    cmd = [bench, "server", "--zk", zk.hosts, "--clients", "50", "--threads", "2", "--num", "200000",
           "--ops", str(ops), "--json", "--timeout-ms", "10000", "--workload", workload, *extra]
    p = subprocess.run(cmd, capture_output=True, text=True)
    return [json.loads(line) for line in p.stdout.splitlines()], p.returncode

rows, rc = run_bench("fill", 200000)
print("fill", rc, rows, flush=True)
before, rc = run_bench("readheavy", 400000)
print("BEFORE", rc, json.dumps(before), flush=True)

result = {"rows": [], "rc": None}
ops_during = int(os.environ.get("MEAS_DURING_OPS", "700000"))
def during():
    if ops_during:
        result["rows"], result["rc"] = run_bench("readheavy", ops_during)
# A reader and a writer on keys that move, through A's instance (which
# forwards once the ring flips): the longest spans without a good answer.
moving = {"stop": False, "read_gap": 0.0, "write_gap": 0.0, "reads": 0, "writes": 0}


def probe(kind):
    c, t = harness.client(a0.port, 10000)
    last_ok, worst, k = time.monotonic(), 0.0, 0
    while not moving["stop"]:
        k = (k + 7919) % N
        try:
            if kind == "read":
                ok = c.get(A + k).found
            else:
                c.put(A + k, val)
                ok = True
        except Exception:
            ok = False
            try:
                t.close()
            except Exception:
                pass
            c, t = harness.client(a0.port, 10000)
        now = time.monotonic()
        if ok:
            worst = max(worst, now - last_ok)
            last_ok = now
            moving[kind + "s"] += 1
        else:
            time.sleep(0.001)
    moving[kind + "_gap"] = max(worst, time.monotonic() - last_ok)
    t.close()


probes = [threading.Thread(target=probe, args=(k,)) for k in ("read", "write")]
for p in probes:
    p.start()
bt = threading.Thread(target=during)
bt.start()
time.sleep(0.5 if ops_during else 0)
t_start = time.monotonic()
m0 = harness.Member(work, server_bin, zk, "m0", M, *common, session_timeout_ms=6000)
harness.wait_ring([a0.port, m0.port], {A: ["127.0.0.1:%d" % a0.port], M: ["127.0.0.1:%d" % m0.port]}, 600)
t_serving = time.monotonic() - t_start
bt.join()
time.sleep(0.5)
moving["stop"] = True
for p in probes:
    p.join()
print("moving keys: longest span without a good read %.3f s (%d reads), without an "
      "acknowledged write %.3f s (%d writes)" % (moving["read_gap"], moving["reads"],
                                                   moving["write_gap"], moving["writes"]), flush=True)
print("DURING", result["rc"], json.dumps(result["rows"]), flush=True)
print("start to serving (change done): %.1f s" % t_serving, flush=True)
s = m0.call(lambda c: c.stats())
print("import stats", {k: v for k, v in s.items() if k.startswith("cluster.import")}, flush=True)
os.system("grep -E 'ring change' %s/m0.log | head -20" % work)
harness.finish(work)
