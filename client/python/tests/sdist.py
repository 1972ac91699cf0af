#!/usr/bin/python3
"""Makes the source archive of client/python the way a release does,
`python3 -m build --sdist` (Debian's python3-build; `setup.py sdist` where
it is missing), then installs that archive, and nothing else, with pip into
a fresh venv and imports flatkv from it. This proves the archive builds on
its own: it carries the IDL as a file (in the repository it is a link to
thrift/flatkv.thrift), setup.py and the package, and no generated code.

Both steps run offline against Debian's setuptools and wheel
(--no-isolation, --no-index --no-build-isolation), from a copy of the
directory whose IDL link points at the repository's IDL, so nothing is
written into the source tree.

Usage: sdist.py WORK_DIR THRIFT_COMPILER"""
import glob
import os
import shutil
import subprocess
import sys
import tarfile

work, compiler = sys.argv[1:3]
src = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GENERATED = ("FlatKV.py", "ttypes.py", "constants.py")
passed, failed = 0, 0


def check(cond, what):
    global passed, failed
    print(("ok   " if cond else "FAIL ") + what)
    if cond:
        passed += 1
    else:
        failed += 1


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        print("$ " + " ".join(cmd))
        print(r.stdout[-3000:] + r.stderr[-3000:])
    return r


shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
copy = os.path.join(work, "python")
shutil.copytree(src, copy, symlinks=True,
                ignore=shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__",
                                              *GENERATED))
# The link stays a link, as in a checkout, but one that resolves from here.
idl = os.path.join(copy, "flatkv.thrift")
if os.path.islink(idl):
    target = os.path.realpath(os.path.join(src, "flatkv.thrift"))
    os.unlink(idl)
    os.symlink(target, idl)
env = dict(os.environ, FLATKV_THRIFT_COMPILER=compiler, PIP_DISABLE_PIP_VERSION_CHECK="1")

dist = os.path.join(work, "dist")
if run(["/usr/bin/python3", "-m", "build", "--version"]).returncode == 0:
    how = "python3 -m build --sdist"
    r = run(["/usr/bin/python3", "-m", "build", "--sdist", "--no-isolation", "--outdir", dist,
             copy], env=env)
else:
    how = "setup.py sdist (python3 -m build is not installed: apt-get install python3-build)"
    r = run(["/usr/bin/python3", "setup.py", "sdist", "--dist-dir", dist], cwd=copy, env=env)
archives = glob.glob(os.path.join(dist, "flatkv-*.tar.gz"))
check(r.returncode == 0 and len(archives) == 1,
      "%s makes one archive: %s" % (how, [os.path.basename(a) for a in archives]))
if len(archives) != 1:
    print("%d passed, %d failed" % (passed, failed))
    sys.exit(1)
archive = archives[0]

with tarfile.open(archive) as t:
    members = {m.name.split("/", 1)[1]: m for m in t.getmembers() if "/" in m.name}
need = ("pyproject.toml", "setup.py", "README.md", "flatkv/__init__.py", "flatkv/client.py",
        "flatkv/errors.py", "flatkv/pool.py", "flatkv/ring.py")
check(all(n in members for n in need), "the archive holds the package and its build files")
check("flatkv.thrift" in members and members["flatkv.thrift"].isfile(),
      "the archive holds the IDL as a file, not a link")
check(not any(("flatkv/" + g) in members for g in GENERATED),
      "the archive holds no generated Thrift code")

venv = os.path.join(work, "venv")
run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", venv])
py = os.path.join(venv, "bin", "python")
r = run([py, "-m", "pip", "install", "--no-index", "--no-build-isolation", "--no-cache-dir",
         archive], env=env, cwd=work)
check(r.returncode == 0, "pip install of the archive into a fresh venv (exit %d)" % r.returncode)
r = run([py, "-c", "import flatkv, flatkv.FlatKV, flatkv.ttypes; print(flatkv.__file__); "
         "print(flatkv.__version__); flatkv.Client('127.0.0.1', 1, retries=0)"], cwd="/")
lines = r.stdout.split()
check(r.returncode == 0 and len(lines) == 2 and lines[0].startswith(venv + "/"),
      "import flatkv works from the venv, outside any source tree: %s" % r.stdout.strip())
version = os.path.basename(archive)[len("flatkv-"):-len(".tar.gz")]
check(len(lines) == 2 and lines[1] == version,
      "the installed version is the archive's (%s)" % version)

if not failed:
    shutil.rmtree(work, ignore_errors=True)
print("%d passed, %d failed" % (passed, failed))
sys.exit(1 if failed else 0)
