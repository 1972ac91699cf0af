"""The suite's network: a Linux bridge in the root namespace (10.77.0.1/24,
where the test's clients run) and one network namespace per process, each
joined to the bridge by a veth pair, ZooKeeper at 10.77.0.2 and members at
10.77.0.11 and up. Every name starts with "fkj" so that a crashed run's
leftovers can be found and removed by the next run (clean()).

Links are cut with nftables inside a namespace: table "inet fkj" holds an
input and an output chain; heal() deletes the table.

Cleanup runs on every exit path: atexit, SIGTERM/SIGINT/SIGHUP (turned into
an exit), and a watchdog process that runs clean() once this process is
gone (SIGKILL, ctest's timeout), since namespaces and the processes in
them outlive their creator. A lock keeps two runs from sharing the names."""
import atexit
import fcntl
import os
import signal
import subprocess
import sys

PREFIX = "fkj"
BRIDGE = PREFIX + "-br0"
SUBNET = "10.77.0"
HOST_ADDR = SUBNET + ".1"  # the root namespace: the test's clients
ZK_ADDR = SUBNET + ".2"
LOCK = "/run/lock/flatkv-jepsen.lock"
TABLE = "inet " + PREFIX


def sh(*args, check=True, ns=None, input=None):
    """Runs a command (inside namespace "ns" if given); its stdout."""
    cmd = (["ip", "netns", "exec", ns] if ns else []) + list(args)
    r = subprocess.run(cmd, input=input, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError("%s: exit %d: %s" % (" ".join(cmd), r.returncode, r.stderr.strip()))
    return r.stdout


def namespaces():
    out = sh("ip", "netns", "list", check=False)
    return [line.split()[0] for line in out.splitlines()
            if line.split() and line.split()[0].startswith(PREFIX + "-")]


def clean():
    """Removes every process, namespace and link of this suite, of this run
    or of a crashed one. Idempotent."""
    for ns in namespaces():
        for pid in sh("ip", "netns", "pids", ns, check=False).split():
            try:
                os.kill(int(pid), signal.SIGKILL)  # a stopped process dies too
            except (ProcessLookupError, ValueError):
                pass
        sh("ip", "netns", "del", ns, check=False)
    links = sh("ip", "-o", "link", "show", check=False)
    for line in links.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if name.startswith(PREFIX):
            sh("ip", "link", "del", name, check=False)


def require_tools():
    """Fails loudly (exit 2) when something the suite needs is missing:
    it must never look like a pass because it could not run."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (network namespaces, nft)")
    for tool in ("ip", "nft", "go", "java"):
        if subprocess.run(["sh", "-c", "command -v " + tool], capture_output=True).returncode:
            missing.append(tool)
    if not os.path.exists("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"):
        missing.append("faketime (libfaketimeMT)")
    if missing:
        sys.stderr.write("jepsen: cannot run, missing: %s (deploy/install-deps.sh installs them)\n"
                         % ", ".join(missing))
        sys.exit(2)


class Net:
    """The bridge and the namespaces of one run. add(name, addr) creates a
    namespace "fkj-<name>" holding address "addr"/24."""

    def __init__(self):
        self._lock = open(LOCK, "w")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            sys.stderr.write("jepsen: another run holds %s\n" % LOCK)
            sys.exit(2)
        clean()  # a crashed run's leftovers
        self.ns = {}  # name -> (namespace, address)
        self._closed = False
        # The watchdog runs clean() once this process is gone: it waits for
        # EOF on a pipe only this process writes to.
        r, w = os.pipe()
        self._watchdog = subprocess.Popen(
            ["/bin/sh", "-c", 'read _ ; exec "$0" "$1" clean', sys.executable,
             os.path.abspath(__file__)],
            stdin=r, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        os.close(r)
        self._watchdog_pipe = w
        atexit.register(self.close)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, _exit_on_signal)
        sh("ip", "link", "add", BRIDGE, "type", "bridge")
        sh("ip", "addr", "add", HOST_ADDR + "/24", "dev", BRIDGE)
        sh("ip", "link", "set", BRIDGE, "up")

    def add(self, name, addr):
        ns = "%s-%s" % (PREFIX, name)
        host_end = "%sv-%s" % (PREFIX, name)  # at most 15 characters
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", ns)
        sh("ip", "link", "set", host_end, "master", BRIDGE, "up")
        sh("ip", "-n", ns, "addr", "add", addr + "/24", "dev", "eth0")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        self.ns[name] = (ns, addr)
        return ns

    # --- links ------------------------------------------------------------
    def _table(self, ns):
        if subprocess.run(["ip", "netns", "exec", ns, "nft", "list", "table", TABLE],
                          capture_output=True).returncode != 0:
            sh("nft", "-f", "-", ns=ns, input=(
                "table %s {\n chain in { type filter hook input priority 0; }\n"
                " chain out { type filter hook output priority 0; }\n}\n" % TABLE))

    def rule(self, name, chain, rule):
        """Adds "rule" (nft syntax) to chain "in" or "out" of namespace "name"."""
        ns = self.ns[name][0]
        self._table(ns)
        sh("nft", "add rule %s %s %s" % (TABLE, chain, rule), ns=ns)

    def drop(self, name, addr, direction="both", percent=None):
        """Drops packets between namespace "name" and "addr": "in" (from
        addr), "out" (to addr) or "both"; with "percent", only that share
        of them, at random."""
        extra = "numgen random mod 100 < %d " % percent if percent else ""
        if direction in ("in", "both"):
            self.rule(name, "in", "ip saddr %s %sdrop" % (addr, extra))
        if direction in ("out", "both"):
            self.rule(name, "out", "ip daddr %s %sdrop" % (addr, extra))

    def heal(self, name=None):
        """Removes the rules of namespace "name" (of every one if None)."""
        for n in ([name] if name else list(self.ns)):
            ns = self.ns[n][0]
            subprocess.run(["ip", "netns", "exec", ns, "nft", "delete", "table", TABLE],
                           capture_output=True)

    def rules(self):
        return {n: sh("nft", "list", "ruleset", ns=ns, check=False) for n, (ns, _) in self.ns.items()}

    def close(self):
        if self._closed:
            return
        self._closed = True
        try:
            clean()
        finally:
            os.close(self._watchdog_pipe)  # the watchdog finds nothing left
            self._watchdog.wait()
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()


def _exit_on_signal(signum, _frame):
    sys.exit(128 + signum)  # runs atexit


if __name__ == "__main__":
    if sys.argv[1:] == ["clean"]:
        clean()
    else:
        sys.stderr.write("usage: topology.py clean\n")
        sys.exit(2)
