#!/usr/bin/python3
"""Summarizes flatkv-bench output, and charts growth runs.

  bench_report.py FILE...                  tables on stdout
  bench_report.py --plot OUT.png [--title T] FILE...
                                           also draw the growth runs in OUT.png

FILEs hold `flatkv-bench engine|growth --json` lines, or `flatkv-bench growth
--csv` output (a header line starting "engine,"); other lines are ignored.

Engine-mode lines give the matrix table: ops/s per engine and flat's ratio to
each peer, per (threads, value size, workload). Growth lines ("mode":
"growth") give one table row per run and, with --plot, one chart per (mix,
value size, key kind, threads) in a grid of mixes (rows) by value sizes
(columns; a single row of mixes when there is one value size), like the ZDB paper's Figures 5-10: records stored on the x axis,
ops/s of each step on the y axis, one line per engine. The PNG carries a
text chunk "flatkv:charts" (JSON: each chart's title and its series with
their point counts), which tests read back.

--plot needs matplotlib (Debian: python3-matplotlib); the tables do not."""
import argparse
import csv
import json
import sys
from collections import defaultdict

PEERS = ["rocksdb", "leveldb", "kyotocabinet"]
ORDER = ["fillseq", "fillrandom", "overwrite", "readrandom", "readmissing", "deleterandom"]
# Growth mixes in the paper's figure order, with their titles.
MIXES = {"writeonly": "write-only", "readheavy": "read-heavy (90% reads)",
         "writeheavy": "write-heavy (10% reads)"}
ENGINE_LABELS = {"flat": "FlatKV", "rocksdb": "RocksDB", "leveldb": "LevelDB",
                 "kyotocabinet": "Kyoto Cabinet"}
ENGINE_ORDER = ["flat"] + PEERS
# Fields of a growth --csv row that are numbers (everything else is text).
TEXT_FIELDS = {"engine", "mode", "mix", "keys", "key_dist", "sync"}


def human(x):
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e3:
        return f"{x / 1e3:.1f}k"
    return f"{x:.0f}"


def short(x):
    """Axis labels: 3 significant digits, k/M suffixes (1250 -> 1.25k)."""
    if abs(x) >= 1e6:
        return f"{x / 1e6:.3g}M"
    if abs(x) >= 1e3:
        return f"{x / 1e3:.3g}k"
    return f"{x:.3g}"


def size_name(b):
    if b >= 1024 and b % 1024 == 0:
        return f"{b // 1024} KiB"
    return f"{b} B"


def read_records(paths):
    """Every object in the files: JSON lines, or rows of a growth --csv file."""
    out = []
    for path in paths:
        with open(path) as f:
            lines = f.read().splitlines()
        i = 0
        while i < len(lines):
            line = lines[i].strip()
            if line.startswith("{"):
                out.append(json.loads(line))
            elif line.startswith("engine,"):
                # A CSV header: the rows under it, up to a line that is not one.
                header = line.split(",")
                i += 1
                while i < len(lines) and lines[i].count(",") == len(header) - 1 \
                        and not lines[i].startswith(("{", "engine,")):
                    row = dict(zip(header, next(csv.reader([lines[i]]))))
                    out.append({k: v if k in TEXT_FIELDS else float(v) if "." in v else int(v)
                                for k, v in row.items()})
                    i += 1
                continue
            i += 1
    return out


def matrix_table(records):
    ops = defaultdict(dict)  # (keys, threads, size, workload) -> engine -> ops/s
    wamp = {}
    disk = defaultdict(dict)  # (keys, threads, size) -> engine -> disk bytes after the fill
    for d in records:
        if d.get("mode") == "growth" or "workload" not in d:
            continue
        dist = d.get("key_dist", "dense")
        key = (dist, d["threads"], d["value_size"], d["workload"])
        ops[key][d["engine"]] = d["ops_per_sec"]
        if d["workload"] in ("fillseq", "fillrandom") and d.get("write_amp"):
            wamp[(d["engine"], dist, d["threads"], d["value_size"], d["workload"])] = d["write_amp"]
        if d["workload"] == "fillrandom" and d.get("disk_bytes") and d.get("num"):
            disk[(dist, d["threads"], d["value_size"])][d["engine"]] = d["disk_bytes"] / d["num"]
    if not ops:
        return
    print("| keys | threads | value | workload | flat | " + " | ".join(PEERS) +
          " | flat/" + " | flat/".join(PEERS) + " |")
    print("|" + " --- |" * (5 + 2 * len(PEERS)))
    worst = None
    dists = ["dense", "random", "snowflake"]
    for key in sorted(ops, key=lambda k: (dists.index(k[0]) if k[0] in dists else 9, k[1], k[2],
                                          ORDER.index(k[3]) if k[3] in ORDER else 99)):
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
        print(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {human(row['flat'])} | " +
              " | ".join(human(row[p]) if p in row else "-" for p in PEERS) + " | " +
              " | ".join(ratios) + " |")
    if worst:
        print(f"\nlowest flat/peer ratio: {worst[0]:.2f} vs {worst[1]} at {worst[2]}")
    if disk:
        print("\ndisk bytes per key after fillrandom:")
        for (dist, t, vs), row in sorted(disk.items()):
            print(f"  {dist} {vs} B, {t} thr: " +
                  ", ".join(f"{e} {row[e]:.0f}" for e in ENGINE_ORDER if e in row))
    if wamp:
        print("\nwrite bytes per user byte during fill (flat):")
        for (e, dist, t, vs, w), v in sorted(wamp.items()):
            if e == "flat":
                print(f"  {dist} {w} {vs} B, {t} thr: {v:.3f}")


def growth_runs(records):
    """(mix, value_size, keys, threads) -> engine -> points sorted by records."""
    charts = defaultdict(lambda: defaultdict(list))
    for d in records:
        if d.get("mode") != "growth":
            continue
        key = (d["mix"], d["value_size"], d["keys"], d["threads"])
        charts[key][d["engine"]].append(d)
    for series in charts.values():
        for points in series.values():
            points.sort(key=lambda d: d["records"])
    return charts


def chart_order(key):
    mix, size, keys, threads = key
    return (list(MIXES).index(mix) if mix in MIXES else 99, size, keys, threads)


def engine_order(name):
    return ENGINE_ORDER.index(name) if name in ENGINE_ORDER else 99


def chart_title(key):
    mix, size, keys, threads = key
    title = f"{MIXES.get(mix, mix)}, {size_name(size)} values"
    if keys != "int":
        title += f", {keys} keys"
    return title + f", {threads} thr"


def growth_table(charts):
    if not charts:
        return
    print("| mix | value | engine | records | ops/s first | ops/s last | ops/s min | ops/s mean |")
    print("|" + " --- |" * 8)
    for key in sorted(charts, key=chart_order):
        for engine in sorted(charts[key], key=engine_order):
            pts = charts[key][engine]
            rates = [p["ops_per_sec"] for p in pts]
            print(f"| {key[0]} | {size_name(key[1])} | {engine} | {pts[-1]['records']} | "
                  f"{human(rates[0])} | {human(rates[-1])} | {human(min(rates))} | "
                  f"{human(sum(rates) / len(rates))} |")


def plot(charts, out, title=None):
    try:
        import matplotlib
    except ImportError:
        sys.exit("bench_report: --plot needs matplotlib (Debian: apt-get install "
                 "python3-matplotlib, then run with /usr/bin/python3)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    keys = sorted(charts, key=chart_order)
    rows = sorted({k[0] for k in keys}, key=lambda m: list(MIXES).index(m) if m in MIXES else 99)
    cols = sorted({k[1:] for k in keys})
    # Mixes down, value sizes across; with one value size, the mixes across.
    across = len(cols) == 1
    nrows, ncols = (1, len(rows)) if across else (len(rows), len(cols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 3.4 * nrows), squeeze=False)
    manifest = []
    colors = {"flat": "#d62728", "rocksdb": "#1f77b4", "leveldb": "#2ca02c",
              "kyotocabinet": "#9467bd"}
    for r, mix in enumerate(rows):
        for c, rest in enumerate(cols):
            ax = axes[0][r] if across else axes[r][c]
            key = (mix,) + rest
            if key not in charts:
                ax.set_visible(False)
                continue
            entry = {"title": chart_title(key), "mix": mix, "value_size": rest[0],
                     "keys": rest[1], "threads": rest[2], "series": []}
            for engine in sorted(charts[key], key=engine_order):
                pts = charts[key][engine]
                ax.plot([p["records"] for p in pts], [p["ops_per_sec"] for p in pts],
                        marker="o", markersize=3, linewidth=1.5, color=colors.get(engine),
                        label=ENGINE_LABELS.get(engine, engine))
                entry["series"].append({"engine": engine, "points": len(pts)})
            ax.set_title(entry["title"], fontsize=10)
            ax.set_xlabel("records stored")
            ax.set_ylabel("ops/s")
            ax.set_ylim(bottom=0)
            ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: short(x)))
            ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: short(y)))
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
            manifest.append(entry)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=80, metadata={"flatkv:charts": json.dumps(manifest)})
    plt.close(fig)
    return manifest


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--plot", metavar="OUT.png",
                    help="draw the growth runs, one chart per (mix, value size), into OUT.png")
    ap.add_argument("--title", help="a line above the charts (say what run made them)")
    ap.add_argument("files", nargs="+", metavar="FILE")
    a = ap.parse_args(argv)
    records = read_records(a.files)
    matrix_table(records)
    charts = growth_runs(records)
    growth_table(charts)
    if a.plot:
        if not charts:
            print("bench_report: --plot: no growth lines in the input", file=sys.stderr)
            return 1
        manifest = plot(charts, a.plot, a.title)
        print(f"\nwrote {a.plot}: {len(manifest)} charts, " +
              "; ".join(f"{m['title']}: {len(m['series'])} series" for m in manifest))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
