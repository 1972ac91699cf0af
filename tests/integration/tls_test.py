#!/usr/bin/python3
"""TLS on the Thrift port (server.tls_*; docs/operating.md, "TLS and secret files") against a real
flatkv-server, with certificates this test makes with the openssl command.

A TLS client works (put/get through the flatkv CLI, which is the C++
client, through Python's TSSLSocket, through flatkv-bench server and
through the Python, Java and Go client examples; Java's and Go's refuse
a server of another CA or whose certificate does not name the host); a
plaintext client is closed without an answer and counted in
server.tls_handshake_errors (and /metrics), a client stalled in its handshake
is closed after 10 s while an idle TLS connection stays, and the server keeps
serving; HTTPS on the HTTP port with the same certificate; a client that does not trust the
server's CA, or (tls_client_auth: required) has no certificate or one from
another CA, is refused. An expired certificate and a key that does not
match are configuration errors at start (exit 2, naming the key). The
certificate is reloaded when its files change (new connections see the new
one, an open connection keeps working) and a bad new file is logged and the
old certificate kept. Secret files: admin.token_file works, and a token file
readable by others gets a warning; no token reaches the log.

Usage: tls_test.py FLATKV_SERVER FLATKV_CLI THRIFT_COMPILER FLATKV_THRIFT"""
import hashlib
import os
import socket
import ssl
import subprocess
import sys
import time

import harness
from harness import check, free_port

server_bin, cli_bin, thrift_bin, idl = sys.argv[1:5]
work = harness.workdir("flatkv-tls-", thrift_bin, idl)

from thrift.protocol import TBinaryProtocol  # noqa: E402
from thrift.transport import TSSLSocket, TTransport  # noqa: E402
from flatkv import FlatKV  # noqa: E402
from flatkv.ttypes import KvError  # noqa: E402

certs = os.path.join(work, "certs")
os.makedirs(certs)


def openssl(*args):
    subprocess.run(["openssl", *args], cwd=certs, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def path(name):
    return os.path.join(certs, name)


def make_ca(name):
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", name + ".key", "-out", name + ".pem", "-days", "30",
            "-subj", "/CN=" + name)


def make_cert(name, ca, server=True, start=None, end=None, names="IP:127.0.0.1,DNS:localhost"):
    """A key and a certificate signed by "ca"; a server's names 127.0.0.1
    and localhost (or names). With start/end (YYYYMMDDHHMMSSZ), those dates."""
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", name + ".key", "-out", name + ".csr", "-subj", "/CN=" + name)
    ext = name + ".ext"
    with open(path(ext), "w") as f:
        if server:
            f.write("subjectAltName=" + names + "\n"
                    "extendedKeyUsage=serverAuth,clientAuth\n")
        else:
            f.write("extendedKeyUsage=clientAuth\n")
    if start is None:
        openssl("x509", "-req", "-in", name + ".csr", "-CA", ca + ".pem", "-CAkey", ca + ".key",
                "-CAcreateserial", "-days", "30", "-extfile", ext, "-out", name + ".pem")
        return
    # Dates of our choosing need `openssl ca` and its small database.
    os.makedirs(path("newcerts"), exist_ok=True)
    open(path("index.txt"), "a").close()
    if not os.path.exists(path("serial")):
        with open(path("serial"), "w") as f:
            f.write("1000\n")
    with open(path("ca.cnf"), "w") as f:
        f.write("[ca]\ndefault_ca=d\n[d]\ndir=.\ndatabase=index.txt\nnew_certs_dir=newcerts\n"
                "serial=serial\ndefault_md=sha256\npolicy=p\nunique_subject=no\n"
                "[p]\ncommonName=supplied\n")
    openssl("ca", "-batch", "-config", "ca.cnf", "-cert", ca + ".pem", "-keyfile", ca + ".key",
            "-in", name + ".csr", "-out", name + ".pem", "-startdate", start, "-enddate", end,
            "-extfile", ext, "-notext")


make_ca("ca")
make_ca("otherca")
make_cert("server", "ca")
make_cert("server2", "ca")
make_cert("misnamed", "ca", names="DNS:kv.example.net")  # not the host a client dials
make_cert("client", "ca", server=False)
make_cert("stranger", "otherca", server=False)
make_cert("expired", "ca", start="20200101000000Z", end="20200102000000Z")
for name in os.listdir(certs):
    if name.endswith(".key"):
        os.chmod(path(name), 0o600)


def fingerprint(der):
    return hashlib.sha256(der).hexdigest()


def pem_fingerprint(name):
    with open(path(name)) as f:
        return fingerprint(ssl.PEM_cert_to_DER_cert(f.read()))


def tls_client(port, cert=None):
    """A FlatKV client over TLS (Python's TSSLSocket), its transport and the
    server certificate's fingerprint."""
    kwargs = {"ca_certs": path("ca.pem"), "cert_reqs": ssl.CERT_REQUIRED}
    if cert:
        kwargs.update(certfile=path(cert + ".pem"), keyfile=path(cert + ".key"))
    sock = TSSLSocket.TSSLSocket("127.0.0.1", port, **kwargs)
    sock.setTimeout(5000)
    t = TTransport.TFramedTransport(sock)
    t.open()
    der = sock.handle.getpeercert(binary_form=True)
    return FlatKV.Client(TBinaryProtocol.TBinaryProtocol(t)), t, fingerprint(der)


def cli(port, *args, tls=("ca", None)):
    ca, cert = tls
    flags = ["--port", str(port), "--timeout-ms", "5000"]
    if ca:
        flags += ["--tls-ca", path(ca + ".pem")]
    if cert:
        flags += ["--tls-cert", path(cert + ".pem"), "--tls-key", path(cert + ".key")]
    return subprocess.run([cli_bin, *flags, *args], capture_output=True, text=True, timeout=30)


def start_tls(name, *extra, auth="none"):
    port = free_port()
    data = os.path.join(work, name)
    log = os.path.join(work, name + ".log")
    proc = harness.start(server_bin, port, data,
                         "--set", "server.tls_cert_file=" + path("server.pem"),
                         "--set", "server.tls_key_file=" + path("server.key"),
                         "--set", "server.tls_ca_file=" + path("ca.pem"),
                         "--set", "server.tls_client_auth=" + auth,
                         "--set", "log.file=" + log, *extra)
    return proc, port, log


def stat(port, name):
    c, t, _ = tls_client(port, "client")
    try:
        return c.stats()[name]
    finally:
        t.close()


def plaintext_refused(port):
    """Sends a framed call in clear; True if the server closes the
    connection without a byte of answer (a TLS alert is not an answer)."""
    from thrift.transport import TSocket
    sock = TSocket.TSocket("127.0.0.1", port)
    sock.setTimeout(5000)
    t = TTransport.TFramedTransport(sock)
    t.open()
    c = FlatKV.Client(TBinaryProtocol.TBinaryProtocol(t))
    try:
        c.get(1)
        return False
    except (TTransport.TTransportException, EOFError, ConnectionError, socket.timeout,
            Exception) as e:  # noqa: B014
        return "timed out" not in str(e)
    finally:
        t.close()


# --- The port speaks TLS only ----------------------------------------------
proc, port, log = start_tls("a")
idle, idle_t, _ = tls_client(port)  # used again after the handshake timeout
idle.put(5000, b"idle")  # beyond the keys flatkv-bench writes below
stalled = socket.create_connection(("127.0.0.1", port), timeout=30)
stalled.send(b"\x16\x03\x01\x00\x05")  # part of a TLS record, then nothing
opened = time.time()
r = cli(port, "put", "7", "seven")
check(r.returncode == 0, "flatkv put over TLS (--tls-ca) exits 0 (%d %s)" % (r.returncode, r.stderr))
r = cli(port, "get", "7")
check(r.returncode == 0 and r.stdout == "seven\n",
      "flatkv get over TLS reads the value (%d %r)" % (r.returncode, r.stdout))
c, t, fp = tls_client(port)
check(c.get(7).value == b"seven" and fp == pem_fingerprint("server.pem"),
      "a Python TSSLSocket client reads it and sees server.pem")
t.close()

# Pipelined calls whose answers the socket cannot take at once: the client
# sends a 4 MiB put and eight gets of it, then waits before reading, so the
# server's writing stops on a full socket and goes on as the client reads;
# then 300 small calls pipelined in one write, and a call sent a few bytes
# per TLS record. Every answer arrives, in order, intact.
c, t, _ = tls_client(port)
big = os.urandom(4 << 20)
c.send_put(4000, big)
for _ in range(8):
    c.send_get(4000)
time.sleep(1.0)
c.recv_put()
gets = [c.recv_get().value for _ in range(8)]
check(all(v == big for v in gets),
      "eight pipelined 4 MiB answers over TLS arrive whole after the socket filled (%s)"
      % [len(v) for v in gets])
for i in range(300):
    c.send_put(4001 + i % 3, b"v%d" % i)
for _ in range(300):
    c.recv_put()
check(c.get(4001).value == b"v297" and c.get(4003).value == b"v299",
      "300 pipelined puts over TLS are applied in order")
t.close()
dribble = ssl.create_default_context(cafile=path("ca.pem")).wrap_socket(
    socket.create_connection(("127.0.0.1", port), timeout=5), server_hostname="127.0.0.1")
buf = TTransport.TMemoryBuffer()
FlatKV.Client(TBinaryProtocol.TBinaryProtocol(buf)).send_get(4001)
call = buf.getvalue()
frame = len(call).to_bytes(4, "big") + call
for i in range(0, len(frame), 3):  # a TLS record of three bytes at a time
    dribble.sendall(frame[i:i + 3])
reply = b""
while len(reply) < 4 or len(reply) < 4 + int.from_bytes(reply[:4], "big"):
    more = dribble.recv(65536)
    if not more:
        break
    reply += more
answer = TTransport.TMemoryBuffer(reply[4:])
result = FlatKV.get_result()
iprot = TBinaryProtocol.TBinaryProtocol(answer)
iprot.readMessageBegin()
result.read(iprot)
check(result.success is not None and result.success.value == b"v297",
      "a call sent in 3-byte TLS records is answered (%r)" % (result.success,))
dribble.close()

errors_before = stat(port, "server.tls_handshake_errors")
refused = [plaintext_refused(port) for _ in range(3)]
check(all(refused), "a plaintext client is closed without an answer (%s)" % refused)
r = cli(port, "get", "7", tls=(None, None))
check(r.returncode == 4, "the CLI without --tls-ca cannot talk to it (exit %d)" % r.returncode)
errors = stat(port, "server.tls_handshake_errors")
check(errors >= errors_before + 4,
      "each plaintext client is counted in server.tls_handshake_errors (%d -> %d)"
      % (errors_before, errors))
check(proc.poll() is None and cli(port, "get", "7").stdout == "seven\n",
      "the server keeps serving TLS clients")
for _ in range(3):
    socket.create_connection(("127.0.0.1", port), timeout=5).close()
time.sleep(0.2)
check(stat(port, "server.tls_handshake_errors") == errors,
      "a port probe (connect, close) is not counted as a handshake error")
r = cli(port, "get", "7", tls=("otherca", None))
check(r.returncode == 4 and "certificate verify failed" in (r.stderr + r.stdout).lower(),
      "a client that does not trust the server's CA refuses it (exit %d: %s)"
      % (r.returncode, r.stderr.strip()))
example = os.path.join(harness.REPO, "client", "examples", "python", "example.py")
r = subprocess.run(["/usr/bin/python3", "-W", "ignore", example, "127.0.0.1", str(port),
                    path("ca.pem")], capture_output=True, text=True, timeout=60,
                   env=dict(os.environ, PYTHONPATH=work))
check(r.returncode == 0,
      "the Python example connects over TLS with a CA file (%d %s)"
      % (r.returncode, r.stderr.strip()[-200:]))
harness.check_example_output(r.stdout, "Python example over TLS: ")
bench_bin = os.path.join(os.path.dirname(cli_bin), "flatkv-bench")  # built beside the CLI
r = subprocess.run([bench_bin, "server", "--port", str(port), "--tls-ca", path("ca.pem"),
                    "--ops", "2000", "--clients", "4", "--workload", "fill,get"],
                   capture_output=True, text=True, timeout=60)
check(r.returncode == 0 and "2000 of 2000 found" in r.stdout,
      "flatkv-bench server --tls-ca fills and reads back over TLS (%d %s)"
      % (r.returncode, r.stderr.strip()))
r = subprocess.run([bench_bin, "server", "--port", str(port), "--tls-ca", path("otherca.pem"),
                    "--ops", "10", "--clients", "1", "--workload", "fill"],
                   capture_output=True, text=True, timeout=60)
check(r.returncode != 0 and "TLS handshake" in r.stderr,
      "flatkv-bench server refuses a server its CA did not sign (%s)" % r.stderr.strip())
version_flags = [("TLSv1_1", ssl.TLSVersion.TLSv1_1)]
for label, version in version_flags:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(path("ca.pem"))
    try:
        ctx.minimum_version = version
        ctx.maximum_version = version
        ctx.set_ciphers("ALL:@SECLEVEL=0")
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            with ctx.wrap_socket(raw, server_hostname="127.0.0.1"):
                ok = True
    except (ssl.SSLError, OSError, ValueError):
        ok = False
    check(not ok, "a %s client is refused (TLS 1.2 and 1.3 only)" % label)
errors = stat(port, "server.tls_handshake_errors")
time.sleep(max(0.0, 11.5 - (time.time() - opened)))  # past the 10 s handshake limit
try:
    stalled_closed = stalled.recv(100) == b""
except OSError:
    stalled_closed = True
check(stalled_closed and stat(port, "server.tls_handshake_errors") == errors + 1,
      "a client stalled in its handshake is closed after 10 s and counted")
try:
    idle_value = idle.get(5000).value
except Exception as e:  # noqa: B902
    idle_value = repr(e)
check(idle_value == b"idle", "an idle TLS connection outlives the handshake limit (%r)" % idle_value)
idle_t.close()
with open(log) as f:
    text = f.read()
check("TLS handshake failed" in text, "the refused handshakes are logged")
harness.stop(proc)

# --- The Java and Go client examples over TLS -------------------------------
# Built by CMake only when their toolchains were found
# (client/examples/CMakeLists.txt; tests/integration/CMakeLists.txt passes
# what was built in the environment): with the CA file they print what they
# print in plaintext (examples_test.py); with a CA that did not sign the
# server, or a certificate of the right CA that does not name the host,
# they refuse it. A server of their own, so that the time a JVM
# takes to start does not count against the handshake timing checked above.
proc, port, log = start_tls("e")
examples = []
if os.environ.get("FLATKV_EXAMPLE_JAR"):
    examples.append(("Java", [os.environ["FLATKV_JAVA"], "-jar",
                              os.environ["FLATKV_EXAMPLE_JAR"]],
                     "javax.net.ssl.SSLHandshakeException"))
else:
    print("skipped: the Java example over TLS: it was not built (CMake found no mvn or java, "
          "or -DFLATKV_EXAMPLES=OFF)")
if os.environ.get("FLATKV_EXAMPLE_GO"):
    examples.append(("Go", [os.environ["FLATKV_EXAMPLE_GO"]],
                     "tls: failed to verify certificate"))
else:
    print("skipped: the Go example over TLS: it was not built (CMake found no go, "
          "or -DFLATKV_EXAMPLES=OFF)")
for lang, cmd, refusal in examples:  # refusal: what stderr says on a failed verification
    r = subprocess.run(cmd + ["127.0.0.1", str(port), path("ca.pem")], capture_output=True,
                       text=True, timeout=120)
    print("%s example over TLS, stdout:\n%sstderr:\n%s" % (lang, r.stdout, r.stderr))
    check(r.returncode == 0 and r.stderr.strip() == "",
          "the %s example connects over TLS with a CA file (exit %d)" % (lang, r.returncode))
    harness.check_example_output(r.stdout, "%s example over TLS: " % lang)
    r = subprocess.run(cmd + ["127.0.0.1", str(port), path("otherca.pem")], capture_output=True,
                       text=True, timeout=120)
    check(r.returncode != 0 and r.stdout == "" and refusal in r.stderr,
          "the %s example with a CA that did not sign the server refuses it (exit %d: %s)"
          % (lang, r.returncode, r.stderr.strip().splitlines()[:1]))
harness.stop(proc)
if examples:
    proc, port, log = start_tls("n", "--set", "server.tls_cert_file=" + path("misnamed.pem"),
                                "--set", "server.tls_key_file=" + path("misnamed.key"))
    for lang, cmd, refusal in examples:
        r = subprocess.run(cmd + ["127.0.0.1", str(port), path("ca.pem")], capture_output=True,
                           text=True, timeout=120)
        check(r.returncode != 0 and r.stdout == "" and refusal in r.stderr,
              "the %s example refuses a certificate of its CA that does not name the host "
              "(exit %d: %s)" % (lang, r.returncode, r.stderr.strip().splitlines()[:1]))
    harness.stop(proc)

# --- HTTPS on the HTTP port, same certificate ------------------------------
import http.client  # noqa: E402
http_port = free_port()
proc, port, log = start_tls("h", "--set", "server.http_port=%d" % http_port)
ctx = ssl.create_default_context(cafile=path("ca.pem"))
conn = http.client.HTTPSConnection("127.0.0.1", http_port, context=ctx, timeout=5)
conn.request("PUT", "/kv/11", body=b"eleven")
put = conn.getresponse()
put.read()
put_status = put.status
conn.request("GET", "/kv/11")
resp = conn.getresponse()
check(put_status in (200, 204) and resp.status == 200 and resp.read() == b"eleven",
      "HTTPS: PUT and GET /kv/11 with the server's certificate (%d, %d)"
      % (put_status, resp.status))
conn.request("GET", "/metrics")
metrics = conn.getresponse().read().decode()
check("flatkv_server_tls_handshake_errors_total" in metrics,
      "/metrics has flatkv_server_tls_handshake_errors_total")
conn.close()
errors_before = stat(port, "server.tls_handshake_errors")
try:
    plain = http.client.HTTPConnection("127.0.0.1", http_port, timeout=5)
    plain.request("GET", "/health")
    answered = plain.getresponse().status
except (OSError, http.client.HTTPException):
    answered = None
check(answered is None, "a plain HTTP request to the HTTPS port gets no answer (%s)" % answered)
harness.wait_until(work, "the plain HTTP request counted in server.tls_handshake_errors",
                   lambda: stat(port, "server.tls_handshake_errors") == errors_before + 1,
                   timeout=5)
for _ in range(3):
    socket.create_connection(("127.0.0.1", http_port), timeout=5).close()
time.sleep(0.3)
check(stat(port, "server.tls_handshake_errors") == errors_before + 1,
      "a probe of the HTTPS port (connect, close) is not counted")
check("failed on the HTTP port" in open(log).read(),
      "the failed HTTPS handshake is logged")
other = ssl.create_default_context(cafile=path("otherca.pem"))
try:
    bad = http.client.HTTPSConnection("127.0.0.1", http_port, context=other, timeout=5)
    bad.request("GET", "/health")
    bad.getresponse()
    refused = False
except ssl.SSLError:
    refused = True
check(refused, "an HTTPS client that does not trust the server's CA refuses it")
conn = http.client.HTTPSConnection("localhost", http_port, context=ctx, timeout=5)
conn.request("GET", "/health")
check(conn.getresponse().status == 200 and proc.poll() is None,
      "the HTTPS port keeps serving (by name too)")
conn.close()
harness.stop(proc)

# --- Workers behind TLS ------------------------------------------------------
# storage.sync: always picks 16 workers (auto) with TLS too: the I/O thread
# does the TLS and hands each call to a worker; every call still answers on
# its own connection, in order.
import threading  # noqa: E402
proc, port, log = start_tls("w", "--set", "storage.sync=always")
offloaded_before = stat(port, "server.offloaded")
results = {}


def writer(w):
    c, t, _ = tls_client(port)
    try:
        for i in range(50):
            k = 100000 + w * 1000 + i
            c.put(k, b"w%d-%d" % (w, i))
        results[w] = all(c.get(100000 + w * 1000 + i).value == b"w%d-%d" % (w, i)
                         for i in range(50))
    finally:
        t.close()


threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
for th in threads:
    th.start()
for th in threads:
    th.join()
check(len(results) == 8 and all(results.values()),
      "8 TLS clients' puts under sync: always are each read back (%s)" % results)
offloaded = stat(port, "server.offloaded") - offloaded_before
check(offloaded >= 800, "each of their 800 calls ran on a worker (server.offloaded +%d)" % offloaded)
harness.stop(proc)

# --- Client certificates ----------------------------------------------------
proc, port, log = start_tls("b", auth="required")
r = cli(port, "put", "8", "eight", tls=("ca", "client"))
check(r.returncode == 0, "with tls_client_auth: required, a client certificate of the CA "
      "is served (%d %s)" % (r.returncode, r.stderr.strip()))
r = cli(port, "get", "8", tls=("ca", None))
check(r.returncode == 4, "a client without a certificate is refused (exit %d)" % r.returncode)
r = cli(port, "get", "8", tls=("ca", "stranger"))
check(r.returncode == 4, "a client certificate from another CA is refused (exit %d)"
      % r.returncode)
check(cli(port, "get", "8", tls=("ca", "client")).stdout == "eight\n",
      "the server keeps serving certified clients")
harness.stop(proc)

# --- Bad certificates at start: configuration errors ------------------------


def start_error(*sets):
    args = [server_bin, "--set", "server.port=%d" % free_port(),
            "--set", "storage.path=" + os.path.join(work, "bad")]
    for s in sets:
        args += ["--set", s]
    r = subprocess.run(args, capture_output=True, text=True, timeout=30)
    return r.returncode, r.stderr.strip()


code, err = start_error("server.tls_cert_file=" + path("expired.pem"),
                        "server.tls_key_file=" + path("expired.key"))
check(code == 2 and "server.tls_cert_file" in err and "expired" in err,
      "an expired certificate: exit 2 naming the key (%d: %s)" % (code, err))
code, err = start_error("server.tls_cert_file=" + path("server.pem"),
                        "server.tls_key_file=" + path("server2.key"))
check(code == 2 and "server.tls_key_file" in err and "does not match" in err,
      "a key that does not match the certificate: exit 2 naming the key (%d: %s)" % (code, err))
code, err = start_error("server.tls_cert_file=" + path("server.pem"))
check(code == 2 and "server.tls_cert_file: set without server.tls_key_file" in err,
      "a certificate without a key: exit 2 (%d: %s)" % (code, err))
code, err = start_error("server.tls_cert_file=" + path("server.pem"),
                        "server.tls_key_file=" + path("server.key"),
                        "server.tls_client_auth=required")
check(code == 2 and "server.tls_ca_file" in err,
      "tls_client_auth: required without a CA file: exit 2 (%d: %s)" % (code, err))
code, err = start_error("server.tls_cert_file=" + path("nothere.pem"),
                        "server.tls_key_file=" + path("server.key"))
check(code == 2 and "nothere.pem: cannot read" in err,
      "a missing certificate file: exit 2 naming it (%d: %s)" % (code, err))

# --- Reload when the files change -------------------------------------------
live_cert, live_key = path("live.pem"), path("live.key")


def install(name):
    """Replaces the live files atomically (rename), key first."""
    for src, dst in ((name + ".key", live_key), (name + ".pem", live_cert)):
        with open(path(src), "rb") as f:
            data = f.read()
        with open(dst + ".tmp", "wb") as f:
            f.write(data)
        os.chmod(dst + ".tmp", 0o600)
        os.replace(dst + ".tmp", dst)


install("server")
port = free_port()
log = os.path.join(work, "c.log")
proc = harness.start(server_bin, port, os.path.join(work, "c"),
                     "--set", "server.tls_cert_file=" + live_cert,
                     "--set", "server.tls_key_file=" + live_key,
                     "--set", "log.file=" + log)
old, old_t, fp = tls_client(port)
old.put(9, b"nine")
check(fp == pem_fingerprint("server.pem"), "before the change: the first certificate")
time.sleep(0.05)
install("server2")


def seen():
    c, t, fp = tls_client(port)
    t.close()
    return fp


deadline = time.time() + 10
while time.time() < deadline and seen() != pem_fingerprint("server2.pem"):
    time.sleep(0.1)
check(seen() == pem_fingerprint("server2.pem"),
      "new connections get the new certificate once its files change")
check(old.get(9).value == b"nine", "a connection opened before the change keeps working")
with open(live_cert, "w") as f:
    f.write("not a certificate\n")
deadline = time.time() + 10
while time.time() < deadline and "not reloaded" not in open(log).read():
    time.sleep(0.1)
text = open(log).read()
check("TLS certificate not reloaded" in text and "server.tls_cert_file" in text,
      "a bad new file is logged")
check(seen() == pem_fingerprint("server2.pem") and old.get(9).value == b"nine",
      "... and the previous certificate stays in use")
install("server")
proc.send_signal(1)  # SIGHUP: checked at once
deadline = time.time() + 10
while time.time() < deadline and seen() != pem_fingerprint("server.pem"):
    time.sleep(0.1)
check(seen() == pem_fingerprint("server.pem") and proc.poll() is None,
      "after SIGHUP the server serves the replaced files and is still running")
old_t.close()
harness.stop(proc)

# --- Secret files -------------------------------------------------------------
token_file = os.path.join(work, "admin.token")
with open(token_file, "w") as f:
    f.write("tok-5f1e9c\n")
os.chmod(token_file, 0o644)
port = free_port()
log = os.path.join(work, "d.log")
proc = harness.start(server_bin, port, os.path.join(work, "d"),
                     "--set", "admin.token=ignored", "--set", "admin.token_file=" + token_file,
                     "--set", "log.file=" + log)
r = subprocess.run([cli_bin, "--port", str(port), "--token", "tok-5f1e9c", "admin", "compact"],
                   capture_output=True, text=True, timeout=30)
check(r.returncode == 0, "admin.token_file's content (newline stripped) is the admin token "
      "(%d %s)" % (r.returncode, r.stderr.strip()))
r = subprocess.run([cli_bin, "--port", str(port), "--token", "ignored", "admin", "compact"],
                   capture_output=True, text=True, timeout=30)
check(r.returncode == 3 and "Unauthorized" in r.stderr,
      "admin.token_file wins over admin.token (%d %s)" % (r.returncode, r.stderr.strip()))
r = subprocess.run([cli_bin, "--port", str(port), "admin", "stats"],
                   capture_output=True, text=True, timeout=30)
harness.stop(proc)
text = open(log).read()
check("admin.token_file" in text and "chmod 600" in text,
      "a token file readable by others gets a warning")
described = subprocess.run([server_bin, "--describe-config"], capture_output=True, text=True).stdout
check("tok-5f1e9c" not in text and "tok-5f1e9c" not in r.stdout and "tok-5f1e9c" not in described,
      "the token is in no log line, stats or --describe-config")
code, err = start_error("admin.token_file=" + os.path.join(work, "none"))
check(code == 2 and "admin.token_file" in err and "cannot read" in err,
      "a missing token file: exit 2 naming the key (%d: %s)" % (code, err))

harness.finish(work)
