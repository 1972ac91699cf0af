"""The client against a real flatkv-server with TLS on its Thrift port
(docs/operating.md, "TLS and secret files") and client certificates required, with
certificates made here by the openssl command: a client with the CA and a
client certificate is served; one that trusts another CA, that calls the
server by a name its certificate does not hold, that has no client
certificate, or that speaks plaintext is refused with a ConnectionError and
nothing is written. In a ring whose members speak TLS to each other too
(cluster.peer_tls), the client reads the ring over TLS and calls each
member directly with the same settings."""
import os
import subprocess
import time

import pytest

import flatkv

import harness


def openssl(certs, *args):
    subprocess.run(["openssl", *args], cwd=certs, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


def make_ca(certs, name):
    openssl(certs, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
            "-nodes", "-keyout", name + ".key", "-out", name + ".pem", "-days", "30",
            "-subj", "/CN=" + name)


def make_cert(certs, name, ca, ext):
    openssl(certs, "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", name + ".key", "-out", name + ".csr", "-subj", "/CN=" + name)
    with open(os.path.join(certs, name + ".ext"), "w") as f:
        f.write(ext)
    openssl(certs, "x509", "-req", "-in", name + ".csr", "-CA", ca + ".pem", "-CAkey",
            ca + ".key", "-CAcreateserial", "-days", "30", "-extfile", name + ".ext",
            "-out", name + ".pem")
    os.chmod(os.path.join(certs, name + ".key"), 0o600)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    """path(name) of: ca, other (another CA), server (names only IP
    127.0.0.1, not "localhost"), member (the same, for ring members, which
    present it to each other as clients too) and app (a client's)."""
    certs = str(tmp_path_factory.mktemp("certs"))
    make_ca(certs, "ca")
    make_ca(certs, "other")
    make_cert(certs, "server", "ca", "subjectAltName=IP:127.0.0.1\n"
              "extendedKeyUsage=serverAuth\n")
    make_cert(certs, "member", "ca", "subjectAltName=IP:127.0.0.1\n"
              "extendedKeyUsage=serverAuth,clientAuth\n")
    make_cert(certs, "app", "ca", "extendedKeyUsage=clientAuth\n")
    return lambda name: os.path.join(certs, name)


@pytest.fixture(scope="module")
def tls(server_bin, certs):
    """A TLS server requiring client certificates of the same CA."""
    path = certs
    port = harness.free_port()
    proc = harness.start(server_bin, port, path("data"),
                         "--set", "server.tls_cert_file=" + path("server.pem"),
                         "--set", "server.tls_key_file=" + path("server.key"),
                         "--set", "server.tls_ca_file=" + path("ca.pem"),
                         "--set", "server.tls_client_auth=required")
    yield port, path
    proc.kill()
    proc.wait()


def good(port, path, host="127.0.0.1", **kw):
    return flatkv.Client(host, port, tls_ca_file=path("ca.pem"), tls_cert_file=path("app.pem"),
                         tls_key_file=path("app.key"), timeout=5.0, **kw)


def test_a_client_with_the_ca_and_a_client_certificate_is_served(tls):
    port, path = tls
    kv = good(port, path)
    kv.put(1, b"over tls")
    kv.sput("k", "v")
    assert kv.get(1) == b"over tls" and kv.sget("k") == b"v"
    kv.multi_put({2: b"b", 3: b"c"})
    assert kv.multi_get([1, 2, 3]) == [b"over tls", b"b", b"c"]
    assert kv.pool_sizes()["127.0.0.1:%d" % port] == (1, 1)  # one connection, reused


def test_a_server_of_another_ca_is_refused_before_anything_is_sent(tls):
    port, path = tls
    kv = flatkv.Client("127.0.0.1", port, tls_ca_file=path("other.pem"),
                       tls_cert_file=path("app.pem"), tls_key_file=path("app.key"), retries=0)
    with pytest.raises(flatkv.ConnectionError) as e:
        kv.put(10, b"x")
    assert not e.value.sent and not e.value.in_doubt
    assert "certificate verify failed" in str(e.value)
    assert good(port, path).get(10) is None


def test_the_host_name_is_checked_against_the_certificate(tls):
    port, path = tls
    with pytest.raises(flatkv.ConnectionError) as e:
        good(port, path, host="localhost", retries=0).put(11, b"x")
    assert not e.value.sent and "localhost" in str(e.value)
    assert good(port, path).get(11) is None
    unchecked = good(port, path, host="localhost", tls_check_hostname=False)
    unchecked.put(11, b"name not checked")
    assert good(port, path).get(11) == b"name not checked"


def test_without_a_client_certificate_or_without_tls_nothing_is_served(tls):
    port, path = tls
    anonymous = flatkv.Client("127.0.0.1", port, tls_ca_file=path("ca.pem"), retries=0,
                              timeout=5.0)
    with pytest.raises(flatkv.ConnectionError):
        anonymous.put(12, b"x")
    plaintext = flatkv.Client("127.0.0.1", port, retries=0, timeout=5.0)
    with pytest.raises(flatkv.ConnectionError):
        plaintext.put(12, b"x")
    assert good(port, path).get(12) is None
    with pytest.raises(ValueError):
        flatkv.Client("127.0.0.1", port, tls_cert_file=path("app.pem"))


def test_a_tls_ring_is_routed_over_tls(server_bin, certs, tmp_path):
    path = certs
    work = str(tmp_path)
    zk = harness.ZooKeeper(work)
    tls_args = ["--set", "server.tls_cert_file=" + path("member.pem"),
                "--set", "server.tls_key_file=" + path("member.key"),
                "--set", "server.tls_ca_file=" + path("ca.pem"),
                "--set", "server.tls_client_auth=required", "--set", "cluster.peer_tls=true",
                "--set", "cluster.replication=sync"]
    members = []
    try:
        # One at a time, each once it is in its own view of the ring: a2
        # then copies from a1 before it registers. (Started together, both
        # may register as if alone; one then leaves the chain again to copy
        # from the other, and the client's ring goes stale.)
        def client(seed):
            return flatkv.Client(seeds=[seed], tls_ca_file=path("ca.pem"),
                                 tls_cert_file=path("app.pem"), tls_key_file=path("app.key"),
                                 timeout=5.0)
        for name, mark in (("a1", 1000), ("a2", 1000), ("b1", 2000)):
            m = harness.Member(work, server_bin, zk, name, mark, *tls_args)
            members.append(m)
            own = client("127.0.0.1:%d" % m.port)
            deadline = time.monotonic() + 30
            while "127.0.0.1:%d" % m.port not in sum(own.refresh()[0].chains, []):
                assert time.monotonic() < deadline, "%s did not join the TLS ring" % name
                time.sleep(0.05)
        addr = ["127.0.0.1:%d" % m.port for m in members]
        kv = client(addr[2])
        deadline = time.monotonic() + 30
        while kv.refresh()[0].chains != [addr[:2], addr[2:]]:
            assert time.monotonic() < deadline, "the TLS ring did not form"
            time.sleep(0.1)
        keys = list(range(0, 3000, 37))  # both marks
        deadline = time.monotonic() + 15
        while True:  # a chain not yet recorded answers UNAVAILABLE for a moment
            try:
                kv.multi_put({k: b"t%d" % k for k in keys})
                break
            except flatkv.Unavailable:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert [kv.get(k) for k in keys] == [b"t%d" % k for k in keys]
        kv.sput("over", "tls")
        assert kv.sget("over") == b"tls"
        # Straight to each owner over TLS: no member forwarded a call, and
        # the client holds connections to the head and the tail of 1000 (writes,
        # reads) and to 2000.
        peer = ("peerGet", "peerPut", "peerMultiGet", "peerMultiPut", "peerSGet", "peerSPut")
        got = {a: {c: kv.stats(a)["calls." + c] for c in peer} for a in addr}
        assert all(sum(n.values()) == 0 for n in got.values()), \
            "forwarded calls %s; the client's ring %s" % (got, kv.ring().chains)
        assert set(kv.pool_sizes()) == set(addr)
    finally:
        for m in members:
            if m.proc.poll() is None:
                m.proc.kill()
                m.proc.wait()
            else:  # it died before the test ended: say how (a signal is negative)
                print("member %s (port %d) had exited: status %d; its log: %s/%s.log"
                      % (m.name, m.port, m.proc.returncode, work, m.name))
        zk.close()
