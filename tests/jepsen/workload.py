"""Client workloads. Every thread has its own framed binary Thrift
connection pinned to one member; every operation is recorded with its
invocation and completion times (time.monotonic_ns(), one clock for every
process on this host) and its outcome:

  ok    it happened, with this result;
  fail  it definitely did not happen;
  info  unknown: it may have happened at any time after its call (no
        return time). A timeout or a broken connection is always info (the
        thread then reconnects, under a new process number, as a crashed
        Jepsen process would). A call that could not connect was never
        sent: fail.

A KvError answered to a get is a fail (a read changes nothing). A KvError
answered to a write is judged by the server's retry contract (docs/application.md,
"Errors and what each means for a retry"): a definite code (UNAVAILABLE, NOT_OWNER,
OVERLOADED, ...) is a fail unless its message says the write "may or may
not have been applied"; that message, and STORAGE_ERROR, make it info. The
checker thereby tests the contract too: a write answered "not applied"
that took effect shows up as a value nobody wrote. --writes-in-doubt (env
FLATKV_JEPSEN_WRITES_IN_DOUBT=1) makes every write error info, for a server
that promises nothing.

Registers: a small set of keys live at a time (NKEYS), replaced by fresh
ones every KEY_LIFE_S seconds, so that conflicts are frequent while each
key's history stays short enough to check; ops are put (a unique value),
get, remove, append (a unique element). Set: every add is a put of a key
never used before; after healing, a final read counts lost (acknowledged,
absent) and unexpected (present, never attempted) elements."""
import itertools
import json
import os
import random
import threading
import time

import cluster

WRITES_IN_DOUBT = os.environ.get("FLATKV_JEPSEN_WRITES_IN_DOUBT") == "1"
IN_DOUBT_TEXT = "may or may not have been applied"
IN_DOUBT_CODES = ("STORAGE_ERROR",)
REG_BASE = 1_000_000     # register keys: REG_BASE + generation * NKEYS + slot
SET_BASE = 500_000_000   # set elements: SET_BASE + thread * 10^7 + n
SET_SPAN = 10_000_000
NKEYS = 10
KEY_LIFE_S = 1.0
OP_TIMEOUT_MS = 1000


class History:
    def __init__(self):
        self.ops = []
        self._lock = threading.Lock()
        self._process = itertools.count(1000)

    def add(self, rec):
        with self._lock:
            self.ops.append(rec)

    def new_process(self):
        with self._lock:
            return next(self._process)

    def write(self, path):
        with self._lock:
            ops = sorted(self.ops, key=lambda r: r["call"])
        with open(path, "w") as f:
            for r in ops:
                f.write(json.dumps(r, separators=(",", ":")) + "\n")


def write_failed(e, code):
    """True when a write answered with error "code" was definitely not
    applied, by the server's contract."""
    if WRITES_IN_DOUBT or code in IN_DOUBT_CODES:
        return False
    return IN_DOUBT_TEXT not in (getattr(e, "message", None) or "")


def error_code(e):
    from flatkv.ttypes import ErrorCode
    code = getattr(e, "code", None)
    if code is None:
        return None
    return ErrorCode._VALUES_TO_NAMES.get(code, str(code))


class Conn:
    """A reconnecting connection to one member."""

    def __init__(self, address):
        self.address = address
        self.c = None
        self.t = None

    def get(self):
        if self.c is None:
            self.c, self.t = cluster.client(self.address, OP_TIMEOUT_MS)
        return self.c

    def drop(self):
        if self.t is not None:
            try:
                self.t.close()
            except Exception:
                pass
        self.c = self.t = None


def run_op(history, conn, process, key, f, value=None):
    """Runs one operation, records it, returns the record."""
    rec = {"process": process, "key": key, "f": f, "member": conn.address}
    if value is not None:
        rec["value"] = value
    rec["call"] = time.monotonic_ns()
    try:
        c = conn.get()
    except Exception as e:
        # No connection, so nothing was sent: definitely not applied.
        rec.update(ret=time.monotonic_ns(), type="fail", error="connect: " + type(e).__name__)
        history.add(rec)
        return rec
    try:
        if f == "get":
            r = c.get(key)
            rec["found"] = bool(r.found)
            if r.found:
                rec["out"] = r.value.decode("latin-1")
        elif f == "put":
            c.put(key, value.encode())
        elif f == "append":
            c.append(key, value.encode())
        elif f == "remove":
            rec["found"] = bool(c.remove(key))
        rec["ret"] = time.monotonic_ns()
        rec["type"] = "ok"
    except Exception as e:
        now = time.monotonic_ns()
        code = error_code(e)
        if code is None:
            conn.drop()
            rec["type"] = "info"
            rec["error"] = type(e).__name__
        else:
            rec["error"] = code + ": " + (getattr(e, "message", None) or "")[:160]
            definite = f == "get" or write_failed(e, code)
            rec["type"] = "fail" if definite else "info"
            # The time the error came back is kept for the report (first
            # UNAVAILABLE); the checker ignores "ret" of an info op.
            rec["ret"] = now
    history.add(rec)
    return rec


class Workload:
    """Register threads (per_member per member), a reader and a set thread
    per member, until stop()."""

    def __init__(self, members, per_member=2, seed=1, set_threads=True, key_offsets=(0,)):
        self.key_offsets = list(key_offsets)
        self.history = History()
        self.stop_ev = threading.Event()
        self.t0 = time.monotonic()
        self.set_attempted, self.set_acked, self.set_failed = set(), set(), set()
        self._set_lock = threading.Lock()
        self.threads = []
        i = 0
        for m in members:
            for _ in range(per_member):
                self.threads.append(threading.Thread(
                    target=self._registers, args=(m.address, random.Random(seed * 1000 + i)), daemon=True))
                i += 1
        # A reader per member, gets only: a member's first refusal shows
        # even while its writer threads wait on forwards to an unreachable
        # peer (the report's first UNAVAILABLE), and more reads are judged.
        for m in members:
            self.threads.append(threading.Thread(
                target=self._reads, args=(m.address, random.Random(seed * 1000 + i)), daemon=True))
            i += 1
        if set_threads:
            for j, m in enumerate(members):
                self.threads.append(threading.Thread(target=self._set_adds, args=(m.address, j), daemon=True))
        for th in self.threads:
            th.start()

    def key(self, rng):
        gen = int((time.monotonic() - self.t0) / KEY_LIFE_S)
        slot = rng.randrange(NKEYS)
        return self.key_offsets[slot % len(self.key_offsets)] + REG_BASE + gen * NKEYS + slot

    def _registers(self, address, rng):
        conn = Conn(address)
        process = self.history.new_process()
        n = 0
        while not self.stop_ev.is_set():
            key = self.key(rng)
            x = rng.random()
            n += 1
            if x < 0.45:
                rec = run_op(self.history, conn, process, key, "get")
            elif x < 0.75:
                rec = run_op(self.history, conn, process, key, "put", "p%d.%d" % (process, n))
            elif x < 0.92:
                rec = run_op(self.history, conn, process, key, "append", ",a%d.%d" % (process, n))
            else:
                rec = run_op(self.history, conn, process, key, "remove")
            if rec["type"] == "info":
                process = self.history.new_process()  # the old one may still be running
            if rec["type"] != "ok":
                # Back off: every write in doubt is one more operation the
                # checker must try at every point after its call.
                time.sleep(0.1 if rec["type"] == "info" or rec["error"].startswith("connect") else 0.02)

    def _reads(self, address, rng):
        conn = Conn(address)
        process = self.history.new_process()
        while not self.stop_ev.is_set():
            rec = run_op(self.history, conn, process, self.key(rng), "get")
            if rec["type"] == "info":
                process = self.history.new_process()
            if rec["type"] != "ok":
                time.sleep(0.02)

    def _set_adds(self, address, j):
        conn = Conn(address)
        for n in itertools.count():
            if self.stop_ev.is_set():
                return
            key = SET_BASE + j * SET_SPAN + n
            with self._set_lock:
                self.set_attempted.add(key)
            try:
                conn.get().put(key, b"e")
                with self._set_lock:
                    self.set_acked.add(key)
            except Exception as e:
                if error_code(e) is None:
                    conn.drop()
                elif write_failed(e, error_code(e)):
                    with self._set_lock:
                        self.set_failed.add(key)
                time.sleep(0.05)

    def stop(self):
        self.stop_ev.set()
        for th in self.threads:
            th.join(timeout=10)

    def register_keys(self):
        return sorted({r["key"] for r in self.history.ops})

    def final_register_reads(self, members):
        """A get of every register key used, through every member, into the history."""
        for m in members:
            conn = Conn(m.address)
            process = self.history.new_process()
            for k in self.register_keys():
                rec = run_op(self.history, conn, process, k, "get")
                if rec["type"] == "info":
                    process = self.history.new_process()

    def final_set_read(self, member):
        """The set elements present, read with scan through "member"; None on failure."""
        present = set()
        c, t = cluster.client(member.address, 10000)
        try:
            key = SET_BASE
            while True:
                r = c.scan(key, 1000, False)
                for p in r.pairs:
                    if p.key >= SET_BASE + len(self.threads) * SET_SPAN:
                        return present
                    present.add(p.key)
                if r.done or not r.pairs:
                    return present
                key = r.nextKey
        finally:
            t.close()

    def set_result(self, present):
        lost = self.set_acked - present
        unexpected = present - self.set_attempted
        revived = present & self.set_failed
        return {"attempted": len(self.set_attempted), "acked": len(self.set_acked),
                "present": len(present), "lost": len(lost), "unexpected": len(unexpected),
                "failed_but_present": len(revived), "lost_sample": sorted(lost)[:10]}
