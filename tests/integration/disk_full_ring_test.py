#!/usr/bin/python3
"""A chain member whose disk fills (server/member/replicator.h, "a full disk"): a
real ZooKeeper, one mark with a chain of two members under
cluster.replication: sync; member "a" keeps its store on the ordinary disk,
member "b" (the tail) on a 128 MiB ext4 file system the test makes itself
(harness.SmallFs; the test fails, naming the reason, if it cannot mount).

Writers through "a" (self-verifying values, each writer owning its keys)
fill b's disk, twice: with b as the tail, then (after "a" restarted behind
it) with b as the head. Each time b leaves the chain by itself: it stays
up, says why in stats (cluster.chain.disk_full) and /health (503 "disk
full: out of mark ..."), and the chain goes on as "a" alone: the longest
time the mark acknowledged no write stays within a failover (session
timeout + 2 s). When the test frees the space, b rejoins by itself
(catches up from the tail, registers at the tail) without a restart. At the end every
acknowledged write is readable at its newest version through both
instances and the two members' digests are equal.

With a fourth argument "always" every member runs storage.sync: always,
where a member's writes pass through its sync pipeline (server/member/replicator.h):
the disk fills with batches logged and passed down whose fdatasync has not
finished.

Usage: disk_full_ring_test.py FLATKV_SERVER THRIFT_COMPILER FLATKV_THRIFT [always]"""
import http.client
import os
import random
import sys
import threading
import time

import harness
from harness import check, free_port

server_bin, thrift_bin, idl = sys.argv[1:4]
SYNC = sys.argv[4] if len(sys.argv) > 4 else "none"  # the default
work = harness.workdir("flatkv-diskring-", thrift_bin, idl)
from flatkv.ttypes import ErrorCode, KvError  # noqa: E402

import logging  # noqa: E402
logging.getLogger("thrift").setLevel(logging.CRITICAL)

try:
    fs = harness.SmallFs(work, "fs", 128)
except RuntimeError as e:
    check(False, "a 128 MiB ext4 file system can be made and loop-mounted: %s" % e)
    harness.finish(work)

SESSION_MS = 1500
MARK = 1000
WRITERS = 3
KEYS_PER_WRITER = 400
zk = harness.ZooKeeper(work)
stop = threading.Event()


class Member:
    def __init__(self, name, data):
        self.name = name
        self.port = free_port()
        self.http_port = free_port()
        self.data = data
        self.log = os.path.join(work, name + ".log")
        self.proc = None

    @property
    def address(self):
        return "127.0.0.1:%d" % self.port

    def start(self):
        self.proc = harness.start_member(
            server_bin, self.port, self.data, zk, MARK, "--set", "cluster.replication=sync",
            "--set", "server.http_port=%d" % self.http_port,
            "--set", "storage.segment_keys=4096", "--set", "storage.sync=" + SYNC,
            log=self.log, session_timeout_ms=SESSION_MS)

    def call(self, fn, timeout_ms=3000):
        return harness.call(self.port, fn, timeout_ms)

    def health(self):
        c = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=5)
        try:
            c.request("GET", "/health")
            r = c.getresponse()
            return r.status, r.read().decode().strip()
        finally:
            c.close()


a = Member("a", os.path.join(work, "a"))
b = Member("b", os.path.join(fs.path, "b"))


def chain():
    """Mark MARK's members as ZooKeeper holds them (a set, sorted)."""
    prefix = "thriftbinary%d:" % MARK
    return sorted(c[len(prefix):] for c in zk.members() if c.startswith(prefix))


def wait_until(what, cond, timeout=30.0):
    return harness.wait_until(work, what, cond, timeout, 0.05, on_fail=stop.set)


a.start()
wait_until("a registered", lambda: chain() == [a.address])
b.start()
wait_until("b joined the chain", lambda: chain() == sorted([a.address, b.address]) and
           b.call(lambda c: c.info().role, 1000) == "tail")
check(chain() == sorted([a.address, b.address]) and a.call(lambda c: c.info().role, 1000) == "head",
      "a chain of two: a (head, ordinary disk), b (tail, the small file system)")

lock = threading.Lock()
acked, attempted, bad = {}, {}, []
errors = []
ack_times = []
pace = [0.0]  # seconds each writer sleeps between writes


def value(key, v):
    return harness.versioned(key, v) + b"." * 3000


def judge(key, got, floor):
    if got is not None and got.endswith(b"." * 3000):
        got = got[:-3000]
    harness.judge_versioned(key, got, floor, attempted, bad)


def writer(index):
    r = random.Random(index)
    keys = [index * KEYS_PER_WRITER + i for i in range(KEYS_PER_WRITER)]
    conn = None
    while not stop.is_set():
        if pace[0]:
            time.sleep(pace[0])
        key = r.choice(keys)
        try:
            if conn is None:
                conn = harness.client(a.port, 5000)
            with lock:
                v = attempted.get(key, 0) + 1
                attempted[key] = v
            conn[0].put(key, value(key, v))
            with lock:
                acked[key] = max(acked.get(key, 0), v)
                ack_times.append(time.monotonic())
        except KvError as e:
            with lock:
                errors.append((e.code, e.message))
            time.sleep(0.01)
        except Exception:
            if conn is not None:
                conn[1].close()
            conn = None
            time.sleep(0.02)
    if conn is not None:
        conn[1].close()


threads = [threading.Thread(target=writer, args=(i,), daemon=True) for i in range(WRITERS)]
for t in threads:
    t.start()


def b_stats():
    return b.call(lambda c: c.stats(), 2000)


def b_fills_and_leaves(role, leaves):
    """Fills b's disk under full-speed writes; b (now "role") must leave the
    chain and say so, and the chain go on without it within a failover;
    then the space is freed and b must rejoin at the tail by itself."""
    pace[0] = 0.0
    t_fill = time.monotonic()
    # The filler must take real space, or freeing it later gives nothing
    # back (b's store grows from round to round: 128 MiB leaves room).
    filler = fs.fill(leave=12 << 20)
    check(os.stat(filler).st_blocks * 512 >= 16 << 20,
          "the filler takes %d MiB of b's file system" % (os.stat(filler).st_blocks * 512 >> 20))
    wait_until("b (%s) leaves the chain when its disk is full" % role,
               lambda: chain() == [a.address], 120)
    t_left = time.monotonic()
    check(b.proc.poll() is None, "b (%s) is still running, out of the chain" % role)
    st = b_stats()
    check(st["cluster.chain.disk_full"] == 1 and st["cluster.chain.disk_full_leaves"] == leaves,
          "b's stats: cluster.chain.disk_full 1, disk_full_leaves %d" % leaves)
    status, body = b.health()
    check(status == 503 and body.startswith("disk full: out of mark %d's chain" % MARK) and
          "No space left on device" in body,
          "b's /health: 503 naming the full disk: %d %r" % (status, body[:160]))
    with open(b.log) as f:
        text = f.read()
    check(text.count("leaving mark %d's chain" % MARK) == leaves,
          "b's log says it left the chain for a full disk")
    with lock:
        n = len(ack_times)
    wait_until("writes acknowledged again by the chain without b",
               lambda: len(ack_times) >= n + 200)
    with lock:
        times = sorted(t for t in ack_times if t >= max(t_fill, t_left - 10))
    gaps = [y - x for x, y in zip(times, times[1:])]
    print("b as %s: longest time without an acknowledged write around its leave: %.2f s" %
          (role, max(gaps)))
    check(max(gaps) <= SESSION_MS / 1000 + 2.0,
          "b as %s: the partition stalls no longer than a failover (%.2f s <= %.1f s)" %
          (role, max(gaps), SESSION_MS / 1000 + 2.0))
    with lock:
        seen = list(errors)
        errors.clear()
    codes = {ErrorCode._VALUES_TO_NAMES.get(c, c) for c, _ in seen}
    print("errors the writers saw: %d %s; e.g. %s" % (len(seen), codes, seen[:2]))

    # Space comes back: b rejoins by itself, no restart.
    pace[0] = 0.02  # slower, so the freed space is not filled again at once
    fs.free_fillers()
    wait_until("b rejoins the chain once its disk has room",
               lambda: chain() == sorted([a.address, b.address]) and
               b.call(lambda c: c.info().role, 1000) == "tail", 60)
    check(chain() == sorted([a.address, b.address]) and b.call(lambda c: c.info().role, 1000) == "tail",
          "b rejoined at the tail without a restart (%.1f s after it left)" % (time.monotonic() - t_left))
    check(b_stats()["cluster.chain.disk_full"] == 0 and b.health() == (200, "ok"),
          "b's stats and /health are back to normal")
    with lock:
        n = len(ack_times)
    wait_until("writes acknowledged through the chain of two", lambda: len(ack_times) >= n + 100)


# b as the tail.
b_fills_and_leaves("tail", 1)
# b as the head: a leaves (SIGTERM) and comes back behind b.
check(harness.stop(a.proc) == 0, "a stops cleanly")
wait_until("b alone in the chain", lambda: chain() == [b.address])
a.start()
wait_until("a rejoins behind b", lambda: chain() == sorted([a.address, b.address]) and
           a.call(lambda c: c.info().role, 1000) == "tail" and
           b.call(lambda c: c.info().role, 1000) == "head")
with lock:
    n = len(ack_times)
wait_until("writes acknowledged with b as the head", lambda: len(ack_times) >= n + 100)
b_fills_and_leaves("head", 2)
stop.set()
for t in threads:
    t.join()
check(not bad, "no stale read, no value nobody wrote: %s" % bad[:5])

time.sleep(1.0)


def digests():
    return [m.call(lambda c: c.digest(""), 10000) for m in (a, b)]


wait_until("a and b hold the same data", lambda: len({(d.keys, d.digest) for d in digests()}) == 1,
           20)
d = digests()
check(d[0].keys >= len(acked), "digests equal on a and b (%d keys)" % d[0].keys)
for m in (a, b):
    c, t = harness.client(m.port, 10000)
    try:
        keys = sorted(acked)
        for i in range(0, len(keys), 100):
            part = keys[i:i + 100]
            for key, r in zip(part, c.multiGet(part)):
                judge(key, r.value if r.found else None, acked[key])
    finally:
        t.close()
check(not bad, "all %d acknowledged keys read back through both instances: %s" %
      (len(acked), bad[:5]))
for m in (a, b):
    check(harness.stop(m.proc) == 0, "%s stops cleanly" % m.name)
    with open(m.log) as f:
        reports = [l for l in f if "runtime error" in l or "Sanitizer" in l]
    check(not reports, "no sanitizer report in %s's log (%s)" % (m.name, reports[:2]))
harness.finish(work)
