#!/usr/bin/python3
"""Process test of a new mark joining a ring that holds data
(server/member/migration.h): an instance started with a mark the ring does not have
registers at once over a range that holds no key, and otherwise imports
the range from its owner first (registering would hide those keys).

One real ZooKeeper, mark A = 1000 (so it owns every hash: integer keys
0..2999 and string keys), holding integer keys 100..199 and 1500..1599 and
a few string keys. An instance with mark B = 1200 would take [1000, 1199]
(empty: it registers, and both then serve); an instance with mark C = 1800
would take [1200, 1799], which A owns by the ring's wraparound and where
keys 1500..1599 live, so C imports them: it registers once it has them,
every key reads its value everywhere, A drops its copies and C takes new
writes there. peerExport is checked directly: a range's integer keys in
order and its string keys by hash, in pages.

`flatkv ring suggest-mark` then names the mark that halves the fullest one.

Usage: new_mark_test.py FLATKV_SERVER FLATKV_CLI THRIFT_COMPILER FLATKV_THRIFT"""
import http.client
import os
import subprocess
import sys
import time

import harness
from harness import check, free_port

server_bin, cli_bin, thrift_bin, idl = sys.argv[1:5]
work = harness.workdir("flatkv-new-mark-", thrift_bin, idl)
from flatkv.ttypes import ErrorCode, KvError, PeerContext  # noqa: E402

zk = harness.ZooKeeper(work)


class Instance:
    def __init__(self, name, mark):
        self.port = free_port()
        self.http = free_port()
        self.mark = mark
        self.proc = harness.start_member(
            server_bin, self.port, os.path.join(work, name), zk, mark,
            "--set", "storage.key_max=3000", "--set", "server.http_port=%d" % self.http,
            log=os.path.join(work, name + ".log"), session_timeout_ms=1500)

    def call(self, fn):
        return harness.call(self.port, fn, 10000)

    def health(self):
        h = http.client.HTTPConnection("127.0.0.1", self.http, timeout=5)
        h.request("GET", "/health")
        r = h.getresponse()
        return r.status, r.read().decode()


def error_code(fn):
    try:
        fn()
    except KvError as e:
        return e.code
    return None


def marks():
    r = a.call(lambda c: c.ring())
    return sorted(p.mark for p in r.partitions if p.chain)


def wait_until(what, cond, timeout=20.0):
    return harness.wait_until(work, what, cond, timeout, 0.1)


a = Instance("a", 1000)
wait_until("mark 1000 serving", lambda: marks() == [1000])
keys = list(range(100, 200)) + list(range(1500, 1600))
a.call(lambda c: [c.put(k, b"v%d" % k) for k in keys])
skeys = [b"s%d" % i for i in range(50)]
a.call(lambda c: [c.sput(s, b"sv" + s) for s in skeys])

# peerExport over [1400, 1599]: A owns it; pages of 30.
ring = a.call(lambda c: c.ring())
ctx = PeerContext(token="", ringVersion=ring.version, mark=1000)
got, sgot, cursor, pages = [], [], b"", 0
while True:
    page = a.call(lambda c: c.peerExport(ctx, 1400, 1599, cursor, 30))
    got += [(p.key, p.value) for p in page.pairs]
    sgot += [p.key for p in page.spairs]
    pages += 1
    if page.done:
        break
    cursor = page.cursor
check(got == [(k, b"v%d" % k) for k in range(1500, 1600)] and pages >= 4,
      "peerExport returns the range's integer keys in order, in pages (%d pages)" % pages)
all_s, cursor = [], b""
while True:
    page = a.call(lambda c: c.peerExport(ctx, -2**63, 2**63 - 1, cursor, 7))
    all_s += [p.key for p in page.spairs]
    if page.done:
        break
    cursor = page.cursor
check(sorted(all_s) == sorted(skeys), "peerExport of the whole hash space returns every string key")
try:
    a.call(lambda c: c.peerExport(PeerContext(token="", ringVersion=ring.version, mark=77),
                                  0, 10, b"", 5))
    check(False, "peerExport for a mark not this instance's is refused")
except KvError as e:
    check(e.code == ErrorCode.NOT_OWNER, "peerExport for a mark not this instance's: NOT_OWNER")

# B takes [1000, 1199], which holds no key: it registers.
b = Instance("b", 1200)
wait_until("mark 1200 registered over an empty range", lambda: marks() == [1000, 1200])
check(all(b.call(lambda c: c.get(k)).value == b"v%d" % k for k in keys),
      "every key reads its value through the new mark's instance")

# C would take [1200, 1799], which A owns by the wraparound and where keys
# 1500..1599 live: it imports them (A refuses writes there meanwhile),
# registers, and A drops its copies.
c_ = Instance("c", 1800)
wait_until("C imported and registered", lambda: marks() == [1000, 1200, 1800], 30)
wait_until("the ring change finished", lambda: "change" not in zk.children("/flatkv/.cluster"), 20)
s = c_.call(lambda c: c.stats())
check(s.get("cluster.import.keys") == 100 and s.get("cluster.import.copied") == 1 and
      s.get("cluster.import.dropped_at_source") == 100,
      "C's stats: 100 keys imported, 100 dropped at the source (%s)" %
      {k: v for k, v in s.items() if k.startswith("cluster.import")})
check(all(x.call(lambda c: c.get(k)).value == b"v%d" % k for x in (a, b, c_) for k in keys),
      "every key reads its value through every instance")
check(c_.call(lambda c: c.digest("")).keys == 100 and a.call(lambda c: c.digest("")).keys == 100,
      "C holds the 100 moved keys and A only its own 100")
check(c_.health()[0] == 200 and c_.call(lambda c: c.stats())["cluster.register_blocked"] == 0,
      "C's /health is OK")
c_.call(lambda c: c.put(1550, b"new"))
check(a.call(lambda c: c.get(1550)).value == b"new", "a write to a moved key lands at C")
# A holds 100 integer keys (100..199) and 50 string keys, B none, C 100:
# the median of A's integer keys is the 51st, 150.
r = subprocess.run([cli_bin, "--port", str(b.port), "ring", "suggest-mark"], capture_output=True,
                   timeout=60)
out = r.stdout.decode()
check(r.returncode == 0 and "mark 1000: 100 integer keys, 50 string keys" in out and
      "suggested mark 150: halves mark 1000" in out,
      "ring suggest-mark halves the fullest mark at its median integer key: %r" % out)
# An importer that never comes back: a change node naming a dead one. The
# source refuses writes to its ranges (reads go on) until an admin rolls
# the change back; a change past its copy cannot be rolled back.
import logging  # noqa: E402
from kazoo.client import KazooClient  # noqa: E402
logging.getLogger("kazoo").setLevel(logging.CRITICAL)
kz = KazooClient(hosts=zk.hosts, timeout=5.0)
kz.start(timeout=10)
dead = (b'{"kind": "add", "mark": 2500, "into": 2500, "source": 1000, '
        b'"importer": "127.0.0.1:1", "state": "%s", "ranges": [[1800, 2499]]}')
a.call(lambda c: c.put(2100, b"before"))
kz.create("/flatkv/.cluster/change", dead % b"copy")
wait_until("A sees the change", lambda: error_code(lambda: a.call(lambda c: c.put(2101, b"probe"))) == ErrorCode.UNAVAILABLE, 10)
out = subprocess.run([cli_bin, "--port", str(b.port), "ring"], capture_output=True,
                     timeout=30).stdout.decode()
check("ring change: adding mark 2500, importing [1800, 2499] from mark 1000 (importer "
      "127.0.0.1:1, state copy)" in out, "`flatkv ring` shows the change in progress: %r" % out)
check(error_code(lambda: b.call(lambda c: c.put(2100, b"during"))) == ErrorCode.UNAVAILABLE and
      b.call(lambda c: c.get(2100)).value == b"before",
      "a change whose importer is gone: writes to its ranges UNAVAILABLE, reads served")
r = subprocess.run([cli_bin, "--port", str(b.port), "admin", "abort-change"], capture_output=True,
                   timeout=30)
check(r.returncode == 0, "flatkv admin abort-change rolls it back: %r" % r.stderr[-200:])
wait_until("writes resume", lambda: error_code(lambda: a.call(lambda c: c.put(2100, b"after"))) is None, 10)
check(b.call(lambda c: c.get(2100)).value == b"after", "after the roll-back the source takes writes again")
kz.create("/flatkv/.cluster/change", dead % b"flip")
r = subprocess.run([cli_bin, "--port", str(b.port), "admin", "abort-change"], capture_output=True,
                   timeout=30)
check(r.returncode == 3 and b"cannot be rolled back" in r.stderr,
      "a change past its copy cannot be rolled back: %r" % r.stderr[-200:])
kz.delete("/flatkv/.cluster/change")
kz.stop()
kz.close()
harness.finish(work)
