"""The parts of the package that need no server: the generated code matches
the IDL, routing decisions match the server's (partition/ring.h,
partition/router.h), each ErrorCode becomes the error class and the retry
verdict docs/application.md's contract gives, and the client acts on them against
scripted instances (NOT_OWNER, UNAVAILABLE in doubt or not), which no
healthy ring answers on demand."""
import os
import re

import pytest

import flatkv
from flatkv import ErrorCode
from flatkv.errors import from_kv_error
from flatkv.ring import Ring, hash_string
from flatkv.ttypes import KvError, Member, Partition, RingInfo

from conftest import REPO


def test_installed_package_is_not_the_source_tree():
    # The generated modules exist only in an installed (built) package.
    here = os.path.join(REPO, "client", "python")
    assert not os.path.abspath(flatkv.__file__).startswith(here + os.sep)
    assert os.path.exists(os.path.join(os.path.dirname(flatkv.__file__), "ttypes.py"))


def test_generated_code_has_every_method_and_error_code_of_the_idl():
    idl = open(os.path.join(REPO, "thrift", "flatkv.thrift")).read()
    service = idl[idl.index("service FlatKV {"):]
    methods = re.findall(r"^\s+(?:oneway\s+)?[\w<>, ]+?\s+(\w+)\(", service, re.M)
    assert len(methods) > 40
    for m in methods:
        assert hasattr(flatkv.FlatKV.Client, m), m
    codes = re.findall(r"^\s+([A-Z_]+) = (\d+),", idl[idl.index("enum ErrorCode"):
                                                       idl.index("enum WriteMode")], re.M)
    assert {n: int(v) for n, v in codes} == ErrorCode._NAMES_TO_VALUES


def _ring(marks_chains, version=5, replication="sync", hash_bound=0):
    return Ring(RingInfo(version=version, hashBound=hash_bound, replication=replication,
                         partitions=[Partition(mark, [Member(h, p) for h, p in chain])
                                     for mark, chain in marks_chains]), "seed:1")


def test_owner_is_the_smallest_mark_above_the_hash_wrapping_to_the_first():
    r = _ring([(20, [("b", 2)]), (10, [("a", 1)])])  # any order in, by mark inside
    assert r.marks == [10, 20]
    # Ring::KeyOrder's example: [INT64_MIN, 9] -> 10, [10, 19] -> 20, [20, INT64_MAX] -> 10.
    assert [r.marks[r.owner(h)] for h in (-(1 << 63), 9, 10, 19, 20, (1 << 63) - 1)] == \
        [10, 10, 20, 20, 10, 10]


def test_writes_go_to_the_head_reads_to_the_tail_under_sync_any_member_under_async():
    chain = [("h", 1), ("m", 2), ("t", 3)]
    sync = _ring([(0, chain)])
    assert sync.target(0, True) == "h:1"
    assert {sync.target(0, False, s) for s in range(6)} == {"t:3"}
    asyn = _ring([(0, chain)], replication="async")
    assert asyn.target(0, True) == "h:1"
    assert {asyn.target(0, False, s) for s in range(6)} == {"h:1", "m:2", "t:3"}
    assert _ring([(0, [])]).target(0, True) is None


def test_a_ring_with_no_mark_routes_nowhere():
    # What a ring's first instance answers before anything has registered.
    r = _ring([])
    assert r.marks == [] and r.target(r.owner(7), True) is None
    kv = flatkv.Client(seeds=["seed:1"])
    with pytest.raises(flatkv.Unavailable, match="holds no mark yet"):
        kv._pick(r, r.owner(7), True)


def test_a_standalone_server_is_routed_to_the_address_asked():
    r = Ring(RingInfo(version=0, hashBound=100, replication="sync",
                      partitions=[Partition(0, [Member("0.0.0.0", 9901)])]), "10.1.2.3:9901")
    assert r.standalone and r.target(r.owner(12345), True) == "10.1.2.3:9901"


def test_string_keys_hash_with_xxh64_seed_0_mod_hash_bound():
    # XXH64 reference values: "" -> 0xEF46DB3751D8E999, "abc" -> 0x44BC2CF5AD770999.
    assert hash_string(b"", 1 << 64) == 0xEF46DB3751D8E999
    assert hash_string(b"abc", (1 << 63) - 1) == 0x44BC2CF5AD770999 % ((1 << 63) - 1)
    assert _ring([(0, [("a", 1)])], hash_bound=1000).hash_string(b"abc") == \
        0x44BC2CF5AD770999 % 1000


WRITE, READ, APPEND = "put", "get", "append"


@pytest.mark.parametrize("code,cls,method,message,in_doubt,retryable", [
    (ErrorCode.KEY_OUT_OF_RANGE, flatkv.KeyOutOfRange, WRITE, "key -5 is outside", False, False),
    (ErrorCode.VALUE_TOO_LARGE, flatkv.ValueTooLarge, WRITE, "too big", False, False),
    (ErrorCode.INVALID_ARGUMENT, flatkv.InvalidArgument, READ, "bad cursor", False, False),
    (ErrorCode.UNAUTHORIZED, flatkv.Unauthorized, "setWriteMode", "wrong token", False, False),
    (ErrorCode.NOT_OWNER, flatkv.NotOwner, APPEND, "not mine", False, True),
    (ErrorCode.OVERLOADED, flatkv.Overloaded, APPEND, "queue full", False, True),
    (ErrorCode.UNAVAILABLE, flatkv.Unavailable, APPEND, "mark 10 has no member", False, True),
    # The server's words for a write it may have applied (server/member/cluster.cc,
    # partition/chain.cc): in doubt; an append then must not be retried.
    (ErrorCode.UNAVAILABLE, flatkv.Unavailable, APPEND,
     "lost the lease; the write may or may not have been applied", True, False),
    (ErrorCode.UNAVAILABLE, flatkv.Unavailable, WRITE,
     "forward failed; a write may or may not have been applied", True, True),
    (ErrorCode.UNAVAILABLE, flatkv.Unavailable, READ,
     "forward failed; a write may or may not have been applied", False, True),
    (ErrorCode.STORAGE_ERROR, flatkv.StorageError, WRITE, "disk full", True, False),
    (ErrorCode.STORAGE_ERROR, flatkv.StorageError, READ, "corrupt record", False, False),
])
def test_each_error_code_has_its_class_and_retry_verdict(code, cls, method, message, in_doubt,
                                                         retryable):
    e = from_kv_error(KvError(code, message), method, "h:1")
    assert type(e) is cls and isinstance(e, flatkv.ServerError)
    assert e.code == code and e.code_name == ErrorCode._VALUES_TO_NAMES[code]
    assert (e.in_doubt, e.retryable) == (in_doubt, retryable)
    assert message in str(e) and "h:1" in str(e)


def test_a_code_this_client_does_not_know_is_still_a_server_error():
    e = from_kv_error(KvError(99, "new"), "get", None)
    assert type(e) is flatkv.ServerError and e.code == 99 and not e.retryable


def test_a_broken_connection_leaves_a_write_in_doubt_and_an_append_not_retryable():
    put = flatkv.ConnectionError("reset", "put", "h:1", in_doubt=True, sent=True)
    append = flatkv.TimeoutError("slow", "append", "h:1", in_doubt=True, sent=True)
    refused = flatkv.ConnectionError("refused", "append", "h:1", sent=False)
    assert put.retryable and put.in_doubt
    assert not append.retryable and append.in_doubt
    assert refused.retryable and not refused.in_doubt


# --- Retries against scripted instances -------------------------------------
# A scripted FlatKV instance (the generated Processor over a thread per
# connection) whose answers a test chooses: how the client reacts to
# NOT_OWNER and UNAVAILABLE, which no healthy ring answers on demand.

class Scripted:
    """Answers ring() with self.ring_info and each of get/put/append with
    the next of self.answers[method] (a KvError is raised, anything else
    returned), recording every call."""

    def __init__(self):
        import socket
        import threading
        from thrift.protocol import TBinaryProtocol
        from thrift.server import TServer
        from thrift.transport import TSocket, TTransport
        self.calls, self.answers, self.ring_info = [], {}, None
        self.store = {}
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        sock.close()
        self.address = "127.0.0.1:%d" % self.port
        server = TServer.TThreadedServer(
            flatkv.FlatKV.Processor(self), TSocket.TServerSocket("127.0.0.1", self.port),
            TTransport.TFramedTransportFactory(), TBinaryProtocol.TBinaryProtocolFactory(),
            daemon=True)
        threading.Thread(target=server.serve, daemon=True).start()
        import time
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.1).close()
                break
            except OSError:
                time.sleep(0.02)

    def _answer(self, method, default):
        self.calls.append(method)
        queue = self.answers.get(method) or []
        a = queue.pop(0) if queue else default
        if isinstance(a, KvError):
            raise a
        return a

    def ring(self):
        self.calls.append("ring")
        return self.ring_info

    def get(self, key):
        value = self.store.get(key)
        return self._answer("get", flatkv.GetResult(found=value is not None, value=value))

    def put(self, key, value):
        self._answer("put", None)
        self.store[key] = value

    def append(self, key, value):
        self._answer("append", None)
        self.store[key] = self.store.get(key, b"") + value


def ring_to(version, address):
    host, port = address.rsplit(":", 1)
    return RingInfo(version=version, hashBound=100, replication="sync",
                    partitions=[Partition(0, [Member(host, int(port))])])


# Thrift's TThreadedServer calls Thread.setDaemon, deprecated since Python 3.10.
quiet_thrift_server = pytest.mark.filterwarnings("ignore:setDaemon:DeprecationWarning")


@quiet_thrift_server
def test_not_owner_reads_the_ring_again_and_the_call_goes_to_the_new_owner():
    old, new = Scripted(), Scripted()
    old.ring_info = ring_to(1, old.address)
    kv = flatkv.Client(seeds=[old.address], retries=0)
    assert kv.ring().version == 1
    # The ring moved: the old owner refuses, and now answers the new ring.
    old.answers["append"] = [KvError(ErrorCode.NOT_OWNER, "mark 0 is not mine")]
    old.ring_info = ring_to(2, new.address)
    kv.append(5, b"x")  # NOT_OWNER means not applied: even an append goes again
    assert old.calls == ["ring", "append", "ring"] and new.calls == ["append"]
    assert new.store == {5: b"x"} and kv.ring().version == 2


@quiet_thrift_server
def test_an_unavailable_in_doubt_append_is_raised_a_put_is_retried():
    inst = Scripted()
    inst.ring_info = ring_to(1, inst.address)
    kv = flatkv.Client(seeds=[inst.address], retries=2, retry_backoff=0.01)
    doubt = "lost its place in the chain; the write may or may not have been applied"
    inst.answers["append"] = [KvError(ErrorCode.UNAVAILABLE, doubt)]
    with pytest.raises(flatkv.Unavailable) as e:
        kv.append(1, b"+")
    assert e.value.in_doubt and not e.value.retryable
    assert inst.calls.count("append") == 1  # never sent twice
    inst.answers["put"] = [KvError(ErrorCode.UNAVAILABLE, doubt),
                           KvError(ErrorCode.UNAVAILABLE, "mark 0 has no serving member")]
    kv.put(2, b"v")  # idempotent: retried through both
    assert inst.calls.count("put") == 3 and inst.store[2] == b"v"
    inst.answers["get"] = [KvError(ErrorCode.UNAVAILABLE, "shutting down")] * 5
    with pytest.raises(flatkv.Unavailable) as e:
        kv.get(2)
    assert inst.calls.count("get") == 4  # the re-route and 2 retries, no more
    assert not e.value.in_doubt and e.value.retryable


def test_retry_options_default_to_six_retries_a_tenth_of_a_second_in_doubt_retried():
    kv = flatkv.Client("127.0.0.1", 1)  # nothing is called
    assert (kv.retries, kv.retry_backoff, kv.retry_in_doubt) == (6, 0.1, True)


@pytest.mark.parametrize("kw", [dict(retries=-1), dict(retries=1.5), dict(retries=True),
                                dict(retries=None), dict(retry_backoff=-0.1),
                                dict(retry_backoff="1"), dict(retry_backoff=float("nan"))])
def test_retry_options_out_of_range_are_refused(kw):
    with pytest.raises(ValueError):
        flatkv.Client("127.0.0.1", 1, **kw)


NO_MEMBER = "mark 0 has no serving member"
IN_DOUBT = "lost its place in the chain; the write may or may not have been applied"


@quiet_thrift_server
@pytest.mark.parametrize("retries", [0, 1, 3])
def test_retries_bounds_the_tries_of_a_retryable_call(retries):
    inst = Scripted()
    inst.ring_info = ring_to(1, inst.address)
    kv = flatkv.Client(seeds=[inst.address], retries=retries, retry_backoff=0.001)
    inst.answers["put"] = [KvError(ErrorCode.UNAVAILABLE, NO_MEMBER)] * 10
    with pytest.raises(flatkv.Unavailable) as e:
        kv.put(1, b"v")
    assert e.value.retryable and not e.value.in_doubt
    assert inst.calls.count("put") == retries + 2  # the call, the re-route, the retries
    # One answer fewer than the tries: the last try succeeds.
    inst.answers["put"] = [KvError(ErrorCode.UNAVAILABLE, NO_MEMBER)] * (retries + 1)
    kv.put(2, b"w")
    assert inst.store[2] == b"w"


@quiet_thrift_server
def test_retry_backoff_doubles_between_tries():
    inst = Scripted()
    inst.ring_info = ring_to(1, inst.address)
    kv = flatkv.Client(seeds=[inst.address], retries=3, retry_backoff=0.05)
    inst.answers["get"] = [KvError(ErrorCode.UNAVAILABLE, NO_MEMBER)] * 5
    import time
    t0 = time.monotonic()
    with pytest.raises(flatkv.Unavailable):
        kv.get(1)
    # The re-route at once, then 0.05 + 0.1 + 0.2 s.
    assert 0.35 <= time.monotonic() - t0 < 5
    assert inst.calls.count("get") == 5


@quiet_thrift_server
def test_retry_in_doubt_false_raises_a_write_in_doubt_at_once_and_retries_the_rest():
    inst = Scripted()
    inst.ring_info = ring_to(1, inst.address)
    kv = flatkv.Client(seeds=[inst.address], retries=3, retry_backoff=0.001,
                       retry_in_doubt=False)
    inst.answers["put"] = [KvError(ErrorCode.UNAVAILABLE, IN_DOUBT)]
    with pytest.raises(flatkv.Unavailable) as e:
        kv.put(1, b"v")
    # The contract allows sending it again; the caller asked not to.
    assert e.value.in_doubt and e.value.retryable
    assert inst.calls.count("put") == 1 and 1 not in inst.store
    # A write refused (not applied) is still retried, and so is a read.
    inst.answers["put"] = [KvError(ErrorCode.UNAVAILABLE, NO_MEMBER)] * 2
    kv.put(1, b"v")
    assert inst.calls.count("put") == 4 and inst.store[1] == b"v"
    inst.answers["get"] = [KvError(ErrorCode.UNAVAILABLE, IN_DOUBT)] * 2  # a read: never in doubt
    assert kv.get(1) == b"v" and inst.calls.count("get") == 3
    # An append in doubt is raised at once either way.
    inst.answers["append"] = [KvError(ErrorCode.UNAVAILABLE, IN_DOUBT)]
    with pytest.raises(flatkv.Unavailable):
        kv.append(1, b"+")
    assert inst.calls.count("append") == 1
