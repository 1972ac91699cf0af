#!/usr/bin/python3
"""Process test of a ring on a ZooKeeper ensemble: three real ZooKeeper
servers on loopback (deploy/zookeeper.sh, QuorumPeerMain) and one mark of
three real flatkv-server members, cluster.replication: sync, the default
session timeout (6 s). Each server's syncLimit is 10 s (50 ticks of 200
ms), as on Debian's packaged configuration (5 ticks of 2 s): a follower
that stops hearing from the leader goes on answering its clients from its
own copy for that long.

Once the ensemble has elected a leader L, the members start: the head and
the middle with L and the second follower in cluster.zookeeper, the tail
with only the first follower F.

Writers put self-verifying values (harness.versioned) through random
members, each writer owning its keys; readers read random keys, one
through random members and one through the tail, and judge each value on
its own (harness.judge_versioned: never older than the newest version
acknowledged before the read began, never a value nobody wrote).

Faults, in turn, under that load:
  A. F cut from L (nftables drops their quorum connection; the tail still
     reaches F, the clients still reach the tail). L expires the tail's
     session after 6 s and the chain goes on without it, while F answers
     the tail's reads for 10 s: the tail must stop serving within its
     lease, which only an answer that went through the leader renews
     (a ZooKeeper sync), so no read is stale. Healed, the tail registers
     again and rejoins.
  B. kill -9 of the leader: the two others elect a new one, the members'
     sessions move to them (every member node keeps its creation zxid: the
     chain did not re-form) and writes are acknowledged again.
  C. No quorum: the two servers other than F killed for longer than the
     session timeout. No write is acknowledged once the members' leases end;
     with one server back (a majority again) writes are acknowledged again
     within the session timeout and every member keeps its session. The
     head and the middle list two servers: a client that retried only one
     of them (the C client over an even list, zk_hosts.h) would wait for
     the server still down, and lose its session.
At the end, with every server back: every acknowledged write readable at
its newest version through every member, and `digest` equal across the
chain.

Usage: zk_ensemble_test.py FLATKV_SERVER THRIFT_COMPILER FLATKV_THRIFT"""
import atexit
import os
import random
import signal
import subprocess
import sys
import threading
import time

import harness
from harness import check, free_port

server_bin, thrift_bin, idl = sys.argv[1:4]
work = harness.workdir("flatkv-zk-ensemble-", thrift_bin, idl)
from flatkv.ttypes import KvError  # noqa: E402

import logging  # noqa: E402
logging.getLogger("thrift").setLevel(logging.CRITICAL)
logging.getLogger("kazoo").setLevel(logging.CRITICAL)

SESSION_MS = 6000
SYNC_LIMIT_S = 10
MARK = 1000
WRITERS, KEYS_PER_WRITER = 3, 100
TABLE = "inet flatkv_zk_ensemble_test"  # the cut's rules, root namespace


def nft(script, check_rc=True):
    return subprocess.run(["nft", "-f", "-"], input=script, text=True, capture_output=True,
                          check=check_rc)


def heal():
    nft("delete table %s\n" % TABLE, check_rc=False)


heal()  # a crashed run's leftover
atexit.register(heal)

ensemble = harness.ZooKeeperEnsemble(work, sync_limit=SYNC_LIMIT_S * 5)
L = ensemble.leader()
F, F2 = [i for i in range(3) if i != L]
zk = ensemble.servers
print("ensemble of 3 up: leader zk%d, the tail's follower zk%d" % (L + 1, F + 1))
stop = threading.Event()


class Member:
    def __init__(self, name, servers):
        self.name = name
        self.port = free_port()
        self.address = "127.0.0.1:%d" % self.port
        self.proc = harness.start_member(
            server_bin, self.port, os.path.join(work, name),
            ",".join(zk[i].hosts for i in servers), MARK,
            "--set", "cluster.replication=sync", log=os.path.join(work, name + ".log"),
            session_timeout_ms=SESSION_MS)

    def call(self, fn, timeout_ms=3000):
        return harness.call(self.port, fn, timeout_ms)

    def role(self):
        return self.call(lambda c: c.info().role, 1000)


def wait_until(what, cond, timeout=30.0):
    return harness.wait_until(work, what, cond, timeout, 0.05, on_fail=stop.set)


def registrations():
    """{member node name: its creation zxid}, read through any live server."""
    from kazoo.client import KazooClient
    client = KazooClient(hosts=ensemble.hosts, timeout=5.0)
    client.start(timeout=15)
    try:
        out = {}
        for c in client.get_children("/flatkv"):
            if c.startswith("thriftbinary"):
                st = client.exists("/flatkv/" + c)
                if st is not None:
                    out[c] = st.czxid
        return out
    finally:
        client.stop()
        client.close()


# Registration order makes the chain: the tail last.
members = []
for name, servers in (("m0", (L, F2)), ("m1", (L, F2)), ("m2", (F,))):
    members.append(Member(name, servers))
    wait_until("%s registered" % name, lambda: len(registrations()) == len(members))
tail = members[2]


def chain_formed():
    return [m.role() for m in members] == ["head", "middle", "tail"]


wait_until("a chain of three, m2 its tail", chain_formed)

# --- The load ---------------------------------------------------------------
lock = threading.Lock()
acked, attempted = {}, {}
acks = [0]          # writes acknowledged so far
ack_times = []      # when each was acknowledged (time.monotonic)
bad = []            # reads that break the rules
tail_reads = [0]    # reads the tail answered itself, with a value


def writer(index):
    r = random.Random(index)
    keys = [index * KEYS_PER_WRITER + i for i in range(KEYS_PER_WRITER)]
    conn = None
    while not stop.is_set():
        key = r.choice(keys)
        try:
            if conn is None:
                conn = harness.client(r.choice(members).port, 3000)
            with lock:
                v = attempted.get(key, 0) + 1
                attempted[key] = v
            conn[0].put(key, harness.versioned(key, v))
            with lock:
                acked[key] = max(acked.get(key, 0), v)
                acks[0] += 1
                ack_times.append(time.monotonic())
        except KvError:
            time.sleep(0.01)
        except Exception:
            conn = None
            time.sleep(0.02)


def reader(index, pick):
    r = random.Random(100 + index)
    conn = None
    while not stop.is_set():
        key = r.randrange(WRITERS * KEYS_PER_WRITER)
        try:
            if conn is None:
                m = pick(r)
                conn = harness.client(m.port, 3000)
            with lock:
                floor = acked.get(key, 0)
            res = conn[0].get(key)
            with lock:
                harness.judge_versioned(key, res.value if res.found else None, floor,
                                        attempted, bad)
                if m is tail and res.found:
                    tail_reads[0] += 1
        except KvError:
            time.sleep(0.01)
        except Exception:
            conn = None
            time.sleep(0.02)


threads = [threading.Thread(target=writer, args=(i,), daemon=True) for i in range(WRITERS)]
threads.append(threading.Thread(target=reader, args=(0, lambda r: r.choice(members)), daemon=True))
threads.append(threading.Thread(target=reader, args=(1, lambda r: tail), daemon=True))
for t in threads:
    t.start()


def wait_progress(what, n=200, timeout=30.0):
    with lock:
        start = acks[0]
    return wait_until("writes acknowledged again after " + what,
                      lambda: acks[0] >= start + n, timeout)


wait_progress("start")


def no_bad_reads(what):
    with lock:
        found = list(bad)
    check(not found, "%s: every read named a version written and none older than the newest "
          "acknowledged before it (%d bad: %s)" % (what, len(found), found[:5]))


# --- A. The tail's follower cut from the leader. ----------------------------
def quorum_link(follower, leader):
    """The local port of the follower's connection to the leader's quorum
    port (ss: the socket the follower's process holds)."""
    qport = ensemble.quorum_ports[leader]
    pid = zk[follower].pid()
    out = subprocess.run(["ss", "-tnpH", "state", "established", "dport", "= :%d" % qport],
                         capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        if "pid=%d," % pid in line:
            return int(line.split()[2].rsplit(":", 1)[1])
    return None


fport = quorum_link(F, L)
check(fport is not None, "found zk%d's link to the leader zk%d" % (F + 1, L + 1))
qport = ensemble.quorum_ports[L]
reg0 = registrations()
with lock:
    reads_before = tail_reads[0]
t_cut = time.monotonic()
nft("table %s {\n chain in { type filter hook input priority 0;\n"
    "  tcp sport %d tcp dport %d drop\n  tcp sport %d tcp dport %d drop\n }\n}\n"
    % (TABLE, fport, qport, qport, fport))
# L expires the tail's session (6 s), F goes on answering for 10 s; the
# tail's lease would end half a session timeout after F stops answering.
time.sleep(SYNC_LIMIT_S + SESSION_MS / 2000.0 + 2)
# Once F gives up on L it rejoins on a new connection and the tail learns
# that its session expired: its node is gone, or made again by a new
# session.
tail_node = [name for name in reg0 if name.endswith(tail.address)]
check(len(tail_node) == 1 and registrations().get(tail_node[0]) != reg0[tail_node[0]],
      "follower cut: the leader expired the tail's session (its node gone or made anew)")
with lock:
    served = tail_reads[0] - reads_before
print("follower cut: the tail answered %d reads with a value in that time (within its lease, "
      "and once it rejoined)" % served)
no_bad_reads("follower cut from the leader")
heal()
print("follower cut healed after %.1f s" % (time.monotonic() - t_cut))
wait_until("the tail registered again and the chain has three members", chain_formed, 60)
wait_progress("the follower cut")

# --- B. kill -9 of the leader. ------------------------------------------------
before = registrations()
check(len(before) == 3, "three members registered")
i = ensemble.leader()
t0 = time.monotonic()
zk[i].kill()
new = ensemble.wait_leader(30)
check(new is not None and new != i, "leader zk%d killed: the others elect a new one (%.1f s)" %
      (i + 1, time.monotonic() - t0))
wait_progress("the leader's kill")
print("leader killed: writes acknowledged again %.1f s after the kill" % (time.monotonic() - t0))
check(registrations() == before,
      "leader killed: every member kept its session (member nodes and their czxids unchanged)")
zk[i].start()
wait_until("three servers serve", lambda: all(z.mode() for z in zk))

# --- C. No quorum for longer than the session timeout. ----------------------
down = [j for j in range(3) if j != F]
zk[down[0]].kill()
t_cut = time.monotonic()  # the next kill takes the majority away
zk[down[1]].kill()
time.sleep(SESSION_MS / 1000.0 + 2)
with lock:
    late = [t - t_cut for t in ack_times if t > t_cut]
# A lease ends half a session timeout after the send time of the last sync
# ZooKeeper answered, so at most that long after the cut (plus the time a
# write takes to come back to its client).
check(all(d < SESSION_MS / 2000.0 + 1.0 for d in late),
      "no quorum: no write acknowledged past the members' leases (%d after the cut, the last "
      "%.2f s after it)" % (len(late), max(late) if late else 0.0))
t_back = time.monotonic()
zk[down[0]].start()
check(ensemble.wait_leader(60) is not None, "one server back: a majority elects a leader")
t_leader = time.monotonic()
wait_progress("the quorum came back", timeout=40)
# The new leader gives every session a fresh timeout. A member whose client
# retried only the server still down would lose its session, and writes
# would wait for the chain to re-form without it: a session timeout or more.
back = time.monotonic() - t_leader
check(back < SESSION_MS / 1000.0,
      "quorum back: writes acknowledged again %.1f s after a leader was elected (%.1f s after "
      "the server was started), within the session timeout" % (back, time.monotonic() - t_back))
zk[down[1]].start()
wait_until("three servers serve", lambda: all(z.mode() for z in zk))
check(registrations() == before,
      "after the quorum loss: every member kept its session (member nodes and their czxids "
      "unchanged)")

stop.set()
for t in threads:
    t.join()
no_bad_reads("all faults")

# --- The end: everything acknowledged, from every member. -------------------
keys = sorted(acked)
wait_until("a chain of three after the faults",
           lambda: sorted(m.role() for m in members) == ["head", "middle", "tail"], 60)
for m in members:
    got = []
    wait_until("%s serves reads" % m.name,
               lambda: got.append(m.call(lambda c: c.multiGet(keys), 10000)) is None, 60)
    res = got[-1]
    wrong = []
    for key, r in zip(keys, res):
        harness.judge_versioned(key, r.value if r.found else None, acked[key], attempted, wrong)
    check(not wrong, "%s: every acknowledged write reads at its newest version (%d keys, %d "
          "wrong: %s)" % (m.name, len(keys), len(wrong), wrong[:3]))
wait_until("digests equal across the chain",
           lambda: len({(d.keys, d.digest) for d in
                        [m.call(lambda c: c.digest("")) for m in members]}) == 1, 30)
for m in members:
    m.proc.send_signal(signal.SIGTERM)
    m.proc.wait()
harness.finish(work)
