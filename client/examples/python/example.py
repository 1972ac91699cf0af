#!/usr/bin/env python3
"""The FlatKV client in Python: the shortest correct program to copy. One
framed, binary-protocol connection with a timeout, reused for every call.

    thrift --gen py flatkv.thrift && PYTHONPATH=gen-py python3 example.py 127.0.0.1 9901

A third argument, a CA file (PEM), connects over TLS to a server with
server.tls_cert_file: its certificate must chain to that CA and name the host.

Debian's python3-thrift (0.17) is what /usr/bin/python3 imports; PyPI's
newest is `pip install thrift==0.16.0`, which works the same."""
import sys

from thrift.protocol import TBinaryProtocol
from thrift.transport import TSSLSocket, TSocket, TTransport

from flatkv import FlatKV
from flatkv.ttypes import ErrorCode, KvError, KvPair

host, port = (sys.argv[1], int(sys.argv[2])) if len(sys.argv) > 2 else ("127.0.0.1", 9901)
if len(sys.argv) > 3:  # TLS: the server is verified against this CA (cert_reqs=CERT_REQUIRED)
    sock = TSSLSocket.TSSLSocket(host, port, ca_certs=sys.argv[3])
else:
    sock = TSocket.TSocket(host, port)
sock.setTimeout(5000)  # ms, for connecting and for every call
transport = TTransport.TFramedTransport(sock)
transport.open()
kv = FlatKV.Client(TBinaryProtocol.TBinaryProtocol(transport))

# Integer keys.
kv.put(1, b"hello")
print("get 1 =", kv.get(1).value.decode())
print("get 2 found =", str(kv.get(2).found).lower())  # not found is not an error

# String keys.
kv.sput(b"user:42", b'{"name":"ada"}')
print("sget user:42 =", kv.sget(b"user:42").value.decode())

# A batch: one round trip; results come in request order.
kv.multiPut([KvPair(10, b"v10"), KvPair(11, b"v11"), KvPair(12, b"v12")])
print("multiGet 10 11 12 =", " ".join(r.value.decode() for r in kv.multiGet([10, 11, 12])))

# Every failure the server reports is a typed KvError.
try:
    kv.put(-5, b"x")
except KvError as e:
    print("put -5: KvError %s: %s" % (ErrorCode._VALUES_TO_NAMES[e.code], e.message))

transport.close()
