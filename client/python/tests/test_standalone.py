"""The client against one real standalone flatkv-server: every call's
answer, scans as generators of pages, typed errors from the server and from
the network, timeouts, the pool shared by threads, and connections that go
stale when the server restarts."""
import os
import random
import signal
import threading
import time

import pytest

import flatkv
from flatkv import ErrorCode, WriteMode

import harness


def client_of(server, **kw):
    kw.setdefault("timeout", 10.0)
    return flatkv.Client("127.0.0.1", server.port, **kw)


def test_calls_answer_like_the_service_contract(standalone):
    s = standalone()
    kv = client_of(s)
    assert kv.get(1) is None  # absent is not an error
    kv.put(1, b"hello")
    assert kv.get(1) == b"hello"
    kv.append(1, " world")  # str is sent as UTF-8
    kv.append(2, b"new")    # append creates
    assert kv.get(1) == b"hello world" and kv.get(2) == b"new"
    assert kv.remove(1) is True and kv.remove(1) is False and kv.get(1) is None
    kv.sput("user:42", b'{"name":"ada"}')
    assert kv.sget(b"user:42") == b'{"name":"ada"}' and kv.sget("user:43") is None
    assert kv.sremove("user:42") is True and kv.sremove("user:42") is False
    kv.multi_put({10: b"v10", 11: b"v11"})
    kv.multi_put([(12, b"v12")])
    assert kv.multi_get([12, 99, 10, 11]) == [b"v12", None, b"v10", b"v11"]
    assert kv.multi_get([]) == []
    # Another client (a plain Thrift connection) sees the same data.
    assert harness.call(s.port, lambda c: c.get(12).value) == b"v12"
    text = client_of(s, decode_responses=True)
    assert text.get(10) == "v10" and list(text.scan(start=10, stop=12)) == [(10, "v10"),
                                                                            (11, "v11")]


def test_scan_is_a_generator_that_asks_for_one_page_at_a_time(standalone):
    s = standalone()
    kv = client_of(s)
    keys = random.Random(1).sample(range(0, 100000), 2500)
    kv.multi_put({k: b"%d" % k for k in keys})
    calls = lambda: s.stats()["calls.scan"]  # noqa: E731
    before = calls()
    gen = kv.scan(page_size=100)
    assert calls() == before  # nothing asked before the first pair is used
    first = next(gen)
    assert first == (min(keys), b"%d" % min(keys)) and calls() == before + 1
    rest = list(gen)
    assert [k for k, _ in [first] + rest] == sorted(keys)
    assert calls() - before >= 25  # 2500 pairs, at most 100 a page
    assert [k for k, _ in kv.scan(reverse=True)] == sorted(keys, reverse=True)
    mid = sorted(keys)[1000]
    assert [k for k, _ in kv.scan(start=mid, stop=mid + 5000)] == \
        [k for k in sorted(keys) if mid <= k < mid + 5000]
    assert [k for k, _ in kv.scan(start=mid, reverse=True, page_size=7)] == \
        [k for k in sorted(keys, reverse=True) if k <= mid]
    # scan_log: the store in write order (docs/engine.md, "Iteration"), every key
    # once, a page per call.
    before = s.stats()["calls.scanLog"]
    logged = [k for k, _ in kv.scan_log(page_size=300)]
    assert sorted(logged) == sorted(keys)
    assert s.stats()["calls.scanLog"] - before >= 9
    page = kv.scan_page(0, 10)
    assert len(page.pairs) == 10 and not page.done and page.nextKey > page.pairs[-1].key


def test_server_errors_are_typed_and_not_retried(standalone):
    s = standalone("--set", "storage.max_value_bytes=1000", "--set", "storage.max_key_bytes=16",
                   "--set", "admin.token=secret")
    kv = client_of(s, retries=3)
    errors = lambda: s.stats()["errors.put"]  # noqa: E731
    before = errors()
    with pytest.raises(flatkv.KeyOutOfRange) as e:
        kv.put(-5, b"x")
    assert e.value.code == ErrorCode.KEY_OUT_OF_RANGE and "outside" in e.value.message
    assert not e.value.retryable and not e.value.in_doubt and e.value.method == "put"
    assert errors() == before + 1  # sent once: nothing to gain from a retry
    with pytest.raises(flatkv.ValueTooLarge) as e:
        kv.put(1, b"x" * 1001)
    assert not e.value.retryable and not e.value.in_doubt and kv.get(1) is None
    with pytest.raises(flatkv.InvalidArgument) as e:
        kv.sput(b"k" * 17, b"v")
    assert not e.value.retryable
    with pytest.raises(flatkv.Unauthorized) as e:
        kv.set_write_mode(WriteMode.ASYNC)  # no token given
    assert not e.value.retryable and kv.get_write_mode() == WriteMode.SAFE
    admin = client_of(s, admin_token="secret")
    admin.set_write_mode(WriteMode.ASYNC)
    assert kv.get_write_mode() == WriteMode.ASYNC
    # A batch with one bad value writes nothing (the server checks it whole).
    with pytest.raises(flatkv.ValueTooLarge):
        kv.multi_put({2: b"ok", 3: b"y" * 2000})
    assert kv.multi_get([2, 3]) == [None, None]
    # Every error is a FlatKVError; client-side misuse is a TypeError/ValueError.
    assert issubclass(flatkv.KeyOutOfRange, flatkv.FlatKVError)
    with pytest.raises(TypeError):
        kv.put("1", b"x")
    with pytest.raises(ValueError):
        kv.get(1 << 64)


def test_overloaded_is_typed_not_applied_and_retried_with_backoff(standalone):
    # One worker, a queue of one and a fdatasync per put: calls sent at once
    # find the queue full (docs/application.md, "Limits, overload and bad input").
    s = standalone("--set", "server.workers=1", "--set", "server.max_queued_calls=1",
                   "--set", "storage.sync=always")

    def burst(kv, base):
        start = threading.Barrier(16)
        out = {}

        def one(i):
            start.wait()
            try:
                kv.put(base + i, b"z" * 200000)
                out[base + i] = None
            except flatkv.FlatKVError as e:
                out[base + i] = e
        threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return out

    no_retry = client_of(s, retries=0, retry_backoff=0.0, max_connections=16)
    got = {}
    for round_ in range(5):  # until a burst meets a full queue
        got = burst(no_retry, round_ * 100)
        if any(e is not None for e in got.values()):
            break
    failed = {k: e for k, e in got.items() if e is not None}
    assert failed, "no put of 5 bursts of 16 met a full queue"
    for k, e in failed.items():
        assert isinstance(e, flatkv.Overloaded) and e.retryable and not e.in_doubt
        assert "server.max_queued_calls" in e.message
    present = no_retry.multi_get(sorted(got))
    for k, value in zip(sorted(got), present):
        assert (value is None) == (k in failed)  # not applied means absent
    patient = client_of(s, retries=8, retry_backoff=0.05, max_connections=16)
    assert all(e is None for e in burst(patient, 1000).values())
    assert s.stats()["server.overloaded"] >= len(failed)


def test_network_failures_say_whether_the_call_was_sent(standalone, work):
    port = harness.free_port()  # nothing listens here
    kv = flatkv.Client("127.0.0.1", port, retries=2, retry_backoff=0.01, connect_timeout=1)
    t0 = time.monotonic()
    with pytest.raises(flatkv.ConnectionError) as e:
        kv.append(1, b"x")
    assert time.monotonic() - t0 < 5
    assert not e.value.sent and not e.value.in_doubt and e.value.retryable
    assert "refused" in str(e.value)


def test_a_dead_address_beside_a_live_one_is_skipped_until_none_can_serve(standalone, work):
    s = standalone()
    dead = "127.0.0.1:%d" % harness.free_port()  # nothing listens here
    clients = [flatkv.Client(seeds=seeds, retries=1, retry_backoff=0.01, connect_timeout=1,
                             timeout=10)
               for seeds in ([dead, s.address], [s.address, dead])]
    for n, kv in enumerate(clients):
        for k in range(20):
            kv.put(k, b"v%d.%d" % (n, k))
        assert kv.multi_get(range(20)) == [b"v%d.%d" % (n, k) for k in range(20)]
        assert list(kv.scan(0, 20)) == [(k, b"v%d.%d" % (n, k)) for k in range(20)]
        assert kv.ring().standalone

    s.proc.kill()  # kill -9: now no address can serve
    s.proc.wait()
    for kv in clients:
        with pytest.raises(flatkv.ConnectionError) as e:
            kv.get(1)
        assert e.value.address == s.address and s.address in str(e.value)
        assert not e.value.sent and not e.value.in_doubt and e.value.retryable
    # A client that never reached either names both.
    fresh = flatkv.Client(seeds=[dead, s.address], retries=0, connect_timeout=1)
    with pytest.raises(flatkv.ConnectionError) as e:
        fresh.put(1, b"x")
    assert dead in str(e.value) and s.address in str(e.value) and not e.value.in_doubt

    # The live address back (the same port and store): every client serves again.
    s.proc = harness.start(s.server_bin, s.port, s.data, *s.extra)
    for kv in clients + [fresh]:
        assert kv.get(19) == b"v1.19"
        kv.put(100, b"back")


def wait_stopped(pid):
    """Returns once every thread of "pid" is stopped (a signal is delivered
    asynchronously: a thread may still answer a call right after kill())."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        states = []
        for tid in os.listdir("/proc/%d/task" % pid):
            with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        if all(st in ("T", "t") for st in states):
            return
        time.sleep(0.01)
    raise AssertionError("process %d did not stop" % pid)


def test_a_paused_server_times_out_and_writes_are_in_doubt(standalone):
    s = standalone()
    kv = client_of(s, timeout=0.5, retries=3, retry_backoff=0.01)
    kv.put(7, b"before")
    pooled = client_of(s, timeout=2.0, max_connections=1, pool_timeout=0.3)
    pooled.get(7)  # it knows the ring
    os.kill(s.proc.pid, signal.SIGSTOP)
    try:
        wait_stopped(s.proc.pid)
        t0 = time.monotonic()
        with pytest.raises(flatkv.TimeoutError) as e:
            kv.put(7, b"during")
        # A timeout is tried again once, no more (each costs the timeout).
        assert 0.9 < time.monotonic() - t0 < 3.0
        assert e.value.sent and e.value.in_doubt and e.value.retryable
        with pytest.raises(flatkv.TimeoutError) as e:
            kv.append(7, b"+")
        assert e.value.in_doubt and not e.value.retryable
        with pytest.raises(flatkv.TimeoutError) as e:
            kv.get(7)
        assert not e.value.in_doubt and e.value.retryable
        # The pool's only connection is lent out: the next caller waits
        # pool_timeout, then gets PoolTimeout (nothing sent).
        held = []

        def hold():
            try:
                pooled.get(7)
            except flatkv.FlatKVError as e:
                held.append(e)
        holder = threading.Thread(target=hold)
        holder.start()
        time.sleep(0.1)
        t0 = time.monotonic()
        with pytest.raises(flatkv.PoolTimeout) as e:
            pooled.get(8)
        # Raised at once, not retried: a full pool is the caller's to handle.
        assert 0.25 < time.monotonic() - t0 < 0.55 and e.value.retryable and not e.value.in_doubt
        holder.join()
        assert len(held) == 1 and isinstance(held[0], flatkv.TimeoutError)
    finally:
        os.kill(s.proc.pid, signal.SIGCONT)
    # Awake, it serves again; the value is one that a call wrote (the writes
    # in doubt may or may not have taken effect).
    assert kv.get(7) in (b"before", b"during", b"during+", b"before+")


def test_one_client_shared_by_threads_within_its_pool_bound(standalone):
    s = standalone()
    accepted = s.stats()["server.connections_accepted"]
    kv = client_of(s, max_connections=4)
    failures = []

    def worker(n):
        rng = random.Random(n)
        mine = {}
        try:
            for i in range(300):
                key = n * 1000 + rng.randrange(50)
                op = rng.random()
                if op < 0.5:
                    value = b"%d-%d" % (n, i)
                    kv.put(key, value)
                    mine[key] = value
                elif op < 0.6:
                    kv.remove(key)
                    mine.pop(key, None)
                elif op < 0.7:
                    keys = sorted(mine)[:5]
                    if kv.multi_get(keys) != [mine[k] for k in keys]:
                        failures.append("thread %d: multi_get of its own keys" % n)
                else:
                    if kv.get(key) != mine.get(key):
                        failures.append("thread %d: key %d read another value" % (n, key))
        except Exception as e:  # noqa: BLE001 (reported below)
            failures.append("thread %d: %r" % (n, e))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    opened, idle = kv.pool_sizes()[s.address]
    assert 1 <= opened <= 4 and idle == opened  # every connection given back
    # The server saw no more than those (and this stats call).
    assert s.stats()["server.connections_accepted"] - accepted <= 4 + 1


def test_pooled_connections_survive_a_server_restart(standalone):
    s = standalone()
    kv = client_of(s, max_connections=4)
    kv.put(5, b"a")
    assert kv.pool_sizes()[s.address][1] == 1  # one idle connection
    s.restart()
    # The idle connection is stale: it is dropped before use, so even an
    # append (never retried once sent) goes through on a fresh one, once.
    kv.append(5, b"b")
    assert kv.get(5) == b"ab"


def test_a_forked_child_opens_its_own_connections(standalone):
    # A pre-fork server (gunicorn, multiprocessing) makes the client, then
    # forks: a child sharing its parent's sockets would read the parent's
    # answers. The child starts with empty pools.
    s = standalone()
    kv = client_of(s)
    kv.put(1, b"parent")
    accepted = s.stats()["server.connections_accepted"]
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            ok = all(kv.get(1) == b"parent" for _ in range(200))
            kv.put(2, b"child")
            code = 0 if ok else 1
        finally:
            os._exit(code)
    for _ in range(200):
        assert kv.get(1) == b"parent"
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert kv.get(2) == b"child"
    # The child's connection is its own (this stats call is one more).
    assert s.stats()["server.connections_accepted"] - accepted == 2


def test_a_corrupt_record_fails_its_key_only(standalone):
    # No value cache: every read goes to the data file, where one byte of
    # key 17's value is flipped under the running server.
    s = standalone("--set", "cache.capacity_bytes=0")
    kv = client_of(s)
    values = {k: b"record-%d-" % k + b"abcdefghij" * 8 for k in (16, 17, 18)}
    kv.multi_put(values)
    hits = 0
    for root, _, files in os.walk(s.data):
        for name in files:
            p = os.path.join(root, name)
            with open(p, "rb") as f:
                blob = f.read()
            at = blob.find(values[17])
            if at >= 0:
                with open(p, "r+b") as f:
                    f.seek(at + 40)
                    f.write(bytes([blob[at + 40] ^ 0x5A]))
                hits += 1
    assert hits >= 1
    with pytest.raises(flatkv.StorageError) as e:
        kv.get(17)
    assert not e.value.in_doubt and not e.value.retryable  # a read; an operator must look
    with pytest.raises(flatkv.StorageError) as e:
        kv.multi_get([16, 17, 18, 19])
    assert e.value.key == 17
    assert e.value.results[0] == values[16] and e.value.results[2:] == [values[18], None]
    got = kv.multi_get([16, 17, 18], raise_on_error=False)
    assert got[0] == values[16] and got[2] == values[18]
    assert isinstance(got[1], flatkv.StorageError) and got[1].key == 17
