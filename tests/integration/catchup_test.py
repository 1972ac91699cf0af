#!/usr/bin/python3
"""Process test of a joiner's catch-up progress (server/member/replicator.h): one
mark, a member holding about 24 MB, cluster.resync_mb_per_sec = 6 on it and
a backlog of 1 MB (its log does not cover an empty member), so
the copy to an empty new member takes a few seconds. While it runs,
`flatkv ring` shows the joiner with its snapshot's percent and MB/s and the
joiner's stats show the stream it loads; the percent only grows, the rate
stays near the limit. Once the joiner registered (as the tail): the ring
lists it, its stats say 100 % and done, and the two digests are equal.

Usage: catchup_test.py FLATKV_SERVER FLATKV_CLI THRIFT_COMPILER FLATKV_THRIFT"""
import os
import re
import subprocess
import sys
import time

import harness
from harness import check, free_port

server_bin, cli_bin, thrift_bin, idl = sys.argv[1:5]
work = harness.workdir("flatkv-catchup-", thrift_bin, idl)
from flatkv.ttypes import KvPair  # noqa: E402

MARK = 1 << 40
LIMIT_MB = 6
zk = harness.ZooKeeper(work)


def member(name, *extra):
    port = free_port()
    proc = harness.start_member(server_bin, port, os.path.join(work, name), zk, MARK,
                                "--set", "storage.key_max=1000000", *extra,
                                log=os.path.join(work, name + ".log"), session_timeout_ms=1500)
    return port, proc


call = harness.call

def wait_until(what, cond, timeout=60.0):
    return harness.wait_until(work, what, cond, timeout, 0.05)


def roles():
    r = call(p0, lambda c: c.ring())
    return [m.port for p in r.partitions for m in p.chain]


# A small backlog: the log no longer covers an empty member, which gets a copy.
p0, proc0 = member("m0", "--set", "cluster.resync_mb_per_sec=%d" % LIMIT_MB,
                   "--set", "cluster.backlog_bytes=1000000")
wait_until("m0 registered", lambda: roles() == [p0])
value = b"v" * 8000
c, t = harness.client(p0, 10000)
for base in range(0, 3000, 100):
    c.multiPut([KvPair(k, value + b"%d" % k) for k in range(base, base + 100)])
t.close()

p1, proc1 = member("m1")
m0 = "127.0.0.1:%d" % p0
m1 = "127.0.0.1:%d" % p1
seen = []  # (percent, MB/s) from `flatkv ring`
joiner_stats = []
line_re = re.compile(r"joining\s+%s\s+snapshot (\d+)%% \(([\d.]+) of ([\d.]+) MB, ([\d.]+) MB/s\)"
                     % re.escape(m1))
t0 = time.monotonic()
while time.monotonic() - t0 < 60 and p1 not in roles():
    out = subprocess.run([cli_bin, "--port", str(p0), "ring"], capture_output=True,
                         timeout=10).stdout.decode()
    m = line_re.search(out)
    if m:
        seen.append((int(m.group(1)), float(m.group(4))))
    try:
        s = call(p1, lambda c: c.stats())
        if ("cluster.chain.snapshot_from.%s.percent" % m0) in s:
            joiner_stats.append(s["cluster.chain.snapshot_from.%s.percent" % m0])
    except Exception:
        pass
    time.sleep(0.3)
print("ring's joiner line (percent, MB/s):", seen)
print("joiner's own percent:", joiner_stats)
check(p1 in roles(), "the joiner registered once it had caught up")
check(len(seen) >= 3 and any(0 < p < 100 for p, _ in seen),
      "`flatkv ring` showed the joiner's snapshot in progress, between 0 and 100 %")
check(all(a[0] <= b[0] for a, b in zip(seen, seen[1:])), "the percent only grew")
# The limit is in MiB/s; the first pages go out at once, so only the rate
# averaged over most of the stream is judged.
check(0 < seen[-1][1] <= LIMIT_MB * 1.048576 * 1.25,
      "the rate shown ends near cluster.resync_mb_per_sec (%d MiB/s)" % LIMIT_MB)
check(joiner_stats and joiner_stats == sorted(joiner_stats),
      "the joiner's stats show the stream it loads, growing")
wait_until("m1 is the tail", lambda: roles() == [p0, p1])
s = call(p1, lambda c: c.stats())
check(s.get("cluster.chain.snapshot_from.%s.percent" % m0) == 100 and
      s.get("cluster.chain.snapshot_from.%s.done" % m0) == 1 and
      s.get("cluster.chain.snapshot_from.%s.bytes" % m0, 0) >= 3000 * 8000,
      "after joining its stats say the whole stream loaded (100 %%, done): %s" %
      {k: v for k, v in s.items() if "snapshot_from" in k})
out = subprocess.run([cli_bin, "--port", str(p0), "ring"], capture_output=True,
                     timeout=10).stdout.decode()
check("joining" not in out and "tail     %s" % m1 in out,
      "`flatkv ring` lists the new tail and no joiner: %r" % out)
d0 = call(p0, lambda c: c.digest(""))
d1 = call(p1, lambda c: c.digest(""))
check(d0.keys == 3000 and (d0.keys, d0.digest) == (d1.keys, d1.digest),
      "the joiner holds what the head holds (equal digests)")
harness.finish(work)
