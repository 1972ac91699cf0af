#!/usr/bin/python3
"""Integration test of the `flatkv` CLI against the real flatkv-server on a
loopback port: exit codes 0-4, values from stdin (binary), --raw, --hex,
scan output, admin commands and the compaction progress on a pipe and on a
terminal.
Usage: cli_test.py FLATKV_SERVER FLATKV_CLI"""
import os
import pty
import re
import subprocess
import sys

import harness
from harness import check, free_port, stop

server_bin, cli_bin = sys.argv[1:3]
work = harness.workdir("flatkv-cli-it-")


def start(port, data, *extra):
    return harness.start(server_bin, port, data, *extra)


port = free_port()
env = dict(os.environ)
env.pop("FLATKV_ADMIN_TOKEN", None)


def kv(*args, stdin=b"", token=None, port_=None):
    """Runs flatkv; returns (exit code, stdout bytes, stderr text)."""
    e = dict(env)
    if token is not None:
        e["FLATKV_ADMIN_TOKEN"] = token
    r = subprocess.run([cli_bin, "--port", str(port_ or port), *args], input=stdin,
                       capture_output=True, env=e, timeout=120)
    return r.returncode, r.stdout, r.stderr.decode(errors="replace")


proc = start(port, os.path.join(work, "data"), "--set", "admin.token=secret",
             "--set", "storage.key_max=1000000")

# --help and usage errors (exit 2), before and without a server.
code, out, _ = kv("--help")
check(code == 0 and b"Exit status" in out and b"admin compact" in out, "--help exits 0 with the exit codes")
for args, what in [((), "no command"), (("frob",), "an unknown command"),
                   (("get",), "a missing KEY"), (("get", "1", "2"), "an extra operand"),
                   (("get", "abc"), "a key that is not an integer"),
                   (("get", "99999999999999999999"), "a key over 64 bits"),
                   (("get", "1", "--limit", "3"), "--limit outside scan"),
                   (("scan", "--limit", "0"), "--limit 0"),
                   (("--raw", "--hex", "get", "1"), "--raw with --hex"),
                   (("--port", "x", "get", "1"), "a bad --port"),
                   (("--bogus", "get", "1"), "an unknown option"),
                   (("admin",), "admin without a subcommand"),
                   (("admin", "write-mode", "fast"), "an unknown write mode"),
                   (("--hex", "put", "1", "abc"), "odd hex digits"),
                   (("--hex", "put", "1", "zz"), "a value that is not hex")]:
    code, out, err = kv(*args)
    check(code == 2 and err.startswith("flatkv: ") and out == b"", "exit 2 for " + what)
code, _, err = kv("--zk", "127.0.0.1:1", "--path", "/flatkv", "--timeout-ms", "500", "get", "1")
check(code == 4 and err.startswith("flatkv: Unavailable: no ring from ZooKeeper 127.0.0.1:1/flatkv")
      and err.count("\n") == 1, "--zk with no ZooKeeper there: one line, exit 4")

# get/put/rm/append: exit 0, and 1 for an absent key.
check(kv("put", "1", "hello")[0] == 0, "put KEY VALUE exits 0")
check(kv("get", "1")[:2] == (0, b"hello\n"), "get prints the value and a newline")
code, out, err = kv("get", "2")
check(code == 1 and out == b"" and "not found" in err, "get of an absent key exits 1")
check(kv("append", "1", " world")[0] == 0, "append exits 0")
check(kv("append", "1", stdin=b"!")[0] == 0, "append reads stdin without VALUE")
check(kv("get", "1")[1] == b"hello world!\n", "append added the bytes")
check(kv("rm", "1")[0] == 0 and kv("rm", "1")[0] == 1, "rm exits 0, then 1 once absent")
check(kv("get", "1")[0] == 1, "a removed key is not found")
check(kv("get", "-1")[0] == 3, "a negative key is an operand, not an option")

# Values from stdin are binary safe; --raw prints them exactly.
blob = bytes(range(256)) * 4096 + b"\x00\n\x00"  # 1 MiB and a bit, NULs and newlines
check(kv("put", "5", stdin=blob)[0] == 0, "put KEY with no VALUE reads stdin")
check(kv("--raw", "get", "5")[1] == blob, "--raw get returns the stdin bytes exactly")
check(kv("put", "6", "-", stdin=b"a\x00b")[0] == 0 and kv("get", "6", "--raw")[1] == b"a\x00b",
      "'-' reads stdin too, and options may follow the command")
check(kv("put", "7", stdin=b"")[0] == 0 and kv("get", "7")[:2] == (0, b"\n"),
      "an empty stdin stores an empty value")
check(kv("put", "--", "8", "--not-an-option")[0] == 0 and kv("get", "8")[1] == b"--not-an-option\n",
      "'--' ends the options")

# --hex on output and input; a hex get piped into a hex put copies a value.
check(kv("--hex", "put", "9", "00FF0a")[0] == 0 and kv("--raw", "get", "9")[1] == b"\x00\xff\n",
      "--hex put decodes the VALUE")
check(kv("--hex", "get", "9")[1] == b"00ff0a\n", "--hex get prints lowercase hex")
code, hexed, _ = kv("--hex", "get", "5")
check(code == 0 and kv("--hex", "put", "10", stdin=hexed)[0] == 0 and
      kv("--raw", "get", "10")[1] == blob, "--hex get | --hex put copies a binary value")
check(kv("--hex", "sput", "00ff", "6869")[0] == 0 and kv("--hex", "sget", "00ff")[1] == b"6869\n"
      and kv("sget", "00ff")[0] == 1, "--hex applies to string keys too")

# String keys.
check(kv("sput", "user:42", '{"n":1}')[0] == 0, "sput exits 0")
check(kv("sget", "user:42")[:2] == (0, b'{"n":1}\n'), "sget prints the value")
check(kv("sput", "user:43", stdin=b"x\x00y")[0] == 0 and kv("--raw", "sget", "user:43")[1] == b"x\x00y",
      "sput reads stdin")
check(kv("srm", "user:42")[0] == 0 and kv("srm", "user:42")[0] == 1, "srm exits 0, then 1")
check(kv("sget", "user:42")[0] == 1, "sget of an absent key exits 1")

# Scan: KEY<TAB>VALUE lines, forward, reverse, from a key, limited, paged.
for k in range(100, 110):
    kv("put", str(k), "v%d" % k)
code, out, _ = kv("scan", "100", "--limit", "3")
check(code == 0 and out == b"100\tv100\n101\tv101\n102\tv102\n", "scan FROM --limit N")
code, out, _ = kv("scan", "105", "--reverse", "--limit", "2")
check(out == b"105\tv105\n104\tv104\n", "scan --reverse goes down from FROM")
code, out, _ = kv("--hex", "scan", "109")
check(out == b"109\t76313039\n", "--hex scan prints hex values")
code, out, _ = kv("--hex", "scan")  # hex: the values hold tabs and newlines
keys = [int(line.split(b"\t")[0]) for line in out.splitlines()]
check(code == 0 and keys[:3] == [5, 6, 7] and keys[-1] == 109, "scan with no FROM starts at the first key")
code, out, _ = kv("scan", "--reverse", "--limit", "1")
check(out == b"109\tv109\n", "scan --reverse with no FROM starts at the last key")
# More than one page (1000 pairs a call) must follow nextKey.
for k in range(2000, 3050):
    subprocess.run([cli_bin, "--port", str(port), "put", str(k), "p"], check=True)
code, out, _ = kv("scan", "2000")
check(code == 0 and out == b"".join(b"%d\tp\n" % k for k in range(2000, 3050)),
      "scan follows nextKey past one page")
code, out, _ = kv("scan", "3049", "--reverse", "--limit", "1001")
check(out.count(b"\n") == 1001 and out.startswith(b"3049\t") and out.endswith(b"\n2049\tp\n"),
      "scan --limit spans pages exactly")

# Errors answered by the server: exit 3 with the Status.
code, _, err = kv("put", "1000000", "x")
check(code == 3 and err.startswith("flatkv: KeyOutOfRange: "), "a key out of range exits 3")
code, _, err = kv("admin", "write-mode", "async", "--token", "wrong")
check(code == 3 and err == "flatkv: Unauthorized: wrong admin token\n", "a wrong --token exits 3")
check(kv("admin", "compact")[0] == 3, "no token at all exits 3")
check(kv("admin", "compact", token="wrong")[0] == 3, "a wrong $FLATKV_ADMIN_TOKEN exits 3")

# Admin: write mode, info, stats.
check(kv("admin", "write-mode")[:2] == (0, b"safe\n"), "admin write-mode prints the mode")
check(kv("admin", "write-mode", "async", "--token", "secret")[0] == 0, "--token sets the mode")
check(kv("admin", "write-mode")[1] == b"async\n", "the mode is now async")
code, out, _ = kv("admin", "info")
info = dict(line.split(" ", 1) for line in out.decode().splitlines())
check(code == 0 and info.get("write_mode") == "async" and info.get("role") == "standalone" and
      info.get("key_max") == "1000000", "admin info prints name value lines")
check(kv("admin", "write-mode", "safe", token="secret")[0] == 0 and
      kv("admin", "write-mode")[1] == b"safe\n", "$FLATKV_ADMIN_TOKEN sets the mode")
code, out, _ = kv("admin", "stats")
lines = out.decode().splitlines()
stats = dict((n, int(v)) for n, v in (line.split(" ") for line in lines))
check(code == 0 and lines == sorted(lines) and stats.get("calls.put", 0) > 1000,
      "admin stats prints sorted name value lines")

# admin digest: what the instance holds, order-independent; it follows
# every change of a value, and a wrong token is refused.
def digest():
    code, out, err = kv("admin", "digest", token="secret")
    check(code == 0, "admin digest exits 0 (%s)" % err.strip())
    return dict(line.split(" ", 1) for line in out.decode().splitlines())


d0 = digest()
check(kv("put", "999000", "one")[0] == 0 and kv("sput", "digest-key", "x")[0] == 0, "puts for digest")
d1 = digest()
check(kv("put", "999000", "two")[0] == 0, "overwrite for digest")
d2 = digest()
check(kv("put", "999000", "one")[0] == 0, "overwrite back for digest")
d3 = digest()
check(int(d1["keys"]) == int(d0["keys"]) + 1 and int(d1["string_keys"]) == int(d0["string_keys"]) + 1 and
      d0["digest"] != d1["digest"] != d2["digest"] and d3["digest"] == d1["digest"] and
      d1["applied_seq"] == "0",
      "admin digest counts keys and follows values: the same contents give the same digest "
      "(%s %s %s %s)" % (d0["digest"], d1["digest"], d2["digest"], d3["digest"]))
code, _, err = kv("admin", "digest", token="wrong")
check(code != 0 and "UNAUTHORIZED" in err.upper(), "admin digest with a wrong token is refused")

# Compaction with --wait, stderr a pipe: one line per 10% reached, ending at
# 100%, then what it reclaimed on stdout.
for k in range(100, 110):  # 50 kB of garbage to reclaim
    kv("put", str(k), "w" * 5000)
    kv("put", str(k), "v%d" % k)
code, out, err = kv("admin", "compact", "--wait", token="secret")
bar = re.compile(r"^\[[# ]{20}\] \d+\.\d%  [\d.]+/[\d.]+ (B|KiB|MiB|GiB|TiB)$")
lines = err.splitlines()
got = dict(line.split(" ") for line in out.decode().splitlines())
check(code == 0 and lines and all(bar.match(line) for line in lines) and "\r" not in err and
      lines[-1].startswith("[####################] 100.0%"),
      "compact --wait on a pipe prints progress lines ending at 100%%: %r" % err)
check(int(got.get("tables_compacted", 0)) >= 1 and int(got.get("bytes_reclaimed", 0)) >= 50000,
      "compact --wait prints tables_compacted and bytes_reclaimed: %r" % out)
check(kv("admin", "compact", "--token", "secret")[0] == 0, "compact without --wait exits 0")

# The same on a terminal: redrawn in place with \r.
master, slave = pty.openpty()
r = subprocess.run([cli_bin, "--port", str(port), "--token", "secret", "admin", "compact", "--wait"],
                   stdout=subprocess.PIPE, stderr=slave, env=env, timeout=120)
os.close(slave)
tty = b""
while True:
    try:
        chunk = os.read(master, 65536)
    except OSError:
        break
    if not chunk:
        break
    tty += chunk
os.close(master)
check(r.returncode == 0 and tty.startswith(b"\r[") and b"100.0%" in tty and tty.endswith(b"\n"),
      "compact --wait on a terminal redraws one line: %r" % tty[-120:])

# Cannot reach the server: exit 4.
dead = free_port()
code, _, err = kv("get", "1", port_=dead)
check(code == 4 and err.startswith("flatkv: IOError: 127.0.0.1:%d" % dead) and err.count("\n") == 1,
      "an unreachable port exits 4 with one line")
check(kv("--host", "127.0.0.1", "--timeout-ms", "500", "admin", "stats", port_=dead)[0] == 4,
      "admin calls exit 4 too")
check(stop(proc) == 0, "the server stops cleanly")
check(kv("get", "5")[0] == 4, "a stopped server exits 4")

# Persistence through the CLI: a value put before a restart is still there.
proc = start(port, os.path.join(work, "data"), "--set", "admin.token=secret",
             "--set", "storage.key_max=1000000")
check(kv("--raw", "get", "5")[1] == blob, "values survive a restart")
check(stop(proc) == 0, "second stop is clean")

harness.finish(work)
