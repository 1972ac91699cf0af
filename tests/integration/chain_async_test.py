#!/usr/bin/python3
"""Process test of an async chain (cluster.replication: async;
server/member/replicator.h): one mark of three real flatkv-server members with
storage.sync: always (so every batch goes through the chain log's
fdatasync), a real ZooKeeper on loopback.

Writers call random members with self-verifying values "k=<key> v=<n>";
under async the head acknowledges once it applied a write and any member
serves reads, so a read may be behind but must never return a value nobody
wrote. Under that load the tail and then the middle member are killed with
kill -9 and restarted (they catch up and rejoin; the head, which
acknowledged every write, lives on). The head's stats show the lag of the
next member in writes while the load runs. After a quiet moment: every
member holds every acknowledged write at its newest version (each read
locally, as async reads are served), digests are equal, and the lag is 0.

Usage: chain_async_test.py FLATKV_SERVER THRIFT_COMPILER FLATKV_THRIFT"""
import os
import random
import signal
import sys
import threading
import time

import harness
from harness import check, free_port

server_bin, thrift_bin, idl = sys.argv[1:4]
work = harness.workdir("flatkv-chain-async-", thrift_bin, idl)
from flatkv.ttypes import KvError  # noqa: E402

import logging  # noqa: E402
logging.getLogger("thrift").setLevel(logging.CRITICAL)

SESSION_MS = 1500
MARK = 1 << 40
WRITERS = 3
KEYS_PER_WRITER = 300

zk = harness.ZooKeeper(work)
stop = threading.Event()


class Member:
    def __init__(self, name):
        self.name = name
        self.port = free_port()
        self.data = os.path.join(work, name)
        self.log = os.path.join(work, name + ".log")
        self.proc = None

    def start(self):
        self.proc = harness.start_member(
            server_bin, self.port, self.data, zk, MARK, "--set", "cluster.replication=async",
            "--set", "storage.sync=always", "--set", "storage.key_max=1000000",
            log=self.log, session_timeout_ms=SESSION_MS)

    def call(self, fn, timeout_ms=10000):
        return harness.call(self.port, fn, timeout_ms)


members = [Member("m%d" % i) for i in range(3)]


def chain_size():
    return sum(1 for c in zk.members() if c.startswith("thriftbinary%d:" % MARK))


def wait_until(what, cond, timeout=30.0):
    return harness.wait_until(work, what, cond, timeout, 0.05, on_fail=stop.set)


def role(m):
    return m.call(lambda c: c.info().role, 1000)


def by_role(wanted):
    found = []

    def look():
        for m in members:
            if role(m) == wanted:
                found.append(m)
                return True
        return False
    wait_until("a %s" % wanted, look, 20)
    return found[0]


members[0].start()
wait_until("the first member registered", lambda: chain_size() == 1)
for m in members[1:]:
    m.start()
wait_until("a chain of 3", lambda: chain_size() == 3 and
           sorted(role(m) for m in members) == ["head", "middle", "tail"])
check(chain_size() == 3 and sorted(role(m) for m in members) == ["head", "middle", "tail"],
      "an async chain of three formed")

lock = threading.Lock()
acked = {}
attempted = {}
bad = []
progress = [0]


def judge(key, got, floor):
    harness.judge_versioned(key, got, floor, attempted, bad)


def writer(index):
    r = random.Random(index)
    keys = [index * KEYS_PER_WRITER + i for i in range(KEYS_PER_WRITER)]
    conn = None
    while not stop.is_set():
        key = r.choice(keys)
        try:
            if conn is None:
                m = r.choice(members)
                c, t = harness.client(m.port, 3000)
                conn = (c, t)
            c = conn[0]
            if r.random() < 0.3:
                res = c.get(key)
                with lock:
                    judge(key, res.value if res.found else None, 0)
                continue
            with lock:
                v = attempted.get(key, 0) + 1
                attempted[key] = v
            c.put(key, harness.versioned(key, v))
            with lock:
                acked[key] = max(acked.get(key, 0), v)
                progress[0] += 1
        except KvError:
            pass
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


threads = [threading.Thread(target=writer, args=(i,), daemon=True) for i in range(WRITERS)]
for t in threads:
    t.start()


def wait_progress(what, n=200):
    with lock:
        start = progress[0]
    wait_until("writes acknowledged after " + what, lambda: progress[0] >= start + n, 30)


wait_progress("start")
head = by_role("head")
lags = []
for _ in range(20):
    try:  # a slow answer under load (a sanitizer build) skips a sample
        lags.append(head.call(lambda c: c.stats()).get("cluster.chain.lag_writes", -1))
    except Exception:
        pass
    time.sleep(0.05)
check(lags, "the head answers stats() under load")
print("lag of the head's successor under load, in writes: max %d, samples %s" %
      (max(lags), lags[:10]))
check(min(lags) >= 0, "the head's stats report its successor's lag in writes under load")

for wanted in ("tail", "middle"):
    victim = by_role(wanted)
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait()
    wait_until("the chain without the %s" % wanted, lambda: chain_size() == 2)
    wait_progress("kill -9 of the %s" % wanted)
    victim.start()
    wait_until("the %s back in the chain" % wanted, lambda: chain_size() == 3, 40)
    wait_progress("the %s's return" % wanted)
    check(chain_size() == 3, "kill -9 of the %s: writes went on, it caught up and rejoined" % wanted)

stop.set()
for t in threads:
    t.join()
check(not bad, "no read from any member returned a value nobody wrote: %s" % bad[:5])
print("acknowledged %d writes" % progress[0])

wait_until("equal digests on every member after quiet",
           lambda: len({(d.keys, d.digest) for d in
                        [m.call(lambda c: c.digest("")) for m in members]}) == 1, 20)
d = members[0].call(lambda c: c.digest(""))
check(d.keys > 0, "every member holds the same data once writes stop (%d keys, %s)" %
      (d.keys, d.digest))
head = by_role("head")
check(head.call(lambda c: c.stats()).get("cluster.chain.lag_writes", -1) == 0,
      "the lag is 0 once the chain is quiet")
for m in members:
    c, t = harness.client(m.port, 5000)
    try:
        keys = sorted(acked)
        for i in range(0, len(keys), 200):
            part = keys[i:i + 200]
            for key, r in zip(part, c.multiGet(part)):
                judge(key, r.value if r.found else None, acked[key])
    finally:
        t.close()
check(not bad, "every acknowledged write is on every member at its newest version: %s" % bad[:5])

for m in members:
    check(harness.stop(m.proc) == 0, "%s stops cleanly" % m.name)
harness.finish(work)
