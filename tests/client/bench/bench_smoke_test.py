#!/usr/bin/python3
"""Smoke test of flatkv-bench for one engine and one key kind (--keys).

Runs every workload on a small database with --json and checks the output
contract (shared/DESIGN.md, "Tools"): one JSON object per workload with every
contract field, all reads of written keys found, all reads of unwritten keys
missed, no errors. Then checks that the deletes survived a clean close, and
that a bad command line exits with status 2. For flat with string keys it
also runs the list with about 100 keys per bucket (--string-slots), and for
flat with integer keys once more with --compaction-mode in_place. A peer
must skip the compaction workloads with a note and exit 0, and refuse the
flat-only flags with status 2.

With --compaction (flat only) it runs compact and readwhilecompacting
instead, unlimited and with --compaction-mb-per-sec, and checks that
compaction shrinks the data files to about the live data and that reads
during it find every key.

With --cache (flat only) it runs fillrandom, zipfoverwrite, zipfread and
readrandom through an ARC write-back cache in async mode and checks the cache
fields, that every key is found, and that zipfoverwrite's repeated puts of hot
keys coalesce (fewer engine writes than puts). Then a clean close and a
rerun without the cache must still find every key.
"""
import argparse
import json
import subprocess
import sys

WORKLOADS = ["fillrandom", "readrandom", "readmissing", "overwrite",
             "deleterandom", "reopen"]
CONTRACT_FIELDS = ["engine", "workload", "num", "value_size", "threads",
                   "seconds", "ops_per_sec", "mb_per_sec", "rss_bytes",
                   "write_bytes", "disk_bytes"]
EXTRA_FIELDS = ["found", "write_amp", "errors", "keys"]
COMPACTION_WORKLOADS = ["compact", "readwhilecompacting"]
COMPACTION_FIELDS = {
    "compact": ["compaction_seconds", "compaction_bytes_read",
                "compaction_mb_per_sec", "compaction_mb_per_sec_limit",
                "tables_compacted", "space_before", "space_after",
                "log_bytes_before", "log_bytes_after", "live_bytes",
                "space_after_over_live"],
    "readwhilecompacting": ["compaction_seconds", "compaction_bytes_read",
                            "compaction_mb_per_sec",
                            "compaction_mb_per_sec_limit", "tables_compacted",
                            "ops", "baseline_ops_per_sec", "ratio"],
}
NUM = 20000


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def run(cmd):
    print("+ " + " ".join(cmd), file=sys.stderr)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    sys.stderr.write(p.stderr)
    sys.stderr.write(p.stdout)
    return p


def parse_lines(stdout, expected, keys):
    lines = [line for line in stdout.splitlines() if line.strip()]
    if len(lines) != len(expected):
        fail("expected %d lines, got %d" % (len(expected), len(lines)))
    rows = []
    for line, workload in zip(lines, expected):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            fail("not JSON (%s): %r" % (e, line))
        missing = [f for f in CONTRACT_FIELDS + EXTRA_FIELDS +
                   COMPACTION_FIELDS.get(workload, []) if f not in row]
        if missing:
            fail("%s: missing fields %s" % (workload, missing))
        if row["workload"] != workload:
            fail("expected workload %s, got %s" % (workload, row["workload"]))
        if row["keys"] != keys:
            fail("%s: expected keys %s, got %s" % (workload, keys, row["keys"]))
        if row["errors"] != 0:
            fail("%s: %d errors" % (workload, row["errors"]))
        if row["seconds"] <= 0 or row["ops_per_sec"] <= 0:
            fail("%s: no time measured: %r" % (workload, row))
        rows.append(row)
    return {row["workload"]: row for row in rows}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    ap.add_argument("--engine", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--keys", choices=["int", "string"], default="int")
    ap.add_argument("--compaction", action="store_true",
                    help="run compact and readwhilecompacting (flat only)")
    ap.add_argument("--cache", action="store_true",
                    help="run Zipf workloads through an async ARC cache (flat only)")
    args = ap.parse_args()
    base = [args.bench, "engine", "--engine", args.engine, "--dir", args.dir,
            "--num", str(NUM), "--value-size", "100", "--threads", "2", "--json"]
    if args.keys != "int":
        # The int case runs without --keys: the default must stay int.
        base += ["--keys", args.keys]

    if args.cache:
        if args.engine != "flat":
            fail("--cache applies to flat only")
        check_cache(args, base)
        print("ok: %s, %s keys, cache" % (args.engine, args.keys))
        return

    if args.compaction:
        if args.engine != "flat":
            fail("--compaction applies to flat only")
        check_compaction(args, base, 0)
        # Paced: 20000 keys of 100 B leave about 10 MB of log, so 20 MB/s
        # makes the compaction last about half a second.
        check_compaction(args, base, 20)
        print("ok: %s, %s keys, compaction" % (args.engine, args.keys))
        return

    check_full_run(args, base)
    if args.engine != "flat":
        check_compaction_skipped(args, base)
    if args.engine == "flat" and args.keys == "string":
        # About 100 keys per bucket: every op goes through bucket search,
        # appends and rewrites, and must still find exactly what it wrote.
        check_full_run(args, base + ["--string-slots", str(NUM // 100)])
    if args.engine == "flat" and args.keys == "int":
        # storage.compaction_mode in_place: every workload still finds
        # exactly what it wrote.
        check_full_run(args, base + ["--compaction-mode", "in_place"])
        check_key_dists(args, base)

    p = run([args.bench, "engine", "--engine", args.engine, "--dir", args.dir,
             "--num", "12x"])
    if p.returncode != 2:
        fail("bad --num: expected exit 2, got %d" % p.returncode)
    p = run([args.bench, "engine", "--engine", args.engine, "--dir", args.dir,
             "--keys", "bytes"])
    if p.returncode != 2:
        fail("bad --keys: expected exit 2, got %d" % p.returncode)
    p = run([args.bench, "engine", "--engine", args.engine, "--dir", args.dir,
             "--compaction-mode", "halfway"])
    if p.returncode != 2 or "whole|in_place" not in p.stderr:
        fail("bad --compaction-mode: expected exit 2 naming the choices, got %d: %r" %
             (p.returncode, p.stderr))
    p = run([args.bench, "engine", "--engine", args.engine, "--dir", args.dir,
             "--keys", "int", "--string-slots", "1000"])
    if p.returncode != 2:
        fail("--string-slots with int keys: expected exit 2, got %d" % p.returncode)
    print("ok: %s, %s keys" % (args.engine, args.keys))


def check_compaction(args, base, mb_per_sec):
    cmd = base + ["--fresh", "--workload", ",".join(COMPACTION_WORKLOADS)]
    if mb_per_sec:
        cmd += ["--compaction-mb-per-sec", str(mb_per_sec)]
    p = run(cmd)
    if p.returncode != 0:
        fail("exit status %d" % p.returncode)
    rows = parse_lines(p.stdout, COMPACTION_WORKLOADS, args.keys)
    for row in rows.values():
        if row["compaction_mb_per_sec_limit"] != mb_per_sec:
            fail("%s: limit %r, expected %d" %
                 (row["workload"], row["compaction_mb_per_sec_limit"],
                  mb_per_sec))
        if row["compaction_seconds"] <= 0 or row["tables_compacted"] < 1:
            fail("%s: no compaction measured: %r" % (row["workload"], row))
    c = rows["compact"]
    if not 0 < c["space_after"] < c["space_before"]:
        fail("compact: space %d -> %d did not shrink" %
             (c["space_before"], c["space_after"]))
    if not 0 < c["log_bytes_after"] < c["log_bytes_before"]:
        fail("compact: log bytes %d -> %d did not shrink" %
             (c["log_bytes_before"], c["log_bytes_after"]))
    if not 0 < c["space_after_over_live"] <= 1.2:
        fail("compact: space after is %.3f x live" % c["space_after_over_live"])
    if c["compaction_bytes_read"] <= 0 or c["mb_per_sec"] <= 0:
        fail("compact: no compaction rate: %r" % c)
    if mb_per_sec and c["compaction_mb_per_sec"] > 1.5 * mb_per_sec:
        fail("compact: %.1f MB/s over the %d MB/s limit" %
             (c["compaction_mb_per_sec"], mb_per_sec))
    r = rows["readwhilecompacting"]
    if r["ops"] < NUM:
        fail("readwhilecompacting: %d reads, expected at least %d" %
             (r["ops"], NUM))
    if r["found"] != r["ops"]:
        fail("readwhilecompacting: found %d of %d during compaction" %
             (r["found"], r["ops"]))
    if r["baseline_ops_per_sec"] <= 0 or r["ratio"] <= 0:
        fail("readwhilecompacting: ratio %r of baseline %r" %
             (r["ratio"], r["baseline_ops_per_sec"]))


CACHE_WORKLOADS = ["fillrandom", "zipfoverwrite", "zipfread", "readrandom"]
CACHE_FIELDS = ["cache", "write_mode", "cache_hits", "cache_misses",
                "cache_flushes", "cache_coalesced", "engine_writes_per_put"]


def check_cache(args, base):
    p = run(base + ["--fresh", "--cache", "arc", "--write-mode", "async",
                    "--workload", ",".join(CACHE_WORKLOADS)])
    if p.returncode != 0:
        fail("exit status %d" % p.returncode)
    rows = parse_lines(p.stdout, CACHE_WORKLOADS, args.keys)
    for row in rows.values():
        missing = [f for f in CACHE_FIELDS if f not in row]
        if missing:
            fail("%s: missing cache fields %s" % (row["workload"], missing))
        if (row["cache"], row["write_mode"]) != ("arc", "async"):
            fail("%s: cache %r, write_mode %r" %
                 (row["workload"], row["cache"], row["write_mode"]))
    for w in ["zipfread", "readrandom"]:
        if rows[w]["found"] != NUM:
            fail("%s found %d of %d" % (w, rows[w]["found"], NUM))
        if rows[w]["cache_hits"] + rows[w]["cache_misses"] < NUM:
            fail("%s: %d cache lookups for %d gets" %
                 (w, rows[w]["cache_hits"] + rows[w]["cache_misses"], NUM))
    z = rows["zipfoverwrite"]
    if not 0 < z["engine_writes_per_put"] < 1:
        fail("zipfoverwrite: engine_writes_per_put %r, expected in (0, 1)" %
             z["engine_writes_per_put"])
    if z["cache_coalesced"] <= 0:
        fail("zipfoverwrite: nothing coalesced")
    f = rows["fillrandom"]
    # Every key once: each put is flushed once, by the end of the workload.
    if f["cache_flushes"] != NUM or f["engine_writes_per_put"] != 1:
        fail("fillrandom: %d flushes, %r engine writes per put" %
             (f["cache_flushes"], f["engine_writes_per_put"]))

    # The cache flushed everything on close: the store alone has every key.
    p = run(base + ["--workload", "readrandom"])
    if p.returncode != 0:
        fail("rerun without cache: exit status %d" % p.returncode)
    row = parse_lines(p.stdout, ["readrandom"], args.keys)["readrandom"]
    if row["found"] != NUM:
        fail("without cache after close: found %d of %d" % (row["found"], NUM))
    if "cache" in row:
        fail("cache fields without --cache: %r" % row)

    p = run(base + ["--workload", "readrandom", "--write-mode", "async"])
    if p.returncode != 2:
        fail("--write-mode without --cache: expected exit 2, got %d" % p.returncode)
    p = run(base + ["--workload", "readrandom", "--cache", "fifo"])
    if p.returncode != 2:
        fail("--cache fifo: expected exit 2, got %d" % p.returncode)


def check_compaction_skipped(args, base):
    # Reuses the database the full run left (every key deleted, so no
    # pre-fill either way): the workloads are skipped with a note, exit 0.
    p = run(base + ["--workload", ",".join(COMPACTION_WORKLOADS)])
    if p.returncode != 0:
        fail("compaction workloads on %s: exit status %d" %
             (args.engine, p.returncode))
    if p.stdout.strip():
        fail("compaction workloads on %s printed %r" % (args.engine, p.stdout))
    if "not supported for %s" % args.engine not in p.stderr:
        fail("no 'not supported for %s' note" % args.engine)
    p = run(base + ["--workload", "readrandom", "--compaction-mb-per-sec", "5"])
    if p.returncode != 2:
        fail("--compaction-mb-per-sec on %s: expected exit 2, got %d" %
             (args.engine, p.returncode))
    p = run(base + ["--workload", "readrandom", "--cache", "arc"])
    if p.returncode != 2:
        fail("--cache on %s: expected exit 2, got %d" % (args.engine, p.returncode))
    p = run(base + ["--workload", "readrandom", "--compaction-mode", "in_place"])
    if p.returncode != 2 or "--compaction-mode" not in p.stderr:
        fail("--compaction-mode on %s: expected exit 2 naming the flag, got %d: %r" %
             (args.engine, p.returncode, p.stderr))


def check_key_dists(args, base):
    # Sparse keys: each read finds what its fill wrote, the keys land in
    # many segments, and a store without garbage never stalls a write.
    for dist, num, extra, least in (("random", 300, ["--key-max", str(1 << 40)], 250),
                                    ("snowflake", 2000, [], 20)):
        workloads = ["fillrandom", "readrandom", "readmissing"]
        p = run(base + ["--fresh", "--num", str(num), "--key-dist", dist,
                        "--workload", ",".join(workloads)] + extra)
        if p.returncode != 0:
            fail("--key-dist %s: exit status %d" % (dist, p.returncode))
        rows = parse_lines(p.stdout, workloads, "int")
        fill = rows["fillrandom"]
        for field in ("key_dist", "put_p50_us", "put_p99_us", "put_max_us",
                      "segments_created", "write_stalls"):
            if field not in fill:
                fail("--key-dist %s: fillrandom lacks %s" % (dist, field))
        if fill["key_dist"] != dist:
            fail("--key-dist %s: echoed %r" % (dist, fill["key_dist"]))
        if fill["segments_created"] < least:
            fail("--key-dist %s: %d segments for %d keys" %
                 (dist, fill["segments_created"], num))
        if fill["write_stalls"] != 0:
            fail("--key-dist %s: %d writes stalled" % (dist, fill["write_stalls"]))
        if rows["readrandom"]["found"] != num:
            fail("--key-dist %s: readrandom found %d of %d" %
                 (dist, rows["readrandom"]["found"], num))
        if rows["readmissing"]["found"] != 0:
            fail("--key-dist %s: readmissing found %d" % (dist, rows["readmissing"]["found"]))
    p = run(base + ["--key-dist", "zipf"])
    if p.returncode != 2 or "dense|random|snowflake" not in p.stderr:
        fail("bad --key-dist: expected exit 2 naming the choices, got %d" % p.returncode)
    p = run(base + ["--key-dist", "random", "--key-min", "5", "--key-max", "5"])
    if p.returncode != 2:
        fail("empty key range: expected exit 2, got %d" % p.returncode)


def check_full_run(args, base):
    p = run(base + ["--fresh", "--workload", ",".join(WORKLOADS)])
    if p.returncode != 0:
        fail("exit status %d" % p.returncode)
    rows = parse_lines(p.stdout, WORKLOADS, args.keys)
    for row in rows.values():
        if (row["engine"], row["num"], row["value_size"], row["threads"]) != \
                (args.engine, NUM, 100, 2):
            fail("echoed parameters wrong: %r" % row)
    if rows["readrandom"]["found"] != NUM:
        fail("readrandom found %d of %d" % (rows["readrandom"]["found"], NUM))
    if rows["readmissing"]["found"] != 0:
        fail("readmissing found %d" % rows["readmissing"]["found"])
    if rows["fillrandom"]["disk_bytes"] <= 0:
        fail("fillrandom: disk_bytes is 0")

    # Reuses the database (no --fresh): every key was deleted before the
    # clean close at the end of the first run, so nothing may come back.
    p = run(base + ["--workload", "readrandom"])
    if p.returncode != 0:
        fail("rerun: exit status %d" % p.returncode)
    row = parse_lines(p.stdout, ["readrandom"], args.keys)["readrandom"]
    if row["found"] != 0:
        fail("deleted keys came back after reopen: found %d" % row["found"])


if __name__ == "__main__":
    main()
