#!/usr/bin/python3
"""Smoke test of `flatkv-bench server --zk`: a real ZooKeeper
(deploy/zookeeper.sh) and three real flatkv-server ring members with marks
1000, 2000, 3000 over the key space [0, 3000). The bench reads the ring from
ZooKeeper and must send every key straight to its owner: afterwards no
member forwarded a single call (cluster.forwarded stays 0), each member's
calls.put/get/multiPut/multiGet grew by about a third of the bench's calls
(uniform keys over three equal ranges), every member holds exactly its own
range of the filled keys, and the bench reports no errors and every get
found. Then a ring with a mark that has no member makes the bench exit 1
naming the mark.

Usage: bench_ring_smoke_test.py FLATKV_BENCH FLATKV_SERVER THRIFT_COMPILER FLATKV_THRIFT"""
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "integration"))
import harness  # noqa: E402
from harness import check, free_port  # noqa: E402

bench_bin, server_bin, thrift_bin, idl = sys.argv[1:5]
work = harness.workdir("flatkv-bench-ring-", thrift_bin, idl)
NUM = 3000
MARKS = [1000, 2000, 3000]
OPS = 3000


def stats(port):
    c, t = harness.client(port, 5000)
    try:
        return c.stats()
    finally:
        t.close()


def keys_of(port, lo, hi):
    """The integer keys in [lo, hi) the member itself holds: peerScan reads
    its own store only (a plain scan would walk the whole ring)."""
    from flatkv.ttypes import PeerContext
    c, t = harness.client(port, 5000)
    try:
        ctx = PeerContext(token="", ringVersion=c.ring().version, mark=hi)
        got, frm = [], lo
        while True:
            r = c.peerScan(ctx, frm, 1000, False, lo, hi - 1)
            got += [p.key for p in r.pairs]
            if r.done:
                return got
            frm = r.nextKey
    finally:
        t.close()


def run_bench(*extra):
    cmd = [bench_bin, "server", "--zk", zk.hosts, "--clients", "6", "--threads", "2",
           "--num", str(NUM), "--ops", str(OPS), "--json", "--timeout-ms", "10000", *extra]
    print("+ " + " ".join(cmd))
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    sys.stdout.write(p.stderr)
    return p.returncode, [json.loads(line) for line in p.stdout.splitlines()], p.stderr


zk = harness.ZooKeeper(work)
ports = [free_port() for _ in MARKS]
for port, mark in zip(ports, MARKS):
    harness.start_member(server_bin, port, os.path.join(work, "m%d" % mark), zk, mark,
                         log=os.path.join(work, "m%d.log" % mark))
addr = ["127.0.0.1:%d" % p for p in ports]
took = harness.wait_ring(ports, {m: [a] for m, a in zip(MARKS, addr)}, timeout=20)
check(took is not None, "three members registered and agree on the ring")

COUNTERS = ["calls.put", "calls.get", "calls.multiPut", "calls.multiGet", "cluster.forwarded"]
before = [stats(p) for p in ports]
rc, rows, err = run_bench("--workload", "fill,get,readheavy")
rc2, rows2, err2 = run_bench("--workload", "put,get", "--batch", "10")
after = [stats(p) for p in ports]
check(rc == 0 and rc2 == 0, "the bench exits 0 (%d, %d)" % (rc, rc2))
rows += rows2
check(len(rows) == 5, "one JSON line per workload (%d)" % len(rows))
for r in rows:
    check(r["errors"] == 0 and r["found"] == r["gets"] and r["members"] == 3 and
          r["zk"] == zk.hosts and r["path"] == "/flatkv",
          "%s (batch %d): no errors, every get found, 3 members, zk named (%s)" %
          (r["workload"], r["batch"], {k: r[k] for k in ("errors", "gets", "found", "members")}))

delta = [{k: int(a.get(k, 0)) - int(b.get(k, 0)) for k in COUNTERS} for a, b in zip(after, before)]
print("per-member counter growth:", delta)
check(all(d["cluster.forwarded"] == 0 for d in delta),
      "no member forwarded a call: every key went straight to its owner")
single_calls = sum(r["calls"] for r in rows if r["batch"] == 1)
batch_calls = sum(r["calls"] for r in rows if r["batch"] > 1)
served_single = sum(d["calls.put"] + d["calls.get"] for d in delta)
check(served_single == single_calls,
      "the members served exactly the bench's %d single-key calls (%d)" %
      (single_calls, served_single))
# A batch of 10 uniform keys over three ranges touches 2 or 3 members
# (all three with probability ~0.95): each part is one multi call there.
served_multi = sum(d["calls.multiPut"] + d["calls.multiGet"] for d in delta)
check(2 * batch_calls <= served_multi <= 3 * batch_calls,
      "each batch split into one part per owner (%d calls -> %d parts)" %
      (batch_calls, served_multi))
for d, m in zip(delta, MARKS):
    share = d["calls.put"] + d["calls.get"]
    check(0.2 * single_calls < share < 0.47 * single_calls,
          "mark %d served about a third of the single-key calls (%d of %d)" %
          (m, share, single_calls))
for port, lo, hi in zip(ports, [0] + MARKS[:-1], MARKS):
    got = keys_of(port, lo, hi)
    check(got == list(range(lo, hi)),
          "the member of mark %d holds exactly keys [%d, %d) (%d keys, first %s, last %s)" %
          (hi, lo, hi, len(got), got[:1], got[-1:]))

# A mark whose only member is gone: the bench refuses with a clear message.
harness.stop(harness._servers[-1])
gone = harness.wait_ring(ports[:2], {1000: [addr[0]], 2000: [addr[1]], 3000: []}, timeout=20)
check(gone is not None, "the ring shows mark 3000 without a member")
rc, rows, err = run_bench("--workload", "get")
check(rc == 1 and "mark 3000 has no member serving" in err,
      "the bench exits 1 naming the mark with no member (rc %d)" % rc)

harness.finish(work)
