"""ZooKeeper and flatkv-server members, each in its own namespace of a
topology.Net, reached from the root namespace by the test's clients.
ZooKeeper is tests/integration/harness.py's (deploy/zookeeper.sh), started
inside its namespace on its address; members are real flatkv-server
processes that die with the test (PR_SET_PDEATHSIG, and topology's cleanup
kills whatever is left in the namespaces)."""
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "integration"))
import harness  # noqa: E402
import topology  # noqa: E402

PORT = 9901
FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"
logging.getLogger("kazoo").setLevel(logging.CRITICAL)
logging.getLogger("thrift").setLevel(logging.CRITICAL)


class ZooKeeper(harness.ZooKeeper):
    """harness.ZooKeeper inside namespace fkj-<name>, listening on "addr";
    "env" is deploy/zookeeper.sh's (an ensemble member's ZK_SERVERS...)."""

    def __init__(self, work, net, addr=topology.ZK_ADDR, name="zk", port=None, env=None):
        self.ns = net.add(name, addr)
        self.name, self.addr = name, addr
        self.extra_env = env or {}
        super().__init__(work, name, port=port)
        self.hosts = "%s:%d" % (addr, self.port)

    def start(self):
        env = dict(os.environ, ZK_HOST=self.addr, **self.extra_env)
        subprocess.run(["ip", "netns", "exec", self.ns, "bash", harness.ZOOKEEPER_SH, "start",
                        self.dir, str(self.port)], check=True, stdout=subprocess.DEVNULL, env=env)


class Hosts:
    """What a Member needs of its ZooKeeper: the connect string."""

    def __init__(self, hosts):
        self.hosts = hosts


class ZooKeeperEnsemble:
    """Three ZooKeeper servers, each in its own namespace (fkj-zk1..3 at
    10.77.0.2..4), with a syncLimit of 50 ticks of 200 ms: a follower cut
    from the leader goes on answering its clients for 10 s, as on Debian's
    packaged configuration (5 ticks of 2 s). hosts names all three."""

    CLIENT_PORT = 2181

    def __init__(self, work, net, n=3, sync_limit_ticks=50):
        addrs = ["%s.%d" % (topology.SUBNET, 2 + i) for i in range(n)]
        lines = " ".join("server.%d=%s:2888:3888" % (i + 1, a) for i, a in enumerate(addrs))
        self.servers = [ZooKeeper(work, net, a, "zk%d" % (i + 1), self.CLIENT_PORT,
                                  {"ZK_SERVERS": lines, "ZK_MYID": str(i + 1),
                                   "ZK_SYNC_LIMIT": str(sync_limit_ticks)})
                        for i, a in enumerate(addrs)]
        self.hosts = ",".join(z.hosts for z in self.servers)
        self.addr = None  # no single server to cut a member from
        t0 = time.monotonic()
        while self.leader() is None or sum(z.mode() is not None for z in self.servers) < 2:
            if time.monotonic() - t0 > 60:
                raise RuntimeError("the ZooKeeper ensemble elected no leader within 60 s")
            time.sleep(0.1)

    def leader(self):
        """The index of the server that leads, or None."""
        for i, z in enumerate(self.servers):
            if z.mode() == "leader":
                return i
        return None

    def kill(self):
        subprocess.run(["bash", harness.ZOOKEEPER_SH, "kill", self.dir], check=True)


class Member:
    """One flatkv-server in namespace fkj-<name> at "addr":PORT, with the
    run's own --set arguments in "settings" after the suite's. With
    "faketime", it runs under libfaketime with its wall clock read from a
    file (set_clock) and its monotonic clock left alone."""

    def __init__(self, work, net, server_bin, zk, name, addr, mark, replication,
                 session_ms, faketime=False, settings=()):
        self.name, self.addr, self.mark = name, addr, mark
        self.ns = net.add(name, addr)
        self.address = "%s:%d" % (addr, PORT)
        self.server_bin, self.zk = server_bin, zk
        self.data = os.path.join(work, name)
        self.log = os.path.join(work, name + ".log")
        self.args = ["--set", "server.host=" + addr, "--set", "server.port=%d" % PORT,
                     "--set", "storage.path=" + self.data,
                     "--set", "cluster.advertise=" + self.address,
                     "--set", "cluster.zookeeper=" + zk.hosts,
                     "--set", "cluster.mark=%d" % mark,
                     "--set", "cluster.replication=" + replication,
                     "--set", "cluster.session_timeout_ms=%d" % session_ms,
                     # The workload's stores hold a few MB: with the
                     # engine's floor instead of the server's 64 MiB they
                     # compact during the faults too.
                     "--set", "storage.compaction_min_bytes=1Mi"]
        for kv in settings:  # the run's own settings (run.py --set)
            self.args += ["--set", kv]
        self.clock_file = os.path.join(work, name + ".faketime") if faketime else None
        if self.clock_file:
            self.set_clock("+0")
        self.proc = None
        self.stopped = False

    def set_clock(self, spec):
        """libfaketime's offset/rate for the wall clock, e.g. "+300s",
        "-300s", "+0 x2" (re-read on every call: FAKETIME_NO_CACHE)."""
        tmp = self.clock_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(spec + "\n")
        os.rename(tmp, self.clock_file)

    def start(self, wait=True):
        cmd = ["ip", "netns", "exec", self.ns]
        if self.clock_file:
            cmd += ["env", "LD_PRELOAD=" + FAKETIME_LIB, "FAKETIME_TIMESTAMP_FILE=" + self.clock_file,
                    "FAKETIME_NO_CACHE=1", "DONT_FAKE_MONOTONIC=1", "FAKETIME_DONT_FAKE_MONOTONIC=1"]
        cmd += [self.server_bin] + self.args
        with open(self.log, "ab") as err:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err,
                                         preexec_fn=harness._die_with_parent)
        self.stopped = False
        if wait:
            self.wait_port()

    def wait_port(self, timeout=30):
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError("%s exited with %d; see %s" % (self.name, self.proc.returncode, self.log))
            try:
                socket.create_connection((self.addr, PORT), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("%s did not listen on %s" % (self.name, self.address))

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def pause(self):
        self.proc.send_signal(signal.SIGSTOP)
        self.stopped = True

    def resume(self):
        self.proc.send_signal(signal.SIGCONT)
        self.stopped = False

    def terminate(self):
        if self.running():
            if self.stopped:
                self.resume()
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def client(addr, timeout_ms):
    """A framed binary-protocol FlatKV client to "host:port" and its transport."""
    from thrift.protocol import TBinaryProtocol
    from thrift.transport import TSocket, TTransport
    from flatkv import FlatKV
    host, port = addr.rsplit(":", 1)
    sock = TSocket.TSocket(host, int(port))
    sock.setTimeout(timeout_ms)
    t = TTransport.TFramedTransport(sock)
    t.open()
    return FlatKV.Client(TBinaryProtocol.TBinaryProtocol(t)), t


def call(addr, fn, timeout_ms=2000):
    c, t = client(addr, timeout_ms)
    try:
        return fn(c)
    finally:
        t.close()


# cluster.service_path: the members run with its default.
SERVICE_PATH = "/flatkv"


def ring_of(addr):
    """{mark: ["host:port", ...]} as the member at "addr" sees it; None on failure."""
    try:
        r = call(addr, lambda c: c.ring(), 1000)
    except Exception:
        return None
    return {p.mark: ["%s:%d" % (m.host, m.port) for m in p.chain] for p in r.partitions}


def role_of(addr):
    try:
        return call(addr, lambda c: c.info().role, 1000)
    except Exception:
        return None


class ZkWatch:
    """Records every change of the registered members as ZooKeeper shows
    them: [(monotonic ns, frozenset of "host:port")]. Its own kazoo session
    in the root namespace; re-reads on reconnect (kazoo's ChildrenWatch)."""

    def __init__(self, zk, path=SERVICE_PATH):
        from kazoo.client import KazooClient
        self.events = []
        self._lock = threading.Lock()
        self.zk = KazooClient(hosts=zk.hosts, timeout=10.0)
        self.zk.start(timeout=15)
        self.zk.ensure_path(path)
        self.zk.ChildrenWatch(path, self._on_children)

    def _on_children(self, children):
        now = time.monotonic_ns()
        members = frozenset(c.split(":", 1)[1] for c in children if c.startswith("thriftbinary"))
        with self._lock:
            if not self.events or self.events[-1][1] != members:
                self.events.append((now, members))
        return True

    def members(self):
        with self._lock:
            return self.events[-1][1] if self.events else frozenset()

    def first_without(self, address, after):
        """The first time >= "after" at which "address" was not registered."""
        with self._lock:
            events = list(self.events)
        state = None
        for t, members in events:
            if t <= after:
                state = members
                continue
            if address not in members:
                return t
        if state is not None and address not in state:
            return after
        return None

    def first_with(self, address, after):
        with self._lock:
            events = list(self.events)
        for t, members in events:
            if t > after and address in members:
                return t
        return None

    def close(self):
        try:
            self.zk.stop()
            self.zk.close()
        except Exception:
            pass
