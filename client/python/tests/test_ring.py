"""The client against a real ring: a loopback ZooKeeper and two marks of two
flatkv-server members each (sync replication), started by
tests/integration/harness.py. Calls go straight to their owner (no member
forwards anything), batches and scans span both marks, and when a member
is killed with kill -9 mid-run the calls fail over as client/python/README.md
says: the ring is read again, writes go to the new head, reads to the new
tail, every acknowledged write is there, and a mark left with no member is
UNAVAILABLE while the other keeps serving.

The tests share one ring and run in file order: the kills come last."""
import os
import signal
import threading
import time

import pytest

import flatkv

import harness

MARK_A, MARK_B = 1000000, 2000000  # A: keys < 1M and >= 2M; B: [1M, 2M)
HASH_BOUND = 3000000               # string keys land in both marks
SESSION_MS = 1500


def wait_for(what, cond, timeout=30.0):
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, "%s within %.0f s" % (what, timeout)
        time.sleep(0.05)


class RingMember:
    def __init__(self, work, server_bin, zk, name, mark):
        self.name, self.mark = name, mark
        self.port = harness.free_port()
        self.address = "127.0.0.1:%d" % self.port
        self.proc = harness.start_member(
            server_bin, self.port, os.path.join(work, name), zk, mark,
            "--set", "cluster.replication=sync", "--set", "cluster.hash_bound=%d" % HASH_BOUND,
            log=os.path.join(work, name + ".log"), session_timeout_ms=SESSION_MS)

    def stats(self):
        return harness.call(self.port, lambda c: c.stats(), 3000)

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


class Ring:
    def __init__(self, work, server_bin):
        self.zk = harness.ZooKeeper(work)
        self.members = []
        for mark, names in ((MARK_A, ("a0", "a1")), (MARK_B, ("b0", "b1"))):
            for name in names:
                self.members.append(RingMember(work, server_bin, self.zk, name, mark))
                # One at a time: the chain's order is the order of registration.
                wait_for("%s in the ring" % name, lambda: name in self.names_in_ring())
        assert harness.wait_serving(self.members[0].port, [0, MARK_A, MARK_B - 1], 30) is not None

    def names_in_ring(self):
        chains, _ = harness.ring_of(self.members[0].port)
        if not chains:
            return set()
        return {m.name for m in self.members
                if any(m.address in chain for chain in chains.values())}

    def by_address(self, address):
        return next(m for m in self.members if m.address == address)

    def alive(self):
        return [m for m in self.members if m.proc.poll() is None]


@pytest.fixture(scope="module")
def ring(server_bin, tmp_path_factory):
    r = Ring(str(tmp_path_factory.mktemp("ring")), server_bin)
    yield r
    for m in r.members:
        if m.proc.poll() is None:
            m.proc.kill()
            m.proc.wait()
    r.zk.close()


PEER_CALLS = ("peerGet", "peerPut", "peerRemove", "peerAppend", "peerMultiGet", "peerMultiPut",
              "peerSGet", "peerSPut", "peerSRemove")


def peer_calls(ring):
    return {m.name: sum(m.stats()["calls." + c] for c in PEER_CALLS) for m in ring.alive()}


def test_the_ring_is_read_from_any_instance_that_answers(ring):
    dead = "127.0.0.1:%d" % harness.free_port()
    kv = flatkv.Client(seeds=[dead, ring.members[2].address])
    r = kv.ring()
    assert r.marks == [MARK_A, MARK_B] and r.replication == "sync"
    assert r.hash_bound == HASH_BOUND
    assert [sorted(c) for c in r.chains] == [sorted(m.address for m in ring.members[:2]),
                                             sorted(m.address for m in ring.members[2:])]


def test_calls_go_straight_to_the_member_that_serves_them(ring):
    kv = flatkv.Client(seeds=[ring.members[0].address])  # one address is enough
    before = peer_calls(ring)
    puts_before = {m.name: m.stats()["calls.put"] for m in ring.members}
    keys = list(range(0, 3000000, 10007))  # both marks
    for k in keys:
        kv.put(k, b"v%d" % k)
    for i in range(200):
        kv.sput("user:%d" % i, b"s%d" % i)
    assert [kv.get(k) for k in keys] == [b"v%d" % k for k in keys]
    assert [kv.sget("user:%d" % i) for i in range(200)] == [b"s%d" % i for i in range(200)]
    kv.multi_put({k + 1: b"m%d" % k for k in keys})
    assert kv.multi_get([k + 1 for k in keys]) == [b"m%d" % k for k in keys]
    kv.append(keys[5], b"+")
    assert kv.get(keys[5]) == b"v%d+" % keys[5]
    assert kv.remove(keys[6]) is True and kv.get(keys[6]) is None
    # No member forwarded a call to another: each went to its owner.
    assert peer_calls(ring) == before
    # Writes entered at each mark's head, and only there.
    r = kv.ring()
    heads = {ring.by_address(chain[0]).name for chain in r.chains}
    grew = {m.name for m in ring.members if m.stats()["calls.put"] > puts_before[m.name]}
    assert grew == heads and len(heads) == 2
    # String keys were spread over both marks by their XXH64 hash.
    owners = {r.owner(r.hash_string(b"user:%d" % i)) for i in range(200)}
    assert owners == {0, 1}


def test_scan_walks_every_mark_in_key_order(ring):
    kv = flatkv.Client(seeds=[ring.members[3].address])
    keys = [5, MARK_A - 1, MARK_A, MARK_A + 7, MARK_B - 1, MARK_B, MARK_B + 3]
    for k in keys:
        kv.put(50000000 + k, b"x")  # a range of its own: [50M, 52M) is mark A's
    span = [k for k, _ in kv.scan(start=49000000, stop=53000000, page_size=2)]
    assert span == [50000000 + k for k in keys]
    everything = [k for k, _ in kv.scan(page_size=500)]
    assert everything == sorted(set(everything)) and set(span) <= set(everything)
    assert {k for k in everything if k < MARK_A} and {k for k in everything if k >= MARK_B}
    assert [k for k, _ in kv.scan(start=53000000, stop=49000000, reverse=True)] == \
        [50000000 + k for k in reversed(keys)]


class Writers:
    """Threads sharing one client, putting versioned values (harness) to keys
    of both marks (disjoint keys per thread), recording per mark every
    error and when each acknowledged put started and returned."""

    def __init__(self, kv, keys_by_mark, threads=4):
        self.kv = kv
        self.acked, self.attempted = {}, {}
        self.errors = {MARK_A: [], MARK_B: []}
        self.acks = {MARK_A: [], MARK_B: []}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = []
        for i in range(threads):
            mine = [(mark, k) for mark, ks in keys_by_mark.items() for k in ks[i::threads]]
            t = threading.Thread(target=self.run, args=(mine,), daemon=True)
            t.start()
            self.threads.append(t)

    def run(self, mine):
        n = 0
        while not self.stop.is_set():
            mark, key = mine[n % len(mine)]
            n += 1
            with self.lock:
                v = self.attempted[key] = self.attempted.get(key, 0) + 1
            started = time.monotonic()
            try:
                self.kv.put(key, harness.versioned(key, v))
            except Exception as e:  # noqa: BLE001 (every kind is judged)
                with self.lock:
                    self.errors[mark].append((time.monotonic(), e))
                time.sleep(0.02)
                continue
            with self.lock:
                self.acked[key] = max(self.acked.get(key, 0), v)
                self.acks[mark].append((started, time.monotonic()))

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(30)

    def judge(self):
        keys = sorted(self.acked)
        bad = []
        for key, got in zip(keys, self.kv.multi_get(keys)):
            harness.judge_versioned(key, got, self.acked[key], self.attempted, bad)
        return bad


def test_kill9_of_a_head_mid_run_fails_over_to_the_new_head(ring):
    kv = flatkv.Client(seeds=[m.address for m in ring.members], timeout=5.0)
    r0 = kv.ring()
    head_a = ring.by_address(r0.chains[0][0])
    keys = {MARK_A: [100 + i for i in range(40)], MARK_B: [MARK_A + 100 + i for i in range(40)]}
    w = Writers(kv, keys)
    time.sleep(1.0)
    killed_at = time.monotonic()
    head_a.kill9()
    time.sleep(4.0)
    w.finish()
    # Writes to mark A are acknowledged again soon after (docs/ring.md, "A
    # member's process dies": a member killed on a live host leaves within a fraction of a
    # second) and the other mark never noticed.
    after = [end for start, end in w.acks[MARK_A] if start > killed_at]
    print("mark A: %d errors, first ack %.3f s after the kill; %d acks" %
          (len(w.errors[MARK_A]), after[0] - killed_at if after else -1, len(w.acks[MARK_A])))
    for t, e in w.errors[MARK_A]:
        print("  %.3f %r" % (t - killed_at, e))
    assert after, "no write to mark A acknowledged after the kill"
    assert after[0] - killed_at < 3.0
    assert w.errors[MARK_B] == []
    # Whatever a caller saw is a typed error it may retry (a put is
    # idempotent); the default retries rode over the failover.
    for _, e in w.errors[MARK_A]:
        assert isinstance(e, flatkv.FlatKVError) and e.retryable, repr(e)
    assert len(w.errors[MARK_A]) <= 4, [repr(e) for _, e in w.errors[MARK_A]]
    # The client routes by the new ring: the dead member is gone from it.
    r1 = kv.ring()
    assert r1.version > r0.version and head_a.address not in r1.members()
    # Every acknowledged write is there, read from the new chains' tails.
    assert w.judge() == []


def test_kill9_of_a_tail_moves_reads_to_the_new_tail(ring):
    kv = flatkv.Client(seeds=[m.address for m in ring.alive()], timeout=5.0)
    keys = [MARK_A + 500 + i for i in range(50)]
    kv.multi_put({k: b"t%d" % k for k in keys})
    tail_b = ring.by_address(kv.ring().chains[1][-1])
    wrong, errors = [], []
    stop = threading.Event()

    def reader():
        while not stop.is_set():
            for k in keys:
                try:
                    if kv.get(k) != b"t%d" % k:
                        wrong.append(k)
                except Exception as e:  # noqa: BLE001 (judged below)
                    errors.append(e)
    t = threading.Thread(target=reader)
    t.start()
    time.sleep(0.5)
    tail_b.kill9()
    time.sleep(3.0)
    stop.set()
    t.join(30)
    assert wrong == []
    for e in errors:
        assert isinstance(e, flatkv.FlatKVError) and e.retryable and not e.in_doubt, repr(e)
    assert len(errors) <= 4, [repr(e) for e in errors]
    assert kv.multi_get(keys) == [b"t%d" % k for k in keys]
    assert tail_b.address not in kv.ring().members()


def test_a_mark_without_members_is_unavailable_and_the_other_serves(ring):
    kv = flatkv.Client(seeds=[m.address for m in ring.alive()], timeout=5.0, retries=2,
                       retry_backoff=0.05)
    for m in ring.alive():
        if m.mark == MARK_B:
            m.kill9()
    deadline = time.monotonic() + 15
    while True:
        try:
            kv.get(MARK_A + 1)
        except flatkv.Unavailable as e:
            err = e
            break
        except flatkv.ConnectionError:
            pass  # the ring still lists the member just killed
        assert time.monotonic() < deadline, "mark B never became UNAVAILABLE"
        time.sleep(0.1)
    assert err.retryable and not err.in_doubt and str(MARK_B) in err.message
    with pytest.raises(flatkv.Unavailable):
        kv.put(MARK_A + 1, b"x")
    kv.put(7, b"still served")
    assert kv.get(7) == b"still served"
