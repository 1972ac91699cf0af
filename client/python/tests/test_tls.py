"""The client against a real flatkv-server with TLS on its Thrift port
(README, "TLS and secret files") and client certificates required, with
certificates made here by the openssl command: a client with the CA and a
client certificate is served; one that trusts another CA, that calls the
server by a name its certificate does not hold, that has no client
certificate, or that speaks plaintext is refused with a ConnectionError and
nothing is written."""
import os
import subprocess

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
def tls(server_bin, tmp_path_factory):
    """A TLS server whose certificate names only IP 127.0.0.1 (not
    "localhost"), requiring client certificates of the same CA."""
    certs = str(tmp_path_factory.mktemp("certs"))
    make_ca(certs, "ca")
    make_ca(certs, "other")
    make_cert(certs, "server", "ca", "subjectAltName=IP:127.0.0.1\n"
              "extendedKeyUsage=serverAuth\n")
    make_cert(certs, "app", "ca", "extendedKeyUsage=clientAuth\n")
    path = lambda name: os.path.join(certs, name)  # noqa: E731
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
