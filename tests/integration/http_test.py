#!/usr/bin/python3
"""Integration test of the HTTP port (server.http_port): the real
flatkv-server on loopback ports, driven with the standard library's
http.client, and with Debian's python3-thrift on the Thrift port to show both
go through the same handler.
Usage: http_test.py FLATKV_SERVER THRIFT_COMPILER FLATKV_THRIFT"""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys

import harness
from harness import check, free_port

server_bin, thrift_bin, idl = sys.argv[1:4]
work = harness.workdir("flatkv-http-", thrift_bin, idl)
from flatkv.ttypes import WriteMode  # noqa: E402

KEY_MAX = 1000000
MAX_VALUE = 4096
TOKEN = "secret"


def start(port, http_port, data, *extra):
    log = open(os.path.join(work, "server.log"), "w")
    proc = harness.start(server_bin, port, data, "--set", "server.http_port=%d" % http_port,
                         *extra, stderr=log)
    harness.wait_port(http_port, proc)
    return proc


def request(method, path, body=None, headers=None):
    """One request on a fresh connection: (status, headers, body bytes)."""
    c = http.client.HTTPConnection("127.0.0.1", http_port, timeout=20)
    try:
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


def one_line(body):
    return body.endswith(b"\n") and body.count(b"\n") == 1 and len(body) > 1


# --- Prometheus text exposition format 0.0.4 -------------------------------

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\["\\n])*"'
VALUE = r"(?:[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)|[-+]Inf|NaN)"
SAMPLE = re.compile(r"^(%s)(?:\{(%s(?:,%s)*)?\})? (%s)(?: -?\d+)?$" % (NAME, LABEL, LABEL, VALUE))
HELP = re.compile(r"^# HELP (%s) .*$" % NAME)
TYPE = re.compile(r"^# TYPE (%s) (counter|gauge|histogram|summary|untyped)$" % NAME)


def parse_metrics(text):
    """Returns (errors, types, samples) where samples is a list of
    (name, {label: value}, float)."""
    errors, types, samples = [], {}, []
    if not text.endswith("\n"):
        errors.append("does not end with a newline")
    for line in text.splitlines():
        if line.startswith("# HELP"):
            if not HELP.match(line):
                errors.append("bad HELP: " + line)
        elif line.startswith("# TYPE"):
            m = TYPE.match(line)
            if not m:
                errors.append("bad TYPE: " + line)
            elif m.group(1) in types:
                errors.append("TYPE twice: " + line)
            else:
                types[m.group(1)] = m.group(2)
        elif line.startswith("#") or not line:
            errors.append("unexpected line: %r" % line)
        else:
            m = SAMPLE.match(line)
            if not m:
                errors.append("bad sample: %r" % line)
                continue
            name = m.group(1)
            labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
            family = name
            for suffix in ("_bucket", "_sum", "_count"):
                if name.endswith(suffix) and types.get(name[:-len(suffix)]) == "histogram":
                    family = name[:-len(suffix)]
            if family not in types:
                errors.append("sample before its TYPE: " + line)
            if not name.startswith("flatkv_"):
                errors.append("not prefixed flatkv_: " + line)
            samples.append((name, labels, float(m.group(3))))
    return errors, types, samples


def scrape():
    status, headers, body = request("GET", "/metrics")
    errors, types, samples = parse_metrics(body.decode())
    return status, headers, errors, types, samples


def sample(samples, name, **labels):
    for n, l, v in samples:
        if n == name and l == labels:
            return v
    return None


def histogram(samples, method):
    """[(le, cumulative)], sum, count of one method's latency histogram."""
    base = "flatkv_request_duration_seconds"
    buckets = [(float(l["le"]), v) for n, l, v in samples
               if n == base + "_bucket" and l.get("method") == method]
    return buckets, sample(samples, base + "_sum", method=method), sample(samples, base + "_count", method=method)


# --- the server ------------------------------------------------------------

data = os.path.join(work, "data")
port, http_port = free_port(), free_port()
proc = start(port, http_port, data, "--set", "admin.token=" + TOKEN,
             "--set", "storage.key_max=%d" % KEY_MAX,
             "--set", "storage.max_value_bytes=%d" % MAX_VALUE)
kv, transport = harness.client(port)

status, headers, body = request("GET", "/health")
check(status == 200 and body == b"ok\n", "GET /health is 200 ok")
check(request("HEAD", "/health")[0] == 200, "HEAD /health is 200")
check(request("POST", "/health")[0] == 405, "POST /health is 405")

# Metrics: valid exposition format, every stats() key present.
status, headers, errors, types, samples = scrape()
check(status == 200 and headers.get("content-type", "").startswith("text/plain; version=0.0.4"),
      "GET /metrics is 200 text/plain; version=0.0.4")
check(not errors, "every /metrics line is valid exposition format %s" % errors[:3])
check(types.get("flatkv_request_duration_seconds") == "histogram" and
      types.get("flatkv_calls_total") == "counter", "# TYPE lines for the histogram and counters")
names = {n for n, _, _ in samples}
stats = kv.stats()
missing = []
for key in stats:
    group, _, rest = key.partition(".")
    if group in ("calls", "errors"):
        found = sample(samples, "flatkv_%s_total" % group, method=rest) is not None
    else:
        base = "flatkv_" + re.sub(r"[^a-zA-Z0-9_:]", "_", key)
        found = base in names or base + "_total" in names
    if not found:
        missing.append(key)
check(not missing, "every stats() counter is in /metrics %s" % missing)

# Counters and histograms move with calls, whichever port they come in by.
_, _, _, _, before = scrape()
puts_before = sample(before, "flatkv_calls_total", method="put")
for k in range(10):
    request("PUT", "/kv/%d" % k, body=b"v%d" % k)
for k in range(10, 15):
    kv.put(k, b"t%d" % k)
_, _, errors, _, after = scrape()
check(sample(after, "flatkv_calls_total", method="put") == puts_before + 15,
      "calls_total{method=put} moved by 15 after 10 HTTP and 5 Thrift puts")
buckets, total, count = histogram(after, "put")
cumulative = [v for _, v in buckets]
check(len(buckets) > 10 and buckets[-1][0] == float("inf"), "put histogram has buckets up to +Inf")
check([le for le, _ in buckets] == sorted(le for le, _ in buckets) and cumulative == sorted(cumulative),
      "histogram buckets are in le order and cumulative")
check(count == cumulative[-1] == sample(after, "flatkv_calls_total", method="put"),
      "histogram _count equals the +Inf bucket and calls_total (%s)" % count)
check(total is not None and total > 0, "histogram _sum is positive")

# Integer keys: binary round trip, append, delete, absent.
value = bytes(range(256)) * 4
status, _, _ = request("PUT", "/kv/42", body=value)
check(status == 204, "PUT /kv/42 is 204")
status, headers, body = request("GET", "/kv/42")
check(status == 200 and body == value and headers.get("content-type") == "application/octet-stream",
      "GET /kv/42 returns the binary value as application/octet-stream")
check(kv.get(42).value == value, "an HTTP put is visible through Thrift")
kv.put(43, b"\x00from thrift\xff")
check(request("GET", "/kv/43")[2] == b"\x00from thrift\xff", "a Thrift put is visible over HTTP")
check(request("POST", "/kv/43", body=b"+more")[0] == 204 and kv.get(43).value == b"\x00from thrift\xff+more",
      "POST /kv/43 appends")
check(request("PUT", "/kv/44", body=b"")[0] == 204 and request("GET", "/kv/44")[:3:2] == (200, b""),
      "an empty value is a value")
check(request("DELETE", "/kv/42")[0] == 204, "DELETE of a present key is 204")
status, headers, body = request("GET", "/kv/42")
check(status == 404 and one_line(body), "GET of an absent key is 404 with one line")
check(request("DELETE", "/kv/42")[0] == 404, "DELETE of an absent key is 404")
check(request("HEAD", "/kv/43")[0] == 200, "HEAD /kv/43 is 200")

# Bad keys, ranges and sizes.
for bad in ("abc", "1.5", "", "99999999999999999999", "12x", "+1"):
    status, _, body = request("GET", "/kv/" + bad)
    check(status == 400 and one_line(body), "GET /kv/%s is 400 with one line" % bad)
for path in ("/kv/%d" % KEY_MAX, "/kv/-5"):
    status, headers, body = request("PUT", path, body=b"x")
    check(status == 422 and headers.get("x-flatkv-error") == "KEY_OUT_OF_RANGE" and one_line(body),
          "PUT %s is 422 KEY_OUT_OF_RANGE with one line" % path)
_, _, _, _, metrics = scrape()
check(sample(metrics, "flatkv_errors_total", method="put") >= 2, "refused puts count as put errors")
status, headers, body = request("PUT", "/kv/7", body=b"x" * (MAX_VALUE + 1))
check(status == 413 and headers.get("x-flatkv-error") == "VALUE_TOO_LARGE" and one_line(body),
      "a value one byte over the limit is 413 VALUE_TOO_LARGE with one line")
try:
    status = request("PUT", "/kv/7", body=b"y" * (4 << 20))[0]
except OSError as e:
    status = str(e)
check(status == 413, "a 4 MiB body (far over the limit) is refused with 413 (%s)" % status)
check(request("GET", "/health")[0] == 200 and request("GET", "/kv/1")[2] == b"v1",
      "the server keeps serving after oversized bodies")

# String keys: percent-encoded, binary-safe (%2F, %00, spaces).
skey = b"a/b\x00c d"
status, _, _ = request("PUT", "/skv/a%2Fb%00c%20d", body=b"string value")
check(status == 204, "PUT /skv/a%2Fb%00c%20d is 204")
check(kv.sget(skey).value == b"string value", "the decoded string key (with / NUL space) is the Thrift key")
kv.sput(b"plain", b"\x01\x02")
check(request("GET", "/skv/plain")[2] == b"\x01\x02", "a Thrift sput is visible over HTTP")
check(request("GET", "/skv/a%2Fb%00c%20d")[:3:2] == (200, b"string value"), "GET /skv/... round trip")
check(request("GET", "/skv/a%2Fb")[0] == 404, "a key that is a prefix is absent (404)")
check(request("DELETE", "/skv/a%2Fb%00c%20d")[0] == 204 and not kv.sget(skey).found,
      "DELETE /skv/... removes it")
check(request("DELETE", "/skv/a%2Fb%00c%20d")[0] == 404, "DELETE of an absent string key is 404")
status, headers, body = request("PUT", "/skv/" + "k" * 5000, body=b"v")
check(status == 400 and headers.get("x-flatkv-error") == "INVALID_ARGUMENT",
      "a string key over storage.max_key_bytes is 400 INVALID_ARGUMENT")

# Routing.
check(request("GET", "/nope")[0] == 404, "an unknown path is 404")
status, headers, _ = request("PATCH", "/kv/1", body=b"x")
check(status == 405 and "PUT" in headers.get("allow", ""), "PATCH /kv/1 is 405 with Allow")
check(request("GET", "/admin/compact")[0] == 405, "GET /admin/compact is 405")
check(request("GET", "/admin/nope")[0] == 404, "an unknown admin route is 404")

# Admin routes: the token, checked by the handler.
status, headers, body = request("POST", "/admin/compact")
check(status == 401 and headers.get("x-flatkv-error") == "UNAUTHORIZED" and one_line(body),
      "POST /admin/compact without the token is 401")
check(request("POST", "/admin/compact", headers={"Authorization": "Bearer wrong"})[0] == 401,
      "a wrong Bearer token is 401")
check(request("POST", "/admin/compact", headers={"Authorization": "Bearer " + TOKEN})[0] == 202,
      "POST /admin/compact with the Bearer token is 202")
check(request("PUT", "/admin/write-mode", body=b"async")[0] == 401, "PUT /admin/write-mode without the token is 401")
check(request("PUT", "/admin/write-mode", body=b"fast", headers={"X-FlatKV-Token": TOKEN})[0] == 400,
      "PUT /admin/write-mode with a bad mode is 400")
check(request("PUT", "/admin/write-mode", body=b"async\n", headers={"X-FlatKV-Token": TOKEN})[0] == 204,
      "PUT /admin/write-mode async with X-FlatKV-Token is 204")
check(request("GET", "/admin/write-mode")[2] == b"async\n" and kv.getWriteMode() == WriteMode.ASYNC,
      "the write mode switched for Thrift too")
request("PUT", "/admin/write-mode", body=b"safe", headers={"Authorization": "Bearer " + TOKEN})
check(kv.getWriteMode() == WriteMode.SAFE, "and back to safe")
status, headers, body = request("GET", "/admin/info")
info = json.loads(body) if status == 200 else {}
check(info.get("role") == "standalone" and info.get("keyMax") == KEY_MAX and info.get("writeMode") == "safe",
      "GET /admin/info is JSON with the node's identity")
status, _, body = request("GET", "/admin/stats")
check(status == 200 and json.loads(body).get("calls.put", 0) >= 15, "GET /admin/stats is the stats() map as JSON")
status, _, body = request("GET", "/admin/compaction")
check(status == 200 and "running" in json.loads(body), "GET /admin/compaction is JSON")

transport.close()
proc.send_signal(signal.SIGTERM)
check(proc.wait(timeout=30) == 0, "SIGTERM exits 0 with the HTTP port on")
log = open(os.path.join(work, "server.log")).read()
check("serving HTTP on port %d" % http_port in log, "the log names the HTTP port")

# A port that cannot be bound stops start-up with one line, exit 1.
taken = socket.socket()
taken.bind(("127.0.0.1", 0))
taken.listen()
bad = subprocess.run([server_bin, "--set", "server.port=%d" % free_port(),
                      "--set", "server.http_port=%d" % taken.getsockname()[1],
                      "--set", "storage.path=" + os.path.join(work, "data2")],
                     capture_output=True, text=True, timeout=30)
taken.close()
check(bad.returncode == 1 and "cannot serve HTTP" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1,
      "an HTTP port in use exits 1 with one line: %s" % bad.stderr.strip())
bad = subprocess.run([server_bin, "--set", "server.port=9901", "--set", "server.http_port=9901"],
                     capture_output=True, text=True, timeout=30)
check(bad.returncode == 2 and "server.http_port" in bad.stderr, "http_port equal to port is a bad config (exit 2)")

harness.finish(work)
