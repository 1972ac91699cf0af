#!/usr/bin/python3
"""The first member of a new ring answers every call while it starts.

Before its own registration reaches its view, the first instance of a ring
has read a ring with no mark at all (nothing registered yet). Calls that
arrive then have no owner to go to: each must fail with UNAVAILABLE, and
the instance must go on to serve once it has registered. A batch routed by
that empty ring once crashed the instance (SIGSEGV).

A real ZooKeeper on loopback; in each round a fresh service path (so a new,
empty ring) and one member of mark 1000, started while client threads
already knock on its port, each sending one kind of call (multiPut,
multiGet, put, get, scan, scanLog, sput) in a loop until the calls are
served. Every answer must be a success or an UNAVAILABLE; the instance must
stay up; at least one round must have seen the empty ring's UNAVAILABLE
(else nothing was tested); and every acknowledged write must read back.

Usage: ring_start_test.py FLATKV_SERVER THRIFT_COMPILER FLATKV_THRIFT"""
import os
import subprocess
import sys
import threading
import time

import harness
from harness import check

server_bin, thrift_bin, idl = sys.argv[1:4]
work = harness.workdir("flatkv-ring-start-", thrift_bin, idl)
from flatkv.ttypes import ErrorCode, KvError, KvPair  # noqa: E402

import logging  # noqa: E402
logging.getLogger("thrift").setLevel(logging.CRITICAL)

ROUNDS = 6
EMPTY = "holds no mark yet"
zk = harness.ZooKeeper(work)


def caller(port, kind, out, stop):
    """Sends calls of one kind to "port" until one is served (then a few
    more), recording every error; connections refused before the port
    listens are retried."""
    served = 0
    n = 0
    while not stop.is_set() and served < 20:
        try:
            c, t = harness.client(port, 2000)
        except Exception:
            time.sleep(0.002)
            continue
        try:
            while not stop.is_set() and served < 20:
                n += 1
                key = (n % 500) * 2
                try:
                    if kind == "multiPut":
                        c.multiPut([KvPair(key, b"m%d" % key), KvPair(key + 1, b"m%d" % (key + 1))])
                        out["acked"][key] = b"m%d" % key
                        out["acked"][key + 1] = b"m%d" % (key + 1)
                    elif kind == "multiGet":
                        c.multiGet([key, key + 1])
                    elif kind == "put":
                        c.put(100000 + key, b"p%d" % key)
                        out["acked"][100000 + key] = b"p%d" % key
                    elif kind == "get":
                        c.get(key)
                    elif kind == "scan":
                        c.scan(0, 10, False)
                    elif kind == "scanLog":
                        c.scanLog(b"", 10)
                    elif kind == "sput":
                        c.sput(b"s%d" % key, b"s%d" % key)
                        out["sacked"][b"s%d" % key] = b"s%d" % key
                    served += 1
                except KvError as e:
                    if e.code != ErrorCode.UNAVAILABLE:
                        out["bad"].append("%s: %s %s" % (kind, ErrorCode._VALUES_TO_NAMES.get(e.code),
                                                         e.message))
                        return
                    out["unavailable"].append(e.message)
                    time.sleep(0.001)
        except Exception as e:  # the connection broke: the server may have died
            out["broken"].append("%s: %r" % (kind, e))
            time.sleep(0.01)
        finally:
            t.close()


KINDS = ("multiPut", "multiGet", "put", "get", "scan", "scanLog", "sput")
saw_empty = 0
for r in range(ROUNDS):
    port = harness.free_port()
    out = {"acked": {}, "sacked": {}, "bad": [], "unavailable": [], "broken": []}
    stop = threading.Event()
    threads = [threading.Thread(target=caller, args=(port, k, out, stop)) for k in KINDS]
    for t in threads:
        t.start()
    log = os.path.join(work, "m%d.log" % r)
    proc = harness.start_member(server_bin, port, os.path.join(work, "m%d" % r), zk, 1000,
                                "--set", "cluster.service_path=/start%d" % r,
                                "--set", "cluster.replication=sync", log=log)
    deadline = time.monotonic() + 30
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        time.sleep(0.01)
    stop.set()
    for t in threads:
        t.join()
    status = proc.poll()
    check(status is None, "round %d: the member stays up while it starts (exit status %s; log %s)"
          % (r, status, log))
    if status is not None:
        continue
    check(not out["bad"], "round %d: answers other than UNAVAILABLE: %s" % (r, out["bad"][:5]))
    check(not out["broken"], "round %d: connections broken: %s" % (r, out["broken"][:5]))
    empty = sum(1 for m in out["unavailable"] if EMPTY in m)
    saw_empty += 1 if empty else 0
    acked = out["acked"]
    got = harness.call(port, lambda c: c.multiGet(sorted(acked)))
    lost = [k for k, res in zip(sorted(acked), got) if not (res.found and res.value == acked[k])]
    lost += [k for k, v in out["sacked"].items()
             if harness.call(port, lambda c: c.sget(k)).value != v]
    check(not lost, "round %d: every acknowledged write reads back (lost: %s)" % (r, lost[:5]))
    print("round %d: %d UNAVAILABLE while starting (%d of an empty ring), %d writes acknowledged"
          % (r, len(out["unavailable"]), empty, len(acked) + len(out["sacked"])))
    harness.stop(proc)

check(saw_empty > 0, "no round met the instance's empty ring: the test tested nothing")
harness.finish(work)
