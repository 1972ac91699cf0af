#!/usr/bin/python3
"""Integration test of ring mode (shared/DESIGN.md, "Cluster"): a real
ZooKeeper on loopback (deploy/zookeeper.sh) and three real flatkv-server
ring members, one per mark, driven from Python through ONE address at a
time, as a client in any language would. Faults are real: kill -9, SIGTERM,
SIGSTOP past the session timeout, ZooKeeper stopped and started again.

Every value names its key and a version ("k=<key> v=<n>", string keys
"s=<hex> v=<n>"), and a model holds the value each key must have, so any
read is judged on its own (STYLE.md §9). At the end every member's
storage.path is opened by a standalone flatkv-server and must hold exactly
the keys its mark owns.

Usage: ring_test.py FLATKV_SERVER THRIFT_COMPILER FLATKV_THRIFT"""
import atexit
import collections
import http.client
import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time

import harness
from harness import check, free_port

server_bin, thrift_bin, idl = sys.argv[1:4]
work = harness.workdir("flatkv-ring-", thrift_bin, idl)
from flatkv.ttypes import ErrorCode, KvError, KvPair, PeerContext  # noqa: E402

try:
    import xxhash  # Debian: python3-xxhash (deploy/install-deps.sh)
except ImportError:
    xxhash = None

logging.getLogger("thrift").setLevel(logging.CRITICAL)  # refused connections are expected
T_START = time.monotonic()
rng = random.Random(int(os.environ.get("FLATKV_TEST_SEED", "9")))
INT64_MAX = 2**63 - 1
SESSION_MS = 1000       # members A and B
SLOW_SESSION_MS = 4000  # member C: a SIGTERM must beat its session timeout visibly
TOKEN = "s3cret"        # cluster.peer_token of the whole ring: forwarding carries it
# Mark A owns [0, A) and, wrapping, [C, 2^63-1): the wraparound is exercised
# by the keys near the top; string hashes (in [0, 2^63-1)) reach all three.
MARKS = [3074457345618258602, 6148914691236517204, 8000000000000000000]
A, B, C = MARKS


def owner(h):
    above = [m for m in MARKS if m > h]
    return min(above) if above else min(MARKS)


def shash(s):
    return xxhash.xxh64_intdigest(s, seed=0) % INT64_MAX


def log_tail(path, n=15):
    try:
        with open(path, "rb") as f:
            return b"".join(f.readlines()[-n:]).decode(errors="replace")
    except OSError:
        return ""


class Member:
    def __init__(self, name, mark, session_ms=SESSION_MS):
        self.name, self.mark, self.session_ms = name, mark, session_ms
        self.port = free_port()
        self.address = "127.0.0.1:%d" % self.port
        self.data = os.path.join(work, name, "data")
        self.log = os.path.join(work, name, "server.log")
        os.makedirs(os.path.join(work, name))
        self.proc = None
        self._c = None

    def start(self, *extra):
        self.drop()
        self.proc = harness.start_member(server_bin, self.port, self.data, zk, self.mark,
                                         "--set", "cluster.peer_token=" + TOKEN, *extra,
                                         log=self.log, session_timeout_ms=self.session_ms)

    def drop(self):
        if self._c is not None:
            self._c[1].close()
        self._c = None

    @property
    def c(self):
        """A client of this instance only (reconnects after a restart)."""
        if self._c is None:
            self._c = harness.client(self.port, 5000)
        return self._c[0]

    def node(self):
        return "thriftbinary%d:%s" % (self.mark, self.address)


def expect_error(fn, code, *words):
    """(ok, what happened): ok if fn raises KvError "code" whose message
    holds every word."""
    try:
        fn()
        return False, "no error"
    except KvError as e:
        name = ErrorCode._VALUES_TO_NAMES.get(e.code, e.code)
        return e.code == code and all(w in e.message for w in words), "%s: %s" % (name, e.message)


def check_error(fn, code, what, *words):
    ok, got = expect_error(fn, code, *words)
    check(ok, what + ("" if ok else " (got %s)" % got))


def timed_wait(cond, timeout, step=0.02):
    """Seconds until cond() held, or None after "timeout" seconds."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if cond():
            return time.monotonic() - t0
        time.sleep(step)
    return None


def whole():
    return {m.mark: [m.address] for m in members}


def without(*gone):
    ring = whole()
    for m in gone:
        ring[m.mark] = []
    return ring


# --- The model: the value every key must have (None: absent) ----------------

model_i = {}
model_s = {}
version = collections.Counter()


def ival(k):
    version[k] += 1
    return b"k=%d v=%d" % (k, version[k])


def sval(s):
    version[s] += 1
    return b"s=%s v=%d" % (s.hex().encode(), version[s])


INT_KEYS = sorted(set(list(range(0, 12)) + [m + d for m in MARKS for d in range(-4, 8)] +
                      [INT64_MAX - 1 - d for d in range(6)]))
ABSENT_KEYS = [12, 13, A + 100, B + 100, C + 100, INT64_MAX - 100]  # never written
STR_KEYS = [b"user:%d" % i for i in range(45)] + [b"\x00bin\xff", b""]


def judge(got, want):
    return (not got.found and want is None) or (got.found and got.value == want)


def verify_all(via, what):
    """Every integer and string key (and some never written) through each
    instance of "via": one check per instance."""
    for m in via:
        bad = []
        for k in INT_KEYS + ABSENT_KEYS:
            r = m.c.get(k)
            if not judge(r, model_i.get(k)):
                bad.append("get(%d) = %r, want %r" % (k, r.value if r.found else None, model_i.get(k)))
        for s in STR_KEYS:
            r = m.c.sget(s)
            if not judge(r, model_s.get(s)):
                bad.append("sget(%r) = %r, want %r" % (s, r.value if r.found else None, model_s.get(s)))
        check(not bad, "%s: every integer and string key reads right through %s%s" %
              (what, m.name, "" if not bad else " (%d wrong: %s)" % (len(bad), "; ".join(bad[:3]))))


def scan_all(via, reverse, limit=7):
    """A whole-ring scan in pages of "limit", each page from the next
    instance of "via" in turn (nextKey resumes anywhere): (pairs, pages,
    largest page)."""
    out, pages, biggest = [], 0, 0
    cursor = INT64_MAX if reverse else 0
    while True:
        r = via[pages % len(via)].c.scan(cursor, limit, reverse)
        pages += 1
        biggest = max(biggest, len(r.pairs))
        out.extend((p.key, p.value) for p in r.pairs)
        if r.done or pages > 1000:
            return out, pages, biggest
        cursor = r.nextKey


def model_pairs(reverse=False):
    return sorted(((k, v) for k, v in model_i.items() if v is not None), reverse=reverse)


def wait_whole(what, timeout=15.0, via=None):
    took = harness.wait_ring([m.port for m in (via or members)], whole(), timeout)
    check(took is not None, "%s (%.2f s)" % (what, took if took is not None else -1))
    wait_serving(what, via)
    return took


def wait_serving(what, via=None):
    # A member in the ring serves once its chain is recorded in ZooKeeper (a
    # round trip after it sees itself there); until then it answers
    # UNAVAILABLE, which clients retry. Wait for that, then read.
    def serving():
        for m in (via or members):
            for k in MARKS:
                m.c.get(k - 1)
        return True
    harness.wait_until(None, "%s: every instance serves reads of every mark" % what, serving, 5.0)


finished = False


@atexit.register
def _diagnose():
    """On a failed check or an exception: how each member ended (a negative
    code is the signal that killed it) and the end of its log. Runs before
    harness kills the servers (atexit is last in, first out)."""
    if (finished and not harness.failures) or "zk" not in globals():
        return
    for m in globals().get("members", []):
        code = m.proc.poll() if m.proc else None
        print("--- %s (pid %s, %s); its log (end):\n%s" %
              (m.name, m.proc.pid if m.proc else "-",
               "running" if code is None else "exit code %d" % code, log_tail(m.log)))
    print("--- ZooKeeper's log (end):\n%s" % log_tail(os.path.join(zk.dir, "zookeeper.log"), 8))


# --- Start: ZooKeeper and three marks of one member each ---------------------

zk = harness.ZooKeeper(work)
ma, mb, mc = Member("a", A), Member("b", B), Member("c", C, SLOW_SESSION_MS)
members = [ma, mb, mc]
for m in members:
    m.start()
wait_whole("the three members register and every instance's ring() shows all three")

nodes = zk.children()
check(sorted(n for n in nodes if n.startswith("thriftbinary")) == sorted(m.node() for m in members)
      and all(nodes[m.node()] == m.node().encode() for m in members),
      "member nodes are thriftbinary<mark>:<host>:<port> holding their own name")
settings = zk.children("/flatkv").get(".cluster", b"")
try:
    settings_ok = json.loads(settings) == {"hash_bound": INT64_MAX, "replication": "sync"}
except ValueError:
    settings_ok = False
check(settings_ok, "/flatkv/.cluster holds the ring-wide settings as JSON (%r)" % settings)
check(sorted(zk.children("/flatkv/.cluster/marks")) == sorted(str(m) for m in MARKS),
      ".cluster/marks records the three marks")

# ring() and info() from every instance: the same ring, in mark order.
def rings_agree():
    rs = [m.c.ring() for m in members]
    return len({r.version for r in rs}) == 1, rs


timed_wait(lambda: rings_agree()[0], 5)
same, rs = rings_agree()
check(same, "ring() answers the same version on every instance (%s)" % [r.version for r in rs])
for m, r in zip(members, rs):
    check([p.mark for p in r.partitions] == MARKS and
          all([("%s:%d" % (x.host, x.port)) for x in p.chain] == [o.address]
              for p, o in zip(r.partitions, members)) and
          r.hashBound == INT64_MAX and r.replication == "sync",
          "%s: ring() has 3 partitions in mark order, each chain its one member, "
          "hashBound 2^63-1, replication sync" % m.name)
    info = m.c.info()
    check(info.role == "single" and info.mark == m.mark,
          "%s: info() says role single and mark %d (got %s, %d)" % (m.name, m.mark, info.role, info.mark))

# --- Writes through ONE instance ---------------------------------------------

for k in INT_KEYS:
    v = ival(k)
    ma.c.put(k, v)
    model_i[k] = v
for s in STR_KEYS:
    v = sval(s)
    ma.c.sput(s, v)
    model_s[s] = v
check({owner(k) for k in INT_KEYS} == set(MARKS), "the integer keys span all three marks")
if xxhash:
    check({owner(shash(s)) for s in STR_KEYS} == set(MARKS), "the string keys span all three marks")
# One removal, one append per mark, all through A.
removed = [0, A + 1, B + 1, INT64_MAX - 2]
ok = all(ma.c.remove(k) for k in removed) and not any(ma.c.remove(k) for k in removed)
for k in removed:
    model_i[k] = None
check(ok, "remove through one instance says whether the key existed, for every mark")
for k in (1, A + 2, B + 2, INT64_MAX - 3):
    ma.c.append(k, b" +a")
    model_i[k] += b" +a"
srem = STR_KEYS[:6]
ok = all(ma.c.sremove(s) for s in srem) and not any(ma.c.sremove(s) for s in srem)
for s in srem:
    model_s[s] = None
check(ok, "sremove through one instance says whether the key existed")
verify_all(members, "after writes through a")
st = ma.c.stats()
check(st.get("cluster.forwarded", 0) > 0 and st.get("cluster.peer_failures", 1) == 0,
      "a forwarded the calls for the other marks (cluster.forwarded=%d)" % st.get("cluster.forwarded", 0))

# --- Batches and scans spanning all marks ------------------------------------

batch = rng.sample(INT_KEYS, len(INT_KEYS) // 2)
pairs = []
for k in batch:
    v = ival(k)
    pairs.append(KvPair(k, v))
    model_i[k] = v
mb.c.multiPut(pairs)
ask = INT_KEYS + ABSENT_KEYS
rng.shuffle(ask)
for m in members:
    got = m.c.multiGet(ask)
    check(len(got) == len(ask) and all(judge(g, model_i.get(k)) for g, k in zip(got, ask)),
          "%s: multiGet over all marks answers in request order after a multiPut through b" % m.name)

want_fwd, want_rev = model_pairs(), model_pairs(True)
for i in range(3):
    via = members[i:] + members[:i]
    got, pages, biggest = scan_all(via, False)
    check(got == want_fwd and biggest <= 7,
          "scan forward over the ring in pages of 7 from %s, then the others in turn: %d keys "
          "in order (%d pages; got %d)" % (via[0].name, len(want_fwd), pages, len(got)))
    got, pages, biggest = scan_all(via, True)
    check(got == want_rev and biggest <= 7,
          "scan reverse from 2^63-1 in pages of 7 from %s: %d keys in descending order "
          "(%d pages; got %d)" % (via[0].name, len(want_rev), pages, len(got)))
check_error(lambda: ma.c.scan(0, 0, False), ErrorCode.INVALID_ARGUMENT, "a scan with limit 0 is INVALID_ARGUMENT")
check_error(lambda: mb.c.scanLog(b"\xffnot a cursor", 7), ErrorCode.INVALID_ARGUMENT,
            "scanLog with a cursor it did not make is INVALID_ARGUMENT")
r = mc.c.scan(B - 2, 5, False)
check([(p.key, p.value) for p in r.pairs] == [kv for kv in want_fwd if kv[0] >= B - 2][:5],
      "a scan from just below a mark crosses into the next partition")

for m in (ma, mc):
    seen, cursor, calls = collections.Counter(), b"", 0
    values_ok = True
    while calls < 1000:
        r = m.c.scanLog(cursor, 7)
        calls += 1
        for p in r.pairs:
            seen[p.key] += 1
            values_ok &= model_i.get(p.key) == p.value
        if r.done:
            break
        cursor = r.cursor
    live = {k for k, v in model_i.items() if v is not None}
    check(set(seen) == live and all(n == 1 for n in seen.values()) and values_ok,
          "%s: scanLog across the partitions returns every integer key exactly once "
          "(%d keys, %d calls)" % (m.name, len(seen), calls))

# --- Peer methods: the owner check and the token -----------------------------

version_b = mb.c.ring().version
ctx = PeerContext(token=TOKEN, ringVersion=version_b, mark=B)
check(judge(mb.c.peerGet(ctx, A + 3), model_i[A + 3]), "peerGet to the owner with the right mark and token is served")
check_error(lambda: mb.c.peerGet(ctx, 5), ErrorCode.NOT_OWNER,
            "peerGet for a key of mark A sent to mark B is NOT_OWNER naming the owner", str(A))
check_error(lambda: mb.c.peerGet(PeerContext(TOKEN, version_b, A), 5), ErrorCode.NOT_OWNER,
            "a call routed to mark A but received by a member of B is NOT_OWNER")
check_error(lambda: mb.c.peerPut(ctx, C + 3, b"stale"), ErrorCode.NOT_OWNER,
            "peerPut for a key of another mark is NOT_OWNER and writes nothing")
check(judge(mc.c.get(C + 3), model_i[C + 3]), "the refused peerPut wrote nothing")
check_error(lambda: mb.c.peerScan(ctx, A - 1, 10, False, A - 1, A + 10), ErrorCode.NOT_OWNER,
            "peerScan over a range that crosses a mark is NOT_OWNER")
check_error(lambda: mb.c.peerMultiGet(ctx, [A + 3, 5]), ErrorCode.NOT_OWNER,
            "peerMultiGet with one key of another mark is NOT_OWNER")
check_error(lambda: mb.c.peerGet(PeerContext("wrong", version_b, B), A + 3), ErrorCode.UNAUTHORIZED,
            "a peer call with a wrong cluster.peer_token is UNAUTHORIZED")
check_error(lambda: mb.c.peerGet(PeerContext("", version_b, B), A + 3), ErrorCode.UNAUTHORIZED,
            "a peer call with no token, when the ring has one, is UNAUTHORIZED")
st = mb.c.stats()
check(st.get("cluster.not_owner_sent", 0) >= 5 and st.get("cluster.peer_unauthorized", 0) >= 2,
      "b's stats count its NOT_OWNER answers and refused tokens (%d, %d)" %
      (st.get("cluster.not_owner_sent", 0), st.get("cluster.peer_unauthorized", 0)))

# --- Concurrent clients across the faults below -----------------------------
# Three writer threads, each with its own keys in every mark's range, put
# "k=<key> v=<n>" with n growing and read the key back, each call through
# one instance (moving to the next when a call fails). The contract of
# docs/application.md decides what a read may name: the last acknowledged
# version, or one whose put is in doubt (no answer, or an error saying it
# may or may not have been applied), which may take effect later or never.
# A put refused with an error that says it was not applied must never be
# read, and no read may name a version older than the last acknowledged
# one unless that version's put is in doubt.


def in_doubt(e):
    """Whether a failed put may still take effect (docs/application.md)."""
    if not isinstance(e, KvError):
        return True  # no answer: connection lost or timed out
    return e.code == ErrorCode.STORAGE_ERROR or "may or may not" in (e.message or "")


class Writer(threading.Thread):
    def __init__(self, t):
        super().__init__(daemon=True)
        self.t = t
        self.keys = [base + 200 + 10 * t + j for base in (0, A, B, C) for j in range(3)]
        self.acked = {k: 0 for k in self.keys}
        self.attempted = {k: 0 for k in self.keys}
        self.doubt = {k: set() for k in self.keys}
        self.history = {k: [] for k in self.keys}  # (seconds, instance, what)
        self.ok = self.failed = 0
        self.late = 0  # reads of an in-doubt put that took effect after a newer acknowledged one
        self.violations = []
        self.halt = threading.Event()
        self.entry = t
        self.conn = None

    def note(self, k, via, what):
        self.history[k].append((time.monotonic() - T_START, via, what))

    def call(self, fn):
        m = members[self.entry % 3]
        try:
            if self.conn is None:
                self.conn = harness.client(m.port, 1000)
            return fn(self.conn[0])
        except KvError:
            raise
        except Exception:
            if self.conn is not None:
                self.conn[1].close()
            self.conn = None
            self.entry += 1
            raise

    def judge_read(self, k, r, when):
        lo, hi = self.acked[k], self.attempted[k]
        n = None
        if r.found and r.value.startswith(b"k=%d v=" % k):
            n = int(r.value.split(b"v=")[1])
        ok = (n == lo or n in self.doubt[k]) if n is not None else (not r.found and lo == 0)
        self.late += ok and n is not None and n < lo
        if not ok:
            self.violations.append(
                "%s: key %d read %r, acked v%d, attempted v%d, in doubt %s; its last calls: %s" %
                (when, k, r.value, lo, hi, sorted(self.doubt[k])[-5:],
                 " ".join("%.2fs@%s:%s" % h for h in self.history[k][-8:])))
        return n

    def run(self):
        i = 0
        while not self.halt.is_set():
            k = self.keys[i % len(self.keys)]
            i += 1
            n = self.attempted[k] + 1
            self.attempted[k] = n
            via = members[self.entry % 3].name
            try:
                self.call(lambda c: c.put(k, b"k=%d v=%d" % (k, n)))
            except Exception as e:
                if in_doubt(e):
                    self.doubt[k].add(n)
                self.note(k, via, "put v%d %s" % (n, "in doubt" if in_doubt(e) else "refused"))
                self.failed += 1
                time.sleep(0.02)
                continue
            self.acked[k] = n
            self.note(k, via, "put v%d ok" % n)
            via = members[self.entry % 3].name
            try:
                r = self.call(lambda c: c.get(k))
            except Exception:
                self.note(k, via, "get failed")
                self.failed += 1
                time.sleep(0.02)
                continue
            self.note(k, via, "get v%s" % self.judge_read(k, r, "read-back"))
            self.ok += 1


writers = [Writer(t) for t in range(3)]
for w in writers:
    w.start()

# --- kill -9 of a member -----------------------------------------------------

mb.drop()
mb.proc.kill()
mb.proc.wait()
t_kill = time.monotonic()
took = harness.wait_ring([ma.port, mc.port], without(mb), 10)
check(took is not None and took <= SESSION_MS / 1000 + 1.0,
      "kill -9 of b: the others' ring shows mark B with an empty chain within session "
      "timeout + 1 s (%.2f s)" % (took if took is not None else -1))
b_key = A + 3
b_str = next((s for s in STR_KEYS if xxhash and owner(shash(s)) == B), None)
check_error(lambda: ma.c.get(b_key), ErrorCode.UNAVAILABLE,
            "get of a key of the dead mark is UNAVAILABLE naming the mark", str(B))
check_error(lambda: mc.c.put(b_key, b"lost"), ErrorCode.UNAVAILABLE,
            "put of a key of the dead mark is UNAVAILABLE naming the mark", str(B))
if b_str is not None:
    check_error(lambda: ma.c.sget(b_str), ErrorCode.UNAVAILABLE,
                "sget of a string key of the dead mark is UNAVAILABLE naming the mark", str(B))
check_error(lambda: ma.c.multiGet([5, b_key, C + 3]), ErrorCode.UNAVAILABLE,
            "multiGet touching the dead mark is UNAVAILABLE naming it", str(B))
check_error(lambda: scan_all([ma], False, 50), ErrorCode.UNAVAILABLE,
            "a ring-wide scan reaching the dead mark is UNAVAILABLE naming it", str(B))
mp = [KvPair(6, ival(6)), KvPair(b_key + 1, b"k=%d lost" % (b_key + 1)), KvPair(C + 6, ival(C + 6))]
check_error(lambda: ma.c.multiPut(mp), ErrorCode.UNAVAILABLE,
            "multiPut touching the dead mark is UNAVAILABLE naming it", str(B))
for p in (mp[0], mp[2]):  # the other marks' pairs may or may not be written
    r = mc.c.get(p.key)
    check(judge(r, model_i[p.key]) or judge(r, p.value),
          "... its pair for key %d of a live mark reads either the old or the new value" % p.key)
    model_i[p.key] = r.value
ok = True
for m in (ma, mc):
    for k in INT_KEYS:
        if owner(k) != B:
            ok &= judge(m.c.get(k), model_i.get(k))
for k in (5, C + 5):
    v = ival(k)
    mc.c.put(k, v)
    model_i[k] = v
check(ok and judge(ma.c.get(5), model_i[5]) and judge(ma.c.get(C + 5), model_i[C + 5]),
      "keys of the other marks are still read and written through a and c")
mb.start()
wait_whole("b restarted on its data dir registers again", 10)
verify_all([mb, ma], "after b's restart (its old data)")

# --- SIGTERM: the node goes at once ------------------------------------------

reads_before = [m.c.stats()["cluster.zk_reads"] for m in (ma, mb)]
mc.drop()
t0 = time.monotonic()
mc.proc.send_signal(signal.SIGTERM)
took = harness.wait_ring([ma.port, mb.port], without(mc), 5)
code = mc.proc.wait(30)
time.sleep(0.5)
reads = [m.c.stats()["cluster.zk_reads"] - b for m, b in zip((ma, mb), reads_before)]
# What a change costs ZooKeeper: each instance reads what changed (one
# listing here), not the whole ring again (a listing, three members' czxids
# and three chain nodes). A burst split in two may add a read.
check(max(reads) <= 2, "one member leaving costs each instance at most 2 ZooKeeper reads %s" % reads)
check(took is not None and took < SLOW_SESSION_MS / 1000 / 2,
      "SIGTERM of c: the others' ring drops it at once, not after its %d ms session "
      "timeout (%.2f s)" % (SLOW_SESSION_MS, took if took is not None else -1))
check(code == 0 and mc.node() not in zk.members(), "c exits 0 and its member node is gone")
reads_before = [m.c.stats()["cluster.zk_reads"] for m in (ma, mb)]
mc.start()
wait_whole("c restarted registers again", 10)
time.sleep(0.5)
reads = [m.c.stats()["cluster.zk_reads"] - b for m, b in zip((ma, mb), reads_before)]
check(max(reads) <= 3,
      "one member joining costs each instance at most 3 ZooKeeper reads (the listing and its "
      "czxid) %s" % reads)

# --- SIGSTOP past the session timeout ----------------------------------------

sessions_before = ma.c.stats().get("cluster.zk_sessions", 0)
ma.drop()
harness.pause(ma.proc)
took = harness.wait_ring([mb.port, mc.port], without(ma), SESSION_MS / 1000 + 3)
check(took is not None, "a paused with SIGSTOP: its session expires and the others drop it (%.2f s)"
      % (took if took is not None else -1))
time.sleep(0.3)
ma.proc.send_signal(signal.SIGCONT)
took = wait_whole("a woken with SIGCONT re-registers by itself", 10)
sessions = ma.c.stats().get("cluster.zk_sessions", 0)
check(sessions_before == 1 and sessions == 2,
      "a's cluster.zk_sessions grows from 1 to 2 (%d -> %d)" % (sessions_before, sessions))
check(ma.proc.poll() is None, "a was not restarted")
verify_all([ma, mc], "after a's pause")

# --- ZooKeeper restart -------------------------------------------------------

pids = [m.proc.pid for m in members]
zk.stop()
time.sleep(0.5)
for m in members:  # no ZooKeeper: the last ring
    for k in (7, A + 6, B + 6, C + 6):
        v = ival(k)
        m.c.put(k, v)
        model_i[k] = v
verify_all(members, "ZooKeeper down: every instance serves with its last ring")
t0 = time.monotonic()
zk.start()
took = timed_wait(lambda: zk.members() == sorted(m.node() for m in members) and
                  harness.wait_ring([m.port for m in members], whole(), 0.01) is not None, 15, 0.1)
check(took is not None and [m.proc.pid for m in members] == pids and all(m.proc.poll() is None for m in members),
      "ZooKeeper restarted on the same dir and port: all three registered again without "
      "restarting them (%.2f s after it serves)" % (took if took is not None else -1))
# A member whose session expired while ZooKeeper was down registers anew and
# serves once its chain is recorded again (UNAVAILABLE until then).
wait_serving("after the ZooKeeper restart")
verify_all([mc], "after the ZooKeeper restart")
subprocess.run(["bash", harness.ZOOKEEPER_SH, "kill", zk.dir], check=True)  # a crash: SIGKILL
time.sleep(0.3)
check(judge(ma.c.get(B + 6), model_i[B + 6]), "ZooKeeper killed: calls still work with the last ring")
zk.start()
took = timed_wait(lambda: zk.members() == sorted(m.node() for m in members) and
                  harness.wait_ring([m.port for m in members], whole(), 0.01) is not None, 15, 0.1)
check(took is not None and [m.proc.pid for m in members] == pids,
      "ZooKeeper killed (SIGKILL) and started again: all three registered again (%.2f s)" %
      (took if took is not None else -1))
wait_serving("after ZooKeeper's SIGKILL")

# --- While ZooKeeper is down, b's address answers but b cannot serve ---------
# a and c keep routing mark B to b's address. First a standalone instance
# answers there: it refuses forwarded calls NOT_OWNER, and with ZooKeeper
# down the forwarder cannot read the ring again, so the call fails
# UNAVAILABLE, not applied, instead of going back to the same address. Then
# b itself, started again, has read no ring: it refuses forwarded calls
# UNAVAILABLE at once.

zk.stop()
mb.drop()
mb.proc.kill()
mb.proc.wait()
# Its key range holds none of the writers' keys, so what they send it
# directly is refused (KEY_OUT_OF_RANGE), not stored where b cannot see it.
stray = harness.start(server_bin, mb.port, os.path.join(work, "stray"),
                      "--set", "storage.key_min=0", "--set", "storage.key_max=100")
for via in (ma, mc):
    t0 = time.monotonic()
    ok, got = expect_error(lambda: via.c.put(A + 6, b"k=%d refused" % (A + 6)), ErrorCode.UNAVAILABLE,
                           "NOT_OWNER", "cannot read the ring", "not applied")
    check(ok, "ZooKeeper down, a standalone instance on b's address: a put through %s is UNAVAILABLE, "
          "not applied, once the ring cannot be read again (%s; %.2f s)" % (via.name, got, time.monotonic() - t0))
check(harness.stop(stray) == 0, "the standalone instance stops with SIGTERM (exit 0)")
mb.start()
for via in (ma, mc):
    t0 = time.monotonic()
    ok, got = expect_error(lambda: via.c.put(A + 6, b"k=%d refused" % (A + 6)), ErrorCode.UNAVAILABLE,
                           "has not read the ring")
    took = time.monotonic() - t0
    check(ok and took < 0.5,
          "ZooKeeper down, b killed and started again: a put that %s forwards to b is UNAVAILABLE "
          "at once (%s; %.2f s)" % (via.name, got, took))
    ok, got = expect_error(lambda: via.c.get(A + 6), ErrorCode.UNAVAILABLE, "has not read the ring")
    check(ok, "... and so is a get (%s)" % got)
zk.start()
wait_whole("ZooKeeper started again: b registers anew once its old session expired", 15)
check(judge(ma.c.get(A + 6), model_i[A + 6]), "the refused puts were not applied")

# --- ZooKeeper down when an instance starts ----------------------------------

mb.drop()
check(harness.stop(mb.proc) == 0, "b stops with SIGTERM (exit 0)")
zk.stop()
http_port = free_port()
mb.start("--set", "server.http_port=%d" % http_port)


def health():
    try:
        h = http.client.HTTPConnection("127.0.0.1", http_port, timeout=2)
        h.request("GET", "/health")
        r = h.getresponse()
        body = r.read()
        h.close()
        return r.status, body
    except OSError as e:
        return None, str(e).encode()


check_error(lambda: mb.c.get(A + 3), ErrorCode.UNAVAILABLE,
            "b started while ZooKeeper is down: data calls are UNAVAILABLE naming ZooKeeper", "ZooKeeper")
check_error(lambda: mb.c.sput(b"x", b"y"), ErrorCode.UNAVAILABLE,
            "... string keys too")
timed_wait(lambda: health()[0] is not None, 5)
status, body = health()
check(status == 503, "... and /health answers 503 (%s %r)" % (status, body[:80]))
check(mb.c.info().role == "syncing", "... and info().role is syncing (%s)" % mb.c.info().role)
zk.start()


def b_serves():
    # The ring is read first (/health 200), then b registers in its mark:
    # until then its own keys are UNAVAILABLE ("no serving member").
    try:
        return health()[0] == 200 and judge(mb.c.get(A + 3), model_i[A + 3])
    except KvError as e:
        if e.code != ErrorCode.UNAVAILABLE:
            raise
        return False


took = timed_wait(b_serves, 10, 0.05)
check(took is not None,
      "ZooKeeper started: b serves again without a restart (after %.2f s)"
      % (took if took is not None else -1))
wait_whole("... and the ring is whole on every instance", 10)

# --- The writers' histories -------------------------------------------------

for w in writers:
    w.halt.set()
for w in writers:
    w.join(30)
for w in writers:
    for k in w.keys:
        r = mc.c.get(k)
        n = w.judge_read(k, r, "final")
        model_i[k] = r.value if r.found else None
check(all(w.ok > 20 for w in writers) and not any(w.violations for w in writers),
      "concurrent writers through the faults: every read names the last acknowledged version "
      "or one whose put is in doubt, never one refused (%s; %d reads named a put in doubt that "
      "took effect after a newer acknowledged one)%s" %
      (", ".join("%d ok/%d failed" % (w.ok, w.failed) for w in writers), sum(w.late for w in writers),
       "".join("; " + "; ".join(w.violations[:3]) for w in writers if w.violations)))
INT_KEYS = sorted(set(INT_KEYS) | {k for w in writers for k in w.keys})

# --- Refused at start-up -----------------------------------------------------


def run_refused(*extra, timeout=30):
    """Starts an instance that must refuse to start: (exit code, stderr)."""
    data = os.path.join(work, "refused-%d" % rng.randrange(10**9))
    p = subprocess.run([server_bin, "--set", "server.port=%d" % free_port(), "--set",
                        "storage.path=" + data, *extra],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=timeout,
                       preexec_fn=harness._die_with_parent)
    return p.returncode, p.stderr.decode(errors="replace")


NEW = 12345
for key, value in (("cluster.hash_bound", "1000"), ("cluster.replication", "async")):
    code, err = run_refused("--set", "cluster.zookeeper=" + zk.hosts, "--set", "cluster.mark=%d" % NEW,
                            "--set", "%s=%s" % (key, value))
    check(code == 2 and key in err,
          "an instance with %s=%s against the ring exits 2 naming the key (%d: %s)" %
          (key, value, code, err.strip().splitlines()[-1:] if err.strip() else ""))
check(not any(str(NEW) in n for n in zk.children()) and str(NEW) not in zk.children("/flatkv/.cluster/marks"),
      "the refused instances wrote nothing: no member node, no recorded mark")
for extra, key in ((["--set", "cluster.zookeeper=" + zk.hosts, "--set", "cluster.advertise=0.0.0.0:9999"],
                    "cluster.advertise"),
                   (["--set", "cluster.zookeeper=nonsense"], "cluster.zookeeper")):
    code, err = run_refused(*extra)
    check(code == 2 and key in err, "bad config %s exits 2 naming the key (%d: %s)" %
          (extra[-1], code, err.strip()))
check(harness.wait_ring([m.port for m in members], whole(), 2) is not None,
      "the ring is unchanged by the refused instances")

# --- The final read, then each member's data dir on its own ------------------

verify_all(members, "final read")
got, _, _ = scan_all(members, False)
check(got == model_pairs(), "final ring-wide scan equals the model")

for m in members:
    m.drop()
    check(harness.stop(m.proc) == 0, "%s stops with SIGTERM (exit 0)" % m.name)
zk.close()

stores = {}
for m in members:
    port = free_port()
    proc = harness.start(server_bin, port, m.data)  # standalone: no cluster keys
    c, t = harness.client(port, 5000)
    stores[m.mark] = (m, proc, c, t)
    check(c.info().role == "standalone", "%s's data dir opens in a standalone server" % m.name)
    if m is ma:
        r = c.ring()
        check(len(r.partitions) == 1 and r.partitions[0].mark == 0 and
              ["%s:%d" % (x.host, x.port) for x in r.partitions[0].chain] == ["127.0.0.1:%d" % port],
              "a standalone server's ring() is one partition of mark 0 holding itself")
        check_error(lambda: c.peerGet(PeerContext(TOKEN, 1, A), 5), ErrorCode.NOT_OWNER,
                    "a standalone server answers a peer call NOT_OWNER")
    got, cursor = [], 0
    for _ in range(1000):
        r = c.scan(cursor, 100, False)
        got.extend((p.key, p.value) for p in r.pairs)
        if r.done:
            break
        cursor = r.nextKey
    want = [(k, v) for k, v in model_pairs() if owner(k) == m.mark]
    check(got == want, "%s's store holds exactly the %d integer keys mark %d owns (got %d)" %
          (m.name, len(want), m.mark, len(got)))
bad = []
for s in STR_KEYS:
    holders = [mark for mark, (_, _, c, _) in stores.items() if c.sget(s).found]
    want_holders = [] if model_s[s] is None else [owner(shash(s))] if xxhash else None
    if want_holders is None:
        good = len(holders) == 1 and stores[holders[0]][2].sget(s).value == model_s[s]
    else:
        good = holders == want_holders and all(stores[h][2].sget(s).value == model_s[s] for h in holders)
    if not good:
        bad.append("%r in %s" % (s, holders))
check(not bad, "each string key is in exactly its owner's store (%s)%s" %
      ("owner by XXH64 mod 2^63-1" if xxhash else "python3-xxhash missing: one store each",
       "" if not bad else ": " + "; ".join(bad[:3])))
for m, proc, c, t in stores.values():
    t.close()
    harness.stop(proc)

print("ring_test: %.1f s" % (time.monotonic() - T_START))
finished = True
harness.finish(work)
