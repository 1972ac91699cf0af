#!/usr/bin/python3
"""Calls whose length fields lie, against the real flatkv-server: a short
frame claiming a string of ~2 GB, or a list of 2^31-1 elements, must be
answered PROTOCOL_ERROR without the server allocating what the call only
claims (Thrift 0.17 would resize the string or list to the claimed length
first: found by tests/fuzz/peer_fuzz). Both server kinds: the EventServer
(calls on the I/O threads) and Thrift's TNonblockingServer (a worker pool).
Usage: lying_lengths_test.py FLATKV_SERVER THRIFT_COMPILER FLATKV_THRIFT"""
import os
import socket
import struct
import sys

import harness
from harness import check, free_port

server_bin, thrift_bin, idl = sys.argv[1:4]
work = harness.workdir("flatkv-lengths-", thrift_bin, idl)
from thrift.protocol import TBinaryProtocol  # noqa: E402
from thrift.Thrift import TApplicationException, TMessageType  # noqa: E402
from thrift.transport import TTransport  # noqa: E402

SERVER_ENV = dict(os.environ, ASAN_OPTIONS="quarantine_size_mb=0")


def rss_mib(proc):
    with open("/proc/%d/status" % proc.pid) as f:
        for line in f:
            if line.startswith("VmHWM:"):  # peak RSS: a transient allocation counts
                return int(line.split()[1]) // 1024
    return 0


def header(name):
    return struct.pack(">I", 0x80010001) + struct.pack(">i", len(name)) + name + struct.pack(">i", 1)


def put_with_long_value():
    # put(1: i64 key = 1, 2: binary value claiming 2,000,000,000 bytes)
    return (header(b"put") + b"\x0a\x00\x01" + struct.pack(">q", 1) + b"\x0b\x00\x02" +
            struct.pack(">i", 2000000000) + b"abc")


def multiput_with_long_list():
    # multiPut(1: list<KvPair> claiming 2^31-1 elements)
    return header(b"multiPut") + b"\x0f\x00\x01\x0c" + struct.pack(">i", 0x7fffffff) + b"\x00"


def sput_with_long_key():
    return header(b"sput") + b"\x0b\x00\x01" + struct.pack(">i", 1500000000) + b"k"


def answer(port, body):
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(10)
    try:
        s.sendall(struct.pack(">i", len(body)) + body)
        head = s.recv(4)
        if len(head) < 4:
            return None
        n = struct.unpack(">i", head)[0]
        data = b""
        while len(data) < n:
            chunk = s.recv(n - len(data))
            if not chunk:
                break
            data += chunk
        return data
    except (ConnectionResetError, socket.timeout):
        return None
    finally:
        s.close()


def protocol_error(payload):
    if payload is None:
        return False
    p = TBinaryProtocol.TBinaryProtocol(TTransport.TMemoryBuffer(payload))
    _, mtype, _ = p.readMessageBegin()
    if mtype != TMessageType.EXCEPTION:
        return False
    x = TApplicationException()
    x.read(p)
    return x.type == TApplicationException.PROTOCOL_ERROR


for kind, extra in (("I/O-thread server", ["--set", "server.workers=0"]),
                    ("worker-pool server", ["--set", "server.workers=2"])):
    port = free_port()
    proc = harness.start(server_bin, port, os.path.join(work, "data-" + extra[1][-1]), *extra,
                         env=SERVER_ENV)
    before = rss_mib(proc)
    for name, body in (("a 2 GB value", put_with_long_value()),
                       ("a list of 2^31-1 pairs", multiput_with_long_list()),
                       ("a 1.5 GB string key", sput_with_long_key())):
        for _ in range(3):
            got = answer(port, body)
        check(protocol_error(got), "%s: a call claiming %s is answered PROTOCOL_ERROR" % (kind, name))
    grew = rss_mib(proc) - before
    check(grew < 64, "%s: peak RSS grew by %d MiB (less than 64)" % (kind, grew))
    kv, t = harness.client(port)
    kv.put(5, b"still here")
    check(kv.get(5).value == b"still here", "%s: the server still serves" % kind)
    t.close()
    check(harness.stop(proc) == 0, "%s: SIGTERM stops it cleanly" % kind)
harness.finish(work)
