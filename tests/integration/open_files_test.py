#!/usr/bin/python3
"""The real flatkv-server under a small open-file limit (soft 128, hard 256,
as `ulimit -n` gives a user): at start it raises the soft limit to the hard
one and says so, keeps the tables of a 200-segment store within its
descriptor budget (idle tables closed, reopened on use), serves every key
for reads and writes, and still accepts new connections; a restart under
the same limit reopens the store.
Usage: open_files_test.py FLATKV_SERVER THRIFT_COMPILER FLATKV_THRIFT"""
import os
import resource
import signal
import subprocess
import sys

import harness
from harness import check, free_port

server_bin, thrift_bin, idl = sys.argv[1:4]
work = harness.workdir("flatkv-nofile-", thrift_bin, idl)
from flatkv.ttypes import KvPair  # noqa: E402

SEGMENTS = 200
SEGMENT_KEYS = 64
data = os.path.join(work, "data")
log_path = os.path.join(work, "server.log")


def limited():
    resource.setrlimit(resource.RLIMIT_NOFILE, (128, 256))
    harness._die_with_parent()


def start(port):
    log = open(log_path, "a")
    proc = subprocess.Popen(
        [server_bin, "--set", "server.port=%d" % port, "--set", "storage.path=" + data,
         "--set", "storage.segment_keys=%d" % SEGMENT_KEYS, "--set", "cache.capacity_bytes=0",
         "--set", "log.level=info"],
        stdout=subprocess.DEVNULL, stderr=log, preexec_fn=limited)
    harness._servers.append(proc)
    harness.wait_port(port, proc)
    return proc


def keys_of(seg):
    # 16 keys, one per data file of the segment (key k lives in file k mod 16).
    return [seg * SEGMENT_KEYS + i * 3 for i in range(16)]


def value(k, gen):
    return ("%d:%d:" % (k, gen)).encode() * 3


def fds(proc):
    return len(os.listdir("/proc/%d/fd" % proc.pid))


port = free_port()
proc = start(port)
with open(log_path) as f:
    text = f.read()
check("open files: limit 256 (was 128, hard 256)" in text,
      "the server raised its soft open-file limit to the hard one and logged it")
check("server.max_connections 1024 lowered to 96" in text,
      "connections are bounded to the descriptors kept for them")
kv, t = harness.client(port)
for seg in range(SEGMENTS):
    ks = keys_of(seg)
    kv.multiPut([KvPair(k, value(k, 1)) for k in ks[:8]])
    for k in ks[8:]:
        kv.put(k, value(k, 1))
stats = kv.stats()
check(stats["engine.segments"] == SEGMENTS, "200 segments exist (%d)" % stats["engine.segments"])
check(stats["engine.segments_open"] <= 8,
      "at most 8 tables are open (%d)" % stats["engine.segments_open"])
check(fds(proc) < 200, "the server holds fewer than 200 descriptors (%d)" % fds(proc))

bad = []
for seg in reversed(range(SEGMENTS)):
    ks = keys_of(seg)
    got = kv.multiGet(ks)
    bad += [k for k, g in zip(ks, got) if not g.found or g.value != value(k, 1)]
    kv.put(ks[0], value(ks[0], 2))
    kv.append(ks[1], b"+")
check(not bad, "every key of every segment reads back (%d wrong)" % len(bad))

# Many new connections at once while the tables are closed and reopened.
conns = []
try:
    for i in range(60):
        c, ct = harness.client(port, timeout_ms=5000)
        conns.append((c, ct))
    ok = all(c.get(keys_of(i * 3)[0]).value == value(keys_of(i * 3)[0], 2)
             for i, (c, _) in enumerate(conns))
    check(ok, "60 new connections are accepted and served")
except Exception as e:  # noqa: BLE001
    check(False, "60 new connections are accepted and served: %r" % e)
for _, ct in conns:
    ct.close()
stats = kv.stats()
check(stats["engine.segment_closes"] > 0 and stats["engine.segment_opens"] > 0,
      "idle tables were closed and reopened (%d closes, %d opens)" %
      (stats["engine.segment_closes"], stats["engine.segment_opens"]))
check(fds(proc) < 200, "still fewer than 200 descriptors (%d)" % fds(proc))
t.close()
check(harness.stop(proc) == 0, "SIGTERM stops the server cleanly")

# Restart under the same limit: every value is there.
port = free_port()
proc = start(port)
kv, t = harness.client(port)
bad = []
for seg in range(SEGMENTS):
    ks = keys_of(seg)
    got = kv.multiGet(ks)
    want = [value(ks[0], 2), value(ks[1], 1) + b"+"] + [value(k, 1) for k in ks[2:]]
    bad += [k for k, g, w in zip(ks, got, want) if not g.found or g.value != w]
check(not bad, "after a restart every value is there (%d wrong)" % len(bad))
s = kv.scan(0, 100000, False)
n = len(s.pairs)
while not s.done:
    s = kv.scan(s.nextKey, 100000, False)
    n += len(s.pairs)
check(n == SEGMENTS * 16, "a scan crosses every segment (%d keys)" % n)
t.close()
check(harness.stop(proc) == 0, "SIGTERM stops the restarted server cleanly")
harness.finish(work)
