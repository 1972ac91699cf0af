"""A client example (client/examples/<lang>) against a real flatkv-server:
it prints exactly what docs/application.md shows, its writes are on the server
(read back through another client), its KvError is typed, and it used one
connection for all its calls. Then the same against one member of a real
ring of two marks (ZooKeeper, forwarding): the example needs one address.

Usage: examples_test.py FLATKV_SERVER THRIFT_COMPILER FLATKV_THRIFT -- CMD...
(CMD is run with HOST PORT appended; for Python's example the generated
code's directory is put on PYTHONPATH)."""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import check  # noqa: E402

server_bin, thrift_bin, idl = sys.argv[1:4]
assert sys.argv[4] == "--", "usage: examples_test.py SERVER THRIFT IDL -- CMD..."
cmd = sys.argv[5:]
work = harness.workdir("flatkv-example-", thrift_bin, idl)

EXPECTED = harness.EXAMPLE_OUTPUT

port = harness.free_port()
server = harness.start(server_bin, port, os.path.join(work, "data"))
kv, t = harness.client(port)
accepted_before = kv.stats()["server.connections_accepted"]

env = dict(os.environ, PYTHONPATH=work)
run = subprocess.run(cmd + ["127.0.0.1", str(port)], capture_output=True, text=True,
                     env=env, timeout=120)
print("example stdout:\n" + run.stdout + "example stderr:\n" + run.stderr)
check(run.returncode == 0, "the example exits 0 (got %d)" % run.returncode)
harness.check_example_output(run.stdout)
check(run.stderr.strip() == "", "nothing on stderr")

# What it wrote is on the server, as another client sees it.
check(kv.get(1).value == b"hello", "key 1 holds hello")
check(not kv.get(2).found, "key 2 is absent")
check(kv.sget(b"user:42").value == b'{"name":"ada"}', "string key user:42 holds the JSON")
check([r.value for r in kv.multiGet([10, 11, 12])] == [b"v10", b"v11", b"v12"],
      "the batch wrote keys 10..12")
stats = kv.stats()
check(stats["server.connections_accepted"] - accepted_before == 1,
      "the example made one connection for all its calls (%d)"
      % (stats["server.connections_accepted"] - accepted_before))
check(stats["errors.put"] >= 1, "the server counted the refused put")

# No server: the example fails with a nonzero exit, not a hang.
t.close()
check(harness.stop(server) == 0, "the server stops cleanly")
run = subprocess.run(cmd + ["127.0.0.1", str(port)], capture_output=True, text=True,
                     env=env, timeout=60)
check(run.returncode != 0, "without a server the example exits nonzero (%d)" % run.returncode)

# A ring of marks 5 and 11: mark 5 owns keys 1 and 2 (and >= 11: 11, 12),
# mark 11 owns key 10. The example talks to the mark-5 member only.
zk = harness.ZooKeeper(work)
ports = [harness.free_port(), harness.free_port()]
members = [harness.start_member(server_bin, ports[i], os.path.join(work, "m%d" % i), zk, mark)
           for i, mark in enumerate([5, 11])]
ring = {5: ["127.0.0.1:%d" % ports[0]], 11: ["127.0.0.1:%d" % ports[1]]}
check(harness.wait_ring(ports, ring, timeout=30) is not None, "the ring of two marks forms")
run = subprocess.run(cmd + ["127.0.0.1", str(ports[0])], capture_output=True, text=True,
                     env=env, timeout=120)
print("example stdout (ring):\n" + run.stdout + "example stderr:\n" + run.stderr)
check(run.returncode == 0, "ring: the example exits 0")
check(run.stdout.splitlines()[:4] == EXPECTED[:4] and
      run.stdout.splitlines()[4].startswith(EXPECTED[4]),
      "ring: it prints the same through one member")
owner = harness.call(ports[1], lambda c: c.stats())
check(owner["calls.peerMultiPut"] + owner["calls.peerPut"] >= 1,
      "ring: the batch's key 10 was forwarded to mark 11's member")
check(harness.call(ports[1], lambda c: c.get(10).value) == b"v10", "ring: key 10 is on mark 11")
for p in members:
    check(harness.stop(p) == 0, "ring member stops cleanly")
harness.finish(work)
