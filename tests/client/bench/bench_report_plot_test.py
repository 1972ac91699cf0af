#!/usr/bin/python3
"""Test of `bench_report.py --plot` (client/bench/bench_report.py).

Runs tiny `flatkv-bench growth` runs (every engine given, mixes writeonly and
readheavy, values of 100 B and 1 KiB; one run written as --csv, the rest as
--json), draws them with --plot and checks the PNG without trusting the
library that wrote it: the signature, every chunk's CRC, IHDR first and IEND
last, the IDAT stream inflating to exactly height scanlines of the declared
width, pixels that are not all one colour and include FlatKV's line colour,
and the "flatkv:charts" text chunk: 4 charts (2 mixes x 2 sizes), each with
one series per engine and one point per growth point. Also: --plot on input
without growth lines exits 1, and the plain tables still print.
matplotlib (python3-matplotlib) must be installed: without it this fails.
Usage: bench_report_plot_test.py --bench BIN --report bench_report.py
       --dir D --engines flat,rocksdb,..."""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import zlib

NUM = 2000
POINTS = 4
MIXES = ["writeonly", "readheavy"]
SIZES = [100, 1024]
FLAT_RGB = (0xd6, 0x27, 0x28)  # bench_report.py's colour for flat


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


def read_png(path):
    """Chunks of a PNG as (type, data), checking the signature and every CRC."""
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail("%s: not a PNG signature: %r" % (path, data[:8]))
    chunks, pos = [], 8
    while pos < len(data):
        if pos + 12 > len(data):
            fail("truncated chunk at byte %d" % pos)
        length, ctype = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        crc, = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        if zlib.crc32(ctype + body) & 0xffffffff != crc:
            fail("bad CRC in chunk %r" % ctype)
        chunks.append((ctype.decode("ascii"), body))
        pos += 12 + length
    if not chunks or chunks[0][0] != "IHDR" or chunks[-1][0] != "IEND":
        fail("chunk order: %s" % [c for c, _ in chunks])
    return chunks, len(data)


def unfilter(raw, width, height, bpp):
    """The pixel rows of an 8-bit PNG (filters 0-4), as bytearrays."""
    stride = width * bpp
    if len(raw) != height * (stride + 1):
        fail("IDAT inflates to %d bytes, expected %d" % (len(raw), height * (stride + 1)))
    rows, prev = [], bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        if f == 1:
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 0xff
        elif f == 2:
            for i in range(stride):
                line[i] = (line[i] + prev[i]) & 0xff
        elif f == 3:
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 0xff
        elif f == 4:
            for i in range(stride):
                a = line[i - bpp] if i >= bpp else 0
                b = prev[i]
                c = prev[i - bpp] if i >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
                line[i] = (line[i] + pred) & 0xff
        elif f != 0:
            fail("row %d: unknown filter %d" % (y, f))
        rows.append(line)
        prev = line
    return rows


def check_png(path, engines):
    chunks, size = read_png(path)
    width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    channels = {2: 3, 6: 4}.get(color)
    if depth != 8 or channels is None or interlace != 0:
        fail("IHDR: depth %d colour type %d interlace %d" % (depth, color, interlace))
    # 2 rows x 2 columns of charts, each a few hundred pixels a side.
    if not (400 <= width <= 2000 and 300 <= height <= 2000):
        fail("size %dx%d" % (width, height))
    raw = zlib.decompress(b"".join(body for t, body in chunks if t == "IDAT"))
    rows = unfilter(raw, width, height, channels)
    colours, flat_pixels = set(), 0
    for line in rows[::2]:
        for x in range(0, width * channels, channels):
            rgb = tuple(line[x:x + 3])
            colours.add(rgb)
            if sum(abs(p - q) for p, q in zip(rgb, FLAT_RGB)) <= 12:
                flat_pixels += 1
    if len(colours) < 50:
        fail("only %d colours: an empty or blank image" % len(colours))
    if flat_pixels < 20:
        fail("only %d pixels of FlatKV's line colour" % flat_pixels)
    texts = {}
    for t, body in chunks:
        if t == "tEXt":
            k, _, v = body.partition(b"\0")
            texts[k.decode("latin-1")] = v.decode("latin-1")
        elif t == "iTXt":
            k, _, rest = body.partition(b"\0")
            # compression flag, method, language\0, translated keyword\0, text
            rest = rest[2:]
            rest = rest.split(b"\0", 2)[2]
            texts[k.decode("latin-1")] = rest.decode("utf-8")
    if "flatkv:charts" not in texts:
        fail("no flatkv:charts text chunk (have %s)" % list(texts))
    charts = json.loads(texts["flatkv:charts"])
    want = [(m, s) for m in MIXES for s in SIZES]
    got = [(c["mix"], c["value_size"]) for c in charts]
    if got != want:
        fail("charts %s, expected %s" % (got, want))
    for c in charts:
        series = [(s["engine"], s["points"]) for s in c["series"]]
        if series != [(e, POINTS) for e in engines]:
            fail("%s: series %s, expected %s" % (c["title"], series,
                                                  [(e, POINTS) for e in engines]))
    print("ok: %s: %dx%d, %d bytes, %d charts of %d series, %d colours" %
          (path, width, height, size, len(charts), len(engines), len(colours)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    ap.add_argument("--report", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--engines", required=True)
    a = ap.parse_args()
    engines = a.engines.split(",")
    shutil.rmtree(a.dir, ignore_errors=True)
    os.makedirs(a.dir)
    db = os.path.join(a.dir, "db")
    inputs = []
    for engine in engines:
        for mix in MIXES:
            for vs in SIZES:
                # One run as CSV, to read both formats.
                fmt = "--csv" if (engine, mix, vs) == ("flat", "writeonly", 100) else "--json"
                out = run([a.bench, "growth", "--engine", engine, "--mix", mix,
                           "--num", str(NUM), "--points", str(POINTS), "--value-size", str(vs),
                           "--dir", db, "--fresh", fmt])
                path = os.path.join(a.dir, "%s-%s-%d.%s" % (engine, mix, vs, fmt[2:]))
                with open(path, "w") as f:
                    f.write(out)
                inputs.append(path)
    # An engine-mode line among them must be tabled, not plotted.
    engine_line = run([a.bench, "engine", "--engine", "flat", "--workload", "fillrandom",
                       "--num", "1000", "--dir", db, "--fresh", "--json"])
    with open(os.path.join(a.dir, "engine.json"), "w") as f:
        f.write(engine_line)
    inputs.append(os.path.join(a.dir, "engine.json"))

    png = os.path.join(a.dir, "growth.png")
    out = run([sys.executable, a.report, "--plot", png] + inputs)
    if "| 1 | 100 | fillrandom |" not in out:
        fail("no engine-mode table in the report:\n" + out)
    if "wrote %s: 4 charts" % png not in out:
        fail("no summary line for the plot:\n" + out)
    check_png(png, engines)

    # No growth lines: nothing to draw, exit 1, no file.
    empty = os.path.join(a.dir, "none.png")
    run([sys.executable, a.report, "--plot", empty, os.path.join(a.dir, "engine.json")],
        expect=1)
    if os.path.exists(empty):
        fail("--plot without growth lines wrote a file")


if __name__ == "__main__":
    main()
