#!/usr/bin/python3
"""The real flatkv-server with the sparse tier (storage.sparse_tier: on) on
a disk that fills: its store on a small ext4 file system the test makes
itself (harness.SmallFs).

Writers put random 64-bit keys (they land in the sparse tier) with
self-verifying values until the disk is full. Then every failed write is
STORAGE_ERROR naming the full disk and the tier; the server stays up;
stats say the disk is full; every acknowledged write reads back. Restarted
(clean, then kill -9) on a disk with no free block, it opens, serves every
acknowledged key and refuses writes. After the test deletes its filler
files, writes succeed again without a restart and the disk-full state
clears. A kill -9 and a restart lose no acknowledged write.

Usage: disk_full_sparse_test.py FLATKV_SERVER THRIFT_COMPILER FLATKV_THRIFT"""
import os
import random
import subprocess
import sys
import threading
import time

import harness
from harness import check, free_port

server_bin, thrift_bin, idl = sys.argv[1:4]
work = harness.workdir("flatkv-diskfull-sparse-", thrift_bin, idl)
from flatkv.ttypes import ErrorCode, KvError  # noqa: E402

try:
    fs = harness.SmallFs(work, "fs", 320)
except RuntimeError as e:
    check(False, "a 320 MiB ext4 file system can be made and loop-mounted: %s" % e)
    harness.finish(work)

data = os.path.join(fs.path, "data")
WRITERS = 3
VALUE = 4096


def value(key, version):
    head = ("%d:%d:" % (key, version)).encode()
    return head + b"x" * (VALUE - len(head))


def version_of(key, got):
    parts = got.split(b":", 2)
    if len(parts) != 3 or parts[0] != str(key).encode() or got != value(key, int(parts[1])):
        return None
    return int(parts[1])


def start(port):
    return harness.start(server_bin, port, data, "--set", "storage.sparse_tier=on",
                         stderr=open(os.path.join(work, "server.log"), "ab"))


class Writers:
    """Threads putting new random keys; acked[key] = version acknowledged."""

    def __init__(self, port):
        self.port = port
        self.acked = {}
        self.errors, self.other = [], []
        self.fail_streak = [0] * WRITERS
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run, args=(w,)) for w in range(WRITERS)]
        for t in self.threads:
            t.start()

    def join(self):
        self.stop.set()
        for t in self.threads:
            t.join()

    def run(self, w):
        rnd = random.Random(w)
        try:
            kv, t = harness.client(self.port, timeout_ms=20000)
            while not self.stop.is_set():
                k = rnd.getrandbits(63)
                try:
                    kv.put(k, value(k, 1))
                    with self.lock:
                        self.acked[k] = 1
                    self.fail_streak[w] = 0
                except KvError as e:
                    with self.lock:
                        self.errors.append((e.code, e.message))
                    self.fail_streak[w] += 1
                    time.sleep(0.01)
            t.close()
        except Exception as e:  # noqa: BLE001 (a lost connection: the server died?)
            with self.lock:
                self.other.append(repr(e))


def verify(port, acked, what):
    bad = []
    kv, t = harness.client(port, timeout_ms=20000)
    keys = sorted(acked)
    for i in range(0, len(keys), 200):
        batch = keys[i:i + 200]
        for k, r in zip(batch, kv.multiGet(batch)):
            if not r.found or version_of(k, r.value) != acked[k]:
                bad.append("key %d: %r" % (k, r.value[:24] if r.found else "missing"))
    t.close()
    check(not bad, "%s: all %d acknowledged keys read back%s" %
          (what, len(acked), (" (bad: %s)" % bad[:3]) if bad else ""))


def stats(port):
    return harness.call(port, lambda kv: kv.stats())


port = free_port()
proc = start(port)
# About 40 MiB of writes get in before the disk is full.
fs.fill(leave=40 << 20)
writers = Writers(port)
harness.wait_until(work, "every writer sees its writes fail for a full disk",
                   lambda: min(writers.fail_streak) >= 10 or writers.other, timeout=180,
                   on_fail=writers.join)
writers.join()
check(not writers.other, "no writer lost its connection (%s)" % writers.other[:2])
check(proc.poll() is None, "the server is up with its disk full")
codes = {c for c, _ in writers.errors}
check(codes == {ErrorCode.STORAGE_ERROR}, "every failed write is STORAGE_ERROR (%d failures, "
      "codes %s)" % (len(writers.errors), codes))
check(all("No space left on device" in m and "sparse tier" in m for _, m in writers.errors),
      "every failure names the full disk and the sparse tier (e.g. %r)" %
      (writers.errors[0][1] if writers.errors else None))
check(len(writers.acked) > 1000, "the tier took %d keys before it refused" % len(writers.acked))
s = stats(port)
check(s.get("engine.disk_full") == 1, "stats say the disk is full (engine.disk_full = %s)" %
      s.get("engine.disk_full"))
check(s.get("engine.segments") == 0, "random keys made no segment (engine.segments = %s)" %
      s.get("engine.segments"))
verify(port, writers.acked, "full disk")

# Restarts on a disk with no free block: the store opens, every
# acknowledged key reads back, and every write is refused (the server up).
fs.fill_all()
for how in ("a clean restart", "kill -9 and a restart"):
    if how == "a clean restart":
        proc.terminate()
        check(proc.wait(timeout=60) == 0, "flatkv-server exits 0 on SIGTERM with its disk full")
    else:
        proc.kill()
        proc.wait()
    proc = start(port)
    verify(port, writers.acked, "%s on a full disk" % how)
    refused = 0
    kv, t = harness.client(port, timeout_ms=20000)
    for _ in range(100):
        k = random.getrandbits(63)
        try:
            kv.put(k, value(k, 1))
            writers.acked[k] = 1
        except KvError as e:
            refused += e.code == ErrorCode.STORAGE_ERROR and "No space left on device" in e.message
    t.close()
    check(refused >= 95, "after %s on a full disk, writes are refused (%d of 100)" %
          (how, refused))
    check(proc.poll() is None, "the server is up after 100 writes to a full disk")

# Space comes back: writes go on without a restart.
fs.free_fillers()
acked = dict(writers.acked)
kv, t = harness.client(port, timeout_ms=20000)
deadline = time.monotonic() + 30
ok_after = None
while time.monotonic() < deadline:
    k = random.getrandbits(63)
    try:
        kv.put(k, value(k, 1))
        acked[k] = 1
        ok_after = k
        break
    except KvError:
        time.sleep(0.2)
t.close()
check(ok_after is not None, "a write succeeds within 30 s of space freed, without a restart")


def put_and_cleared():
    k = random.getrandbits(63)
    harness.call(port, lambda kv: kv.put(k, value(k, 1)))
    acked[k] = 1
    return stats(port).get("engine.disk_full") == 0


# Cleared by a write a second after the last refusal (so it does not flap).
harness.wait_until(work, "the disk-full state clears as writes succeed", put_and_cleared,
                   timeout=10, step=0.2)

# kill -9 and a restart: nothing acknowledged is lost.
proc.kill()
proc.wait()
proc = start(port)
verify(port, acked, "after kill -9 and a restart")
check(proc.poll() is None, "the restarted server is up")
proc.terminate()
check(proc.wait(timeout=60) == 0, "flatkv-server exits 0 on SIGTERM")
harness.finish(work)
