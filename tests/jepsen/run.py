#!/usr/bin/python3
"""Runs one scenario of the fault-injection suite against a real
flatkv-server build and judges it (README.md in this directory).

  run.py --scenario NAME --mode sync|async --seconds S --server BIN --out DIR

Exit status: 0 no anomaly, 1 an anomaly (non-linearizable history, a lost
or unexpected set element, a ring that did not settle), 2 the suite could
not run (missing tools, bad arguments)."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import topology  # noqa: E402

SCENARIOS = {
    "none": [],
    "zk-cut-tail": ["zk-cut-tail"],
    "zk-cut-head": ["zk-cut-head"],
    "zk-cut-any": ["zk-cut-any"],
    "peer-cut": ["peer-cut"],
    "isolate": ["isolate"],
    "asym": ["asym"],
    "loss": ["loss"],
    "pause": ["pause"],
    "kill": ["kill"],
    "zk-restart": ["zk-restart"],
    "zk-follower-cut": ["zk-follower-cut"],  # a three-server ensemble
    "clock": ["clock"],
    "ring-change": ["ring-change"],  # --marks 2 implied
    "ring-change-mix": ["ring-change-mix"],  # --marks 2 implied
}
MARK_A, MARK_B = 1_000_000_000, 2_000_000_000  # A owns [0, 1e9) and >= 2e9; B [1e9, 2e9)
WRITES = ("put", "append", "remove")


def parse():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenario", required=True, choices=sorted(SCENARIOS))
    p.add_argument("--mode", default="sync", choices=("sync", "async"))
    p.add_argument("--seconds", type=float, default=30.0, help="workload time under the nemesis")
    p.add_argument("--server", default=os.environ.get("FLATKV_SERVER", os.path.join(REPO, "build/server/flatkv-server")))
    p.add_argument("--out", required=True, help="directory for the report and, on an anomaly, the evidence")
    p.add_argument("--session-ms", type=int, default=3000)
    p.add_argument("--marks", type=int, default=1, choices=(1, 2),
                   help="a second mark of two members (ring-change: always)")
    p.add_argument("--cli", default=None, help="the flatkv CLI (default: client/flatkv beside the server's build)")
    p.add_argument("--seed", type=int, default=int(os.environ.get("FLATKV_JEPSEN_SEED", "1")))
    p.add_argument("--thrift", default=shutil.which("thrift") or "thrift")
    p.add_argument("--writes-in-doubt", action="store_true",
                   help="every error answered to a write is in doubt (default: the server's retry contract)")
    p.add_argument("--keep", action="store_true", help="keep the evidence even without an anomaly")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a setting for every member (flatkv-server --set), e.g. storage.sparse_tier=on")
    return p.parse_args()


def build_checker(dest):
    env = dict(os.environ, GOFLAGS="-mod=mod")
    r = subprocess.run(["go", "build", "-o", dest, "."], cwd=os.path.join(HERE, "checker"),
                       env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write("jepsen: cannot build the checker:\n" + r.stderr)
        sys.exit(2)


def ms(ns):
    return None if ns is None else round(ns / 1e6)


def stale_reads(ops):
    """Reads stale on their own, whatever else happened (a count for the
    report; the checker is the judge). A value read names its last writer
    ("p<proc>.<n>", or ",a<proc>.<n>" for an append): the read is stale if
    another write of the key was acknowledged after that writer returned
    and before the read began. An absent read is stale if a put or append
    was acknowledged before it began and no remove could have run between
    the two. Returns [(read, the write it missed)]."""
    writer_of = {}
    writes_by_key = {}
    removes_by_key = {}
    for r in ops:
        if r["f"] in ("put", "append") and r["type"] != "fail":
            writer_of[r["value"].lstrip(",")] = r
        if r["f"] in WRITES and r["type"] == "ok":
            writes_by_key.setdefault(r["key"], []).append(r)
        if r["f"] == "remove" and r["type"] != "fail":
            removes_by_key.setdefault(r["key"], []).append(r)
    stale = []
    for r in ops:
        if r["f"] != "get" or r["type"] != "ok":
            continue
        if not r.get("found"):
            sets = [w for w in writes_by_key.get(r["key"], [])
                    if w["f"] != "remove" and w["ret"] < r["call"]]
            if not sets:
                continue
            w = max(sets, key=lambda x: x["call"])
            if not any(x["call"] < r["ret"] and (x["type"] == "info" or x["ret"] > w["call"])
                       for x in removes_by_key.get(r["key"], [])):
                stale.append((r, w))
            continue
        w = writer_of.get(r["out"].split(",")[-1])
        if w is None or w["type"] != "ok":
            continue  # a value nobody wrote, or one in doubt: the checker judges it
        newer = [x for x in writes_by_key.get(r["key"], []) if x["call"] > w["ret"] and x["ret"] < r["call"]]
        if newer:
            stale.append((r, min(newer, key=lambda x: x["ret"])))
    return stale


def phantom_reads(ops):
    """Reads that returned a value nobody wrote: every piece of a value
    (a put's "p<proc>.<n>", then appends' ",a<proc>.<n>") must be the value
    of a write of that key that was not answered "not applied". Linear in
    the history; the verdict under async, which promises no order between
    members' reads."""
    written = {}
    for r in ops:
        if r["f"] in ("put", "append") and r["type"] != "fail":
            written.setdefault(r["key"], set()).add(r["value"].lstrip(","))
    bad = []
    for r in ops:
        if r["f"] != "get" or r["type"] != "ok" or not r.get("found"):
            continue
        pieces = r["out"].split(",")
        if pieces[0] == "":
            pieces = pieces[1:]  # an append created the key
        known = written.get(r["key"], set())
        if not pieces or any(p not in known for p in pieces):
            bad.append(r)
    return bad


def head_failed(events):
    """Whether a fault hit the member that was a head then: under async the
    only case in which acknowledged writes may be lost (those it had not
    passed down)."""
    return any(ev["what"] == "fault" and ev.get("role") == "head" for ev in events)


def unavailable_windows(ops, t_start, t_end, gap_ms=1000):
    """Gaps of more than gap_ms between successive acknowledged writes."""
    times = sorted(r["ret"] for r in ops if r["f"] in WRITES and r["type"] == "ok")
    pts = [t_start] + [t for t in times if t_start <= t <= t_end] + [t_end]
    return [(a, b) for a, b in zip(pts, pts[1:]) if b - a > gap_ms * 1_000_000]


def fault_timings(events, ops, watch, members):
    """For every fault that hit a member: the time to its first UNAVAILABLE,
    to its node vanishing from ZooKeeper, and to the first write acknowledged
    by another member after that (the new chain), in ms from the fault."""
    by_name = {m.name: m for m in members}
    out = []
    for i, ev in enumerate(events):
        if ev["what"] != "fault":
            continue
        heal = next((e["t"] for e in events[i + 1:] if e["what"] == "heal"), None)
        t0 = ev["t"]
        row = {"fault": ev["fault"], "member": ev["member"], "detail": ev["detail"],
               "role": ev.get("role"), "held_ms": ms(heal - t0) if heal else None}
        m = by_name.get(ev["member"])
        if m is not None:
            unav = [r["ret"] for r in ops if r["member"] == m.address and (r.get("error") or "").startswith("UNAVAILABLE")
                    and r.get("ret", 0) >= t0 and (heal is None or r["call"] <= heal)]
            row["first_unavailable_ms"] = ms(min(unav) - t0) if unav else None
            gone = watch.first_without(m.address, t0)
            if gone is not None and heal is not None and gone > heal:
                gone = None
            row["node_gone_ms"] = ms(gone - t0) if gone is not None else None
            # The lease's margin: for a member that answers by its lease (the
            # head its writes, the tail of a chain of two or more its reads)
            # cut from ZooKeeper, the time from the last call it answered
            # itself to its node's removal. (Its other calls it forwards,
            # and the new chain answers them; a middle forwards all.)
            # With two marks a member also forwards its clients' calls for
            # the other mark's keys (and a ring change moves keys between
            # them), which the client cannot tell from its own answers: no
            # margin there.
            own = {"head": WRITES, "tail": ("get",)}.get(row["role"], ())
            one_mark = len({x.mark for x in members}) == 1
            if gone is not None and own and one_mark and "zk" in ev["detail"]:
                served_own = [r["ret"] for r in ops if r["member"] == m.address and r["type"] == "ok"
                              and r["f"] in own and t0 <= r["ret"] <= gone]
                if served_own:
                    row["last_served_ms"] = ms(max(served_own) - t0)
                    row["margin_ms"] = row["node_gone_ms"] - row["last_served_ms"]
            since = gone if gone is not None else t0
            acks = [r["ret"] for r in ops if r["f"] in WRITES and r["type"] == "ok"
                    and r["member"] != m.address and r["call"] >= since]
            row["new_chain_write_ms"] = ms(min(acks) - t0) if acks else None
            served = [r for r in ops if r["member"] == m.address and r["type"] == "ok"
                      and gone is not None and r["call"] > gone and (heal is None or r["ret"] <= heal)]
            row["served_after_node_gone"] = len(served)
        else:
            acks = [r["ret"] for r in ops if r["f"] in WRITES and r["type"] == "ok" and r["call"] >= t0]
            row["first_write_after_ms"] = ms(min(acks) - t0) if acks else None
        out.append(row)
    return out


def wait_settled(members, watch, marks, timeout=60.0):
    """Every member running, registered, and seeing the full chain of its
    mark; then a get through each member answers. Seconds it took, or None."""
    import cluster
    t0 = time.monotonic()
    want = {mark: sorted(m.address for m in members if m.mark == mark) for mark in marks}
    while time.monotonic() - t0 < timeout:
        ok = all(m.running() for m in members) and \
            set(watch.members()) == {m.address for m in members}
        if ok:
            for m in members:
                ring = cluster.ring_of(m.address)
                if ring is None or {k: sorted(v) for k, v in ring.items()} != want:
                    ok = False
                    break
        if ok:
            try:
                for m in members:
                    cluster.call(m.address, lambda c: c.get(1), 2000)
                return time.monotonic() - t0
            except Exception:
                pass
        time.sleep(0.2)
    return None


def main():
    args = parse()
    topology.require_tools()
    if not os.access(args.server, os.X_OK):
        sys.stderr.write("jepsen: no server binary at %s (--server or FLATKV_SERVER)\n" % args.server)
        sys.exit(2)
    if args.scenario == "clock" and "libjemalloc" in subprocess.run(
            ["ldd", args.server], capture_output=True, text=True).stdout:
        # libfaketime's clock_gettime and jemalloc's start-up call each other:
        # the server hangs before it listens.
        sys.stderr.write("jepsen: the clock scenario needs a server built with -DFLATKV_JEMALLOC=OFF "
                         "(libfaketime deadlocks jemalloc at start-up); %s links jemalloc\n" % args.server)
        sys.exit(2)
    cli = args.cli or os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(args.server))),
                                   "client", "flatkv")
    ring_change = any(f.startswith("ring-change") for f in SCENARIOS[args.scenario])
    if ring_change and not os.access(cli, os.X_OK):
        sys.stderr.write("jepsen: the %s scenario needs the flatkv CLI; none at %s (--cli)\n"
                         % (args.scenario, cli))
        sys.exit(2)
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    tag = "%s-%s" % (args.scenario, args.mode)
    work = tempfile.mkdtemp(prefix="fkj-%s-" % tag)
    subprocess.run([args.thrift, "--gen", "py", "-out", work, os.path.join(REPO, "thrift/flatkv.thrift")],
                   check=True)
    sys.path.insert(0, work)
    checker_bin = os.path.join(work, "checker")
    build_checker(checker_bin)

    import cluster
    import nemesis
    import workload
    if args.writes_in_doubt:
        workload.WRITES_IN_DOUBT = True

    print("== %s (%s, %.0f s, session %d ms, seed %d)" % (tag, args.server, args.seconds,
                                                         args.session_ms, args.seed), flush=True)
    net = topology.Net()
    ensemble = args.scenario == "zk-follower-cut"
    zk = cluster.ZooKeeperEnsemble(work, net) if ensemble else cluster.ZooKeeper(work, net)
    if ring_change:
        args.marks = 2
    marks = [MARK_A] + ([MARK_B] if args.marks == 2 else [])
    # In an ensemble the tail (n3, started last) talks to one follower
    # only, the others to the leader and the other follower.
    zk_of = {}
    if ensemble:
        lead = zk.leader()
        zk.tail_follower, other = [i for i in range(len(zk.servers)) if i != lead]
        zk_of = {3: cluster.Hosts(zk.servers[zk.tail_follower].hosts)}
        both = cluster.Hosts(",".join(zk.servers[i].hosts for i in (lead, other)))
        zk_of.update({1: both, 2: both})
    members = []
    for mi, mark in enumerate(marks):
        for i in range(3 if mi == 0 else 2):
            n = mi * 10 + i + 1
            members.append(cluster.Member(
                work, net, args.server, zk_of.get(n, zk), "n%d" % n,
                "%s.%d" % (topology.SUBNET, 10 + n), mark,
                args.mode, args.session_ms, faketime=(args.scenario == "clock" and n == 3),
                settings=args.set))
    # Registration order makes the chain: start one at a time.
    # Not through the follower the nemesis cuts: it would see the tail's
    # node go only once that follower gave up.
    watch = cluster.ZkWatch(zk_of[1] if ensemble else zk)
    for m in members:
        m.start()
        t = time.monotonic()
        while m.address not in watch.members() and time.monotonic() - t < 30:
            time.sleep(0.05)
    settle0 = wait_settled(members, watch, marks)
    if settle0 is None:
        sys.stderr.write("jepsen: the ring did not form; logs in %s\n" % work)
        sys.exit(2)

    nem = nemesis.Nemesis(net, zk, members, args.session_ms, args.seed, cli=cli)
    offsets = [0] + ([MARK_A + 500_000_000 - workload.REG_BASE] if args.marks == 2 else [])
    wl = workload.Workload(members, seed=args.seed, key_offsets=offsets)
    t_start = time.monotonic_ns()
    anomalies = []
    try:
        nemesis.schedule(nem, SCENARIOS[args.scenario], args.seconds)
    finally:
        nem.heal_all()
        for m in members:
            if m.stopped:
                m.resume()
    t_faults_end = time.monotonic_ns()
    anomalies.extend(nem.errors)
    settle = wait_settled(members, watch, marks)
    if settle is None:
        anomalies.append("ring did not settle within 60 s after healing")
    wl.stop()
    t_end = time.monotonic_ns()
    set_res = None
    if settle is not None:
        wl.final_register_reads(members)
        # Writes in flight when the workload stopped may still be on their
        # way down a chain: the members must agree within seconds
        # (convergence), not at the first look.
        for _ in range(10):
            reads = {}
            for m in members:
                try:
                    reads[m.name] = wl.final_set_read(m)
                except Exception as e:
                    reads[m.name] = e
            sets = [v for v in reads.values() if not isinstance(v, Exception)]
            if len(sets) == len(members) and all(x == sets[0] for x in sets):
                break
            time.sleep(1.0)
        for name, got in reads.items():
            if isinstance(got, Exception):
                anomalies.append("final set read through %s failed: %s" % (name, got))
        if any(x != sets[0] for x in sets):
            anomalies.append("final set reads still differ between members after 10 s")
        present = sets[0] if sets else None
        if present is not None:
            set_res = wl.set_result(present)
            # Under async a failed head loses what it acknowledged and had
            # not passed down: counted, not an anomaly. Nothing else may go.
            lost_allowed = args.mode == "async" and head_failed(nem.events)
            set_res["lost_allowed"] = lost_allowed
            if ((set_res["lost"] and not lost_allowed) or set_res["unexpected"]
                    or set_res["failed_but_present"]):
                anomalies.append("set: %d lost, %d unexpected, %d failed-but-present" % (
                    set_res["lost"], set_res["unexpected"], set_res["failed_but_present"]))

    ops = list(wl.history.ops)
    hist = os.path.join(work, "history.jsonl")
    wl.history.write(hist)
    html = os.path.join(work, "violation.html")
    phantoms = phantom_reads(ops)
    if phantoms:
        anomalies.append("%d reads returned a value nobody wrote" % len(phantoms))
    if args.mode == "sync":
        chk = subprocess.run([checker_bin, "-timeout", "120", "-html", html, hist],
                             capture_output=True, text=True)
        if chk.returncode == 2:
            sys.stderr.write("jepsen: the checker refused the history:\n" + chk.stdout + chk.stderr)
            sys.exit(2)
        linearizable = chk.returncode == 0
        verdict = "ok" if linearizable else "violation" if "NOT linearizable" in chk.stdout else "unknown"
    else:
        # Under async any member serves reads, which may lag the head: not
        # linearizable by design (shared/DESIGN.md), so the register
        # checker has nothing to judge. The verdict is the phantom reads,
        # the set and the replicas' agreement after healing.
        chk = subprocess.CompletedProcess([], 0, stdout="async: linearizability is not promised; not checked\n")
        linearizable = None
        verdict = "n/a"
    if verdict == "violation":
        anomalies.append("not linearizable")
    elif verdict == "unknown":
        anomalies.append("linearizability not decided in time (%s)" % (chk.stdout.strip().splitlines() or ["?"])[-1])
    stale = stale_reads(ops)
    counts = {t: sum(1 for r in ops if r["type"] == t) for t in ("ok", "fail", "info")}
    windows = unavailable_windows(ops, t_start, t_faults_end)
    timings = fault_timings(nem.events, ops, watch, members)
    result = {
        "scenario": args.scenario, "mode": args.mode, "seconds": args.seconds, "seed": args.seed,
        "session_ms": args.session_ms, "server": args.server, "settings": args.set,
        "ops": len(ops), **counts,
        "linearizable": linearizable, "check": verdict, "stale_reads": len(stale),
        "phantom_reads": len(phantoms),
        "stale_by_member": {a: sum(1 for s in stale if s[0]["member"] == a) for a in {s[0]["member"] for s in stale}},
        "set": set_res, "anomalies": anomalies,
        "unavailable_windows_ms": [(ms(a - t_start), ms(b - a)) for a, b in windows],
        "settle_s": None if settle is None else round(settle, 2),
        "faults": timings,
    }
    watch.close()
    for m in members:
        m.terminate()

    print(chk.stdout.rstrip())
    for s, newer in stale[:5]:
        print("  stale: get(%d) via %s at +%d ms -> %r, but %s(%r) acknowledged at +%d ms" % (
            s["key"], s["member"], ms(s["call"] - t_start), s.get("out", "absent")[-24:], newer["f"],
            newer.get("value", ""), ms(newer["ret"] - t_start)))
    for row in timings:
        print("  " + json.dumps(row))
    line = ("%-12s %-5s ops %6d ok %6d fail %5d info %5d | linearizable %-3s stale %4d | set lost %s unexpected %s"
            " | unavail windows %d (max %s ms)" % (
                args.scenario, args.mode, len(ops), counts["ok"], counts["fail"], counts["info"],
                {"ok": "yes", "violation": "NO", "unknown": "?", "n/a": "n/a"}[verdict], len(stale),
                set_res["lost"] if set_res else "?", set_res["unexpected"] if set_res else "?",
                len(windows), max((ms(b - a) for a, b in windows), default=0)))
    print(line)
    with open(os.path.join(out, "results.jsonl"), "a") as f:
        f.write(json.dumps(result) + "\n")

    if anomalies or args.keep:
        dest = os.path.join(out, "%s-%d" % (tag, int(time.time())))
        os.makedirs(dest, exist_ok=True)
        for name in os.listdir(work):
            p = os.path.join(work, name)
            if name.endswith((".log", ".jsonl", ".html")) or name.startswith("zk"):
                if os.path.isdir(p):
                    shutil.copy(os.path.join(p, "zookeeper.log"),
                                os.path.join(dest, name + ".zookeeper.log"))
                else:
                    shutil.copy(p, dest)
        with open(os.path.join(dest, "result.json"), "w") as f:
            json.dump(result, f, indent=1)
        with open(os.path.join(dest, "events.json"), "w") as f:
            json.dump({"nemesis": nem.events, "zk_members": [(t, sorted(m)) for t, m in watch.events],
                       "t_start": t_start, "t_end": t_end}, f, indent=1)
        with open(os.path.join(dest, "checker.txt"), "w") as f:
            f.write(chk.stdout)
        print("ANOMALY: %s\n  evidence (history, visualization, server logs): %s" % ("; ".join(anomalies), dest)
              if anomalies else "kept: " + dest)
    shutil.rmtree(work, ignore_errors=True)
    sys.exit(1 if anomalies else 0)


if __name__ == "__main__":
    try:
        main()
    except RuntimeError as e:  # a member or ZooKeeper that would not start: not a verdict
        sys.stderr.write("jepsen: cannot run: %s\n" % e)
        sys.exit(2)
