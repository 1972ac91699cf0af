"""Faults, each with its heal. A scenario is a schedule: warm up, then
(fault, hold, heal, recover) repeated until the time is up. Every fault
and heal is recorded as an event with its CLOCK_MONOTONIC time and the
member it hit, for the report's timings.

Roles (head, middle, tail) are read from the ring as a member reports it
when the fault starts, so "zk-cut-tail" cuts whoever is the tail then."""
import random
import subprocess
import time

import cluster

FAULTS = {}


def fault(name):
    def register(fn):
        FAULTS[name] = fn
        return fn
    return register


class Nemesis:
    def __init__(self, net, zk, members, session_ms, seed, cli=None):
        self.net, self.zk, self.members = net, zk, members
        self.session_s = session_ms / 1000.0
        self.seed = seed
        self.rng = random.Random(seed)
        self.cli = cli          # the flatkv CLI, for ring changes
        self.errors = []        # a fault that could not be carried out: an anomaly
        self.events = []  # {"t": ns, "what": "fault"|"heal", "fault": name, "member": name|None}
        self.heals = []   # callables undoing the faults in force
        self.round = 0

    def log(self, what, fault_name, member=None, detail=""):
        ev = {"t": time.monotonic_ns(), "what": what, "fault": fault_name,
              "member": member.name if member else None, "detail": detail}
        if what == "fault" and member is not None:
            ev["role"] = self.role_of(member)
        self.events.append(ev)
        print("  %s %-10s %s %s" % (what, fault_name, member.name if member else "-", detail), flush=True)

    def chain(self, mark=None):
        """The members of the first mark's chain, head first, as a running
        member sees it; falls back to start order."""
        mark = mark if mark is not None else self.members[0].mark
        for m in self.members:
            if not m.running() or m.stopped:
                continue
            ring = cluster.ring_of(m.address)
            if ring and ring.get(mark):
                by_addr = {x.address: x for x in self.members}
                chain = [by_addr[a] for a in ring[mark] if a in by_addr]
                if chain:
                    return chain
        return [m for m in self.members if m.mark == mark]

    def role_of(self, member):
        """head, middle, tail or single in the first mark's chain as a
        running member sees it; none when it is not in it."""
        chain = self.chain(member.mark)
        if member not in chain:
            return "none"
        if len(chain) == 1:
            return "single"
        i = chain.index(member)
        return "head" if i == 0 else "tail" if i == len(chain) - 1 else "middle"

    def role(self, which):
        chain = self.chain()
        if which == "head":
            return chain[0]
        if which == "tail":
            return chain[-1]
        if which == "middle" and len(chain) >= 3:
            return chain[1]
        return self.rng.choice(chain)

    def others(self, m):
        return [x for x in self.members if x is not m]

    def heal_all(self):
        while self.heals:
            self.heals.pop()()
        self.net.heal()


def cut(nem, name, target, addrs, direction, detail):
    """Drops target's packets to and/or from each of addrs, inside target's
    namespace, until the heal (which removes all of target's rules)."""
    for addr in addrs:
        nem.net.drop(target.name, addr, direction)
    nem.log("fault", name, target, detail)

    def heal():
        nem.net.heal(target.name)
        nem.log("heal", name, target)
    nem.heals.append(heal)
    return target


def cut_zk(nem, target, name, direction="both"):
    return cut(nem, name, target, [nem.zk.addr], direction, "zk " + direction)


@fault("zk-cut-tail")
def zk_cut_tail(nem):
    return cut_zk(nem, nem.role("tail"), "zk-cut"), 2.0 * nem.session_s


@fault("zk-cut-head")
def zk_cut_head(nem):
    return cut_zk(nem, nem.role("head"), "zk-cut"), 2.0 * nem.session_s


@fault("zk-cut-any")
def zk_cut_any(nem):
    return cut_zk(nem, nem.role("any"), "zk-cut"), nem.session_s * nem.rng.uniform(0.8, 1.6)


@fault("peer-cut")
def peer_cut(nem):
    chain = nem.chain()
    a, b = (chain[0], chain[1]) if nem.round % 2 == 0 else (chain[1], chain[-1])
    return cut(nem, "peer-cut", a, [b.addr], "both", "<-> " + b.name), 2.0 * nem.session_s


@fault("isolate")
def isolate(nem):
    """From ZooKeeper and every peer; the test's clients still reach it."""
    target = nem.role("tail" if nem.round % 2 == 0 else "head")
    addrs = [nem.zk.addr] + [o.addr for o in nem.others(target)]
    return cut(nem, "isolate", target, addrs, "both", "zk+peers"), 2.0 * nem.session_s


@fault("asym")
def asym(nem):
    """One direction only, in turn: the tail's packets to ZooKeeper, ZooKeeper's
    to the tail, the head's to its successor."""
    variant = nem.round % 3
    if variant == 0:
        return cut_zk(nem, nem.role("tail"), "asym", "out"), 2.0 * nem.session_s
    if variant == 1:
        return cut_zk(nem, nem.role("tail"), "asym", "in"), 2.0 * nem.session_s
    chain = nem.chain()
    head, succ = chain[0], chain[1]
    return cut(nem, "asym", head, [succ.addr], "out", "out -> " + succ.name), 2.0 * nem.session_s


@fault("loss")
def loss(nem):
    """Random loss on every link between members (replication, catch-up,
    forwarding), not on ZooKeeper's or the clients'."""
    pct = (10, 30, 50)[nem.round % 3]
    for m in nem.members:
        for o in nem.others(m):
            nem.net.drop(m.name, o.addr, "in", percent=pct)
    nem.log("fault", "loss", None, "%d%% member<->member" % pct)

    def heal():
        nem.net.heal()
        nem.log("heal", "loss")
    nem.heals.append(heal)
    return None, 2.0 * nem.session_s


@fault("pause")
def pause(nem):
    factor = (0.4, 0.6, 2.0)[nem.round % 3]
    target = nem.role(("tail", "head", "tail", "head", "middle", "tail")[nem.round % 6])
    target.pause()
    nem.log("fault", "pause", target, "SIGSTOP %.1fx" % factor)

    def heal():
        target.resume()
        nem.log("heal", "pause", target)
    nem.heals.append(heal)
    return target, factor * nem.session_s


@fault("kill")
def kill(nem):
    target = nem.role("any")
    target.kill9()
    nem.log("fault", "kill", target, "kill -9")

    def heal():
        target.start()
        nem.log("heal", "kill", target, "restarted")
    nem.heals.append(heal)
    return target, nem.rng.uniform(0.5, 2.0) * nem.session_s


def wait_chain(nem, via, mark, n, timeout=90.0):
    """Until "via" shows a chain of "n" members for "mark"; False on timeout."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        ring = cluster.ring_of(via.address)
        if ring and len(ring.get(mark, [])) == n:
            return True
        time.sleep(0.2)
    return False


def wait_no_change(nem, timeout=90.0):
    """Until ZooKeeper holds no ring change node; False on timeout."""
    from kazoo.client import KazooClient
    zk = KazooClient(hosts=nem.zk.hosts, timeout=10.0)
    zk.start(timeout=10)
    try:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if not zk.exists(cluster.SERVICE_PATH + "/.cluster/change"):
                return True
            time.sleep(0.2)
        return False
    finally:
        zk.stop()
        zk.close()


def concurrent_kill_importer(nem, a, b, via):
    """kill -9 of a member of the importing chain (not the one the CLI
    calls); restarted at the heal."""
    victim = nem.rng.choice([m for m in a if m is not via])
    victim.kill9()
    nem.log("fault", "kill", victim, "kill -9 during remove-mark")

    def heal():
        victim.start()
        nem.log("heal", "kill", victim, "restarted")
    return victim, heal


def concurrent_cut(name, pick, peers):
    """A cut of one member from ZooKeeper (and, with peers, from every other
    member) during the ring change; pick(nem, a, b, via) names it."""
    def fault_fn(nem, a, b, via):
        target = pick(nem, a, b, via)
        addrs = [nem.zk.addr] + ([o.addr for o in nem.others(target)] if peers else [])
        for addr in addrs:
            nem.net.drop(target.name, addr, "both")
        nem.log("fault", name, target, ("zk+peers" if peers else "zk both") + " during remove-mark")

        def heal():
            nem.net.heal(target.name)
            nem.log("heal", name, target)
        return target, heal
    return fault_fn


def concurrent_pause_source(nem, a, b, via):
    """SIGSTOP of a member of the mark being removed, for 0.6 x timeout:
    its lease lapses, its node stays, the release must wait for it."""
    target = nem.rng.choice(b)
    target.pause()
    nem.log("fault", "pause", target, "SIGSTOP during remove-mark")

    def heal():
        target.resume()
        nem.log("heal", "pause", target)
    return target, heal


def concurrent_kill_source(nem, a, b, via):
    """kill -9 of a member of the mark being removed: its range's release
    goes on without it; the heal starts it again with the others."""
    target = nem.rng.choice(b)
    target.kill9()
    nem.log("fault", "kill", target, "kill -9 during remove-mark")
    return target, lambda: None


def importer_head(nem, a, b, via):
    chain = nem.chain(a[0].mark)
    head = chain[0] if chain else a[0]
    return head if head is not via else nem.rng.choice([m for m in a if m is not via])


# What ring-change-mix runs beside each remove-mark, in turn: faults on the
# mark being removed (its release must wait for or go on without the member),
# and on the importing chain (its import must go on under a new head).
MIX = [
    ("zk-cut source", concurrent_cut("zk-cut", lambda nem, a, b, via: nem.rng.choice(b), False), 1.5),
    ("pause source", concurrent_pause_source, 0.6),
    ("isolate importer", concurrent_cut("isolate", lambda nem, a, b, via:
                                        nem.rng.choice([m for m in a if m is not via]), True), 1.5),
    ("kill source", concurrent_kill_source, 1.0),
    ("zk-cut importer head", concurrent_cut("zk-cut", importer_head, False), 1.5),
]


def remove_and_restore(nem, concurrent, hold_sessions):
    """flatkv admin remove-mark of the second mark (its range goes to the
    first), and 0.1-1 s into it the fault "concurrent" (a function of the
    nemesis, the first mark's members, the second's and the member the CLI
    calls, returning its target and its heal), held hold_sessions x the
    session timeout; healed by undoing the fault, waiting for the removal
    and starting the removed mark's members again on their old data, which
    must wipe it and import their range back as a new mark."""
    first = nem.members[0].mark
    a = [m for m in nem.members if m.mark == first]
    b = [m for m in nem.members if m.mark != first]
    via = nem.rng.choice(a)
    # The previous round's import must be done: one ring change at a time.
    if not wait_chain(nem, via, b[0].mark, len(b)):
        nem.errors.append("ring-change: mark %d did not come back within 90 s" % b[0].mark)
        return None, 0.1
    # Its chain may be complete while its add still drops the range at the
    # source (one ring change at a time): wait for the change node to go.
    if not wait_no_change(nem):
        nem.errors.append("ring-change: the previous ring change did not finish within 90 s")
        return None, 0.1
    proc = subprocess.Popen([nem.cli, "--host", via.addr, "--port", str(cluster.PORT), "admin",
                             "remove-mark", str(b[0].mark), "--wait"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    nem.log("fault", "ring-change", None, "remove-mark %d via %s" % (b[0].mark, via.name))
    time.sleep(nem.rng.uniform(0.1, 1.0))
    target, undo = concurrent(nem, a, b, via)

    def heal():
        undo()
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            nem.errors.append("ring-change: remove-mark did not finish within 120 s: %s" % err[-300:])
        if proc.returncode != 0:
            nem.errors.append("ring-change: remove-mark exited %s: %s" % (proc.returncode, err[-300:]))
        for m in b:
            try:
                m.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                nem.errors.append("ring-change: %s of the removed mark did not exit" % m.name)
                m.kill9()
        nem.log("heal", "ring-change", None, "mark %d removed (%s)" % (b[0].mark, out.strip()[-80:]))
        for m in b:
            m.start()
        nem.log("heal", "ring-change", None, "mark %d's members started again" % b[0].mark)
    nem.heals.append(heal)
    return target, hold_sessions * nem.session_s


@fault("ring-change")
def ring_change(nem):
    """A remove-mark with a kill -9 of a member of the importing chain in
    it (remove_and_restore). Needs --marks 2."""
    return remove_and_restore(nem, concurrent_kill_importer, 1.0)


@fault("ring-change-mix")
def ring_change_mix(nem):
    """A remove-mark with, in turn, each fault of MIX in it, starting at
    the seed's (a 30 s run has room for about three). Needs --marks 2."""
    _name, concurrent, hold = MIX[(nem.seed + nem.round) % len(MIX)]
    return remove_and_restore(nem, concurrent, hold)


@fault("zk-follower-cut")
def zk_follower_cut(nem):
    """An ensemble (run.py: ZooKeeperEnsemble): the follower the tail alone
    talks to (nem.zk.tail_follower) cut from the other ZooKeeper servers,
    not from the tail. The leader expires the tail's session after the
    session timeout while that follower answers the tail for its syncLimit
    (10 s): the tail must stop serving within its lease all the same."""
    f = nem.zk.servers[nem.zk.tail_follower]
    for other in nem.zk.servers:
        if other is not f:
            nem.net.drop(f.name, other.addr, "both")
    target = nem.role("tail")
    nem.log("fault", "zk-follower-cut", target, "zk follower %s cut from the ensemble" % f.name)

    def heal():
        nem.net.heal(f.name)
        nem.log("heal", "zk-follower-cut", target)
    nem.heals.append(heal)
    return target, 10.0 + nem.session_s / 2 + 2.0


@fault("zk-restart")
def zk_restart(nem):
    nem.zk.kill()
    nem.log("fault", "zk-restart", None, "kill -9 zookeeper")

    def heal():
        nem.zk.start()
        nem.log("heal", "zk-restart", None, "zookeeper restarted")
    nem.heals.append(heal)
    return None, nem.rng.uniform(0.5, 1.5) * nem.session_s


@fault("clock")
def clock(nem):
    """The wall clock of the member started under faketime: a step forward,
    back, a fast and a slow rate. The monotonic clock is untouched, so
    nothing may change."""
    target = next(m for m in nem.members if m.clock_file)
    spec = ("+300s", "-300s", "+0 x4", "+0 x0.25")[nem.round % 4]
    target.set_clock(spec)
    nem.log("fault", "clock", target, "wall clock " + spec)

    def heal():
        target.set_clock("+0")
        nem.log("heal", "clock", target)
    nem.heals.append(heal)
    return target, 2.0 * nem.session_s


# Seconds to wait after a heal before the next fault: long enough for a
# member that left to come back (re-register, catch up).
RECOVER_S = 4.0


def schedule(nem, names, seconds, warmup=3.0, stop=None):
    """Runs the faults "names" in turn (a list; empty: none) until
    "seconds" after start, each held for its own time, then healed."""
    t_end = time.monotonic() + seconds
    time.sleep(min(warmup, seconds))
    while names and time.monotonic() < t_end - 1.0:
        name = names[nem.round % len(names)]
        _target, hold = FAULTS[name](nem)
        time.sleep(max(0.1, min(hold, t_end - time.monotonic())))
        nem.heal_all()
        nem.round += 1
        time.sleep(max(0.0, min(RECOVER_S, t_end - time.monotonic())))
    rest = t_end - time.monotonic()
    if rest > 0:
        time.sleep(rest)
