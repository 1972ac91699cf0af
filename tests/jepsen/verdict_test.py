#!/usr/bin/python3
"""The suite's own verdicts on hand-made histories (run.py): a value
nobody wrote is caught, appends and puts are traced to their writers, a
write answered "not applied" does not count as written, a stale read is
counted, and lost writes are excused only after a head failed."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # noqa: E402

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def op(f, key, call, ret, typ="ok", value=None, found=None, out=None, member="m1"):
    r = {"f": f, "key": key, "call": call, "ret": ret, "type": typ, "member": member}
    if value is not None:
        r["value"] = value
    if found is not None:
        r["found"] = found
    if out is not None:
        r["out"] = out
    return r


base = [
    op("put", 1, 0, 10, value="p1.1"),
    op("append", 1, 20, 30, value=",a2.1"),
    op("append", 1, 40, 50, "info", value=",a2.2"),   # in doubt: may be read
    op("put", 1, 60, 70, "fail", value="p1.2"),        # answered "not applied"
    op("append", 2, 0, 10, value=",a3.1"),              # creates key 2
]
check(run.phantom_reads(base + [op("get", 1, 80, 90, found=True, out="p1.1,a2.1,a2.2"),
                                op("get", 2, 80, 90, found=True, out=",a3.1"),
                                op("get", 1, 80, 90, found=False)]) == [],
      "values made of puts and appends that happened (or may have) are not phantoms")
bad = run.phantom_reads(base + [op("get", 1, 80, 90, found=True, out="p1.2")])
check(len(bad) == 1, "a write answered 'not applied' that is read is a value nobody wrote")
bad = run.phantom_reads(base + [op("get", 2, 80, 90, found=True, out="p1.1")])
check(len(bad) == 1, "another key's value is a value nobody wrote to this key")
bad = run.phantom_reads(base + [op("get", 1, 80, 90, found=True, out="garbage")])
check(len(bad) == 1, "garbage is a value nobody wrote")

stale = run.stale_reads([op("put", 1, 0, 10, value="p1.1"), op("put", 1, 20, 30, value="p1.2"),
                         op("get", 1, 40, 50, found=True, out="p1.1")])
check(len(stale) == 1, "a read of a value overwritten before it began is stale")
stale = run.stale_reads([op("put", 1, 0, 10, value="p1.1"), op("put", 1, 20, 45, value="p1.2"),
                         op("get", 1, 40, 50, found=True, out="p1.1")])
check(stale == [], "a read concurrent with the overwrite is not stale")

events = [{"what": "fault", "role": "tail"}, {"what": "heal"}]
check(not run.head_failed(events), "faults that hit no head excuse no lost write")
check(run.head_failed(events + [{"what": "fault", "role": "head"}]),
      "a fault that hit the head then excuses async losses")

sys.exit(1 if failures else 0)
