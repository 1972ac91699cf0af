"""Client: the ring-aware FlatKV client, safe to share between threads.

It reads the ring from any instance's ring() (no ZooKeeper needed) and
sends each call straight to the member that serves its key: a write to
its chain's head, a read to the tail under sync replication (any member
under async). A batch is split by owner, every part sent before any answer
is read. A standalone server is a ring of one.

Routing and retries follow the C++ RingClient (client/ring_client.h): a
call that finds its member gone (a network failure, UNAVAILABLE or
NOT_OWNER) reads the ring again and is routed once more at once; past that
the client tries "retries" times more, waiting retry_backoff, then twice
that, and so on (at most half a second, so a call notices a new ring
soon), reading the ring again before each. OVERLOADED is tried again the
same way. The defaults (6, 0.1 s: 2.2 s of waits) ride over a member
killed on a live host, which leaves the ring within a fraction of a second
(docs/ring.md, "A member's process dies"); a member whose host is down leaves only
after cluster.session_timeout_ms, and its calls fail once the retries are
spent.

Only what is retryable is retried (errors.py): an append whose connection
broke after it was sent, or that failed with an UNAVAILABLE in doubt, is
raised at once. An idempotent write in doubt (a put, remove or multi_put
whose connection broke after it was sent) is retried, as the contract
allows, unless the client was made with retry_in_doubt=False: then every
write in doubt is raised at once, for the caller to read back and decide. A timeout is tried again at most once. Errors the caller
must fix (KEY_OUT_OF_RANGE, VALUE_TOO_LARGE, INVALID_ARGUMENT,
UNAUTHORIZED), STORAGE_ERROR and PoolTimeout are raised at once.
"""

import os
import random
import socket
import threading
import time

from thrift.Thrift import TApplicationException

from .errors import (ConnectionError, FlatKVError, Overloaded, PoolTimeout, ProtocolError,
                     TimeoutError, Unavailable, WRITES, from_kv_error)
from .pool import ConnectionPool, Options, split_address
from .ring import Ring
from .ttypes import KvError, KvPair

_MAX_BACKOFF = 0.5  # seconds: the longest wait between two tries
_I64_MIN = -(1 << 63)
_I64_MAX = (1 << 63) - 1


def _key(key):
    if isinstance(key, bool) or not isinstance(key, int):
        raise TypeError("an integer key must be an int, not %s" % type(key).__name__)
    if not _I64_MIN <= key <= _I64_MAX:
        raise ValueError("integer key %d does not fit in 64 bits" % key)
    return key


def _bytes(v, what="value"):
    if isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode("utf-8")
    if isinstance(v, (bytearray, memoryview)):
        return bytes(v)
    raise TypeError("a %s must be bytes or str, not %s" % (what, type(v).__name__))


class Client:
    """A FlatKV client for a standalone server or a whole ring.

    Client("127.0.0.1", 9901) or Client(seeds=["kv1:9901", "kv2:9901"]):
    the ring is read from the first of these that answers, on the first
    call. One Client serves every thread of a process: it keeps a pool of
    connections per member.

    timeout: seconds for each call's send and answer (None: none);
    connect_timeout: for connecting (and the TLS handshake).
    max_connections: per member (None: no bound); a thread that finds all
    in use waits up to pool_timeout seconds, then gets PoolTimeout.
    retries, retry_backoff: see the module's comment (0 retries: the one
    re-route the C++ client makes, no more). retry_in_doubt: whether a
    write whose outcome is in doubt but which is safe to send again (every
    write but append) is retried (True) or raised at once (False).
    tls_ca_file: connect over TLS (a server with server.tls_cert_file);
    the server's certificate must chain to it and name the host called
    (tls_check_hostname=False skips the name). tls_cert_file, tls_key_file:
    a client certificate (server.tls_client_auth).
    decode_responses: values come back as str (UTF-8), not bytes.
    admin_token: admin.token, for the admin calls.
    """

    def __init__(self, host="127.0.0.1", port=9901, *, seeds=None, timeout=30.0,
                 connect_timeout=2.0, max_connections=32, pool_timeout=5.0, retries=6,
                 retry_backoff=0.1, retry_in_doubt=True, tls_ca_file=None, tls_cert_file=None, tls_key_file=None,
                 tls_check_hostname=True, decode_responses=False, admin_token=""):
        if seeds is None:
            seeds = ["%s:%d" % (host, port)]
        elif isinstance(seeds, str):
            seeds = [s.strip() for s in seeds.split(",") if s.strip()]
        if not seeds:
            raise ValueError("give at least one instance (host and port, or seeds)")
        for s in seeds:
            split_address(s)  # ValueError for a seed without a port
        self.seeds = list(seeds)
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError("retries must be an int >= 0, not %r" % (retries,))
        if isinstance(retry_backoff, bool) or not isinstance(retry_backoff, (int, float)) \
                or not retry_backoff >= 0:
            raise ValueError("retry_backoff must be a number of seconds >= 0, not %r"
                             % (retry_backoff,))
        self.retries = retries
        self.retry_backoff = retry_backoff
        self.retry_in_doubt = bool(retry_in_doubt)
        self.decode_responses = decode_responses
        self.admin_token = admin_token
        self._options = Options(connect_timeout=connect_timeout, timeout=timeout,
                                tls_ca_file=tls_ca_file, tls_cert_file=tls_cert_file,
                                tls_key_file=tls_key_file, tls_check_hostname=tls_check_hostname,
                                max_connections=max_connections, pool_timeout=pool_timeout)
        self._lock = threading.Lock()       # guards _pools, _ring, _generation
        self._refresh_lock = threading.Lock()  # one ring read at a time
        self._pools = {}
        self._ring = None
        self._generation = 0  # grows with every ring read
        self._pid = os.getpid()
        self._spread = random.randrange(1 << 30)

    # --- Connections and the ring -----------------------------------------

    def _pool(self, address):
        with self._lock:
            if self._pid != os.getpid():
                # A forked child must not share its parent's sockets.
                self._pools = {}
                self._pid = os.getpid()
            pool = self._pools.get(address)
            if pool is None:
                pool = self._pools[address] = ConnectionPool(address, self._options)
            return pool

    def _invoke(self, address, method, fn):
        """fn(generated client) on a pooled connection to "address", every
        failure raised as a FlatKVError."""
        pool = self._pool(address)
        conn = pool.acquire(method)  # raises with sent = False
        broken = True
        try:
            result = fn(conn.client)
            broken = False
            conn.calls += 1
            return result
        except KvError as e:
            broken = False
            raise from_kv_error(e, method, address) from None
        except TApplicationException as e:
            broken = False
            raise ProtocolError("the server refused the call: %s" % (e.message or e), method,
                                address) from None
        except Exception as e:
            in_doubt = method in WRITES
            if _timed_out(e):
                raise TimeoutError("no answer within %s s" % self._options.timeout, method,
                                   address, in_doubt=in_doubt, sent=True) from e
            raise ConnectionError("connection failed: %s" % (_describe(e)), method, address,
                                  in_doubt=in_doubt, sent=True) from e
        finally:
            pool.release(conn, broken)

    def _fetch_ring(self, avoid=None):
        """Reads the ring from the seeds, then from the members of the ring
        known so far; "avoid" (an address that just failed) is asked last."""
        with self._lock:
            known = self._ring.members() if self._ring is not None else []
        order = [a for a in self.seeds + known if a != avoid]
        if avoid is not None:
            order.append(avoid)
        tried = []
        last = None
        for address in order:
            if address in tried:
                continue
            tried.append(address)
            try:
                info = self._invoke(address, "ring", lambda c: c.ring())
            except FlatKVError as e:
                last = e
                continue
            return Ring(info, address)
        if last is None:
            raise Unavailable("no instance to ask for the ring")
        # The last failure, naming every address that failed too.
        last.message = "%s; no instance answered: %s" % (last.message, ", ".join(tried))
        last.args = (last.message,)
        raise last

    def _current_ring(self):
        with self._lock:
            ring, gen = self._ring, self._generation
        if ring is None:
            return self.refresh(gen)
        return ring, gen

    def refresh(self, seen_generation=None, avoid=None):
        """Reads the ring again now (from any instance that answers) and
        returns (ring, generation). With seen_generation, a ring read by
        another thread since that generation is taken instead."""
        with self._refresh_lock:
            with self._lock:
                if seen_generation is not None and self._generation != seen_generation \
                        and self._ring is not None:
                    return self._ring, self._generation
            ring = self._fetch_ring(avoid)
            with self._lock:
                self._ring = ring
                self._generation += 1
                return ring, self._generation

    def ring(self):
        """The ring this client routes by (a Ring: marks, chains, version,
        replication), read on first use."""
        return self._current_ring()[0]

    def close(self):
        """Closes every idle connection (the client stays usable)."""
        with self._lock:
            pools = list(self._pools.values())
        for p in pools:
            p.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- Routing ------------------------------------------------------------

    def _next_spread(self):
        self._spread += 1  # a race only changes which member reads
        return self._spread

    def _pick(self, ring, index, write):
        address = ring.target(index, write, self._next_spread())
        if address is None and not ring.marks:
            raise Unavailable("the ring read from %s holds no mark yet" % ring.seed)
        if address is None:
            raise Unavailable("mark %d has no serving member" % ring.marks[index])
        return address

    def _with_retries(self, method, attempt_fn):
        """Runs attempt_fn(ring) under the retry rules of the module's
        comment. attempt_fn raises FlatKVError; the error's address (the
        member that failed) is asked for the ring last."""
        ring, gen = self._current_ring()
        timeouts = 0
        for attempt in range(self.retries + 2):
            try:
                return attempt_fn(ring)
            except FlatKVError as e:
                if not e.retryable or attempt == self.retries + 1 or isinstance(e, PoolTimeout):
                    raise  # a full pool is the caller's to handle (a bigger pool, fewer threads)
                if e.in_doubt and not self.retry_in_doubt:
                    raise  # the caller decides what a write that may have been applied needs
                if isinstance(e, TimeoutError):
                    timeouts += 1
                    if timeouts > 1:
                        raise
                if attempt > 0 or isinstance(e, Overloaded):
                    time.sleep(min(self.retry_backoff * (1 << max(0, attempt - 1)),
                                   _MAX_BACKOFF))
                if isinstance(e, Overloaded):
                    continue  # the same member, later
                try:
                    ring, gen = self.refresh(gen, avoid=e.address)
                except FlatKVError:
                    pass  # no instance answered: route by the ring we have
        raise AssertionError("unreachable")

    def _routed(self, method, h, write, fn):
        """fn(generated client) on the member that serves hash "h"."""
        def attempt(ring):
            address = self._pick(ring, ring.owner(h), write)
            return self._invoke(address, method, fn)
        return self._with_retries(method, attempt)

    def _string_routed(self, method, key, write, fn):
        def attempt(ring):
            address = self._pick(ring, ring.owner(ring.hash_string(key)), write)
            return self._invoke(address, method, fn)
        return self._with_retries(method, attempt)

    def _value(self, result):
        if not result.found:
            return None
        return result.value.decode("utf-8") if self.decode_responses else result.value

    # --- Integer keys ---------------------------------------------------------

    def get(self, key):
        """The value of "key" (bytes), or None if absent."""
        key = _key(key)
        return self._value(self._routed("get", key, False, lambda c: c.get(key)))

    def put(self, key, value):
        """Sets "key" to "value" (bytes, or str as UTF-8)."""
        key, value = _key(key), _bytes(value)
        self._routed("put", key, True, lambda c: c.put(key, value))

    def remove(self, key):
        """Removes "key"; True if it existed."""
        key = _key(key)
        return self._routed("remove", key, True, lambda c: c.remove(key))

    def append(self, key, value):
        """Appends "value" to the value of "key" (created if absent). Not
        idempotent: never retried once it may have been applied."""
        key, value = _key(key), _bytes(value)
        self._routed("append", key, True, lambda c: c.append(key, value))

    def multi_get(self, keys, raise_on_error=True):
        """The values of "keys" in request order (None for an absent key).
        A key whose record could not be read (its stored copy is corrupt)
        raises that key's error with .results (every other key answered);
        with raise_on_error=False its place holds the error instead."""
        keys = [_key(k) for k in keys]
        if not keys:
            return []
        results = self._with_retries("multiGet", lambda ring: self._batch(
            ring, "multiGet", keys, False,
            lambda c, part: c.send_multiGet([keys[i] for i in part]), lambda c: c.recv_multiGet()))
        out = []
        first_error = None
        for key, r in zip(keys, results):
            if r.errorCode is not None:
                e = from_kv_error(KvError(r.errorCode, r.errorMessage or ""), "multiGet", None)
                e.key = key
                first_error = first_error or e
                out.append(e)
            else:
                out.append(self._value(r))
        if first_error is not None and raise_on_error:
            first_error.results = out
            raise first_error
        return out

    def multi_put(self, pairs):
        """Writes every (key, value) of "pairs" (a dict or pairs). One
        instance checks its whole part before writing any of it; with more
        than one partition the batch is split by owner and is atomic per
        partition only (each part is written or refused whole)."""
        items = pairs.items() if isinstance(pairs, dict) else pairs
        kv = [KvPair(_key(k), _bytes(v)) for k, v in items]
        if not kv:
            return
        keys = [p.key for p in kv]
        self._with_retries("multiPut", lambda ring: self._batch(
            ring, "multiPut", keys, True,
            lambda c, part: c.send_multiPut([kv[i] for i in part]), lambda c: c.recv_multiPut()))

    def _batch(self, ring, method, keys, write, send, recv):
        """One attempt of a batch: the positions of "keys" grouped by owner,
        send(client, positions) on each owner's member before any
        recv(client); the answers put back in request order. Raises the
        first part's error, preferring one that is not retryable."""
        groups = {}
        for pos, key in enumerate(keys):
            groups.setdefault(ring.owner(key), []).append(pos)
        parts = []  # [address, positions, pool, conn, error]
        for index in sorted(groups):
            parts.append([self._pick(ring, index, write), groups[index], None, None, None])
        try:
            for part in parts:
                address, positions = part[0], part[1]
                pool = self._pool(address)
                try:
                    conn = pool.acquire(method)
                except FlatKVError as e:
                    part[4] = e
                    continue
                part[2], part[3] = pool, conn
                try:
                    send(conn.client, positions)
                except Exception as e:
                    part[4] = self._failure(e, method, address, part)
            results = [None] * len(keys)
            for part in parts:
                if part[3] is None or part[4] is not None:
                    continue
                try:
                    got = recv(part[3].client)
                    part[3].calls += 1
                except Exception as e:
                    part[4] = self._failure(e, method, part[0], part)
                    continue
                if got is not None:
                    for pos, r in zip(part[1], got):
                        results[pos] = r
        finally:
            for part in parts:
                if part[3] is not None:
                    part[2].release(part[3], broken=bool(getattr(part[4], "_broken", False)))
        errors = [p[4] for p in parts if p[4] is not None]
        if errors:
            fatal = [e for e in errors if not e.retryable]
            raise (fatal or errors)[0]
        return results

    def _failure(self, e, method, address, part):
        """The FlatKVError of exception "e" from a part of a batch (marked
        _broken when the connection must be closed)."""
        if isinstance(e, KvError):
            return from_kv_error(e, method, address)
        if isinstance(e, TApplicationException):
            return ProtocolError("the server refused the call: %s" % (e.message or e), method,
                                 address)
        in_doubt = method in WRITES
        if _timed_out(e):
            err = TimeoutError("no answer within %s s" % self._options.timeout, method, address,
                               in_doubt=in_doubt, sent=True)
        else:
            err = ConnectionError("connection failed: %s" % _describe(e), method, address,
                                  in_doubt=in_doubt, sent=True)
        err._broken = True
        return err

    def scan(self, start=None, stop=None, reverse=False, page_size=1000):
        """(key, value) pairs in key order over the whole ring: from
        "start" up (keys >= start), or with reverse down (keys <= start);
        "stop" (exclusive) ends it early. A generator: each page is one
        call (at most page_size pairs; the server may answer fewer, even
        none, and the scan goes on), made when the previous one is used up."""
        if start is None:
            start = _I64_MIN if not reverse else _I64_MAX  # the whole key range
        key = _key(start)
        while True:
            page = self.scan_page(key, page_size, reverse)
            for p in page.pairs:
                if stop is not None and (p.key <= stop if reverse else p.key >= stop):
                    return
                yield p.key, (p.value.decode("utf-8") if self.decode_responses else p.value)
            if page.done:
                return
            key = page.nextKey

    def scan_page(self, from_key, limit=1000, reverse=False):
        """One scan call: a ScanResult (pairs, done, nextKey to resume)."""
        from_key = _key(from_key)
        return self._routed("scan", from_key, False, lambda c: c.scan(from_key, limit, reverse))

    def scan_log(self, page_size=1000):
        """(key, value) pairs of integer keys in insertion order, partition by
        partition; a generator over pages like scan."""
        cursor = b""
        while True:
            page = self._with_retries("scanLog", lambda ring: self._invoke(
                self._pick(ring, 0, False), "scanLog", lambda c: c.scanLog(cursor, page_size)))
            for p in page.pairs:
                yield p.key, (p.value.decode("utf-8") if self.decode_responses else p.value)
            if page.done:
                return
            cursor = page.cursor

    # --- String keys ----------------------------------------------------------

    def sget(self, key):
        """The value of string key "key" (bytes or str), or None."""
        key = _bytes(key, "string key")
        return self._value(self._string_routed("sget", key, False, lambda c: c.sget(key)))

    def sput(self, key, value):
        key, value = _bytes(key, "string key"), _bytes(value)
        self._string_routed("sput", key, True, lambda c: c.sput(key, value))

    def sremove(self, key):
        """Removes string key "key"; True if it existed."""
        key = _bytes(key, "string key")
        return self._string_routed("sremove", key, True, lambda c: c.sremove(key))

    # --- One member ------------------------------------------------------------

    def call(self, address, method, *args):
        """The generated client's "method"(*args) on the member at
        "host:port" (pooled, errors typed, not retried): for the calls not
        routed by key (info, stats, getWriteMode, compactionStatus, ...)."""
        return self._invoke(address, method, lambda c: getattr(c, method)(*args))

    def info(self, address=None):
        """NodeInfo of one member (the first seed by default)."""
        return self.call(address or self.seeds[0], "info")

    def stats(self, address=None):
        return self.call(address or self.seeds[0], "stats")

    def ring_info(self, address=None):
        """The RingInfo one instance answers (its view, not this client's)."""
        return self.call(address or self.seeds[0], "ring")

    def set_write_mode(self, mode, address=None):
        """Admin: one member's write mode (WriteMode.SAFE or ASYNC), with
        admin_token."""
        self.call(address or self.seeds[0], "setWriteMode", self.admin_token, mode)

    def get_write_mode(self, address=None):
        return self.call(address or self.seeds[0], "getWriteMode")

    def compact(self, address=None):
        """Admin: starts a compaction of one member (compactionStatus()
        through call() shows its progress)."""
        self.call(address or self.seeds[0], "compact", self.admin_token)

    def pool_sizes(self):
        """{address: (open connections, idle ones)} of every member called."""
        with self._lock:
            pools = dict(self._pools)
        return {a: p.size() for a, p in pools.items()}


def _timed_out(e):
    while e is not None:
        if isinstance(e, socket.timeout):
            return True
        inner = getattr(e, "inner", None)
        e = inner if inner is not None else e.__context__
    return False


def _describe(e):
    inner = getattr(e, "inner", None)
    if inner is not None:
        return "%s (%s)" % (e, inner)
    return str(e) or type(e).__name__
