"""Builds the flatkv package. The Thrift code (FlatKV.py, ttypes.py,
constants.py) is generated from the IDL by `thrift --gen py` as the
package is built, as the C++, Java and Go code is: the project commits no
generated code. It needs the Thrift compiler (Debian's thrift-compiler,
0.17): $FLATKV_THRIFT_COMPILER, else `thrift` on PATH. The IDL is
flatkv.thrift beside this file (a link to thrift/flatkv.thrift), or
$FLATKV_THRIFT."""
import os
import shutil
import subprocess
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = os.path.dirname(os.path.abspath(__file__))
GENERATED = ("FlatKV.py", "ttypes.py", "constants.py")


def generate(out_dir):
    """Writes the generated modules into out_dir (the package's directory)."""
    idl = os.environ.get("FLATKV_THRIFT") or os.path.join(HERE, "flatkv.thrift")
    compiler = os.environ.get("FLATKV_THRIFT_COMPILER") or shutil.which("thrift")
    if not compiler:
        raise SystemExit("flatkv: the Thrift compiler is needed to build this package "
                         "(apt-get install thrift-compiler, or set FLATKV_THRIFT_COMPILER)")
    if not os.path.exists(idl):
        raise SystemExit("flatkv: no IDL at %s (set FLATKV_THRIFT)" % idl)
    tmp = tempfile.mkdtemp(prefix="flatkv-gen-")
    try:
        subprocess.run([compiler, "--gen", "py", "-out", tmp, idl], check=True)
        os.makedirs(out_dir, exist_ok=True)
        for name in GENERATED:
            shutil.copyfile(os.path.join(tmp, "flatkv", name), os.path.join(out_dir, name))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class BuildPy(build_py):
    def run(self):
        super().run()
        # In place (an editable install) the modules go into the source tree
        # (.gitignore'd); else into the build directory the wheel is made from.
        target = os.path.join(HERE, "flatkv") if getattr(self, "editable_mode", False) \
            else os.path.join(self.build_lib, "flatkv")
        generate(target)


class Sdist(sdist):
    # The IDL travels inside the source archive as a file (not a link), so
    # that the archive builds on its own.
    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        dst = os.path.join(base_dir, "flatkv.thrift")
        if os.path.islink(dst) or not os.path.exists(dst):
            if os.path.lexists(dst):
                os.unlink(dst)
            shutil.copyfile(os.path.realpath(os.path.join(HERE, "flatkv.thrift")), dst)


setup(packages=["flatkv"], cmdclass={"build_py": BuildPy, "sdist": Sdist})
