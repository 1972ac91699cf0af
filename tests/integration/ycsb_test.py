"""The YCSB binding (client/ycsb) through client/ycsb/run.sh against a real
flatkv-server: workload A with integer keys (every record loaded, every
operation OK, and an update costing exactly one get and one put as the
README says), workload E's scans, and workload A with string keys.

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


def ycsb(workload, records, ops, threads, keys="int"):
    env = dict(os.environ, FLATKV_YCSB_BUILD=build, FLATKV_YCSB_KEYS=keys)
    run = subprocess.run(["bash", run_sh, "127.0.0.1:%d" % port, workload, str(records),
                          str(ops), str(threads)], capture_output=True, text=True, env=env,
                         timeout=300)
    print(run.stdout[-3000:] + run.stderr[-3000:])
    check(run.returncode == 0, "run.sh %s (%s keys) exits 0 (%d)" % (workload, keys, run.returncode))
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
harness.finish(work)
