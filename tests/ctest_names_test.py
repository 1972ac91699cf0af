#!/usr/bin/python3
"""Every ctest entry is one test case with a readable name: catch_discover_tests
joins every case of an executable into one entry (names separated by ';')
when a case name holds an unbalanced '[' (a CMake list bracket), which made
ctest print a 640-character line. Fails naming each entry that holds a ';'
or is 100 characters or longer.
Usage: ctest_names_test.py CTEST BUILD_DIR"""
import re
import subprocess
import sys

ctest, build = sys.argv[1:3]
out = subprocess.run([ctest, "--test-dir", build, "-N"], capture_output=True, text=True,
                     check=True).stdout
names = re.findall(r"^\s*Test\s+#\d+: (.*)$", out, re.M)
bad = [n for n in names if ";" in n or len(n) >= 100]
for n in bad:
    print("bad ctest name (%d chars): %s" % (len(n), n[:200]))
print("%d ctest entries, %d bad" % (len(names), len(bad)))
sys.exit(1 if bad or not names else 0)
