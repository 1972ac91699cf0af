#!/usr/bin/python3
"""Integration test: bad input against the real flatkv-server. Each bad
request gets its precise answer (or closes only its own connection), the
server keeps serving, and its memory does not jump. Also overload: with the
worker queue full, calls are answered OVERLOADED instead of queuing.
Usage: bad_input_test.py FLATKV_SERVER THRIFT_COMPILER FLATKV_THRIFT"""
import os
import socket
import struct
import subprocess
import sys
import time

import harness
from harness import check, client, free_port, stop

server_bin, thrift_bin, idl = sys.argv[1:4]
work = harness.workdir("flatkv-bad-", thrift_bin, idl)
from thrift.Thrift import TApplicationException, TMessageType, TType  # noqa: E402
from thrift.protocol import TBinaryProtocol  # noqa: E402
from thrift.transport import TTransport  # noqa: E402
from flatkv import FlatKV  # noqa: E402
from flatkv.ttypes import (ChainFrame, ChainKind, ErrorCode, KvError, KvPair,  # noqa: E402
                           PeerContext, SnapshotPage, TrackToken)

# In a sanitizer build, freed memory waits in ASan's quarantine (256 MiB)
# and would read as growth; without it RSS shows what the server keeps.
SERVER_ENV = dict(os.environ, ASAN_OPTIONS="quarantine_size_mb=0")


def start(port, data, *extra):
    return harness.start(server_bin, port, data, *extra, env=SERVER_ENV)


def rss_kib(proc):
    with open("/proc/%d/status" % proc.pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def message(name, mtype, seqid, fields):
    """A binary-protocol message; fields = [(id, TType, writer)]."""
    buf = TTransport.TMemoryBuffer()
    p = TBinaryProtocol.TBinaryProtocol(buf)
    p.writeMessageBegin(name, mtype, seqid)
    p.writeStructBegin("args")
    for fid, ftype, write in fields:
        p.writeFieldBegin("f", ftype, fid)
        write(p)
        p.writeFieldEnd()
    p.writeFieldStop()
    p.writeStructEnd()
    p.writeMessageEnd()
    return buf.getvalue()


def recv_exact(sock, n):
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            return None
        out += chunk
    return out


def call_raw(port, body, framed=True, timeout=5):
    """Sends one request; returns the answer frame's payload, or None if the
    server closed the connection without answering."""
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(timeout)
    try:
        s.sendall((struct.pack(">i", len(body)) if framed else b"") + body)
        head = recv_exact(s, 4)
        if head is None:
            return None
        return recv_exact(s, struct.unpack(">i", head)[0])
    except (ConnectionResetError, socket.timeout):
        return None
    finally:
        s.close()


def decode_exception(payload):
    """(message type, TApplicationException) of an answer."""
    p = TBinaryProtocol.TBinaryProtocol(TTransport.TMemoryBuffer(payload))
    _, mtype, _ = p.readMessageBegin()
    if mtype != TMessageType.EXCEPTION:
        return mtype, None
    x = TApplicationException()
    x.read(p)
    return mtype, x


def closed_without_answer(port, payload):
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(5)
    s.sendall(payload)
    try:
        got = s.recv(16)
    except (ConnectionResetError, socket.timeout):
        got = None
    s.close()
    return got == b""


def stat(c, name):
    return c.stats()[name]


data = os.path.join(work, "data")
port = free_port()
# Two I/O threads, whatever the machine: connections handed between them.
proc = start(port, data, "--set", "storage.max_value_bytes=1Mi",
             "--set", "server.max_frame_bytes=4Mi", "--set", "server.io_threads=2")
c, t = client(port)
for k in range(100):
    c.put(k, b"v%d" % k)
rss_before = rss_kib(proc)
errors_before = stat(c, "server.protocol_errors")

# An unframed client: its first four bytes read as a huge frame length.
unframed = message("get", TMessageType.CALL, 1, [(1, TType.I64, lambda p: p.writeI64(1))])
check(closed_without_answer(port, unframed), "an unframed client is disconnected")
check(closed_without_answer(port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
      "an HTTP request on the Thrift port is disconnected")
check(closed_without_answer(port, struct.pack(">I", 0x80000000) + b"xyz"),
      "a frame header claiming 2 GiB is disconnected")
check(closed_without_answer(port, struct.pack(">i", 5 << 20) + b"x" * 1000),
      "a frame over server.max_frame_bytes is disconnected")
check(stat(c, "server.protocol_errors") >= errors_before + 4,
      "each refused frame is counted in server.protocol_errors")

# Truncated frames: the header promises more than arrives.
s = socket.create_connection(("127.0.0.1", port))
s.sendall(struct.pack(">i", 1000) + b"\x80\x01\x00\x01")
s.close()
stalled = socket.create_connection(("127.0.0.1", port))
stalled.sendall(struct.pack(">i", 1000) + unframed[:10])  # and then nothing
check(c.get(5).value == b"v5", "a truncated frame, closed or stalled, does not stall others")

# Complete frames whose message is bad.
answer = call_raw(port, unframed[:len(unframed) - 5])
mtype, x = decode_exception(answer) if answer else (None, None)
check(x is not None and x.type == TApplicationException.PROTOCOL_ERROR and "get" in x.message,
      "arguments cut short inside a frame get PROTOCOL_ERROR naming the method")
answer = call_raw(port, message("nosuchMethod", TMessageType.CALL, 7, []))
mtype, x = decode_exception(answer) if answer else (None, None)
check(x is not None and x.type == TApplicationException.UNKNOWN_METHOD and "nosuchMethod" in x.message,
      "an unknown method name gets UNKNOWN_METHOD")
answer = call_raw(port, message("put", TMessageType.CALL, 8,
                                [(1, TType.STRING, lambda p: p.writeString("12")),
                                 (2, TType.STRING, lambda p: p.writeBinary(b"v"))]))
mtype, x = decode_exception(answer) if answer else (None, None)
check(x is not None and x.type == TApplicationException.PROTOCOL_ERROR and "put" in x.message,
      "a mistyped argument gets PROTOCOL_ERROR naming the method")
check(c.get(0).value == b"v0", "a mistyped put does not write key 0 with a default")
answer = call_raw(port, message("get", TMessageType.CALL, 9, []))
mtype, x = decode_exception(answer) if answer else (None, None)
check(x is not None and x.type == TApplicationException.PROTOCOL_ERROR,
      "a missing argument gets PROTOCOL_ERROR")
answer = call_raw(port, message("get", TMessageType.REPLY, 10,
                                [(1, TType.I64, lambda p: p.writeI64(1))]))
mtype, x = decode_exception(answer) if answer else (None, None)
check(x is not None and x.type == TApplicationException.INVALID_MESSAGE_TYPE,
      "a message that is not a call gets INVALID_MESSAGE_TYPE")
# peerChain is oneway: called as a call that waits, it is refused with an
# answer (rather than leaving the caller waiting for one that never comes);
# a method that answers, called oneway, is refused too.
answer = call_raw(port, message("peerChain", TMessageType.CALL, 11, []))
mtype, x = decode_exception(answer) if answer else (None, None)
check(x is not None and x.type == TApplicationException.INVALID_MESSAGE_TYPE and
      "oneway" in x.message, "peerChain called as a two-way call gets INVALID_MESSAGE_TYPE")
answer = call_raw(port, message("get", TMessageType.ONEWAY, 12,
                                [(1, TType.I64, lambda p: p.writeI64(1))]))
mtype, x = decode_exception(answer) if answer else (None, None)
check(x is not None and x.type == TApplicationException.INVALID_MESSAGE_TYPE and
      "oneway" in x.message, "get called oneway gets INVALID_MESSAGE_TYPE")
# A oneway peerChain is never answered, even when refused: a malformed one
# (no arguments) and a well-formed one this standalone server does not
# take (NOT_OWNER) are dropped, counted and logged; the server goes on.
malformed_before = stat(c, "server.malformed_calls")
chain_errors_before = stat(c, "errors.peerChain")
check(call_raw(port, message("peerChain", TMessageType.ONEWAY, 13, []), timeout=1) is None,
      "a malformed oneway peerChain gets no answer")

buf = TTransport.TMemoryBuffer()
p = TBinaryProtocol.TBinaryProtocol(buf)
p.writeMessageBegin("peerChain", TMessageType.ONEWAY, 14)
FlatKV.peerChain_args(
    peer=PeerContext(token="", ringVersion=1, mark=1), sender="127.0.0.1:1",
    frame=ChainFrame(kind=ChainKind.ACK, chain=1, entries=[], applied=0, committed=0, floor=0,
                     positionEpoch=0, positionSeq=0)).write(p)
p.writeMessageEnd()
check(call_raw(port, buf.getvalue(), timeout=1) is None,
      "a oneway peerChain to a server in no chain gets no answer")
check(stat(c, "server.malformed_calls") == malformed_before + 1,
      "the malformed oneway call is counted in server.malformed_calls")
check(stat(c, "errors.peerChain") == chain_errors_before + 1,
      "the refused peerChain (NOT_OWNER) is counted in errors.peerChain")
check(c.get(0).value == b"v0", "the server serves on after refused oneway calls")

# Every two-way peer* call is one a ring member answers: a standalone
# server refuses each with NOT_OWNER naming the method and saying it is
# standalone, counts it in errors.<method>, and applies nothing.
ctx = PeerContext(token="", ringVersion=1, mark=1)
page = SnapshotPage(token=0, first=True, last=True, atEpoch=1, atSeq=1,
                    pairs=[KvPair(key=0, value=b"overwritten?")], spairs=[])
peer_calls = {
    "peerGet": lambda: c.peerGet(ctx, 0),
    "peerPut": lambda: c.peerPut(ctx, 0, b"overwritten?"),
    "peerRemove": lambda: c.peerRemove(ctx, 0),
    "peerAppend": lambda: c.peerAppend(ctx, 0, b"+"),
    "peerMultiGet": lambda: c.peerMultiGet(ctx, [0]),
    "peerMultiPut": lambda: c.peerMultiPut(ctx, [KvPair(key=0, value=b"overwritten?")]),
    "peerScan": lambda: c.peerScan(ctx, 0, 10, False, 0, 100),
    "peerScanLog": lambda: c.peerScanLog(ctx, b"", 10),
    "peerSGet": lambda: c.peerSGet(ctx, b"s"),
    "peerSPut": lambda: c.peerSPut(ctx, b"s", b"v"),
    "peerSRemove": lambda: c.peerSRemove(ctx, b"s"),
    "peerSnapshot": lambda: c.peerSnapshot(ctx, "127.0.0.1:1", page),
    "peerRepair": lambda: c.peerRepair(ctx, 0),
    "peerBucket": lambda: c.peerBucket(ctx, 16, 0, True),
    "peerExport": lambda: c.peerExport(ctx, 0, 100, b"", 10),
    "peerFence": lambda: c.peerFence(ctx),
    "peerTrack": lambda: c.peerTrack(ctx, 1),
    "peerDelta": lambda: c.peerDelta(ctx, TrackToken(head="127.0.0.1:1", nonce=1, czxid=1),
                                     b"", 10),
    "peerDrop": lambda: c.peerDrop(ctx, 0, 100, 10),
}
refused = {}
for name, call in peer_calls.items():
    before = stat(c, "errors." + name)
    try:
        call()
        refused[name] = "answered"
    except KvError as e:
        refused[name] = (e.code == ErrorCode.NOT_OWNER and name in e.message and
                         "standalone" in e.message and stat(c, "errors." + name) == before + 1)
        if not refused[name]:
            refused[name] = "%s %r" % (ErrorCode._VALUES_TO_NAMES[e.code], e.message)
wrong = {n: r for n, r in refused.items() if r is not True}
check(not wrong, "a standalone server refuses each of %d peer* calls with NOT_OWNER naming it, "
      "counted (%s)" % (len(peer_calls), wrong))
check(c.get(0).value == b"v0" and not c.sget(b"s").found,
      "... and none of them wrote anything")
answer = call_raw(port, b"\x80\x01\x00")
mtype, x = decode_exception(answer) if answer else (None, None)
check(x is not None and x.type == TApplicationException.PROTOCOL_ERROR,
      "a frame too short for a message header gets PROTOCOL_ERROR")
check(closed_without_answer(port, struct.pack(">i", 0)),
      "a frame of length 0 is disconnected")

# Pipelining: two calls in one write on one connection are both answered,
# in order (the second reads what the first wrote).
s = socket.create_connection(("127.0.0.1", port))
s.settimeout(5)
first = message("put", TMessageType.CALL, 21, [(1, TType.I64, lambda p: p.writeI64(300)),
                                               (2, TType.STRING, lambda p: p.writeBinary(b"p1"))])
second = message("get", TMessageType.CALL, 22, [(1, TType.I64, lambda p: p.writeI64(300))])
s.sendall(struct.pack(">i", len(first)) + first + struct.pack(">i", len(second)) + second)
answers = []
for _ in range(2):
    head = recv_exact(s, 4)
    answers.append(recv_exact(s, struct.unpack(">i", head)[0]) if head else None)
s.close()
seqids, got = [], None
for payload, result in zip(answers, (FlatKV.put_result(), FlatKV.get_result())):
    if payload is None:
        break
    p = TBinaryProtocol.TBinaryProtocol(TTransport.TMemoryBuffer(payload))
    seqids.append(p.readMessageBegin()[2])
    result.read(p)
    got = result
check(seqids == [21, 22] and got is not None and got.success is not None and
      got.success.value == b"p1",
      "two calls pipelined in one write both get their answers, in order")

# A second server on a port already served is refused (SO_REUSEPORT must
# not let it share the port).
second_server = subprocess.run([server_bin, "--set", "server.port=%d" % port,
                                "--set", "storage.path=" + os.path.join(work, "second")],
                               capture_output=True, text=True, timeout=30, env=SERVER_ENV)
check(second_server.returncode == 1, "a second server on the same port exits 1")

try:
    c.setWriteMode("", 7)
    check(False, "an unknown write mode is INVALID_ARGUMENT")
except KvError as e:
    check(e.code == ErrorCode.INVALID_ARGUMENT and "7" in e.message,
          "an unknown write mode is INVALID_ARGUMENT")

# Oversized values: over storage.max_value_bytes is a typed error; over the
# frame limit closes that connection only.
try:
    c.put(1, b"x" * ((1 << 20) + 1))
    check(False, "a value over storage.max_value_bytes is VALUE_TOO_LARGE")
except KvError as e:
    check(e.code == ErrorCode.VALUE_TOO_LARGE and "1048577" in e.message,
          "a value over storage.max_value_bytes is VALUE_TOO_LARGE")
try:
    c.multiPut([KvPair(200, b"ok"), KvPair(201, b"x" * ((1 << 20) + 1))])
    check(False, "a batch with one oversized value is refused whole")
except KvError as e:
    check(e.code == ErrorCode.VALUE_TOO_LARGE and not c.get(200).found,
          "a batch with one oversized value is refused whole")
big = socket.create_connection(("127.0.0.1", port))
body = message("put", TMessageType.CALL, 1, [(1, TType.I64, lambda p: p.writeI64(3)),
                                             (2, TType.STRING, lambda p: p.writeBinary(b"x" * (6 << 20)))])
big.sendall(struct.pack(">i", len(body)) + body[:65536])
big.settimeout(5)
try:
    closed = big.recv(16) == b""
except OSError:
    closed = True  # reset: closed too
check(closed, "a value over the frame limit closes that connection")
big.close()

# Memory: 40 connections each sending an almost-max frame (refused values),
# plus 200 garbage connections, must not leave the server holding them.
for i in range(40):
    body = message("put", TMessageType.CALL, 1,
                   [(1, TType.I64, lambda p: p.writeI64(3)),
                    (2, TType.STRING, lambda p: p.writeBinary(b"y" * (3 << 20)))])
    call_raw(port, body)
for i in range(200):
    closed_without_answer(port, b"\xff" * 64)
grown_mib = (rss_kib(proc) - rss_before) / 1024.0
print("     rss grew by %.1f MiB" % grown_mib)
check(grown_mib < 64, "memory does not jump after 40 frames of 3 MiB and 200 garbage connections")

# A client that pipelines calls without reading the answers: the server
# stops reading it while more than a frame of answers waits (memory stays
# bounded), and every answer still arrives, in order, once it reads.
c.put(400, b"w" * (1 << 20))
s = socket.create_connection(("127.0.0.1", port))
s.settimeout(20)
get400 = [message("get", TMessageType.CALL, i, [(1, TType.I64, lambda p: p.writeI64(400))])
          for i in range(40)]
s.sendall(b"".join(struct.pack(">i", len(m)) + m for m in get400))
time.sleep(0.5)
in_order = 0
for i in range(40):
    head = recv_exact(s, 4)
    payload = recv_exact(s, struct.unpack(">i", head)[0]) if head else None
    if payload is None:
        break
    p = TBinaryProtocol.TBinaryProtocol(TTransport.TMemoryBuffer(payload))
    seqid = p.readMessageBegin()[2]
    result = FlatKV.get_result()
    result.read(p)
    in_order += seqid == i and result.success is not None and len(result.success.value) == 1 << 20
s.close()
check(in_order == 40, "40 pipelined gets of 1 MiB, read late, are all answered in order")

t.close()
stalled.close()
c, t = client(port)
check(c.get(99).value == b"v99" and proc.poll() is None, "the server still serves after all of it")
t.close()
check(stop(proc) == 0, "and stops cleanly")

# server.max_connections: connections past it are closed on accept; the
# ones already open keep working, and closing some makes room again.
port = free_port()
proc = start(port, os.path.join(work, "conns"), "--set", "server.max_connections=4")
held = []
for i in range(4):
    c2, t2 = client(port)
    c2.put(i, b"c")
    held.append((c2, t2))
extra = socket.create_connection(("127.0.0.1", port))
extra.settimeout(5)
try:
    refused = extra.recv(16) == b""
except socket.timeout:
    refused = False  # still open: the limit was not enforced
except OSError:
    refused = True  # reset
extra.close()
check(refused, "a connection past server.max_connections is closed")
check(all(c2.get(i).value == b"c" for i, (c2, _) in enumerate(held)),
      "the connections within the limit keep working")
for _, t2 in held:
    t2.close()
time.sleep(0.2)
c2, t2 = client(port)
check(c2.get(0).value == b"c", "closing connections makes room again")
t2.close()
check(stop(proc) == 0, "the server at its connection limit stops cleanly")

# Overload: one worker, sync: always (each put waits for fdatasync) and a
# queue limit of 1. Twenty calls sent at once: the first runs, those that
# find the queue full behind them are answered OVERLOADED; none is lost.
port = free_port()
proc = start(port, os.path.join(work, "overload"), "--set", "server.workers=1",
             "--set", "server.max_queued_calls=1", "--set", "storage.sync=always")
socks = []
for i in range(20):
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(10)
    socks.append(s)
payloads = [message("put", TMessageType.CALL, i,
                    [(1, TType.I64, lambda p, i=i: p.writeI64(i)),
                     (2, TType.STRING, lambda p: p.writeBinary(b"z" * 200000))]) for i in range(20)]
for s, body in zip(socks, payloads):
    s.sendall(struct.pack(">i", len(body)) + body)
overloaded, ok = [], []
for i, s in enumerate(socks):
    head = recv_exact(s, 4)
    payload = recv_exact(s, struct.unpack(">i", head)[0])
    p = TBinaryProtocol.TBinaryProtocol(TTransport.TMemoryBuffer(payload))
    p.readMessageBegin()
    result = FlatKV.put_result()
    result.read(p)
    if result.err is not None and result.err.code == ErrorCode.OVERLOADED:
        overloaded.append(i)
        msg = result.err.message
    elif result.err is None:
        ok.append(i)
    s.close()
print("     %d ok, %d overloaded" % (len(ok), len(overloaded)))
check(len(overloaded) > 0 and len(ok) > 0 and len(ok) + len(overloaded) == 20,
      "a full worker queue answers OVERLOADED instead of queuing")
check(len(overloaded) == 0 or "server.max_queued_calls" in msg, "the OVERLOADED message names the limit")
c, t = client(port)
check(all(c.get(i).found for i in ok) and not any(c.get(i).found for i in overloaded),
      "every acknowledged put is there; no rejected one is")
check(stat(c, "server.overloaded") == len(overloaded), "stats counts server.overloaded")
t.close()
check(stop(proc) == 0, "the overloaded server stops cleanly")

harness.finish(work)
