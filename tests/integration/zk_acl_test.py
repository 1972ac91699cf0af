#!/usr/bin/python3
"""ZooKeeper ACLs of a ring (cluster.zookeeper_auth_file, `flatkv admin
secure-ring`; docs/operating.md, "Securing the ring") against a real ZooKeeper and real
members: two marks, mark A a chain of two.

An open ring is secured in place and rolling-restarted with credentials
while it keeps every key; then clients without credentials, or with a wrong
password, are refused (NOAUTH) every change to the ring, and the ring keeps
serving every key. A credentialed instance refuses (exit 2, naming the
node) a ring with a node the world may write, and starts once secure-ring
ran. The ring survives a session expiry (SIGSTOP past the session timeout)
and a ZooKeeper restart with the ACLs kept on every node it makes again.
Bad credentials files are configuration errors, and no log holds the
password.

Usage: zk_acl_test.py FLATKV_SERVER FLATKV_CLI THRIFT_COMPILER FLATKV_THRIFT"""
import logging
import os
import signal
import subprocess
import sys
import time

import harness
from harness import check, free_port

server_bin, cli_bin, thrift_bin, idl = sys.argv[1:5]
work = harness.workdir("flatkv-zkacl-", thrift_bin, idl)

from kazoo.client import KazooClient  # noqa: E402
from kazoo.exceptions import NoAuthError  # noqa: E402
from kazoo.security import make_digest_acl_credential  # noqa: E402

logging.getLogger("kazoo").setLevel(logging.CRITICAL)
logging.getLogger("thrift").setLevel(logging.CRITICAL)

SESSION_MS = 1500
USER, PASSWORD = "flatkv", "pw-7d1c0e9a"
A, B = 1000, 2000          # integer keys: (B, max) and [0, A) belong to A
KEYS = list(range(0, 3000, 50))
ROOT = "/flatkv"
DIGEST_ID = make_digest_acl_credential(USER, PASSWORD)

AUTH = os.path.join(work, "zk.auth")
with open(AUTH, "w") as f:
    f.write("%s:%s\n" % (USER, PASSWORD))
os.chmod(AUTH, 0o600)

zk = harness.ZooKeeper(work)


class Inst:
    """A ring member: its port, data directory and log survive restarts."""

    def __init__(self, name, mark):
        self.name, self.mark = name, mark
        self.port = free_port()
        self.address = "127.0.0.1:%d" % self.port
        self.data = os.path.join(work, name)
        self.log = os.path.join(work, name + ".log")
        self.proc = None

    def start(self, secure):
        extra = ["--set", "cluster.zookeeper_auth_file=" + AUTH] if secure else []
        self.proc = harness.start_member(server_bin, self.port, self.data, zk, self.mark, *extra,
                                         log=self.log, session_timeout_ms=SESSION_MS)

    def node(self):
        return "%s/thriftbinary%d:%s" % (ROOT, self.mark, self.address)


def kazoo(auth=None):
    c = KazooClient(hosts=zk.hosts, timeout=5.0, auth_data=auth)
    c.start(timeout=10)
    return c


def all_nodes(c, path=ROOT):
    out = [path]
    for child in c.get_children(path):
        out += all_nodes(c, path + "/" + child)
    return out


def open_nodes(world=1):
    """Nodes under ROOT whose ACL is not exactly digest(USER): all, world:
    "world" (1: read; 31: all, the transitional ACL), read with the
    credentials."""
    c = kazoo([("digest", "%s:%s" % (USER, PASSWORD))])
    try:
        bad = []
        for n in all_nodes(c):
            try:
                acl = c.get_acls(n)[0]
            except Exception:
                continue  # an ephemeral node gone meanwhile
            # ZooKeeper shows a digest id as "user:x" to a client that may
            # not administer the node.
            got = sorted((a.id.scheme, USER if a.id.id in (DIGEST_ID, USER + ":x") else a.id.id,
                          a.perms) for a in acl)
            if got != sorted([("digest", USER, 31), ("world", "anyone", world)]):
                bad.append("%s %r" % (n, got))
        return bad
    finally:
        c.stop()
        c.close()


def value(k):
    return b"k=%d v=1" % k


def reads_all(port):
    try:
        got = harness.call(port, lambda c: [c.get(k) for k in KEYS], 5000)
    except Exception:
        return False
    return all(r.found and r.value == value(k) for k, r in zip(KEYS, got))


def ring_is(ports, want):
    """Every instance sees the chains of "want" ({mark: set of addresses})."""
    for p in ports:
        ring, _ = harness.ring_of(p)
        if ring is None or {m: set(c) for m, c in ring.items()} != want:
            return False
    return True


def wait(what, cond, timeout=30.0):
    """Checks that cond() comes true within "timeout" seconds."""
    t0 = time.monotonic()
    done = False
    while not done and time.monotonic() - t0 < timeout:
        try:
            done = bool(cond())
        except Exception:
            pass
        if not done:
            time.sleep(0.1)
    check(done, what if done else "%s within %.0f s" % (what, timeout))
    return done


def serving(insts, want, what):
    ports = [i.port for i in insts]
    wait(what + ": the ring is whole on every instance", lambda: ring_is(ports, want))
    wait(what + ": every key reads back through every instance",
         lambda: all(reads_all(p) for p in ports))


def refused_start(name, mark, *words):
    """Starts a credentialed instance that must exit 2 with "words" in its log."""
    port = free_port()
    log = os.path.join(work, name + ".log")
    with open(log, "ab") as err:
        proc = subprocess.Popen(
            [server_bin, "--set", "server.port=%d" % port,
             "--set", "storage.path=" + os.path.join(work, name),
             "--set", "cluster.zookeeper=" + zk.hosts, "--set", "cluster.mark=%d" % mark,
             "--set", "cluster.session_timeout_ms=%d" % SESSION_MS,
             "--set", "cluster.zookeeper_auth_file=" + AUTH],
            stdout=subprocess.DEVNULL, stderr=err)
    try:
        rc = proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
    text = open(log, errors="replace").read()
    check(rc == 2 and all(w in text for w in words),
          "%s: a credentialed instance refuses the ring (exit 2, log names %s) (exit %s; log "
          "tail: %s)" % (name, ", ".join(words), rc, text[-300:].strip()))


def secure_ring(what, *extra):
    r = subprocess.run([cli_bin, "--zk", zk.hosts, "--path", ROOT, "admin", "secure-ring",
                        "--zk-auth-file", AUTH, *extra], capture_output=True, text=True,
                       timeout=60)
    check(r.returncode == 0 and r.stdout.startswith("secured "),
          "%s: flatkv admin secure-ring %s exits 0 (%d: %s%s)"
          % (what, " ".join(extra), r.returncode, r.stdout.strip(), r.stderr.strip()))


# --- 1. Bad credentials files are configuration errors ----------------------

def config_error(what, content, *words):
    path = os.path.join(work, "bad.auth")
    if os.path.exists(path):
        os.remove(path)
    if content is not None:
        with open(path, "w") as f:
            f.write(content)
    r = subprocess.run([server_bin, "--set", "storage.path=" + os.path.join(work, "cfg"),
                        "--set", "server.port=%d" % free_port(),
                        "--set", "cluster.zookeeper=" + zk.hosts,
                        "--set", "cluster.zookeeper_auth_file=" + path],
                       capture_output=True, text=True, timeout=30)
    check(r.returncode == 2 and all(w in r.stderr for w in ("cluster.zookeeper_auth_file", path) + words)
          and "s3cret" not in r.stderr,
          "config: %s is refused (exit 2, naming the key, file and reason) (%d: %s)"
          % (what, r.returncode, r.stderr.strip()))


config_error("a missing file", None, "cannot read")
config_error("a file without ':'", "flatkv-s3cret\n", "no ':'")
config_error("an empty file", "", "empty")

# --- 2. An open ring, secured in place and rolling-restarted ----------------

a1, a2, b1 = Inst("a1", A), Inst("a2", A), Inst("b1", B)
ring = [a1, a2, b1]
for i in ring:
    i.start(secure=False)
WHOLE = {A: {a1.address, a2.address}, B: {b1.address}}
wait("open ring: whole", lambda: ring_is([i.port for i in ring], WHOLE))
wait("open ring: the keys are written",
     lambda: harness.call(a1.port, lambda c: [c.put(k, value(k)) for k in KEYS]) is not None)
check(len(open_nodes()) > 0, "open ring: its nodes are open to the world, as before")

refused_start("c0", B, "is writable by anyone", "/flatkv", "admin secure-ring")
c = kazoo()
check(c.exists(ROOT + "/.cluster/marks/%d" % B) is not None and
      not any(n.startswith("thriftbinary%d:" % B) and n != b1.node()[len(ROOT) + 1:]
              for n in c.get_children(ROOT)),
      "open ring: the refused instance registered nothing")
c.stop()
c.close()

# docs/operating.md, "Securing the ring": the transitional ACL first, so the members
# still without credentials keep writing the ring (a chain's head records
# its new membership) while the others restart with them.
secure_ring("open ring", "--transitional")
bad = open_nodes(world=31)
check(not bad, "transitional: every node under %s, ephemeral members included, has digest:all, "
      "world:all (%s)" % (ROOT, "; ".join(bad[:3])))
serving(ring, WHOLE, "transitional, not yet restarted")

WRITE_KEYS = [10, 1510]  # one of mark A, one of mark B
for i in ring:
    check(harness.stop(i.proc) == 0, "rolling restart: %s stops cleanly" % i.name)
    i.start(secure=True)
    serving(ring, WHOLE, "rolling restart of " + i.name)
    # Writable again before the next restart: the chain recorded its new
    # membership, whichever of its members still runs without credentials.
    wait("rolling restart of %s: writes to both marks succeed" % i.name,
         lambda: harness.call(a2.port, lambda c: [c.put(k, value(k)) for k in WRITE_KEYS])
         is not None)
check(all("authenticating as 'flatkv'" in open(i.log, errors="replace").read() for i in ring),
      "every restarted instance logs that it authenticates as the digest user")
check("secure-ring --transitional" in open(a1.log, errors="replace").read(),
      "an instance on the transitional ACL warns that the ring is still writable by anyone")
secure_ring("every instance restarted")
bad = open_nodes()
check(not bad, "secured: every node under %s, ephemeral members included, has digest:all, "
      "world:read (%s)" % (ROOT, "; ".join(bad[:3])))
serving(ring, WHOLE, "secured")

# --- 3. Clients without the credentials, or with a wrong password -----------


def attacks(client, who):
    cluster = client.get(ROOT + "/.cluster")[0]
    check(len(client.get_children(ROOT)) >= 4 and cluster.startswith(b"{"),
          who + ": can read the ring (members, .cluster)")
    for what, fn in [
            ("create a member node", lambda: client.create(
                ROOT + "/thriftbinary%d:127.0.0.1:1" % A, b"thriftbinary%d:127.0.0.1:1" % A,
                ephemeral=True)),
            ("delete mark %d" % B, lambda: client.delete(ROOT + "/.cluster/marks/%d" % B)),
            ("set .cluster", lambda: client.set(ROOT + "/.cluster", b'{"hash_bound":7}')),
            ("delete a member node", lambda: client.delete(b1.node())),
            ("open .cluster's ACL", lambda: client.set_acls(
                ROOT + "/.cluster", [make_acl_open()]))]:
        refused, got = False, "it could"
        try:
            fn()
        except NoAuthError:
            refused = True
        except Exception as e:
            got = "got %r, not NOAUTH" % e
        check(refused, "%s: cannot %s (%s)" % (who, what, "NOAUTH" if refused else got))


def make_acl_open():
    from kazoo.security import OPEN_ACL_UNSAFE
    return OPEN_ACL_UNSAFE[0]


for who, auth in [("no credentials", None),
                  ("a wrong password", [("digest", USER + ":not-the-password")])]:
    c = kazoo(auth)
    try:
        attacks(c, who)
    finally:
        c.stop()
        c.close()
c = kazoo([("digest", "%s:%s" % (USER, PASSWORD))])
data = c.get(ROOT + "/.cluster")[0]
try:
    stat = c.set(ROOT + "/.cluster", data)
    check(c.get(ROOT + "/.cluster")[1].version == stat.version,
          "the right credentials may write (.cluster rewritten with its own settings)")
except Exception as e:
    check(False, "the right credentials may write (got %r)" % e)
c.stop()
c.close()
serving(ring, WHOLE, "after the refused changes")

# --- 4. Session expiry and a ZooKeeper restart with ACLs on ---------------


def czxid(path):
    c = kazoo()
    try:
        st = c.exists(path)
        return st.czxid if st else None
    finally:
        c.stop()
        c.close()


before = czxid(b1.node())
harness.pause(b1.proc)
time.sleep(SESSION_MS / 1000.0 * 3 + 1)
b1.proc.send_signal(signal.SIGCONT)
wait("session expiry: b1 registers again (a new member node)",
     lambda: czxid(b1.node()) not in (None, before), timeout=60)
serving(ring, WHOLE, "after b1's session expiry")
bad = open_nodes()
check(not bad, "after session expiry every node, b1's new one too, is protected (%s)"
      % "; ".join(bad[:3]))
wait("after session expiry: a write to a key of mark B succeeds",
     lambda: harness.call(a1.port, lambda c: c.put(1500, value(1500))) is None)

zk.stop()
time.sleep(1.0)
zk.start()
serving(ring, WHOLE, "after a ZooKeeper restart")
wait("after a ZooKeeper restart: writes to both marks succeed",
     lambda: harness.call(b1.port, lambda c: [c.put(k, value(k)) for k in (10, 1510)])
     is not None, timeout=60)
bad = open_nodes()
check(not bad, "after a ZooKeeper restart every node is protected (%s)" % "; ".join(bad[:3]))
c = kazoo()
refused = False
try:
    c.create(ROOT + "/thriftbinary%d:127.0.0.1:1" % A, b"x", ephemeral=True)
except NoAuthError:
    refused = True
finally:
    c.stop()
    c.close()
check(refused, "after a ZooKeeper restart a client without credentials still cannot create a member")

# --- 5. One node opened again: refused, named; secure-ring; then it joins ----

c = kazoo([("digest", "%s:%s" % (USER, PASSWORD))])
opened = ROOT + "/.cluster/marks/%d" % A
c.set_acls(opened, [make_acl_open()])
c.stop()
c.close()
refused_start("b2-refused", B, "zookeeper node " + opened + " is writable by anyone",
              "admin secure-ring")
secure_ring("one node opened again")
b2 = Inst("b2", B)
os.chmod(AUTH, 0o640)  # readable by the group: started, with a warning
b2.start(secure=True)
os.chmod(AUTH, 0o600)
ring.append(b2)
WHOLE = {A: {a1.address, a2.address}, B: {b1.address, b2.address}}
serving(ring, WHOLE, "a credentialed member joins after secure-ring")
bad = open_nodes()
check(not bad, "at the end every node is protected (%s)" % "; ".join(bad[:3]))
check("may be read by group or others" in open(b2.log, errors="replace").read(),
      "an instance whose credentials file the group may read warns about it")

# --- 6. The password is in no log ---------------------------------------------

logs = [f for f in os.listdir(work) if f.endswith(".log")]
leaked = [f for f in logs if PASSWORD in open(os.path.join(work, f), errors="replace").read()]
check(logs and not leaked, "no instance log holds the password (%d logs; leaked in %s)"
      % (len(logs), leaked))
for i in ring:
    check(harness.stop(i.proc) == 0, "%s stops cleanly" % i.name)
harness.finish(work)
