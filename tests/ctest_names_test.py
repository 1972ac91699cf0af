#!/usr/bin/python3
"""Every ctest entry is one test case with a readable name: catch_discover_tests
joins every case of an executable into one entry (names separated by ';')
when a case name holds an unbalanced '[' (a CMake list bracket), which made
ctest print a 640-character line. Fails naming each entry that holds a ';'
or is 100 characters or longer. A Catch2 case whose name holds a ';' is
split there into an entry that matches no case and runs nothing (and
passes): every TEST_CASE name in SOURCE_DIR/tests must be free of it.
Every entry carries exactly one kind label of unit, sim, process and fuzz
(docs/testing.md, "Running one kind of test"), so `ctest -L KIND` runs one
kind: fails naming each entry with none or with two.
Usage: ctest_names_test.py CTEST BUILD_DIR SOURCE_DIR"""
import json
import os
import re
import subprocess
import sys

ctest, build, source = sys.argv[1:4]
out = subprocess.run([ctest, "--test-dir", build, "-N"], capture_output=True, text=True,
                     check=True).stdout
names = re.findall(r"^\s*Test\s+#\d+: (.*)$", out, re.M)
bad = [n for n in names if ";" in n or len(n) >= 100]
for n in bad:
    print("bad ctest name (%d chars): %s" % (len(n), n[:200]))
print("%d ctest entries, %d bad" % (len(names), len(bad)))
split = []
for root, _, files in os.walk(os.path.join(source, "tests")):
    for f in files:
        if f.endswith(".cc"):
            path = os.path.join(root, f)
            text = open(path, encoding="utf-8", errors="replace").read()
            for m in re.finditer(r'TEST_CASE\(\s*((?:"(?:[^"\\]|\\.)*"\s*)+)', text):
                name = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(1)))
                if ";" in name:
                    split.append("%s: %s" % (os.path.relpath(path, source), name))
for s in split:
    print("test case that ctest splits at ';' (it never runs): " + s)
KINDS = {"unit", "sim", "process", "fuzz"}
listing = json.loads(subprocess.run([ctest, "--test-dir", build, "--show-only=json-v1"],
                                    capture_output=True, text=True, check=True).stdout)
unkinded = []
for test in listing["tests"]:
    labels = []
    for prop in test.get("properties", []):
        if prop["name"] == "LABELS":
            labels = prop["value"]
    kinds = sorted(KINDS.intersection(labels))
    if len(kinds) != 1:
        unkinded.append("%s: %s" % (test["name"], ",".join(kinds) or "no kind label"))
for u in unkinded:
    print("ctest entry without exactly one kind label (unit, sim, process, fuzz): " + u)
print("%d ctest entries, %d without exactly one kind label" % (len(listing["tests"]),
                                                                len(unkinded)))
sys.exit(1 if bad or split or unkinded or not names else 0)
