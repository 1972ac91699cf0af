#!/usr/bin/python3
"""Process test of corrupt records: what a reader gets when a record on disk
fails its checksum (bit rot, a bad sector, a stray write), standalone and in
a chain (read repair, `flatkv admin verify`).

The records are damaged the way the disk would: one byte of a value is
flipped in the data file, under the running server (its value cache is off,
cache.capacity_bytes = 0, so every read goes to the file).

Standalone: get of the bad key is STORAGE_ERROR naming the file and offset;
multiGet answers every other key and marks only the bad one with its error;
scan skips it and counts it; `flatkv admin verify` reports it (exit 5); a
put over it makes the key good again; the server stays up throughout.
String keys (storage.string_slots = 8, so a bucket holds several keys): a
bad bucket makes its keys STORAGE_ERROR; an sput into it succeeds and
reads back while the bucket's other keys stay STORAGE_ERROR (never "not
found"); verify reports the bucket.

A chain of three (cluster.replication: sync, one mark): a bad record on the
tail is repaired at the first read (the head rewrites the key through the
chain); a key bad on the head and the tail is repaired from the middle
member's copy; `flatkv admin verify` on the head repairs a key bad only
there; a key bad on every member is STORAGE_ERROR, and nothing else is
lost. String keys are repaired by bucket the same way (bad on the tail;
bad on head and tail), and a replicated sput into a bucket bad on the
middle member (an sremove: it reads the bucket) does not stop it (no
exit 3): the bucket keeps the write with a
damaged mark, `flatkv admin verify` there repairs it from the chain.
Then a bucket is damaged on the tail and repaired by a read in 12 rounds
while a writer puts 30 other string keys through the head (some into that
bucket; the string-key table compacts meanwhile): every put is
acknowledged, no member stops (not even one applying a put into a bad
bucket that a running compaction has not copied yet), and every key reads its last acknowledged value afterwards.
Afterwards every key reads its value from every member and the chain's
digests are equal.

With a fifth argument "always" every server runs storage.sync: always, where
a repair (a serial event reading the store) first drains the member's sync
pipeline (server/member/replicator.h).

Usage: repair_test.py FLATKV_SERVER FLATKV_CLI THRIFT_COMPILER FLATKV_THRIFT [always]"""
import os
import random
import subprocess
import sys
import threading
import time

import harness
from harness import check, free_port

server_bin, cli_bin, thrift_bin, idl = sys.argv[1:5]
SYNC = sys.argv[5] if len(sys.argv) > 5 else "none"  # the default
work = harness.workdir("flatkv-repair-", thrift_bin, idl)
from flatkv.ttypes import ErrorCode, KvError, PeerContext  # noqa: E402

NO_CACHE = ("--set", "cache.capacity_bytes=0", "--set", "storage.string_slots=8",
            "--set", "storage.sync=" + SYNC)
KEYS = range(1, 201)
SKEYS = [b"skey-%02d" % i for i in range(40)]


def value(key):
    """A value that names its key and occurs nowhere else on disk."""
    return b"repair-test key=%08d " % key + b"abcdefghij" * (3 + key % 7)


def svalue(skey):
    """The same for a string key."""
    return b"repair-test skey=%s " % skey + b"klmnopqrst" * 4


def corrupt(data_dir, key):
    """Flips one byte in the middle of key's value (a string key's if key
    is bytes) wherever a data file of data_dir holds it (not in the chain
    log, which is not read by gets); returns how many copies it damaged."""
    needle = svalue(key) if isinstance(key, bytes) else value(key)
    hits = 0
    for root, _, files in os.walk(data_dir):
        for name in files:
            if name == "CHAINLOG":
                continue
            path = os.path.join(root, name)
            # A compaction may delete an old generation's files while this
            # walks (the phase with a writer beside the repairs): such a
            # file holds nothing the store still reads; skip it.
            try:
                with open(path, "rb") as f:
                    blob = f.read()
                at = blob.find(needle)
                while at >= 0:
                    with open(path, "r+b") as f:
                        f.seek(at + len(needle) // 2)
                        f.write(bytes([blob[at + len(needle) // 2] ^ 0x5a]))
                    hits += 1
                    at = blob.find(needle, at + 1)
            except FileNotFoundError:
                continue
    return hits


def cli(port, *args):
    return subprocess.run([cli_bin, "--port", str(port), *args], capture_output=True,
                          timeout=60)


def storage_error(fn):
    """The KvError code and message fn raises (None if it returns)."""
    try:
        fn()
    except KvError as e:
        return e.code, e.message
    return None, None


# --- Standalone ---------------------------------------------------------
port = free_port()
data = os.path.join(work, "standalone")
proc = harness.start(server_bin, port, data, *NO_CACHE)
c, t = harness.client(port, 10000)
for k in KEYS:
    c.put(k, value(k))
# With the sparse tier on (FLATKV_TEST_SERVER_SET), keys 1-200 live in it:
# too few for their segment to become a flat table.
TIER = "storage.sparse_tier=on" in os.environ.get("FLATKV_TEST_SERVER_SET", "").split()
if TIER:
    st = c.stats()
    check(st["engine.sparse_keys"] == len(KEYS) and st["engine.segments"] == 0,
          "every key is in the sparse tier")
check(corrupt(data, 17) == 1 and corrupt(data, 33) == 1, "one copy of keys 17 and 33 damaged")

code, msg = storage_error(lambda: c.get(17))
check(code == ErrorCode.STORAGE_ERROR and "offset" in msg and "data" in msg,
      "get of a bad record: STORAGE_ERROR naming the file and offset (%s)" % msg)
res = c.multiGet([16, 17, 18, 33, 999])
check(res[0].found and res[0].value == value(16) and res[2].found and res[2].value == value(18),
      "multiGet answers the good keys beside a bad one")
check(not res[1].found and res[1].errorCode == ErrorCode.STORAGE_ERROR and
      "offset" in (res[1].errorMessage or ""),
      "multiGet marks only the bad key with its error (%s)" % res[1].errorMessage)
check(res[3].errorCode == ErrorCode.STORAGE_ERROR and not res[4].found and
      res[4].errorCode is None, "a second bad key is marked; a missing key is just not found")
s = c.scan(0, 1000, False)
keys = [p.key for p in s.pairs]
check(s.done and keys == [k for k in KEYS if k not in (17, 33)] and
      all(p.value == value(p.key) for p in s.pairs),
      "scan skips the two bad records and returns every other pair intact")
check(c.stats()["engine.corrupt_records"] >= 2, "the bad records are counted in stats")
r = cli(port, "admin", "verify")
out = r.stdout.decode()
check(r.returncode == 5 and "corrupt 2" in out and "repaired 0" in out and
      "records %d" % (len(KEYS) - 2) in out and out.count("problem ") == 2 and "offset" in out,
      "admin verify reports both bad records with file and offset, exit 5: %r" % out[-300:])
check(cli(port, "admin", "verify", "--no-repair").returncode == 5,
      "admin verify --no-repair reports the same")
c.put(17, b"fresh")
check(c.get(17).value == b"fresh", "a put over a bad record makes the key good again")
r = cli(port, "admin", "verify")
check(r.returncode == 5 and "corrupt 1" in r.stdout.decode(), "verify then finds one bad record")
# String keys: a bad bucket fails the keys it holds, and takes new writes.
for k in SKEYS:
    c.sput(k, svalue(k))
check(corrupt(data, b"skey-05") >= 1, "the bucket of skey-05 damaged")
bad = [k for k in SKEYS if storage_error(lambda: c.sget(k))[0] == ErrorCode.STORAGE_ERROR]
check(b"skey-05" in bad and len(bad) < len(SKEYS),
      "the keys of the bad bucket are STORAGE_ERROR, the others read (%s)" % bad)
check(all(c.sget(k).value == svalue(k) for k in SKEYS if k not in bad),
      "every key of the other buckets reads its value")
check(len(bad) >= 2, "the bad bucket holds other keys too")
check(c.sremove(b"skey-05") is not None and not c.sget(b"skey-05").found,
      "an sremove in the bad bucket succeeds (it read the bucket: the damage was found)")
c.sput(b"skey-05", b"after the damage")
check(c.sget(b"skey-05").value == b"after the damage",
      "an sput into the bad bucket succeeds and reads back")
check(all(storage_error(lambda: c.sget(k))[0] == ErrorCode.STORAGE_ERROR
          for k in bad if k != b"skey-05"),
      "the bucket's other keys stay STORAGE_ERROR, never 'not found'")
# With the sparse tier, the put over bad key 17 wrote its tier bucket anew
# with a damaged mark too.
check(c.stats()["engine.buckets_damaged"] == (2 if TIER else 1),
      "the damaged bucket is counted in stats")
r = cli(port, "admin", "verify")
check(r.returncode == 5 and "string-key bucket" in r.stdout.decode(),
      "admin verify reports the damaged bucket: %r" % r.stdout.decode()[-300:])
check(proc.poll() is None, "the standalone server stayed up")
t.close()
harness.stop(proc)

# --- A chain of three ---------------------------------------------------
SESSION_MS = 1500
MARK = 1 << 40
zk = harness.ZooKeeper(work)


class Member:
    def __init__(self, name):
        self.name = name
        self.port = free_port()
        self.data = os.path.join(work, name)
        self.log = os.path.join(work, name + ".log")
        self.proc = harness.start_member(
            server_bin, self.port, self.data, zk, MARK, *NO_CACHE,
            "--set", "storage.key_max=1000000", log=self.log, session_timeout_ms=SESSION_MS)

    def call(self, fn, timeout_ms=10000):
        """fn through this member, sent again (as a client does: nothing was
        applied) for up to 5 s while the member cannot serve for a lapsed
        ZooKeeper lease (a loaded machine: the session is 1.5 s):
        UNAVAILABLE, or a repair refused for want of the lease."""
        for _ in range(50):
            try:
                return harness.call(self.port, fn, timeout_ms)
            except KvError as e:
                if e.code != ErrorCode.UNAVAILABLE and "no ZooKeeper lease" not in e.message:
                    raise
                time.sleep(0.1)
        return harness.call(self.port, fn, timeout_ms)

    def role(self):
        return self.call(lambda c: c.info().role, 2000)


def wait_until(what, cond, timeout=30.0):
    return harness.wait_until(work, what, cond, timeout, 0.05)


def chain_size():
    return sum(1 for c in zk.members() if c.startswith("thriftbinary%d:" % MARK))


members = [Member("m0")]
wait_until("the first member registered", lambda: chain_size() == 1)
members += [Member("m1"), Member("m2")]
wait_until("a chain of 3", lambda: chain_size() == 3 and
           sorted(m.role() for m in members) == ["head", "middle", "tail"])
role = {m.role(): m for m in members}
head, middle, tail = role["head"], role["middle"], role["tail"]
for k in KEYS:
    head.call(lambda c: c.put(k, value(k)))


def repairs():
    return head.call(lambda c: c.stats()).get("cluster.chain.repairs", -1)


# A bad record on the tail, which serves reads: repaired at the first read.
check(corrupt(tail.data, 10) == 1, "key 10 damaged on the tail")
before = repairs()
got = middle.call(lambda c: c.get(10))  # forwarded to the tail
check(got.found and got.value == value(10), "a read of a key bad on the tail returns its value")
check(repairs() == before + 1, "the head rewrote the key through the chain")
check(tail.call(lambda c: c.stats())["engine.corrupt_records"] >= 1,
      "the tail counted the bad record")
check(tail.call(lambda c: c.get(10)).value == value(10), "the tail's copy reads good again")

# Bad on the head and the tail: the head takes the middle member's copy.
check(corrupt(head.data, 20) == 1 and corrupt(tail.data, 20) == 1, "key 20 damaged twice")
res = tail.call(lambda c: c.multiGet([19, 20, 21]))
check([r.value for r in res] == [value(19), value(20), value(21)] and
      all(r.errorCode is None for r in res),
      "multiGet repairs a key bad on head and tail from the middle member's copy")

# Bad only on the head (no read would meet it): admin verify repairs it.
check(corrupt(head.data, 30) == 1, "key 30 damaged on the head")
r = cli(head.port, "admin", "verify")
out = r.stdout.decode()
check(r.returncode == 0 and "corrupt 1" in out and "repaired 1" in out,
      "admin verify on the head finds and repairs the bad record: %r" % out[-300:])
r = cli(head.port, "admin", "verify")
check(r.returncode == 0 and "corrupt 0" in r.stdout.decode(), "a second verify finds nothing")

# String keys, repaired by bucket.
for k in SKEYS:
    head.call(lambda c: c.sput(k, svalue(k)))
check(corrupt(tail.data, b"skey-01") >= 1, "the bucket of skey-01 damaged on the tail")
before = repairs()
got = middle.call(lambda c: c.sget(b"skey-01"))  # forwarded to the tail
check(got.found and got.value == svalue(b"skey-01"),
      "a read of a string key bad on the tail returns its value")
check(repairs() == before + 1, "the head rewrote the bucket through the chain")
check(all(tail.call(lambda c: c.sget(k)).value == svalue(k) for k in SKEYS),
      "every string key reads its value from the tail after the repair")
check(corrupt(head.data, b"skey-02") >= 1 and corrupt(tail.data, b"skey-02") >= 1,
      "the bucket of skey-02 damaged on head and tail")
got = tail.call(lambda c: c.sget(b"skey-02"))
check(got.found and got.value == svalue(b"skey-02"),
      "a bucket bad on head and tail is repaired from the middle member's copy")
# Bad on the middle member, then a write into that bucket passes through
# it: the member must not stop (exit 3), then or at a restart.
check(corrupt(middle.data, b"skey-03") >= 1, "the bucket of skey-03 damaged on the middle")
head.call(lambda c: c.sremove(b"skey-03"))  # reads the bucket on every member
check(not tail.call(lambda c: c.sget(b"skey-03")).found,
      "the write through a member with a bad bucket is acknowledged and read")
check(middle.call(lambda c: c.stats())["engine.buckets_damaged"] == 1,
      "the middle member kept the write in a bucket marked damaged")
check(middle.proc.poll() is None, "the middle member stayed up")
r = cli(middle.port, "admin", "verify", "--no-repair")
check(r.returncode == 5 and "string-key bucket" in r.stdout.decode(),
      "verify on the middle member reports the damaged bucket: %r" % r.stdout.decode()[-300:])
r = cli(middle.port, "admin", "verify")
check(r.returncode == 0 and "repaired 1" in r.stdout.decode(),
      "verify on the middle member repairs it from the chain: %r" % r.stdout.decode()[-300:])
r = cli(middle.port, "admin", "verify")
check(r.returncode == 0 and "corrupt 0" in r.stdout.decode(), "a second verify finds nothing")
# The peer call itself refuses what it cannot serve, precisely.
ctx = PeerContext("", 0, MARK)
code, msg = storage_error(lambda: tail.call(lambda c: c.peerBucket(ctx, 16, 0, False)))
check(code == ErrorCode.INVALID_ARGUMENT and "string_slots" in msg,
      "peerBucket for another storage.string_slots is INVALID_ARGUMENT saying so (%s)" % msg)
code, msg = storage_error(lambda: tail.call(lambda c: c.peerBucket(ctx, 8, 8, False)))
check(code == ErrorCode.INVALID_ARGUMENT, "peerBucket for a slot out of range is INVALID_ARGUMENT")
code, msg = storage_error(lambda: middle.call(lambda c: c.peerBucket(ctx, 8, 0, True)))
check(code == ErrorCode.NOT_OWNER and "head" in msg,
      "a repair asked of a member that is not the head is NOT_OWNER (%s)" % msg)
code, msg = storage_error(lambda: tail.call(lambda c: c.peerBucket(PeerContext("", 0, 7), 8, 0,
                                                                       False)))
check(code == ErrorCode.NOT_OWNER, "peerBucket routed to another mark is NOT_OWNER")
svals = dict((k, svalue(k)) for k in SKEYS)
del svals[b"skey-03"]

# A bucket repaired again and again while a writer keeps putting string
# keys (30 keys over the 8 buckets, so about 4 share each bucket, the bad
# one too): a repair rewrites the bucket from the head's copy with the
# writes the chain has not committed yet laid over it, and must never put
# back an older value of a key written meanwhile, nor drop a key.
WKEYS = [b"wkey-%02d" % i for i in range(30)]
acked = {}  # key -> the last version acknowledged
stop_writer = threading.Event()
writer_errors = []


def wvalue(skey, version):
    return b"repair-writer %s v%06d " % (skey, version) + b"uvwxyz" * 5


def writer():
    rng = random.Random(7)
    c, t = harness.client(head.port, 10000)
    version = 0
    try:
        while not stop_writer.is_set():
            version += 1
            k = rng.choice(WKEYS)
            for _ in range(50):  # the same put again until acknowledged
                try:
                    c.sput(k, wvalue(k, version))
                    acked[k] = version
                    break
                except KvError as e:
                    writer_errors.append(e.message)
                    time.sleep(0.01)
            else:
                writer_errors.append("sput of %r never acknowledged" % k)
                return
    finally:
        t.close()


wt = threading.Thread(target=writer, daemon=True)  # a failed check must not hang on it
wt.start()
time.sleep(0.3)
before = repairs()
rounds_bad = 0
for _ in range(12):
    if corrupt(tail.data, b"skey-05") == 0:
        continue
    rounds_bad += 1
    got = tail.call(lambda c: c.sget(b"skey-05"))
    check(got.found and got.value == svalue(b"skey-05"),
          "a read of a bucket bad on the tail while writes go into it returns the value")
    time.sleep(0.05)
stop_writer.set()
wt.join()
check(rounds_bad >= 10 and repairs() >= before + 1,
      "the bucket was damaged in %d rounds and repaired %d times under writes" %
      (rounds_bad, repairs() - before))
# A head whose ZooKeeper lease lapsed (a loaded machine: the session is
# 1.5 s) refuses writes as not applied, and the writer sends them again;
# every other refusal is the repairs' doing.
lease = [e for e in writer_errors if e.startswith("no ZooKeeper lease")]
other = [e for e in writer_errors if not e.startswith("no ZooKeeper lease")]
print("sputs refused for a lapsed lease and sent again: %d" % len(lease))
check(not other, "every sput beside the repairs was acknowledged (%s)" % other[:3])
check(len(acked) == len(WKEYS), "the writer wrote every key (%d)" % len(acked))
for m in members:
    r = cli(m.port, "admin", "verify", "--no-repair")
    check(r.returncode == 0 and "corrupt 0" in r.stdout.decode(),
          "%s: nothing bad after the repairs under writes: %r" % (m.name, r.stdout.decode()[-200:]))
for m in members:
    vals = [m.call(lambda c: c.sget(k)) for k in WKEYS]
    check(all(v.found and v.value == wvalue(k, acked[k]) for k, v in zip(WKEYS, vals)),
          "through %s: every key the writer wrote reads its last acknowledged value" % m.name)
svals.update((k, wvalue(k, acked[k])) for k in WKEYS)

# Bad everywhere: an error, never a wrong value, and the members stay up.
check(all(corrupt(m.data, 40) == 1 for m in members), "key 40 damaged on every member")
code, msg = storage_error(lambda: tail.call(lambda c: c.get(40)))
check(code == ErrorCode.STORAGE_ERROR and "repair" in msg,
      "a key bad on every member is STORAGE_ERROR saying the repair failed (%s)" % msg)

# Everything else intact everywhere (sync: the tail serves reads; the
# others' copies through admin verify and the digests).
good = [k for k in KEYS if k != 40]
vals = tail.call(lambda c: c.multiGet(good))
check(all(v.found and v.value == value(k) for k, v in zip(good, vals)),
      "every other key reads its value from the tail")
for m in members:
    r = cli(m.port, "admin", "verify", "--no-repair")
    check(r.returncode == 5 and "corrupt 1" in r.stdout.decode(),
          "%s: only key 40 is bad" % m.name)
head.call(lambda c: c.put(40, value(40)))
digests = [m.call(lambda c: c.digest("")) for m in members]
check(len({(d.keys, d.stringKeys, d.digest) for d in digests}) == 1 and
      digests[0].keys == len(KEYS) and digests[0].stringKeys == len(SKEYS) - 1 + len(WKEYS),
      "equal digests across the chain after the rewrite of key 40")
check(all(tail.call(lambda c: c.sget(k)).value == v for k, v in svals.items()) and
      not tail.call(lambda c: c.sget(b"skey-03")).found, "every string key reads its value")
check(all(m.proc.poll() is None for m in members), "every member stayed up")
harness.finish(work)
