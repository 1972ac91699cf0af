"""The YCSB binding (client/ycsb) through client/ycsb/run.sh against a real
flatkv-server: workload A with integer keys (every record loaded, every
operation OK, and an update costing exactly one get and one put as
docs/performance.md, "YCSB against Redis", says), workload E's scans, and workload A with string keys. Then a
real ring of two marks: ring-aware (flatkv.ring=true) calls go straight to
their owners, so nothing is forwarded.

Usage: ycsb_test.py FLATKV_SERVER THRIFT_COMPILER FLATKV_THRIFT RUN_SH BUILD_DIR"""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import check  # noqa: E402

server_bin, thrift_bin, idl, run_sh, build = sys.argv[1:6]
work = harness.workdir("flatkv-ycsb-", thrift_bin, idl)
port = harness.free_port()
server = harness.start(server_bin, port, os.path.join(work, "data"))
kv, t = harness.client(port)


def ycsb(workload, records, ops, threads, keys="int", to=None, opts=""):
    env = dict(os.environ, FLATKV_YCSB_BUILD=build, FLATKV_YCSB_KEYS=keys, YCSB_OPTS=opts)
    run = subprocess.run(["bash", run_sh, "127.0.0.1:%d" % (to or port), workload, str(records),
                          str(ops), str(threads)], capture_output=True, text=True, env=env,
                         timeout=300)
    print(run.stdout[-3000:] + run.stderr[-3000:])
    check(run.returncode == 0, "run.sh %s (%s keys%s) exits 0 (%d)" %
          (workload, keys, ", " + opts if opts else "", run.returncode))
    # {phase: {(SECTION, metric): value}} from lines like "[READ], Operations, 1497".
    phases, phase = {}, None
    for line in run.stdout.splitlines():
        m = re.match(r"# (load|run):", line)
        if m:
            phase = phases.setdefault(m.group(1), {})
            continue
        m = re.match(r"\[(\w+)\], ([^,]+), ([-\d.]+)$", line)
        if m and phase is not None:
            phase[(m.group(1), m.group(2))] = float(m.group(3))
    check(set(phases) == {"load", "run"}, "both phases printed a summary")
    for name, p in phases.items():
        bad = [k for k in p if k[1].startswith("Return=") and k[1] != "Return=OK"]
        check(not bad, "%s %s: every operation returned OK (%s)" % (workload, name, bad))
        check(p.get(("OVERALL", "Throughput(ops/sec)"), 0) > 0, "%s %s: a throughput" % (workload, name))
    return phases.get("load", {}), phases.get("run", {})


def ops(p, section):
    return int(p.get((section, "Return=OK"), 0))


# Workload A, integer keys: "user<N>" is key N, loaded in order.
before = kv.stats()
load, run = ycsb("workloada", 1000, 3000, 4)
check(ops(load, "INSERT") == 1000, "load inserted 1000 records (%d)" % ops(load, "INSERT"))
reads, updates = ops(run, "READ"), ops(run, "UPDATE")
check(reads + updates == 3000 and reads > 0 and updates > 0,
      "the run did 3000 reads and updates (%d + %d)" % (reads, updates))
results = kv.multiGet(list(range(1000)))
check(all(r.found for r in results), "integer keys 0..999 all hold a record")
check(not kv.get(1000).found, "and key 1000 none")
rec = results[0].value
fields, i = {}, 0
while i < len(rec):
    n = int.from_bytes(rec[i:i + 4], "big")
    name = rec[i + 4:i + 4 + n].decode()
    i += 4 + n
    n = int.from_bytes(rec[i:i + 4], "big")
    fields[name] = rec[i + 4:i + 4 + n]
    i += 4 + n
check(sorted(fields) == ["field%d" % k for k in range(10)] and
      all(len(v) == 100 for v in fields.values()),
      "a record holds YCSB's 10 fields of 100 bytes (%s)" % sorted(fields))
after = kv.stats()
gets = after["calls.get"] - before["calls.get"] - 1  # less this test's own get(1000)
puts = after["calls.put"] - before["calls.put"]
check(gets == reads + updates, "one get per read and per update (%d == %d + %d)" % (gets, reads, updates))
check(puts == 1000 + updates, "one put per insert and per update (%d == 1000 + %d)" % (puts, updates))

# Workload E: scans in key order (and inserts after the loaded keys).
load, run = ycsb("workloade", 1000, 300, 2)
check(ops(run, "SCAN") > 0, "workload E ran scans (%d)" % ops(run, "SCAN"))

# Workload A with string keys: sput / sget.
before = kv.stats()
load, run = ycsb("workloada", 300, 600, 2, keys="string")
check(ops(load, "INSERT") == 300, "string keys: 300 records loaded")
after = kv.stats()
check(after["calls.sput"] - before["calls.sput"] == 300 + ops(run, "UPDATE"),
      "string keys: one sput per insert and per update")
check(after["calls.put"] == before["calls.put"], "string keys: no integer put")

t.close()
check(harness.stop(server) == 0, "the server stops cleanly")

# A ring of two marks: mark 500 owns integer keys 0..499, the other mark
# 500..999 (and about half of the string keys' hashes). With flatkv.ring=true
# every call goes straight to its owner: no instance forwards anything.
zk = harness.ZooKeeper(work)
MARKS = [500, 4611686018427387904]
rports = [harness.free_port(), harness.free_port()]
members = [harness.start_member(server_bin, rports[i], os.path.join(work, "m%d" % i), zk, MARKS[i])
           for i in range(2)]
check(harness.wait_ring(rports, {MARKS[i]: ["127.0.0.1:%d" % rports[i]] for i in range(2)},
                        timeout=30) is not None, "the ring of two marks forms")


def ring_stats():
    return [harness.call(p, lambda c: c.stats()) for p in rports]


before = ring_stats()
ycsb("workloada", 1000, 2000, 4, to=rports[0], opts="-p flatkv.ring=true")
ycsb("workloada", 300, 600, 2, keys="string", to=rports[0], opts="-p flatkv.ring=true")
after = ring_stats()
forwarded = sum(a.get("cluster.forwarded", 0) - b.get("cluster.forwarded", 0)
                for a, b in zip(after, before))
check(forwarded == 0, "ring-aware: no call was forwarded (%d)" % forwarded)
for i in range(2):
    puts = after[i]["calls.put"] - before[i]["calls.put"]
    sputs = after[i]["calls.sput"] - before[i]["calls.sput"]
    check(puts >= 400 and sputs >= 50,
          "mark %d's member served its own integer and string keys (%d puts, %d sputs)"
          % (MARKS[i], puts, sputs))
before = ring_stats()
ycsb("workloada", 200, 200, 2, to=rports[1])  # keys 0..199: mark 500's
after = ring_stats()
check(after[1].get("cluster.forwarded", 0) - before[1].get("cluster.forwarded", 0) >= 200,
      "without flatkv.ring the entry instance forwards the other mark's keys")
for p in members:
    check(harness.stop(p) == 0, "ring member stops cleanly")
harness.finish(work)
