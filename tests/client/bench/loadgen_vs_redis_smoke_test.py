#!/usr/bin/python3
"""Smoke test of client/bench/loadgen_vs_redis.sh: the pinned comparison runs
end to end, small, and prints its table.

One round at 100 B over 4 threads and 400 keys, with both servers and the
generator pinned to CPU 0 (present on every machine): the script must exit 0
and print one table row for each of put, get, multiPut and multiGet, each
with both servers' rates and CPU figures, and the JSON line of every run
(fill plus four workloads, for each server). Nothing about speed is checked.
Then a CPU list that cannot exist exits 2, naming it.

Usage: loadgen_vs_redis_smoke_test.py SCRIPT BUILD_DIR
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def main():
    script, build = sys.argv[1], sys.argv[2]
    if shutil.which("redis-server") is None:
        fail("redis-server not found: run deploy/install-deps.sh")
    env = dict(os.environ, OPS="2000", BATCH_CALLS="400", BATCH="5", KEYSPACE="400",
               THREADS="4", ROUNDS="1", SIZES="100")
    with tempfile.TemporaryDirectory() as tmp:
        env["RUNS"] = os.path.join(tmp, "runs.jsonl")
        p = subprocess.run(["bash", script, build, "--server-cpus", "0", "--client-cpus", "0"],
                           capture_output=True, text=True, env=env, timeout=240)
        sys.stderr.write(p.stderr)
        print(p.stdout)
        if p.returncode != 0:
            fail("exit %d" % p.returncode)
        runs = [json.loads(line) for line in open(env["RUNS"])]
    seen = sorted((r["target"], r["workload"]) for r in runs)
    want = sorted((t, w) for t in ("flatkv", "redis")
                  for w in ("fill", "put", "get", "mput", "mget"))
    if seen != want:
        fail("runs %s, want %s" % (seen, want))
    for r in runs:
        if r["errors"] != 0 or r["ops"] <= 0 or "server_cpu_ticks" not in r:
            fail("bad run %s" % r)
        if r["workload"] in ("mput", "mget") and (r["batch"], r["keys"]) != (5, 5 * r["ops"]):
            fail("batch run counts %s" % r)
    rows = [line for line in p.stdout.splitlines() if line.startswith("| ")]
    if not rows or "server CPU us/call" not in rows[0]:
        fail("no table header in the output")
    for name in ("put / SET", "get / GET", "multiPut / MSET x 5", "multiGet / MGET x 5"):
        row = [r for r in rows if r.startswith("| " + name + " | 100 B |")]
        if len(row) != 1:
            fail("no single table row for %s" % name)
        cells = [c.strip() for c in row[0].strip("|").split("|")]
        if len(cells) != 10 or not all(cells):
            fail("row for %s: %s" % (name, cells))
        float(cells[2])  # FlatKV calls/s
        float(cells[4])  # Redis calls/s

    p = subprocess.run(["bash", script, build, "--server-cpus", "100000"], capture_output=True,
                       text=True, env=env, timeout=60)
    if p.returncode != 2 or "100000" not in p.stderr:
        fail("an impossible CPU list gave exit %d: %s" % (p.returncode, p.stderr))
    print("PASS")


if __name__ == "__main__":
    main()
