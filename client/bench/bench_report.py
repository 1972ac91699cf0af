#!/usr/bin/env python3
"""Summarizes flatkv-bench --json lines: ops/s per engine and flat's ratio to
each peer, per (threads, value size, workload). Usage: bench_report.py FILE"""
import json
import sys
from collections import defaultdict

PEERS = ["rocksdb", "leveldb", "kyotocabinet"]
ORDER = ["fillseq", "fillrandom", "overwrite", "readrandom", "readmissing", "deleterandom"]


def human(x):
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e3:
        return f"{x / 1e3:.1f}k"
    return f"{x:.0f}"


def main(path):
    ops = defaultdict(dict)  # (threads, size, workload) -> engine -> ops/s
    wamp = {}
    for line in open(path):
        line = line.strip()
        if not line.startswith("{"):
            continue
        d = json.loads(line)
        key = (d["threads"], d["value_size"], d["workload"])
        ops[key][d["engine"]] = d["ops_per_sec"]
        if d["workload"] in ("fillseq", "fillrandom") and d.get("write_amp"):
            wamp[(d["engine"], d["threads"], d["value_size"], d["workload"])] = d["write_amp"]
    print("| threads | value | workload | flat | " + " | ".join(PEERS) +
          " | flat/" + " | flat/".join(PEERS) + " |")
    print("|" + " --- |" * (4 + 2 * len(PEERS)))
    worst = None
    for key in sorted(ops, key=lambda k: (k[0], k[1], ORDER.index(k[2]) if k[2] in ORDER else 99)):
        row = ops[key]
        if "flat" not in row:
            continue
        ratios = []
        for p in PEERS:
            if p in row and row[p] > 0:
                r = row["flat"] / row[p]
                ratios.append(f"{r:.2f}")
                if worst is None or r < worst[0]:
                    worst = (r, p, key)
            else:
                ratios.append("-")
        print(f"| {key[0]} | {key[1]} | {key[2]} | {human(row['flat'])} | " +
              " | ".join(human(row[p]) if p in row else "-" for p in PEERS) + " | " +
              " | ".join(ratios) + " |")
    if worst:
        print(f"\nlowest flat/peer ratio: {worst[0]:.2f} vs {worst[1]} at {worst[2]}")
    if wamp:
        print("\nwrite bytes per user byte during fill (flat):")
        for (e, t, vs, w), v in sorted(wamp.items()):
            if e == "flat":
                print(f"  {w} {vs} B, {t} thr: {v:.3f}")


if __name__ == "__main__":
    main(sys.argv[1])
