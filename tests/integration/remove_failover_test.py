#!/usr/bin/python3
"""Process test of a remove-mark whose importer dies mid-copy
(partition/change.h: a remove is imported by whoever heads the inheriting
mark when the change node is read).

Marks A = 1000 (one member) and B = 2000 (a chain of two, b0 head, b1);
keys 0..2999 (B owns [1000, 1999], A the rest), A's range preloaded with
about 4 MB and the copy throttled to 1 MB/s (cluster.migrate_mb_per_sec),
so it runs for seconds. Writers call B with self-verifying values on keys
of both marks. `flatkv admin remove-mark 1000`; once b0 has copied some
keys it is killed with SIGKILL; b1 becomes B's head after b0's session
expires, takes the import over and finishes it: A's member exits 0, the
ring is B = [b1], and every acknowledged write and every preloaded key
reads its newest value through b1. Then a mark C of two whose head is
stopped (SIGSTOP) past its session while C is removed: the remove finishes
through the other member, and the stopped one, running again, leaves
rather than adding its mark back.

Usage: remove_failover_test.py FLATKV_SERVER FLATKV_CLI THRIFT_COMPILER FLATKV_THRIFT"""
import os
import signal
import subprocess
import sys
import time

import harness
from harness import check, free_port

server_bin, cli_bin, thrift_bin, idl = sys.argv[1:5]
work = harness.workdir("flatkv-remove-failover-", thrift_bin, idl)
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
    return harness.Member(work, server_bin, zk, name, mark, "--set", "storage.key_max=3000",
                          "--set", "cluster.migrate_mb_per_sec=1")


def wait_until(what, cond, timeout=60.0):
    return harness.wait_until(work, what, cond, timeout, 0.1, on_fail=writers_stop)


def remove_mark(via, mark):
    """flatkv admin remove-mark through "via". A ZooKeeper that does not
    answer in time (a loaded CI machine) makes the call fail with
    "operation timeout", which an operator would simply retry."""
    for _ in range(3):
        r = subprocess.run([cli_bin, "--port", str(via.port), "admin", "remove-mark", str(mark)],
                           capture_output=True, timeout=30)
        if r.returncode == 0 or b"operation timeout" not in r.stderr:
            break
        time.sleep(1)
    return r


def ring(member):
    r = member.call(lambda c: c.ring())
    return {p.mark: [m.port for m in p.chain] for p in r.partitions}


b0 = Member("b0", B)
wait_until("B serves", lambda: ring(b0) == {B: [b0.port]})
b1 = Member("b1", B)
wait_until("B's chain of two", lambda: ring(b0) == {B: [b0.port, b1.port]})
a0 = Member("a0", A)
wait_until("A serves", lambda: ring(b0) == {A: [a0.port], B: [b0.port, b1.port]} and
           harness.ring_change_of(b0.port) is None)
pad = b"p" * 10000
preloaded = {k: b"pre%d " % k + pad for k in list(range(0, 1000, 3)) + list(range(2000, 3000, 3))}
items = sorted(preloaded.items())
for i in range(0, len(items), 100):
    b0.call(lambda c: c.multiPut([KvPair(k, v) for k, v in items[i:i + 100]]))

# b1 lives through the test: every writer calls it.
writers = harness.VersionedWriters([list(range(i * 10 + 1, 3000, 40)) for i in range(3)],
                                   lambda rng: b1.port)
time.sleep(0.5)

r = remove_mark(b1, A)
check(r.returncode == 0, "flatkv admin remove-mark 1000 through b1: %r %r" % (r.stdout, r.stderr[-200:]))
wait_until("b0 copies A's keys (cluster.import.keys > 0)",
           lambda: b0.call(lambda c: c.stats()).get("cluster.import.keys", 0) > 0, 30)
copied = b0.call(lambda c: c.stats()).get("cluster.import.keys", 0)
b0.proc.send_signal(signal.SIGKILL)
b0.proc.wait()
check(copied < len(preloaded), "b0 killed mid-copy (%d of about %d keys copied)" % (copied, len(preloaded)))

took = wait_until("b1 takes the import over and A leaves: the ring is B = [b1]",
                  lambda: ring(b1) == {B: [b1.port]} and harness.ring_change_of(b1.port) is None,
                  120)
check(a0.proc.wait(30) == 0, "A's member exited with status 0")
check("change" not in zk.children("/flatkv/.cluster") and
      str(A) not in zk.children("/flatkv/.cluster/marks"),
      "the change node and mark 1000's node are gone")
time.sleep(0.3)
writers.stop()
bad = writers.judge(lambda keys: b1.call(lambda c: c.multiGet(keys)))
check(not bad, "every acknowledged write (%d keys) reads its newest version through b1: %s" %
      (len(writers.acked), bad[:5]))
attempted = writers.attempted
pk = [k for k in sorted(preloaded) if k not in attempted]
wrong = []
for i in range(0, len(pk), 200):
    part = pk[i:i + 200]
    got = b1.call(lambda c: c.multiGet(part))
    wrong += [k for k, res in zip(part, got) if res.value != preloaded[k]]
check(not wrong, "every preloaded key of both marks (%d) reads its value through b1: %s" %
      (len(pk), wrong[:5]))
log = open(os.path.join(work, "b1.log")).read()
check("copied" in log, "b1's log says it copied A's keys itself")

# --- A removed mark's head frozen past its session during the remove -------
# Mark C = 2500 (c0 head, c1) takes (2000, 2500] from B. c0 is stopped
# (SIGSTOP) and C removed: after c0's session expires c1 heads C, the
# remove finishes through it and c1 exits. When c0 runs again its session
# is gone and the ring shows no trace of C: it must leave too (exit 0),
# not add C back as a new mark, which would undo the operator's remove.
C = 2500
c0 = Member("c0", C)
wait_until("C serves", lambda: ring(b1) == {B: [b1.port], C: [c0.port]} and
           harness.ring_change_of(b1.port) is None)
c1 = Member("c1", C)
wait_until("C's chain of two", lambda: ring(b1) == {B: [b1.port], C: [c0.port, c1.port]})
c_keys = {k: b"c%d" % k for k in range(2001, 2500, 7)}
for k, v in c_keys.items():
    b1.call(lambda c: c.put(k, v))
harness.pause(c0.proc)
r = remove_mark(b1, C)
check(r.returncode == 0, "flatkv admin remove-mark 2500 through b1 while c0 is stopped: %r"
      % r.stderr[-200:])
wait_until("the remove finishes through c1: the ring is B = [b1] again",
           lambda: ring(b1) == {B: [b1.port]} and harness.ring_change_of(b1.port) is None, 90)
check(c1.proc.wait(30) == 0, "c1 exited with status 0")
c0.proc.send_signal(signal.SIGCONT)
try:
    code = c0.proc.wait(30)
except subprocess.TimeoutExpired:
    code = None
check(code == 0, "c0, running again after its mark was removed, leaves (exit %s)" % code)
time.sleep(0.5)
check(ring(b1) == {B: [b1.port]} and str(C) not in zk.children("/flatkv/.cluster/marks"),
      "... and mark 2500 stays removed: %r" % ring(b1))
got = {k: b1.call(lambda c: c.get(k)).value for k in c_keys}
check(got == c_keys, "every key C held reads its value through b1")
c0_log = open(os.path.join(work, "c0.log")).read()
check("was removed from the ring" in c0_log, "c0's log says its mark was removed")
harness.finish(work)
