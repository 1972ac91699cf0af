#!/usr/bin/python3
"""Integration test: admin actions under load on the real flatkv-server.
Writers keep putting (single puts and multiPut batches) and appending while
the write mode is switched back and forth and compactions run; afterwards,
and again after a SIGTERM restart, every acknowledged write is there with
its newest value.
Usage: load_test.py FLATKV_SERVER THRIFT_COMPILER FLATKV_THRIFT"""
import os
import signal
import sys
import threading
import time

import harness
from harness import check, client, free_port

server_bin, thrift_bin, idl = sys.argv[1:4]
work = harness.workdir("flatkv-load-", thrift_bin, idl)
from flatkv.ttypes import KvPair, WriteMode  # noqa: E402


def start(port, data, *extra):
    return harness.start(server_bin, port, data, "--set", "admin.token=t", *extra)


KEYS_PER_WRITER = 400
WRITERS = 3
stop_writers = threading.Event()
# Newest acknowledged value per key, per writer (each writer owns its keys,
# so "newest acknowledged" is well defined without cross-thread ordering).
expected = [dict() for _ in range(WRITERS)]
appended = [dict() for _ in range(WRITERS)]
writer_errors = []


def writer(port, w):
    c, t = client(port)
    base = w * 100000
    rounds = 0
    try:
        while not stop_writers.is_set() or rounds < 3:
            for k in range(0, KEYS_PER_WRITER, 2):
                v = b"w%d-r%d-k%d-" % (w, rounds, k) + b"x" * (k % 300)
                c.put(base + k, v)
                expected[w][base + k] = v
            batch = [KvPair(base + k, b"b%d-%d" % (rounds, k)) for k in range(1, KEYS_PER_WRITER, 2)]
            c.multiPut(batch)
            for p in batch:
                expected[w][p.key] = p.value
            key = base + 50000
            c.append(key, b"%d," % rounds)
            appended[w][key] = appended[w].get(key, b"") + b"%d," % rounds
            rounds += 1
    except Exception as e:  # noqa: BLE001 - any failure fails the test
        writer_errors.append("writer %d: %r" % (w, e))
    t.close()


def verify(c, what):
    bad = []
    for w in range(WRITERS):
        keys = sorted(expected[w])
        for i in range(0, len(keys), 100):
            chunk = keys[i:i + 100]
            for k, r in zip(chunk, c.multiGet(chunk)):
                if not r.found or r.value != expected[w][k]:
                    bad.append(k)
        for k, v in appended[w].items():
            if c.get(k).value != v:
                bad.append(k)
    check(not bad, "%s (%d keys wrong, first %s)" % (what, len(bad), bad[:5]))


data = os.path.join(work, "data")
port = free_port()
# Small segments and an eager garbage ratio: compactions have work to do.
# A worker pool (the default, server.workers auto, runs calls on the I/O
# threads, which the other tests cover).
SEGMENTS = ("--set", "storage.segment_keys=65536")
proc = start(port, data, *SEGMENTS, "--set", "storage.sync=interval",
             "--set", "cache.flush_interval_ms=20", "--set", "server.workers=4",
             "--set", "server.io_threads=1")
threads = [threading.Thread(target=writer, args=(port, w)) for w in range(WRITERS)]
for th in threads:
    th.start()
admin, at = client(port)
switches = compactions = 0
deadline = time.time() + 8
while time.time() < deadline:
    mode = WriteMode.ASYNC if switches % 2 == 0 else WriteMode.SAFE
    admin.setWriteMode("t", mode)
    if admin.getWriteMode() != mode:
        check(False, "getWriteMode follows setWriteMode under load")
    switches += 1
    if switches % 3 == 0:
        admin.compact("t")
        compactions += 1
    time.sleep(0.2)
stop_writers.set()
for th in threads:
    th.join()
check(not writer_errors, "no write failed while modes switched and compactions ran %s" % writer_errors[:2])
print("     %d mode switches, %d compactions requested, %d keys" %
      (switches, compactions, sum(len(e) for e in expected)))
for _ in range(600):
    if not admin.compactionStatus().running:
        break
    time.sleep(0.05)
status = admin.compactionStatus()
check(not status.running and status.tablesCompacted > 0 and status.lastError == "",
      "compactions under load finish without error (%d tables)" % status.tablesCompacted)
verify(admin, "every acknowledged write reads back after the load")
admin.setWriteMode("t", WriteMode.ASYNC)
for w in range(WRITERS):  # a last round acknowledged only from the cache
    for k in range(0, KEYS_PER_WRITER, 7):
        v = b"final-%d" % k
        admin.put(w * 100000 + k, v)
        expected[w][w * 100000 + k] = v
strings = {b"user:%d" % i: b"profile-%d" % i for i in range(200)}
for k, v in strings.items():  # string keys, also acknowledged from the cache
    admin.sput(k, v)
at.close()
proc.send_signal(signal.SIGTERM)
check(proc.wait(timeout=60) == 0, "SIGTERM exits 0 in async mode")

proc = start(port, data, *SEGMENTS)
c, t = client(port)
verify(c, "every acknowledged write survives the SIGTERM restart")
check(all(c.sget(k).value == v for k, v in strings.items()),
      "async string-key writes survive the SIGTERM restart")
t.close()
proc.send_signal(signal.SIGTERM)
check(proc.wait(timeout=60) == 0, "the restarted server stops cleanly")

harness.finish(work)
