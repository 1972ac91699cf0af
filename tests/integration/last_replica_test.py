#!/usr/bin/python3
"""The last replica standing (shared/DESIGN.md, "Partitions and chains"):
when every member of a chain is gone, only a member of the recorded chain
with its store intact may start it again. One that is not (it missed
acknowledged writes) must not become head and serve old data: the mark
answers UNAVAILABLE until a member that holds the commit point is back.

A real ZooKeeper on loopback and one mark of three real flatkv-server
members a, b, c (registered in that order: chain [a, b, c]), sync:
1. version 1 of every key, acknowledged;
2. kill -9 c (the tail); once the chain is [a, b], version 2 of every key,
   acknowledged by [a, b] (recorded without c);
3. kill -9 a and b; the mark has no member;
4. c, the stalest, restarts first: for three session timeouts it does not
   register, and every read of the mark through it is UNAVAILABLE (never
   version 1);
5. b restarts: it starts the chain, c catches up from it and joins, then a
   too; every key reads version 2 through each of them.

Usage: last_replica_test.py FLATKV_SERVER THRIFT_COMPILER FLATKV_THRIFT"""
import sys
import time

import harness
from harness import check

server_bin, thrift_bin, idl = sys.argv[1:4]
work = harness.workdir("flatkv-last-replica-", thrift_bin, idl)
from flatkv.ttypes import ErrorCode, KvError  # noqa: E402

import logging  # noqa: E402
logging.getLogger("thrift").setLevel(logging.CRITICAL)

SESSION_MS = 1500
MARK = 1000000
KEYS = range(0, 2000, 20)
zk = harness.ZooKeeper(work)
EXTRA = ("--set", "cluster.replication=sync", "--set", "storage.key_max=4000000")


class Member:
    def __init__(self, name):
        self.name = name
        self.port = harness.free_port()
        self.data = work + "/" + name
        self.log = work + "/" + name + ".log"
        self.proc = None

    @property
    def address(self):
        return "127.0.0.1:%d" % self.port

    def start(self):
        self.proc = harness.start_member(server_bin, self.port, self.data, zk, MARK, *EXTRA,
                                         log=self.log, session_timeout_ms=SESSION_MS)

    def kill9(self):
        self.proc.kill()
        self.proc.wait()


def wait_until(what, cond, timeout=30.0):
    return harness.wait_until(work, what, cond, timeout)


def registered():
    prefix = "thriftbinary%d:" % MARK
    return sorted(c[len(prefix):] for c in zk.members() if c.startswith(prefix))


def chain_seen_by(m):
    ring, _ = harness.ring_of(m.port)
    return None if ring is None else ring.get(MARK)


def write_all(via, version):
    """Writes "k=<key> v=<version>" to every key through "via", retrying
    UNAVAILABLE (a chain re-forming); True once every write is acknowledged."""
    def put_all(c):
        for k in KEYS:
            c.put(k, ("k=%d v=%d" % (k, version)).encode())
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            harness.call(via.port, put_all, 3000)
            return True
        except Exception:
            time.sleep(0.1)
    return False


def read_all(via):
    return harness.call(via.port, lambda c: [c.get(k) for k in KEYS], 5000)


a, b, c = Member("a"), Member("b"), Member("c")
a.start()
wait_until("a registered", lambda: registered() == [a.address])
b.start()
wait_until("b registered", lambda: len(registered()) == 2)
c.start()
wait_until("chain [a, b, c]", lambda: chain_seen_by(a) == [a.address, b.address, c.address])
check(write_all(a, 1), "version 1 of %d keys acknowledged by [a, b, c]" % len(KEYS))

c.kill9()
wait_until("c's node gone", lambda: c.address not in registered())
check(write_all(a, 2), "version 2 acknowledged by [a, b] after c was killed")

a.kill9()
b.kill9()
wait_until("every node of the mark gone", lambda: registered() == [])

# The stalest member comes back first.
c.start()
harness.wait_port(c.port, c.proc)
served_old = []
refused = 0
other_errors = []
deadline = time.monotonic() + 3 * SESSION_MS / 1000.0
while time.monotonic() < deadline:
    if registered():
        break
    for k in KEYS[:10]:
        try:
            got = harness.call(c.port, lambda cl: cl.get(k), 2000)
            served_old.append((k, got.value if got.found else None))
        except KvError as e:
            if e.code == ErrorCode.UNAVAILABLE:
                refused += 1
            else:
                other_errors.append(e)
        except Exception as e:  # noqa: BLE001 (a connection error is not an answer)
            other_errors.append(e)
    time.sleep(0.05)
check(registered() == [], "c, which missed acknowledged writes, did not start the chain alone "
      "(registered: %s)" % registered())
check(not served_old, "no read of the mark was served through c meanwhile (%s)" % served_old[:3])
check(refused > 0 and not other_errors,
      "every read through c was UNAVAILABLE (%d; other errors: %s)" % (refused, other_errors[:2]))

# A member of the recorded chain with its store intact starts it again.
b.start()
wait_until("chain [b, c]", lambda: chain_seen_by(c) == [b.address, c.address])
a.start()
wait_until("chain [b, c, a]",
           lambda: all(chain_seen_by(m) == [b.address, c.address, a.address] for m in (a, b, c)))
for m in (a, b, c):
    got = None
    deadline = time.monotonic() + 10
    while got is None and time.monotonic() < deadline:
        try:
            got = read_all(m)
        except Exception:
            time.sleep(0.1)
    want = [("k=%d v=2" % k).encode() for k in KEYS]
    check(got is not None and [r.value if r.found else None for r in got] == want,
          "every key reads version 2 through %s" % m.name)

harness.finish(work)
