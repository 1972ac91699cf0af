#!/usr/bin/python3
"""Installs client/python the way a user does, `pip install ./client/python`,
into a fresh venv that sees Debian's packages (python3-thrift, python3-xxhash,
python3-pytest, setuptools and wheel to build with: offline, --no-index
--no-build-isolation), from a copy of the directory with its IDL link made a
file (so nothing is written into the source tree and the package builds
without the rest of the repository). Then imports it from outside the source
tree and checks the generated Thrift modules are there. ctest's
python_client_* tests run pytest with this venv's python.

Usage: install.py VENV_DIR THRIFT_COMPILER"""
import os
import shutil
import subprocess
import sys
import tempfile

venv, compiler = sys.argv[1:3]
src = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
passed, failed = 0, 0


def check(cond, what):
    global passed, failed
    print(("ok   " if cond else "FAIL ") + what)
    if cond:
        passed += 1
    else:
        failed += 1


tmp = tempfile.mkdtemp(prefix="flatkv-python-")
try:
    copy = os.path.join(tmp, "python")
    shutil.copytree(src, copy, symlinks=False,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__",
                                                  "FlatKV.py", "ttypes.py", "constants.py"))
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", venv], check=True)
    py = os.path.join(venv, "bin", "python")
    env = dict(os.environ, FLATKV_THRIFT_COMPILER=compiler, PIP_DISABLE_PIP_VERSION_CHECK="1")
    r = subprocess.run([py, "-m", "pip", "install", "--no-index", "--no-build-isolation",
                        "--no-cache-dir", copy], env=env, capture_output=True, text=True)
    print(r.stdout[-2000:] + r.stderr[-2000:])
    check(r.returncode == 0, "pip install ./client/python succeeds (exit %d)" % r.returncode)
    r = subprocess.run([py, "-c", "import flatkv, flatkv.ttypes, flatkv.FlatKV; "
                        "print(flatkv.__file__); print(flatkv.__version__)"],
                       cwd="/", capture_output=True, text=True)
    lines = r.stdout.split()
    check(r.returncode == 0 and len(lines) == 2 and lines[0].startswith(venv + "/"),
          "flatkv imports from the venv: %s %s" % (r.stdout.strip(), r.stderr.strip()[-500:]))
    pkg = os.path.dirname(lines[0]) if lines else ""
    check(all(os.path.exists(os.path.join(pkg, m)) for m in ("FlatKV.py", "ttypes.py",
                                                               "constants.py")),
          "the Thrift modules were generated into the installed package")
    r = subprocess.run([py, "-c", "import pytest"], capture_output=True)
    check(r.returncode == 0, "the venv sees pytest (Debian's python3-pytest)")
finally:
    shutil.rmtree(tmp, ignore_errors=True)
print("%d passed, %d failed" % (passed, failed))
sys.exit(1 if failed else 0)
