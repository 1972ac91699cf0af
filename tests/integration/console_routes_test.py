#!/usr/bin/python3
"""The operator console's routes on the HTTP port (server/console.h,
server/http.cc) of a real standalone flatkv-server: GET /ui (the embedded
page and its headers), the JSON of /admin/ring and /admin/members, and the
actions: each refused with a wrong or missing token (401, and the very line
the `flatkv` CLI prints for the same call), a bad body or member answered
with a precise error, the right token doing what the CLI does. The server
answers /health after all of it.
Usage: console_routes_test.py FLATKV_SERVER FLATKV_CLI THRIFT_COMPILER FLATKV_THRIFT"""
import http.client
import json
import os
import subprocess
import sys

import harness
from harness import check, free_port

server_bin, cli_bin, thrift_bin, idl = sys.argv[1:5]
work = harness.workdir("flatkv-console-", thrift_bin, idl)
from flatkv.ttypes import WriteMode  # noqa: E402

TOKEN = "s3cret"
port, http_port = free_port(), free_port()
log = open(os.path.join(work, "server.log"), "w")
proc = harness.start(server_bin, port, os.path.join(work, "data"),
                     "--set", "server.http_port=%d" % http_port, "--set", "admin.token=" + TOKEN,
                     "--set", "storage.key_max=1000000", stderr=log)
harness.wait_port(http_port, proc)
SELF = "127.0.0.1:%d" % port


def request(method, path, body=None, token=None):
    """(status, {header: value}, body bytes) on a fresh connection."""
    headers = {"Authorization": "Bearer " + token} if token is not None else {}
    c = http.client.HTTPConnection("127.0.0.1", http_port, timeout=20)
    try:
        c.request(method, path, body=body, headers=headers)
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


def answer(method, path, body=None, token=None):
    """An action's (status, headers, JSON answer)."""
    status, headers, raw = request(method, path, body, token)
    try:
        return status, headers, json.loads(raw)
    except ValueError:
        return status, headers, {"unparsed": raw.decode(errors="replace")}


def cli_error(*args):
    """The line the CLI prints on stderr for a failing command."""
    env = dict(os.environ)
    env.pop("FLATKV_ADMIN_TOKEN", None)
    r = subprocess.run([cli_bin, "--port", str(port), *args], capture_output=True, text=True,
                       env=env, timeout=30)
    return r.returncode, r.stderr.strip()


def write_mode():
    return harness.call(port, lambda c: c.getWriteMode())


# --- The page -------------------------------------------------------------
status, headers, page = request("GET", "/ui")
check(status == 200, "GET /ui is 200 (got %d)" % status)
check(headers.get("content-type") == "text/html; charset=utf-8", "the page is text/html")
csp = headers.get("content-security-policy", "")
check("default-src 'none'" in csp and "connect-src 'self'" in csp,
      "the page may load nothing and talk only to this origin: %r" % csp)
check(page.startswith(b"<!DOCTYPE html>") and page.rstrip().endswith(b"</html>"),
      "the whole page is served (%d bytes)" % len(page))
check(b"http://" not in page.replace(b"http://www.w3.org/2000/svg", b"")
      and b"https://" not in page, "the page refers to no other site")
check(b"/admin/ring" in page and b"/admin/members" in page, "the page reads the JSON routes")
status, headers, _ = request("POST", "/ui")
check(status == 405 and headers.get("allow") == "GET, HEAD", "POST /ui is 405 with Allow")

# --- /admin/ring ----------------------------------------------------------
status, headers, raw = request("GET", "/admin/ring")
ring = json.loads(raw)
check(status == 200 and headers.get("content-type") == "application/json", "/admin/ring is JSON")
check(ring["standalone"] is True and ring["ready"] is True and ring["self"] == SELF,
      "a standalone instance is a ready ring of itself: %r" % ring["self"])
check(len(ring["marks"]) == 1 and ring["marks"][0]["chain"] == [SELF],
      "one mark whose chain is this instance")
check(ring["marks"][0]["keyShare"] == 1 and ring["marks"][0]["stringShare"] == 1,
      "it owns every key and every string hash")
check(ring["keyMin"] == 0 and ring["keyMax"] == 1000000, "the key range is storage.key_min/max")
check(ring["change"] is None, "no ring change")

# --- /admin/members -------------------------------------------------------
for k in range(200):
    harness.call(port, lambda c: c.put(k, b"v" * 100))
status, _, raw = request("GET", "/admin/members")
members = json.loads(raw)["members"]
check(status == 200 and len(members) == 1, "/admin/members lists one member")
m = members[0]
check(m["address"] == SELF and m["self"] and m["reachable"] and m["role"] == "standalone",
      "the member is this instance, answering, role standalone: %r" % m)
check(m["writeMode"] == "safe" and m["mark"] == 0 and m["position"] == 0, "safe, mark 0, head")
check(m["liveBytes"] > 20000, "live bytes count the 200 values (%d)" % m["liveBytes"])
check(m["diskTotalBytes"] > 0 and 0 <= m["diskFreeBytes"] <= m["diskTotalBytes"],
      "disk total and free are reported")
check(m["opsPerSec"] > 0 and m["p99Micros"] > 0 and m["windowMs"] > 0,
      "ops/s and p99 of the recent puts: %d/s, %d us" % (m["opsPerSec"], m["p99Micros"]))
check(m["compaction"]["running"] in (True, False) and m["lagWrites"] == 0, "compaction and lag")
status, headers, _ = request("DELETE", "/admin/members")
check(status == 405 and headers.get("allow") == "GET, HEAD", "DELETE /admin/members is 405")

# --- Actions: the token ---------------------------------------------------
path = "/admin/members/%s/write-mode" % SELF
for token, label in ((None, "no token"), ("wrong", "a wrong token")):
    status, headers, a = answer("PUT", path, b"async", token)
    check(status == 401 and a.get("ok") is False and a.get("code") == "UNAUTHORIZED",
          "write-mode with %s is 401 UNAUTHORIZED: %d %r" % (label, status, a))
    check(headers.get("www-authenticate") == "Bearer" and headers.get("x-flatkv-error") == "UNAUTHORIZED",
          "with WWW-Authenticate and X-FlatKV-Error")
code, line = cli_error("--token", "wrong", "admin", "write-mode", "async")
check(code != 0 and line == "flatkv: Unauthorized: wrong admin token", "the CLI says %r" % line)
status, _, a = answer("PUT", path, b"async", "wrong")
check(a.get("error") == line, "the page's error is the CLI's line: %r" % a.get("error"))
check(write_mode() == WriteMode.SAFE, "a refused switch changed nothing")
code, cli_line = cli_error("--token", "wrong", "admin", "compact")
status, _, a = answer("POST", "/admin/members/%s/compact" % SELF, token="wrong")
check(status == 401 and a.get("error") == cli_line, "compact with a wrong token: %r" % a.get("error"))
code, cli_line = cli_error("--token", "wrong", "admin", "remove-mark", "5")
status, _, a = answer("POST", "/admin/ring/remove-mark", b"5", "wrong")
check(status == 401 and a.get("error") == cli_line, "remove-mark with a wrong token: %r" % a.get("error"))
code, cli_line = cli_error("--token", "wrong", "admin", "abort-change")
status, _, a = answer("POST", "/admin/ring/abort-change", token="wrong")
check(status == 401 and a.get("error") == cli_line, "abort-change with a wrong token: %r" % a.get("error"))

# --- Actions: bad input ---------------------------------------------------
status, _, a = answer("PUT", path, b"fast", TOKEN)
check(status == 400 and a.get("error") == "flatkv: InvalidArgument: write mode must be safe or async, "
      "not 'fast'", "a bad write mode is 400: %r" % a.get("error"))
status, _, a = answer("PUT", "/admin/members/10.9.9.9:1/write-mode", b"async", TOKEN)
check(status == 404 and "10.9.9.9:1 is not in the ring" in a.get("error", ""),
      "a member not in the ring is 404, never called: %r" % a.get("error"))
status, _, a = answer("PUT", "/admin/members/%s/explode" % SELF, b"", TOKEN)
check(status == 404, "an unknown member action is 404")
status, _, a = answer("POST", "/admin/ring/remove-mark", b"twelve", TOKEN)
check(status == 400 and "integer mark, not 'twelve'" in a.get("error", ""),
      "remove-mark of a non-integer is 400: %r" % a.get("error"))
code, cli_line = cli_error("--token", TOKEN, "admin", "remove-mark", "5")
status, _, a = answer("POST", "/admin/ring/remove-mark", b"5", TOKEN)
check(status == 400 and a.get("error") == cli_line,
      "remove-mark on a standalone instance: the CLI's %r" % cli_line)
code, cli_line = cli_error("--token", TOKEN, "admin", "abort-change")
status, _, a = answer("POST", "/admin/ring/abort-change", token=TOKEN)
check(status == 400 and a.get("error") == cli_line,
      "abort-change on a standalone instance: the CLI's %r" % cli_line)
status, headers, _ = answer("GET", "/admin/ring/remove-mark")
check(status == 405 and headers.get("allow") == "POST", "GET of an action is 405")

# --- Actions: done --------------------------------------------------------
status, _, a = answer("PUT", path, b"async\n", TOKEN)
check(status == 200 and a == {"ok": True, "message": "write mode of %s is now async" % SELF},
      "the switch with the token is done: %r" % a)
check(write_mode() == WriteMode.ASYNC, "getWriteMode() is ASYNC after it")
status, _, a = answer("POST", "/admin/members/%s/compact" % SELF, token=TOKEN)
check(status == 200 and a.get("ok") is True, "a compaction starts: %r" % a)
harness.wait_until(work, "/admin/members shows async", lambda: json.loads(
    request("GET", "/admin/members")[2])["members"][0]["writeMode"] == "async", timeout=5)
status, _, body = request("GET", "/health")
check(status == 200 and body == b"ok\n", "the server still answers /health")
check(proc.poll() is None, "the server is still running")
harness.stop(proc)
log.close()
harness.finish(work)
