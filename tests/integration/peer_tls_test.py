#!/usr/bin/python3
"""cluster.peer_tls against a real ZooKeeper and real members, with
certificates this test makes with the openssl command: two marks, mark A a
sync chain of two, every member with TLS on its port, client certificates
required (so a peer without one is refused) and calls between instances over
TLS. Writes through every member (single-key calls forwarded by the I/O
thread, batches by the workers, chain replication to A's tail) are read back
through every member. The CA is then rotated under the running ring (both
CAs trusted, new certificates, the new CA only), files replaced in place:
calls to a restarted member present the new certificate without a restart
of the others. A TLS ring member without cluster.peer_tls, and
cluster.peer_tls without a CA, are configuration errors.

Usage: peer_tls_test.py FLATKV_SERVER FLATKV_CLI THRIFT_COMPILER FLATKV_THRIFT"""
import os
import ssl
import subprocess
import sys
import time

import harness
from harness import check, free_port

server_bin, cli_bin, thrift_bin, idl = sys.argv[1:5]
work = harness.workdir("flatkv-peertls-", thrift_bin, idl)

from thrift.protocol import TBinaryProtocol  # noqa: E402
from thrift.transport import TSSLSocket, TTransport  # noqa: E402
from flatkv import FlatKV  # noqa: E402
from flatkv.ttypes import KvPair  # noqa: E402

certs = os.path.join(work, "certs")
os.makedirs(certs)
EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]


def openssl(*args):
    subprocess.run(["openssl", *args], cwd=certs, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def path(name):
    return os.path.join(certs, name)


openssl("req", "-x509", *EC, "-keyout", "ca.key", "-out", "ca.pem", "-days", "30",
        "-subj", "/CN=ca")
with open(path("san.ext"), "w") as f:
    f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
for name in ("member", "client"):
    openssl("req", *EC, "-keyout", name + ".key", "-out", name + ".csr", "-subj", "/CN=" + name)
    openssl("x509", "-req", "-in", name + ".csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "30", "-extfile", "san.ext", "-out", name + ".pem")
    os.chmod(path(name + ".key"), 0o600)

TLS = ["--set", "server.tls_cert_file=" + path("member.pem"),
       "--set", "server.tls_key_file=" + path("member.key"),
       "--set", "server.tls_ca_file=" + path("ca.pem"),
       "--set", "server.tls_client_auth=required",
       "--set", "cluster.peer_tls=true"]
A, B = 1000, 2000  # integer keys [0, A) and (B, max) belong to A, [A, B) to B
KEYS = list(range(0, 3000, 37))


def tls_call(port, fn, timeout_ms=5000):
    sock = TSSLSocket.TSSLSocket("127.0.0.1", port, ca_certs=path("ca.pem"),
                                 cert_reqs=ssl.CERT_REQUIRED, certfile=path("client.pem"),
                                 keyfile=path("client.key"))
    sock.setTimeout(timeout_ms)
    t = TTransport.TFramedTransport(sock)
    t.open()
    try:
        return fn(FlatKV.Client(TBinaryProtocol.TBinaryProtocol(t)))
    finally:
        t.close()


def ring(port):
    try:
        r = tls_call(port, lambda c: c.ring())
        return {p.mark: ["%s:%d" % (m.host, m.port) for m in p.chain] for p in r.partitions}
    except Exception:
        return None


zk = harness.ZooKeeper(work)
members = {}
for name, mark in (("a1", A), ("a2", A), ("b1", B)):
    members[name] = harness.Member(work, server_bin, zk, name, mark, *TLS)
    time.sleep(0.3)  # a1 heads A's chain, a2 is its tail
ports = [m.port for m in members.values()]
expected = {A: ["127.0.0.1:%d" % members["a1"].port, "127.0.0.1:%d" % members["a2"].port],
            B: ["127.0.0.1:%d" % members["b1"].port]}
deadline = time.time() + 30
while time.time() < deadline and not all(ring(p) == expected for p in ports):
    time.sleep(0.1)
check(all(ring(p) == expected for p in ports), "the TLS ring forms: %s" % ring(ports[0]))


def value(k, who):
    return ("v%d-%s" % (k, who)).encode()


def write_all(port, who):
    deadline = time.time() + 15
    while True:
        try:
            tls_call(port, lambda c: [c.put(k, value(k, who)) for k in KEYS[::2]])
            tls_call(port, lambda c: c.multiPut([KvPair(k, value(k, who)) for k in KEYS[1::2]]))
            return True
        except Exception as e:  # a chain not yet recorded answers UNAVAILABLE
            if time.time() > deadline:
                print("write through %d: %s" % (port, e))
                return False
            time.sleep(0.1)


for name in ("b1", "a1", "a2"):
    ok = write_all(members[name].port, name)
    got = {}
    for reader in members.values():
        results = tls_call(reader.port, lambda c: c.multiGet(KEYS))
        got[reader.name] = all(r.found and r.value == value(k, name)
                               for k, r in zip(KEYS, results))
        singles = tls_call(reader.port, lambda c: [c.get(k).value for k in KEYS[:20]])
        got[reader.name] = got[reader.name] and singles == [value(k, name) for k in KEYS[:20]]
    check(ok and all(got.values()),
          "written through %s (forwarded gets and puts, batches): every member reads every "
          "key over TLS (%s)" % (name, got))

stats = tls_call(members["b1"].port, lambda c: c.stats())
forwarded = sum(v for k, v in stats.items() if k.startswith("cluster.forwarded."))
check(forwarded > 0, "b1 forwarded calls to A's members (%d)" % forwarded)
a2 = tls_call(members["a2"].port, lambda c: c.stats())
check(a2.get("server.tls_handshake_errors", -1) == 0,
      "no TLS handshake failed between the members")

r = subprocess.run([cli_bin, "--port", str(members["b1"].port), "--tls-ca", path("ca.pem"),
                    "--tls-cert", path("client.pem"), "--tls-key", path("client.key"),
                    "get", str(KEYS[0])], capture_output=True, text=True, timeout=30)
check(r.returncode == 0 and r.stdout.strip() == value(KEYS[0], "a2").decode(),
      "flatkv --tls-ca/--tls-cert/--tls-key reads through the ring (%d %r)"
      % (r.returncode, r.stdout))
r = subprocess.run([cli_bin, "--zk", zk.hosts, "--tls-ca", path("ca.pem"),
                    "--tls-cert", path("client.pem"), "--tls-key", path("client.key"),
                    "get", str(KEYS[-1])], capture_output=True, text=True, timeout=30)
check(r.returncode == 0 and r.stdout.strip() == value(KEYS[-1], "a2").decode(),
      "flatkv --zk with the TLS flags (RingClient) reads from the owner (%d %r %s)"
      % (r.returncode, r.stdout, r.stderr.strip()))

# --- A CA rotated under a running ring ---------------------------------------
# Trust the old and new CA, move every certificate to the new one, then trust
# only the new one: each step is a file replaced in place (renamed over),
# which the members load without a restart. Restarted, a2 and then a1 trust
# only the new CA, so every new call to them (b1 forwarding, the chain
# replicating and catching up) must present a certificate of the new CA,
# read from the changed files.
openssl("req", "-x509", *EC, "-keyout", "ca2.key", "-out", "ca2.pem", "-days", "30",
        "-subj", "/CN=ca2")
for name in ("member", "client"):
    openssl("req", *EC, "-keyout", name + "2.key", "-out", name + "2.csr", "-subj", "/CN=" + name)
    openssl("x509", "-req", "-in", name + "2.csr", "-CA", "ca2.pem", "-CAkey", "ca2.key",
            "-CAcreateserial", "-days", "30", "-extfile", "san.ext", "-out", name + "2.pem")


def replace(name, data):
    with open(path(name + ".new"), "wb") as f:
        f.write(data)
    os.chmod(path(name + ".new"), 0o600)
    os.rename(path(name + ".new"), path(name))


def read(name):
    with open(path(name), "rb") as f:
        return f.read()


def reloads(m):
    with open(os.path.join(work, m.name + ".log")) as f:
        return f.read().count("TLS certificate reloaded")


def rotate_step(files, what):
    before = {m.name: reloads(m) for m in members.values()}
    for name, data in files:
        replace(name, data)
    harness.wait_until(work, "every member loads " + what,
                       lambda: all(reloads(m) > before[m.name] for m in members.values()),
                       timeout=15)


ca1, ca2 = read("ca.pem"), read("ca2.pem")
rotate_step([("ca.pem", ca1 + ca2)], "a CA file of both CAs")
time.sleep(1.2)  # the watcher looks once a second: the key and certificate change in one look
rotate_step([("member.key", read("member2.key")), ("member.pem", read("member2.pem")),
             ("client.key", read("client2.key")), ("client.pem", read("client2.pem"))],
            "the certificate of the new CA")
time.sleep(1.2)
rotate_step([("ca.pem", ca2)], "a CA file of the new CA only")
for name in ("a2", "a1"):
    m = members[name]
    check(harness.stop(m.proc) == 0, "%s stops cleanly" % name)
    m.proc = harness.start_member(server_bin, m.port, os.path.join(work, name), zk, A, *TLS,
                                  log=os.path.join(work, name + ".log"), session_timeout_ms=1500)
    deadline = time.time() + 30
    while time.time() < deadline and not all(
            {k: sorted(v) for k, v in (ring(p) or {}).items()} ==
            {k: sorted(v) for k, v in expected.items()} for p in ports):
        time.sleep(0.1)
    check(all({k: sorted(v) for k, v in (ring(p) or {}).items()} ==
              {k: sorted(v) for k, v in expected.items()} for p in ports),
          "the ring forms again with %s restarted: %s" % (name, ring(ports[0])))
ok = write_all(members["b1"].port, "rotated")


def reads_rotated(reader):
    # A restarted tail catching up answers UNAVAILABLE for a moment.
    deadline = time.time() + 15
    while True:
        try:
            return tls_call(reader.port, lambda c: [c.get(k).value for k in KEYS[:20]]) \
                == [value(k, "rotated") for k in KEYS[:20]]
        except Exception as e:
            if time.time() > deadline:
                print("read through %s: %s" % (reader.name, e))
                return False
            time.sleep(0.1)


got = {r.name: reads_rotated(r) for r in members.values()}
check(ok and all(got.values()),
      "after the CA rotation, writes through b1 reach mark A's restarted members (b1 "
      "forwards, the chain replicates with the new certificate) and every member reads them "
      "(%s)" % got)
errors = {n: tls_call(members[n].port, lambda c: c.stats()).get("server.tls_handshake_errors", -1)
          for n in ("a1", "a2")}
check(errors == {"a1": 0, "a2": 0},
      "no peer was refused by the restarted a1 and a2 (handshake errors %s)" % errors)


def start_error(*sets):
    args = [server_bin, "--set", "server.port=%d" % free_port(),
            "--set", "storage.path=" + os.path.join(work, "bad"),
            "--set", "cluster.zookeeper=" + zk.hosts, "--set", "cluster.mark=3000"]
    for s in sets:
        args += ["--set", s]
    r = subprocess.run(args, capture_output=True, text=True, timeout=30)
    return r.returncode, r.stderr.strip()


code, err = start_error("server.tls_cert_file=" + path("member.pem"),
                        "server.tls_key_file=" + path("member.key"))
check(code == 2 and "cluster.peer_tls" in err,
      "a TLS ring member without cluster.peer_tls: exit 2 (%d: %s)" % (code, err))
code, err = start_error("server.tls_cert_file=" + path("member.pem"),
                        "server.tls_key_file=" + path("member.key"), "cluster.peer_tls=true")
check(code == 2 and "cluster.peer_tls: needs" in err,
      "cluster.peer_tls without server.tls_ca_file: exit 2 (%d: %s)" % (code, err))

for m in members.values():
    check(harness.stop(m.proc) == 0, "%s stops cleanly" % m.name)
harness.finish(work)
