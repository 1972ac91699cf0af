#!/usr/bin/python3
"""Turns run.py's results.jsonl into a markdown table: one row per
scenario and mode, summed over its runs.

Usage: report.py RESULTS.jsonl"""
import json
import sys
from collections import OrderedDict


def span(values):
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return "%d" % lo if lo == hi else "%d–%d" % (lo, hi)


def main():
    rows = OrderedDict()
    with open(sys.argv[1]) as f:
        for line in f:
            r = json.loads(line)
            rows.setdefault((r["scenario"], r["mode"]), []).append(r)
    print("| scenario | mode | runs | runs with an anomaly | ops | ok / fail / info |"
          " non-linearizable runs | stale reads | values nobody wrote | set lost / unexpected | unavailable windows > 1 s (max ms) | first UNAVAILABLE ms |"
          " node gone ms | margin ms (gone − last served) | new chain's first write ms |")
    print("|" + " --- |" * 15)
    for (sc, mode), rs in rows.items():
        faults = [x for r in rs for x in r["faults"]]
        sets = [r["set"] for r in rs if r["set"]]
        wins = [w[1] for r in rs for w in r["unavailable_windows_ms"]]
        # Under async linearizability is not promised (None: not checked)
        # and a lost acknowledged write is allowed after a head failed.
        checked = [r for r in rs if r["linearizable"] is not None]
        print("| %s | %s | %d | %d | %d | %d / %d / %d | %s | %d | %d | %s | %d (%s) | %s | %s | %s | %s |" % (
            sc, mode, len(rs), sum(1 for r in rs if r["anomalies"]), sum(r["ops"] for r in rs),
            sum(r["ok"] for r in rs), sum(r["fail"] for r in rs), sum(r["info"] for r in rs),
            sum(1 for r in checked if not r["linearizable"]) if checked else "not checked",
            sum(r["stale_reads"] for r in rs), sum(r.get("phantom_reads", 0) for r in rs),
            ("%d / %d" % (sum(s["lost"] for s in sets), sum(s["unexpected"] for s in sets))
             if len(sets) == len(rs) else "final read failed"),
            len(wins), max(wins, default=0),
            span(x.get("first_unavailable_ms") for x in faults),
            span(x.get("node_gone_ms") for x in faults),
            span(x.get("margin_ms") for x in faults),
            span(x.get("new_chain_write_ms") for x in faults)))


if __name__ == "__main__":
    main()
