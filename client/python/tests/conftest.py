"""What the tests of the flatkv package share: the real flatkv-server
($FLATKV_SERVER, set by ctest) started through tests/integration/harness.py,
which also brings ZooKeeper for ring tests and kills every process it
started when the test process ends.

They test the installed package (ctest's python_client_install puts it in a
venv and runs pytest from there), never the source tree, which lacks the
generated Thrift modules."""
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(REPO, "tests", "integration"))

import harness  # noqa: E402


@pytest.fixture(scope="session")
def server_bin():
    path = os.environ.get("FLATKV_SERVER")
    if not path or not os.access(path, os.X_OK):
        pytest.fail("set FLATKV_SERVER to a built flatkv-server (ctest does)")
    return path


@pytest.fixture
def work(tmp_path):
    return str(tmp_path)


class Standalone:
    """A standalone flatkv-server on a free loopback port."""

    def __init__(self, server_bin, data, *extra):
        self.server_bin = server_bin
        self.data = data
        self.extra = extra
        self.port = harness.free_port()
        self.address = "127.0.0.1:%d" % self.port
        self.proc = harness.start(server_bin, self.port, data, *extra)

    def restart(self):
        harness.stop(self.proc)
        self.proc = harness.start(self.server_bin, self.port, self.data, *self.extra)

    def stats(self):
        return harness.call(self.port, lambda c: c.stats())


@pytest.fixture
def standalone(server_bin, work):
    """A fresh standalone server for one test (factory: extra --set args)."""
    made = []

    def make(*extra):
        s = Standalone(server_bin, os.path.join(work, "data%d" % len(made)), *extra)
        made.append(s)
        return s
    yield make
    for s in made:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()
