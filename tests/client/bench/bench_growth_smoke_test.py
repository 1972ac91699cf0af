#!/usr/bin/python3
"""Smoke test of `flatkv-bench growth` for one engine (client/bench/bench_growth.h).

For each mix (writeonly, readheavy, writeheavy) it grows a small store in a
few points with --json and checks every line: the fields, point 1..P, the
records after each point exactly num * p / points (so strictly increasing,
ending at num), inserts per point = the records it added, ops = inserts +
reads, every read found, no errors, the read share near the mix's, ops_per_sec
= ops / seconds, elapsed_seconds the running sum. Then the same run with
--csv must print a header with the JSON's field names in the same order and
rows with the same counts (the op sequence is a function of the seed, even
with 2 threads), a run with --keys string (flat only) must pass the same
checks, and bad command lines must exit 2.
Usage: bench_growth_smoke_test.py --bench BIN --engine E --dir D"""
import argparse
import csv
import io
import json
import os
import subprocess
import sys

NUM = 3000
POINTS = 6
MIXES = {"writeonly": 0, "readheavy": 90, "writeheavy": 10}
FIELDS = ["engine", "mode", "mix", "read_percent", "keys", "key_dist", "value_size", "threads", "sync",
          "num", "points", "point", "records", "ops", "inserts", "reads", "found", "errors",
          "seconds", "ops_per_sec", "micros_per_op", "elapsed_seconds", "disk_bytes",
          "rss_bytes", "write_bytes"]


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def run(cmd, expect=0):
    print("+ " + " ".join(cmd), file=sys.stderr)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    sys.stderr.write(p.stderr)
    if p.returncode != expect:
        sys.stderr.write(p.stdout)
        fail("exit %d, expected %d: %s" % (p.returncode, expect, " ".join(cmd)))
    return p.stdout


def check_points(rows, engine, mix, keys, threads, value_size, key_dist="dense"):
    """The contract of one run's points (JSON or CSV, already typed)."""
    if len(rows) != POINTS:
        fail("%s: expected %d points, got %d" % (mix, POINTS, len(rows)))
    prev_records, elapsed = 0, 0.0
    total_ops = total_reads = 0
    for p, row in enumerate(rows, start=1):
        where = "%s point %d" % (mix, p)
        if list(row) != FIELDS:
            fail("%s: fields %s, expected %s" % (where, list(row), FIELDS))
        want = {"engine": engine, "mode": "growth", "mix": mix, "read_percent": MIXES[mix],
                "keys": keys, "key_dist": key_dist, "value_size": value_size,
                "threads": threads, "sync": "none",
                "num": NUM, "points": POINTS, "point": p, "errors": 0}
        for k, v in want.items():
            if row[k] != v:
                fail("%s: %s = %r, expected %r" % (where, k, row[k], v))
        records = NUM * p // POINTS
        if row["records"] != records or records <= prev_records:
            fail("%s: records %d, expected %d (after %d)" %
                 (where, row["records"], records, prev_records))
        if row["inserts"] != records - prev_records:
            fail("%s: %d inserts for %d new records" %
                 (where, row["inserts"], records - prev_records))
        if row["ops"] != row["inserts"] + row["reads"]:
            fail("%s: ops %d != inserts + reads" % (where, row["ops"]))
        if row["found"] != row["reads"]:
            fail("%s: %d of %d reads found" % (where, row["found"], row["reads"]))
        if row["seconds"] <= 0 or row["ops_per_sec"] <= 0:
            fail("%s: seconds %r, ops_per_sec %r" % (where, row["seconds"], row["ops_per_sec"]))
        rate = row["ops"] / row["seconds"]
        if abs(row["ops_per_sec"] - rate) > 0.01 * rate + 1:
            fail("%s: ops_per_sec %r, but ops / seconds = %r" % (where, row["ops_per_sec"], rate))
        elapsed += row["seconds"]
        if abs(row["elapsed_seconds"] - elapsed) > 1e-3 + 1e-4 * elapsed:
            fail("%s: elapsed_seconds %r, sum of seconds %r" %
                 (where, row["elapsed_seconds"], elapsed))
        if row["disk_bytes"] <= 0 or row["rss_bytes"] <= 0:
            fail("%s: disk_bytes %r, rss_bytes %r" % (where, row["disk_bytes"], row["rss_bytes"]))
        prev_records = records
        total_ops += row["ops"]
        total_reads += row["reads"]
    if prev_records != NUM:
        fail("%s: ends at %d records, expected %d" % (mix, prev_records, NUM))
    share = 100.0 * total_reads / total_ops
    # Reads are drawn per op (binomial): at NUM = 3000 inserts, readheavy
    # does ~27000 reads, so a few points either side is far outside chance.
    if abs(share - MIXES[mix]) > 4:
        fail("%s: %.1f%% reads, expected about %d%%" % (mix, share, MIXES[mix]))
    # The store holds the values it was given (LSMs compress them to about half).
    if rows[-1]["disk_bytes"] < NUM * value_size // 4:
        fail("%s: disk_bytes %d for %d records of %d B" %
             (mix, rows[-1]["disk_bytes"], NUM, value_size))


def growth_cmd(a, mix, fmt, threads=1, keys="int", value_size=1024, extra=()):
    return [a.bench, "growth", "--engine", a.engine, "--mix", mix, "--num", str(NUM),
            "--points", str(POINTS), "--value-size", str(value_size), "--threads",
            str(threads), "--keys", keys, "--dir", a.dir, "--fresh", fmt] + list(extra)


def json_rows(out):
    rows = []
    for line in out.splitlines():
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            fail("not JSON (%s): %r" % (e, line))
    return rows


def csv_rows(out):
    lines = out.splitlines()
    if not lines or lines[0] != ",".join(FIELDS):
        fail("CSV header %r, expected %r" % (lines[0] if lines else "", ",".join(FIELDS)))
    rows = []
    for r in csv.DictReader(io.StringIO(out)):
        rows.append({k: v if k in ("engine", "mode", "mix", "keys", "key_dist", "sync")
                     else float(v) if "." in v else int(v) for k, v in r.items()})
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    ap.add_argument("--engine", required=True)
    ap.add_argument("--dir", required=True)
    a = ap.parse_args()

    for mix in MIXES:
        check_points(json_rows(run(growth_cmd(a, mix, "--json"))), a.engine, mix, "int", 1, 1024)
        print("ok: %s %s --json" % (a.engine, mix))

    # --csv with 2 threads: the same counts as --json with 2 threads.
    j = json_rows(run(growth_cmd(a, "readheavy", "--json", threads=2, value_size=4096)))
    c = csv_rows(run(growth_cmd(a, "readheavy", "--csv", threads=2, value_size=4096)))
    for rows in (j, c):
        check_points(rows, a.engine, "readheavy", "int", 2, 4096)
    for pj, pc in zip(j, c):
        for k in ("records", "inserts", "reads", "ops", "found"):
            if pj[k] != pc[k]:
                fail("point %d: %s %r with --json, %r with --csv" % (pj["point"], k, pj[k], pc[k]))
    print("ok: %s readheavy 2 threads, --csv = --json" % a.engine)

    # Text output: one line per point.
    text = [l for l in run(growth_cmd(a, "writeonly", "--fresh")).splitlines() if l.strip()]
    if len(text) != POINTS or not all(l.startswith("growth writeonly") for l in text):
        fail("text output: %r" % text)

    # Random 64-bit keys (a flat store with the sparse tier, as a user with
    # such keys runs it): every inserted record is found again.
    extra = ["--key-dist", "random"] + (["--sparse-tier", "on"] if a.engine == "flat" else [])
    check_points(json_rows(run(growth_cmd(a, "readheavy", "--json", extra=extra))), a.engine,
                 "readheavy", "int", 1, 1024, key_dist="random")
    print("ok: %s --key-dist random" % a.engine)

    if a.engine == "flat":
        check_points(json_rows(run(growth_cmd(a, "writeheavy", "--json", keys="string"))),
                     a.engine, "writeheavy", "string", 1, 1024)
        print("ok: flat --keys string")

    # Bad command lines: exit 2, nothing on stdout.
    base = [a.bench, "growth", "--engine", a.engine, "--dir", a.dir]
    for extra in (["--workload", "fillrandom"], ["--json", "--csv"], ["--num", "5", "--points", "6"],
                  ["--mix", "readmost"], ["--points", "0"]):
        if run(base + ["--fresh"] + extra, expect=2):
            fail("output on stdout for %s" % extra)
    if run([a.bench, "engine", "--engine", a.engine, "--dir", a.dir, "--mix", "readheavy"],
           expect=2):
        fail("output on stdout for engine --mix")
    # A store that is not empty is refused without --fresh, and left alone.
    marker = os.path.join(a.dir, "keep-me")
    with open(marker, "w") as f:
        f.write("x")
    run(base + ["--num", "10", "--points", "2"], expect=2)
    if not os.path.exists(marker):
        fail("growth without --fresh removed files in --dir")
    print("ok: %s bad command lines" % a.engine)


if __name__ == "__main__":
    main()
