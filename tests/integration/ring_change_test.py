#!/usr/bin/python3
"""Process test of adding marks live under write load (issue 11,
server/migration.h): real ZooKeeper, real members, kill -9.

Mark A = 1,000,000 (a chain of two, sync) owns every key at first and holds
about 24 MB in the ranges that will move. Writers call random instances
with self-verifying values (harness.versioned) on keys in and out of the
moving ranges, and record what was acknowledged.

1. Mark M = 1,500,000 takes [1,000,000, 1,499,999]: its importer copies at
   cluster.migrate_mb_per_sec = 4, is killed with kill -9 mid-copy (writes
   to the moving range are UNAVAILABLE meanwhile, others go on), restarts,
   resumes and registers; a second member of M then joins its chain.
2. Mark N = 1,800,000 takes [1,500,000, 1,799,999] from A (A owns it by the
   wraparound): mid-copy A's head is killed with kill -9; the importer
   finishes against A's new head, registers; A's old head restarts and
   rejoins.
3. Mark P = 2,500,000 takes [1,800,000, 2,499,999] from A: ZooKeeper is
   restarted mid-copy; the change completes.

After each: the change node is gone, the ring has the mark. At the end:
every acknowledged write reads its newest version from every instance,
each chain's digests are equal, and each member's data directory, opened
by a standalone server, holds keys of its own ranges only.

Usage: ring_change_test.py FLATKV_SERVER THRIFT_COMPILER FLATKV_THRIFT"""
import os
import random
import signal
import sys
import threading
import time

import harness
from harness import check, free_port

server_bin, thrift_bin, idl = sys.argv[1:4]
work = harness.workdir("flatkv-ring-change-", thrift_bin, idl)
from flatkv.ttypes import KvError, KvPair  # noqa: E402

import logging  # noqa: E402
logging.getLogger("thrift").setLevel(logging.CRITICAL)

A, M, N = 1000000, 1500000, 1800000
SESSION_MS = 1500
zk = harness.ZooKeeper(work)
stop = threading.Event()


class Member:
    def __init__(self, name, mark, *extra):
        self.name = name
        self.mark = mark
        self.port = free_port()
        self.data = os.path.join(work, name)
        self.log = os.path.join(work, name + ".log")
        self.extra = extra
        self.proc = None
        self.start()

    def start(self):
        self.proc = harness.start_member(
            server_bin, self.port, self.data, zk, self.mark, "--set", "storage.key_max=3000000",
            *self.extra, log=self.log, session_timeout_ms=SESSION_MS)

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def call(self, fn, timeout_ms=10000):
        return harness.call(self.port, fn, timeout_ms)


def wait_until(what, cond, timeout=60.0):
    return harness.wait_until(work, what, cond, timeout, 0.1, on_fail=stop.set)


def ring():
    """{mark: [port, ...]} of the instances serving each mark."""
    r = a0.call(lambda c: c.ring(), 3000) if a0.proc.poll() is None else \
        a1.call(lambda c: c.ring(), 3000)
    return {p.mark: [m.port for m in p.chain] for p in r.partitions}


def no_change():
    return "change" not in zk.children("/flatkv/.cluster")


a0 = Member("a0", A)
wait_until("a0 serves", lambda: ring() == {A: [a0.port]})
a1 = Member("a1", A)
wait_until("A's chain of two", lambda: ring() == {A: [a0.port, a1.port]})
members = [a0, a1]

# ~16 MB in the ranges that move (8000 keys of 1 KiB each per range).
pad = b"p" * 1000
c, t = harness.client(a0.port, 20000)
for base in (1000000, 1500000, 1800000):
    for i in range(0, 8000, 200):
        c.multiPut([KvPair(k, pad + b"%d" % k) for k in range(base + i, base + i + 200)])
t.close()
preloaded = {k: pad + b"%d" % k for b in (1000000, 1500000, 1800000)
             for k in range(b, b + 8000)}

lock = threading.Lock()
acked, attempted, bad, errors = {}, {}, [], {}
progress = {"in": 0, "out": 0}
KEYS_IN = [b + 9000 + i for b in (1000000, 1500000, 1800000) for i in range(100)]
KEYS_OUT = list(range(100, 400))


def writer(index):
    r = random.Random(index)
    # Each writer owns its keys, so the newest acknowledged version of a key
    # is the newest one written (two writers of one key race legitimately).
    mine = (KEYS_IN if index % 2 else KEYS_OUT)[index // 2::2]
    conn = None
    while not stop.is_set():
        key = r.choice(mine)
        try:
            if conn is None:
                live = [m for m in members if m.proc.poll() is None]
                conn = harness.client(r.choice(live).port, 3000)
            with lock:
                v = attempted.get(key, 0) + 1
                attempted[key] = v
            conn[0].put(key, harness.versioned(key, v))
            with lock:
                acked[key] = max(acked.get(key, 0), v)
                progress["in" if index % 2 else "out"] += 1
        except KvError as e:
            with lock:
                errors[e.code] = errors.get(e.code, 0) + 1
            time.sleep(0.01)
        except Exception:
            if conn is not None:
                try:
                    conn[1].close()
                except Exception:
                    pass
            conn = None
            time.sleep(0.02)
    if conn is not None:
        conn[1].close()


threads = [threading.Thread(target=writer, args=(i,), daemon=True) for i in range(4)]
for th in threads:
    th.start()


def progressed(kind, n=100):
    with lock:
        start = progress[kind]
    return lambda: progress[kind] >= start + n


wait_until("writes acknowledged", progressed("in"), 20)

# --- 1. Add M; kill -9 its importer mid-copy; restart it. ------------------
m0 = Member("m0", M, "--set", "cluster.migrate_mb_per_sec=4")
members.append(m0)
wait_until("m0's import under way",
           lambda: 0 < m0.call(lambda c: c.stats(), 2000).get("cluster.import.bytes", 0) and
           m0.call(lambda c: c.stats(), 2000).get("cluster.import.copied") == 0, 30)
m0.kill()
check(M not in ring(), "the importer killed mid-copy: M is not in the ring")
with lock:
    before_err = dict(errors)
wait_until("writes outside the moving range go on", progressed("out"), 20)
time.sleep(1.0)
with lock:
    unavailable = errors.get(7, 0) - before_err.get(7, 0)
check(unavailable > 0, "writes to the moving range are UNAVAILABLE while the change waits (%d)" %
      unavailable)
m0.start()
took = wait_until("m0 resumed, imported and registered",
                  lambda: ring().get(M) == [m0.port] and no_change(), 60)
print("restarted importer to registered and change done: %.1f s" % took)
wait_until("writes to M's range resume", progressed("in"), 20)
m1 = Member("m1", M)
members.append(m1)
wait_until("a second member joins M's chain", lambda: ring().get(M) == [m0.port, m1.port], 60)
check(True, "M added: importer killed mid-copy resumed, then a second member joined")

# --- 2. Add N; kill -9 the source's head mid-copy. -------------------------
n0 = Member("n0", N, "--set", "cluster.migrate_mb_per_sec=4")
members.append(n0)
wait_until("n0's import under way",
           lambda: 0 < n0.call(lambda c: c.stats(), 2000).get("cluster.import.bytes", 0), 30)
head = a0 if ring()[A][0] == a0.port else a1
head.kill()
took = wait_until("n0 imported from A's new head and registered",
                  lambda: ring().get(N) == [n0.port] and no_change(), 90)
print("source head killed: N registered and change done %.1f s later" % took)
head.start()
wait_until("A's old head rejoined", lambda: len(ring()[A]) == 2, 60)
wait_until("writes go on", progressed("in"), 20)
check(True, "N added although A's head was killed mid-copy")

# --- 3. Add P; restart ZooKeeper mid-copy. --------------------------------
P = 2500000
p0 = Member("p0", P, "--set", "cluster.migrate_mb_per_sec=4")
members.append(p0)
wait_until("p0's import under way",
           lambda: 0 < p0.call(lambda c: c.stats(), 2000).get("cluster.import.bytes", 0), 30)
zk.stop()
time.sleep(1.0)
zk.start()
took = wait_until("p0 imported and registered after the ZooKeeper restart",
                  lambda: ring().get(P) == [p0.port] and no_change(), 90)
print("ZooKeeper restarted mid-copy: P registered and change done %.1f s later" % took)
wait_until("writes go on", progressed("in"), 30)
check(True, "P added although ZooKeeper restarted mid-copy")

stop.set()
for th in threads:
    th.join()
print("acknowledged %d writes; errors seen by the writers: %s" % (sum(acked.values()), errors))

# --- Checks ---------------------------------------------------------------
# Every mark serving (a member whose session expired under load rejoins).
wait_until("every mark serving", lambda: all(ring().get(x) for x in (A, M, N, P)), 60)
time.sleep(1.0)


def multi_get(c, keys):
    # A member may be rejoining after a session expiry under load: the
    # read is retried while it says UNAVAILABLE, for up to 20 s.
    t0 = time.monotonic()
    while True:
        try:
            return c.multiGet(keys)
        except KvError as e:
            if e.code != 7 or time.monotonic() - t0 > 20:
                raise
            time.sleep(0.2)


for m in members:
    c, t = harness.client(m.port, 10000)
    try:
        keys = sorted(acked)
        for i in range(0, len(keys), 200):
            part = keys[i:i + 200]
            for key, res in zip(part, multi_get(c, part)):
                harness.judge_versioned(key, res.value if res.found else None, acked[key],
                                        attempted, bad)
        pk = sorted(preloaded)
        lost = []
        for i in range(0, len(pk), 500):
            part = pk[i:i + 500]
            lost += [k for k, res in zip(part, multi_get(c, part)) if res.value != preloaded[k]]
        check(not lost, "%s: every preloaded key reads its value (%d wrong)" % (m.name, len(lost)))
    finally:
        t.close()
check(not bad, "every acknowledged write reads its newest version from every instance: %s" %
      bad[:5])
for mark, chain in ((A, [a0, a1]), (M, [m0, m1])):
    # A write whose client gave up (timeout) may still be on its way down
    # the chain: the members converge, they need not be equal at once.
    took = wait_until("mark %d: equal digests" % mark,
                      lambda: len({(d.keys, d.digest) for d in
                                   [m.call(lambda c: c.digest("")) for m in chain]}) == 1, 15)
    print("mark %d: digests equal after %.1f s" % (mark, took))

owns = {A: lambda k: k < A or k >= P, M: lambda k: A <= k < M, N: lambda k: M <= k < N,
        P: lambda k: N <= k < P}
for m in members:
    harness.stop(m.proc)
for m in members:
    port = free_port()
    p = harness.start(server_bin, port, m.data, "--set", "storage.key_max=3000000")
    c, t = harness.client(port, 10000)
    keys, frm = [], 0
    while True:
        s = c.scan(frm, 5000, False)
        keys += [x.key for x in s.pairs]
        if s.done:
            break
        frm = s.nextKey
    t.close()
    harness.stop(p)
    strays = [k for k in keys if not owns[m.mark](k)]
    check(keys and not strays, "%s's data directory holds keys of mark %d's ranges only "
          "(%d keys, strays %s)" % (m.name, m.mark, len(keys), strays[:5]))
harness.finish(work)
