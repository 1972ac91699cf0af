#!/usr/bin/python3
"""Process test of `flatkv admin remove-mark` under write load
(server/member/cluster.h: StartRemoveMark, RemoveStep).

Marks A = 1000 (a chain of two) and B = 2000 (one member); keys 0..2999, so
B owns [1000, 1999] and A the rest. Writers call random instances with
self-verifying values on keys of both marks. While another ring change is
recorded, remove-mark is refused with a clear error. Then `flatkv admin
remove-mark 1000 --wait` through B: B's head copies A's keys through its
chain, A's members exit with status 0, mark 1000 leaves
`.cluster/marks`, and B serves every key. Afterwards every acknowledged
write reads its newest version through B, and so does every preloaded key.

Usage: remove_mark_test.py FLATKV_SERVER FLATKV_CLI THRIFT_COMPILER FLATKV_THRIFT"""
import os
import subprocess
import sys
import time

import harness
from harness import check, free_port

server_bin, cli_bin, thrift_bin, idl = sys.argv[1:5]
work = harness.workdir("flatkv-remove-mark-", thrift_bin, idl)
from flatkv.ttypes import KvPair  # noqa: E402

import logging  # noqa: E402
logging.getLogger("thrift").setLevel(logging.CRITICAL)

A, B = 1000, 2000
zk = harness.ZooKeeper(work)
writers = None


def writers_stop():
    if writers is not None:
        writers.stop()


def Member(name, mark):
    return harness.Member(work, server_bin, zk, name, mark, "--set", "storage.key_max=3000")


def wait_until(what, cond, timeout=60.0):
    return harness.wait_until(work, what, cond, timeout, 0.1, on_fail=writers_stop)


def ring():
    r = b0.call(lambda c: c.ring())
    return {p.mark: [m.port for m in p.chain] for p in r.partitions}


b0 = Member("b0", B)
wait_until("B serves", lambda: ring() == {B: [b0.port]})
a0 = Member("a0", A)
wait_until("A serves", lambda: ring() == {A: [a0.port], B: [b0.port]})
a1 = Member("a1", A)
wait_until("A's chain of two", lambda: ring()[A] == [a0.port, a1.port])
preloaded = {k: b"pre%d" % k for k in range(0, 3000, 7)}
b0.call(lambda c: c.multiPut([KvPair(k, v) for k, v in preloaded.items()]))

# Writers on keys of both marks, through B or A (A's members exit: then B).
writers = harness.VersionedWriters([list(range(i * 10 + 1, 3000, 40)) for i in range(4)],
                                   lambda rng: b0.port if rng.random() < 0.5 else a0.port)
time.sleep(1.0)

# Another change recorded: refused, naming it.
from kazoo.client import KazooClient  # noqa: E402
logging.getLogger("kazoo").setLevel(logging.CRITICAL)
kz = KazooClient(hosts=zk.hosts, timeout=5.0)
kz.start(timeout=10)
other = (b'{"kind": "add", "mark": 5000, "into": 5000, "source": 1000, '
         b'"importer": "127.0.0.1:1", "state": "copy", "ranges": [[2000, 4999]]}')
kz.create("/flatkv/.cluster/change", other)
r = subprocess.run([cli_bin, "--port", str(b0.port), "admin", "remove-mark", str(A)],
                   capture_output=True, timeout=30)
check(r.returncode == 3 and b"another ring change runs" in r.stderr,
      "remove-mark while another change runs: refused, naming it (%r)" % r.stderr[-200:])
kz.delete("/flatkv/.cluster/change")
# With --zk and no --host/--port the CLI finds an instance in the ring
# (nothing listens on the default address here): a refusal from a member
# shows the call got there.
zk_flags = ["--zk", zk.hosts, "--path", "/flatkv"]
r = subprocess.run([cli_bin] + zk_flags + ["admin", "remove-mark", "7"], capture_output=True,
                   timeout=30)
check(r.returncode == 3 and b"not in the ring" in r.stderr,
      "remove-mark of an unknown mark through --zk: refused by a member (%r)" % r.stderr[-200:])
r = subprocess.run([cli_bin] + zk_flags + ["admin", "stats"], capture_output=True, timeout=30)
check(r.returncode == 2 and b"name it with --host and --port" in r.stderr,
      "admin stats with --zk and no instance named: a usage error (%r)" % r.stderr[-200:])

# Through --zk: the call goes to an instance outside mark A (B's), which
# imports A's range, and --wait follows the ring there.
asked_b = b0.call(lambda c: c.stats()).get("calls.removeMark", 0)
t0 = time.monotonic()
r = subprocess.run([cli_bin] + zk_flags + ["admin", "remove-mark", str(A), "--wait"],
                   capture_output=True, timeout=120)
took = time.monotonic() - t0
check(r.returncode == 0 and b"removed" in r.stdout,
      "flatkv --zk admin remove-mark 1000 --wait (%.1f s): %r %r" % (took, r.stdout, r.stderr[-200:]))
check(b0.call(lambda c: c.stats()).get("calls.removeMark", 0) == asked_b + 1,
      "the removal was asked of B's member, not of A's")
check(ring() == {B: [b0.port]}, "the ring is B alone")
check(a0.proc.wait(30) == 0 and a1.proc.wait(30) == 0, "A's members exited with status 0")
check(str(A) not in zk.children("/flatkv/.cluster/marks") and
      "change" not in zk.children("/flatkv/.cluster"),
      "mark 1000 left .cluster/marks and the change node is gone")
time.sleep(0.5)
writers.stop()
bad = writers.judge(lambda keys: b0.call(lambda c: c.multiGet(keys)))
check(not bad, "every acknowledged write (%d keys) reads its newest version through B: %s" %
      (len(writers.acked), bad[:5]))
attempted = writers.attempted
keys = sorted(writers.acked)
pk = [k for k in sorted(preloaded) if k not in attempted]
got = b0.call(lambda c: c.multiGet(pk))
check(all(res.value == preloaded[k] for k, res in zip(pk, got)),
      "every preloaded key of both marks reads its value through B")
s = b0.call(lambda c: c.stats())
check(s.get("cluster.import.keys", 0) > 0, "B's stats count the keys it took over (%d)" %
      s.get("cluster.import.keys", 0))

# A removed member started again on its old data dir never serves that stale
# copy: its mark node is gone, so it registers only as a new mark, through an
# import of the range from B (its old store is wiped first).
newest = {k: got_v.value for k, got_v in zip(keys, b0.call(lambda c: c.multiGet(keys)))}
for k in pk:
    newest[k] = preloaded[k]
port = free_port()
a0_again = harness.start_member(server_bin, port, os.path.join(work, "a0"), zk, A,
                                "--set", "storage.key_max=3000",
                                log=os.path.join(work, "a0-again.log"), session_timeout_ms=1500)
took = harness.wait_ring([b0.port, port], {A: ["127.0.0.1:%d" % port], B: ["127.0.0.1:%d" % b0.port]},
                         timeout=60)
check(took is not None, "the removed member, started again, is back as mark 1000 only through "
      "an import (%s s)" % (None if took is None else "%.1f" % took))
ks = sorted(newest)
for name, p in (("a0", port), ("b0", b0.port)):
    got = harness.call(p, lambda c: c.multiGet(ks))
    stale = [k for k, res in zip(ks, got) if (res.value if res.found else None) != newest[k]]
    check(not stale, "through %s every key reads its newest value, none from the old copy: %s" %
          (name, stale[:5]))
log = open(os.path.join(work, "a0-again.log")).read()
check("imports" in log and "emptied this store first" in log,
      "the restarted member emptied its old store and imported its range")
harness.finish(work)
