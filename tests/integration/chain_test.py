#!/usr/bin/python3
"""Process test of chain replication (shared/DESIGN.md, "Partitions and
chains"; server/member/replicator.h): a real ZooKeeper on loopback and two marks
of three real flatkv-server members each, cluster.replication: sync.

Writers call random instances (any instance forwards) with self-verifying
values "k=<key> v=<n>"; each writer owns its keys and writes versions in
order, so the newest acknowledged version of each key is known, and any
value read is judged on its own: it must name its key, be no older than the
newest version acknowledged before the read began (no stale read after an
acknowledgement), and no newer than the newest version attempted (no value
nobody wrote).

Faults, in turn, under that load: kill -9 of a tail, a middle member and a
head (a neighbour removes its node when its port refuses a connection),
each restarted with its data (it rejoins at the tail after catching up from
the log); SIGSTOP of a head past its session timeout, then SIGCONT
(it must not answer writes the new chain does not hold, and rejoins); a
member restarted with its data directory wiped (a full copy from the tail);
a ZooKeeper restart. After each, the writers must make progress again.
At the end, after a quiet second: every acknowledged write readable at its
newest version from every instance, and `digest` equal across each chain.

With a fourth argument "always" every member runs storage.sync: always: a
member passes a batch down before its own fdatasync, the head commits the
least position every member reports after its sync, and the tail serves a
read of a key only once the head's commit point covers its newest write
(partition/chain.h, ChainOptions::sends_before_sync), which on an I/O
thread runs the read again on a worker: the same checks hold.

Usage: chain_test.py FLATKV_SERVER THRIFT_COMPILER FLATKV_THRIFT [always]"""
import os
import random
import shutil
import signal
import sys
import threading
import time

import harness
from harness import check, free_port

server_bin, thrift_bin, idl = sys.argv[1:4]
SYNC = sys.argv[4] if len(sys.argv) > 4 else "interval"
work = harness.workdir("flatkv-chain-%s-" % SYNC, thrift_bin, idl)
from flatkv.ttypes import ErrorCode, KvError  # noqa: E402

import logging  # noqa: E402
logging.getLogger("thrift").setLevel(logging.CRITICAL)

rng = random.Random(int(os.environ.get("FLATKV_TEST_SEED", "10")))
SESSION_MS = 1500
MARK_A, MARK_B = 1000000, 2000000  # mark A owns [0, 1e6) and the wrap; B [1e6, 2e6)
KEYS_PER_WRITER = 200
WRITERS = 4

zk = harness.ZooKeeper(work)
stop = threading.Event()  # the writers stop


class Member:
    def __init__(self, name, mark):
        self.name = name
        self.mark = mark
        self.port = free_port()
        self.data = os.path.join(work, name)
        self.log = os.path.join(work, name + ".log")
        self.proc = None

    @property
    def address(self):
        return "127.0.0.1:%d" % self.port

    def start(self):
        self.proc = harness.start_member(
            server_bin, self.port, self.data, zk, self.mark, "--set", "cluster.replication=sync",
            "--set", "storage.key_max=4000000", "--set", "storage.sync=" + SYNC, log=self.log,
            session_timeout_ms=SESSION_MS)

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def call(self, fn, timeout_ms=3000):
        return harness.call(self.port, fn, timeout_ms)


members = {m: [Member("%s%d" % (n, i), m) for i in range(3)]
           for m, n in ((MARK_A, "a"), (MARK_B, "b"))}
everyone = members[MARK_A] + members[MARK_B]


def chain_of(mark):
    """The chain of "mark" as ZooKeeper holds it (member addresses, by
    registration order is not known here: as a set)."""
    prefix = "thriftbinary%d:" % mark
    return sorted(c[len(prefix):] for c in zk.members() if c.startswith(prefix))


def wait_until(what, cond, timeout=30.0):
    return harness.wait_until(work, what, cond, timeout, 0.05, on_fail=stop.set)


def role(m):
    return m.call(lambda c: c.info().role, 1000)


# --- Start: the first member of each mark, then the others join. -----------
for mark in (MARK_A, MARK_B):
    first = members[mark][0]
    first.start()
    wait_until("%s registered" % first.name, lambda: chain_of(mark) == [first.address])
for m in members[MARK_A][1:] + members[MARK_B][1:]:
    m.start()
for mark in (MARK_A, MARK_B):
    wait_until("mark %d has a chain of 3" % mark,
               lambda: len(chain_of(mark)) == 3 and
               sorted(role(m) for m in members[mark]) == ["head", "middle", "tail"])
check(all(len(chain_of(mark)) == 3 for mark in (MARK_A, MARK_B)),
      "two marks of three members each formed their chains")

# --- The load --------------------------------------------------------------
lock = threading.Lock()
acked = {}      # key -> newest acknowledged version
attempted = {}  # key -> newest version sent
errors = []     # failures a user would see, with their codes
bad = []        # values that break the rules: the test fails on any
progress = [0]
ack_times = {MARK_A: [], MARK_B: []}
paused = set()  # members a client would give up on (SIGSTOP): writers skip them


def owner(key):
    return MARK_A if key < MARK_A or key >= MARK_B else MARK_B


def judge(key, got, floor):
    harness.judge_versioned(key, got, floor, attempted, bad)


def writer(index):
    r = random.Random(index)
    # Keys of both marks: half below MARK_A, half in [MARK_A, MARK_B).
    keys = [index * KEYS_PER_WRITER + i for i in range(KEYS_PER_WRITER // 2)] + \
           [MARK_A + index * KEYS_PER_WRITER + i for i in range(KEYS_PER_WRITER // 2)]
    conn = None
    while not stop.is_set():
        key = r.choice(keys)
        m = r.choice([x for x in everyone if x not in paused])
        try:
            if conn is None or conn[0] is not m:
                if conn is not None:
                    conn[2].close()
                c, t = harness.client(m.port, 3000)
                conn = (m, c, t)
            c = conn[1]
            if r.random() < 0.3:
                with lock:
                    floor = acked.get(key, 0)
                res = c.get(key)
                with lock:
                    judge(key, res.value if res.found else None, floor)
                continue
            with lock:
                v = attempted.get(key, 0) + 1
                attempted[key] = v
            c.put(key, harness.versioned(key, v))
            with lock:
                acked[key] = max(acked.get(key, 0), v)
                progress[0] += 1
                ack_times[owner(key)].append(time.monotonic())
        except KvError as e:
            with lock:
                errors.append(e.code)
        except Exception:
            if conn is not None:
                try:
                    conn[2].close()
                except Exception:
                    pass
            conn = None
            time.sleep(0.02)
    if conn is not None:
        conn[2].close()


threads = [threading.Thread(target=writer, args=(i,), daemon=True) for i in range(WRITERS)]
for t in threads:
    t.start()


def wait_progress(what, n=100, timeout=30.0):
    """Both marks acknowledge writes again: returns the fewest writes
    either acknowledged meanwhile (at least n)."""
    with lock:
        start = {m: len(ack_times[m]) for m in ack_times}
    wait_until("writes to both marks acknowledged again after " + what,
               lambda: all(len(ack_times[m]) >= start[m] + n for m in ack_times), timeout)
    with lock:
        return min(len(ack_times[m]) - start[m] for m in ack_times)


def rejoined_at_tail(mark, victim):
    """Waits for "victim" to be the tail of a chain of 3 again; true then."""
    wait_until("%s back at the tail of mark %d" % (victim.name, mark),
               lambda: len(chain_of(mark)) == 3 and role(victim) == "tail", 30)
    return len(chain_of(mark)) == 3 and role(victim) == "tail"


def wait_chain(mark, n=3, timeout=40.0):
    wait_until("mark %d back to a chain of %d" % (mark, n),
               lambda: len(chain_of(mark)) == n, timeout)


def by_role(mark, wanted, timeout=20.0):
    """The member of "mark" whose role is "wanted" (a member that just
    joined may still be settling)."""
    found = []

    def look():
        for m in members[mark]:
            if role(m) == wanted:
                found.append(m)
                return True
        return False
    wait_until("mark %d has a %s" % (mark, wanted), look, timeout)
    return found[0]


check(wait_progress("start") >= 100, "writes through random instances are acknowledged")

def evictions(mark, but):
    """Member nodes the members of "mark" other than "but" removed because
    a dead member's host refused connections (ChainMember::OnPeerRefused)."""
    return sum(m.call(lambda c: c.stats()).get("cluster.chain.evictions", 0)
               for m in members[mark] if m is not but)


# kill -9 of the tail, the middle and the head of mark A, each restarted.
for wanted in ("tail", "middle", "head"):
    victim = by_role(MARK_A, wanted)
    evicted = evictions(MARK_A, victim)
    t_kill = time.monotonic()
    victim.kill9()
    wait_chain(MARK_A, 2)
    # Its port refuses connections at once: a neighbour removes its node
    # instead of waiting for its session to expire.
    check(evictions(MARK_A, victim) > evicted,
          "kill -9 of the %s: a neighbour removed its node on the refused connection" % wanted)
    wait_progress("kill -9 of the %s" % wanted, 100)
    if wanted == "head":
        # The longest time mark A acknowledged nothing around the kill.
        with lock:
            times = sorted(t for t in ack_times[MARK_A] if t >= t_kill - 1)
        gaps = [b - a for a, b in zip(times, times[1:])]
        print("write gap after kill -9 of the head: %.2f s (session timeout %.1f s)" %
              (max(gaps) if gaps else -1, SESSION_MS / 1000))
        check(gaps and max(gaps) <= SESSION_MS / 1000 + 2.0,
              "writes to the mark resume within session timeout + 2 s of a head kill")
    victim.start()
    check(rejoined_at_tail(MARK_A, victim),
          "kill -9 of the %s: the chain went on and the member rejoined at the tail" % wanted)

# SIGSTOP of mark B's head past its session timeout, then SIGCONT.
victim = by_role(MARK_B, "head")
paused.add(victim)
harness.pause(victim.proc)
wait_chain(MARK_B, 2, timeout=SESSION_MS / 1000 * 4 + 10)
wait_progress("SIGSTOP of a head")
victim.proc.send_signal(signal.SIGCONT)
paused.discard(victim)
check(rejoined_at_tail(MARK_B, victim) and wait_progress("SIGCONT of the old head") >= 100,
      "a head paused past its session timeout was replaced, then rejoined at the tail")

# A member whose data directory is wiped: a full copy from the tail.
victim = by_role(MARK_B, "middle")
victim.kill9()
shutil.rmtree(victim.data)
wait_chain(MARK_B, 2)
victim.start()
check(rejoined_at_tail(MARK_B, victim) and wait_progress("a wiped member's return") >= 100,
      "a member with a wiped data directory copied the chain and rejoined")

# ZooKeeper restart.
zk.stop()
time.sleep(0.5)
zk.start()
restart_acks = wait_progress("a ZooKeeper restart", timeout=60)
wait_chain(MARK_A, 3, timeout=60)
wait_chain(MARK_B, 3, timeout=60)
check(restart_acks >= 100 and all(len(chain_of(mark)) == 3 for mark in (MARK_A, MARK_B)),
      "a ZooKeeper restart: writes go on and both chains are whole")

stop.set()
for t in threads:
    t.join()
check(not bad, "no stale read, no value nobody wrote, nothing missing: %s" % bad[:5])
print("acknowledged %d writes; errors seen by the writers: %s" %
      (progress[0], {ErrorCode._VALUES_TO_NAMES.get(c, c): errors.count(c) for c in set(errors)}))

# --- Quiet: every member equal, every acknowledged write there. -------------
time.sleep(1.0)
for mark in (MARK_A, MARK_B):
    def digests():
        return [m.call(lambda c: c.digest("")) for m in members[mark]]
    wait_until("mark %d's members hold the same data" % mark,
               lambda: len({(d.keys, d.digest) for d in digests()}) == 1, 20)
    d = digests()
    check(d[0].keys > 0, "mark %d: digests equal across the chain (%d keys, %s)" %
          (mark, d[0].keys, d[0].digest))

for m in everyone:
    c, t = harness.client(m.port, 5000)
    try:
        keys = sorted(acked)
        for i in range(0, len(keys), 200):
            part = keys[i:i + 200]
            res = c.multiGet(part)
            for key, r in zip(part, res):
                judge(key, r.value if r.found else None, acked[key])
    finally:
        t.close()
check(not bad, "every acknowledged write is readable from every instance: %s" % bad[:5])
held = sum(m.call(lambda c: c.stats()).get("cluster.chain.reads_held", 0) for m in everyone)
print("reads held back at a tail until their key's write committed (storage.sync %s): %d" %
      (SYNC, held))

for m in everyone:
    check(harness.stop(m.proc) == 0, "%s stops cleanly" % m.name)
harness.finish(work)
