"""The Debian package (cpack -G DEB, deploy/CMakeLists.txt) installed into
this machine with dpkg, as an operator would: the files land in place, the
`flatkv` system user exists, flatkv.service is enabled but not started, the
installed flatkv-server runs (as that user) against the installed config on
a test port and answers; an upgrade keeps an edited config and the
operator's choice to disable the unit; purge removes what the package put
there.

This test changes the machine, so it refuses to run (a failure, not a skip)
where it could damage something: without root, or where a flatkv package,
/etc/flatkv or /usr/bin/flatkv-server already exists. It holds a lock file
while it runs, so two runs of it (two worktrees, two ctest runs) take turns,
and it removes the package (and the user, if it created it) however it ends;
a run killed before that leaves a marker
(/var/lib/flatkv-package-test.installed) by which the next run knows the
package is its own and removes it first.

Usage: package_test.py CPACK CPACK_CONFIG THRIFT_COMPILER FLATKV_THRIFT SOURCE_DIR"""
import fcntl
import os
import pwd
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import check  # noqa: E402

cpack, cpack_config, thrift_bin, idl, source = sys.argv[1:6]
work = harness.workdir("flatkv-package-", thrift_bin, idl)
os.chmod(work, 0o755)  # the flatkv user reaches its data directory inside
WANTS = "/etc/systemd/system/multi-user.target.wants/flatkv.service"
UNITS = "/usr/lib/systemd/system"


def sh(*cmd, timeout=300, ok=True):
    run = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout,
                         stdin=subprocess.DEVNULL)
    if ok and run.returncode != 0:
        print("$ %s\n%s%s" % (" ".join(cmd), run.stdout, run.stderr))
    return run


def dpkg(*args):
    """dpkg, waiting while another dpkg or apt holds its lock."""
    for _ in range(120):
        run = sh("dpkg", *args, ok=False)
        if run.returncode == 0 or "lock" not in run.stderr:
            if run.returncode != 0:
                print("$ dpkg %s\n%s%s" % (" ".join(args), run.stdout, run.stderr))
            return run
        time.sleep(1)
    return run


def installed():
    run = sh("dpkg-query", "-W", "-f=${Status} ${Version}", "flatkv", ok=False)
    return run.stdout if run.returncode == 0 and "ok installed" in run.stdout else ""


def server_processes():
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink("/proc/%s/exe" % pid) == "/usr/bin/flatkv-server":
                pids.append(int(pid))
        except OSError:
            pass
    return pids


def build(version):
    out = os.path.join(work, "pkg-" + version)
    run = sh(cpack, "-G", "DEB", "--config", cpack_config, "-B", out,
             "-D", "CPACK_PACKAGE_VERSION=" + version)
    check(run.returncode == 0, "cpack -G DEB builds version %s" % version)
    debs = [f for f in os.listdir(out) if f.endswith(".deb")] if run.returncode == 0 else []
    return os.path.join(out, debs[0]) if debs else None


if os.geteuid() != 0:
    check(False, "this test installs a package: run it as root (CI does)")
    harness.finish(work)

lock = open("/var/lock/flatkv-package-test.lock", "w")
fcntl.flock(lock, fcntl.LOCK_EX)  # another run of this test goes first

# A run killed mid-way (ctest's timeout) leaves its marker: what it
# installed is this test's own, so it is removed before anything else.
MARKER = "/var/lib/flatkv-package-test.installed"
if os.path.exists(MARKER):
    created_user = open(MARKER).read().strip() == "created-user"
    print("removing what a killed run of this test left installed")
    if installed():
        dpkg("--purge", "flatkv")
    if created_user:
        sh("userdel", "flatkv", ok=False)
        sh("groupdel", "flatkv", ok=False)
    os.unlink(MARKER)

problems = [what for what, bad in [
    ("a flatkv package is installed (%s)" % installed(), installed()),
    ("/etc/flatkv exists", os.path.exists("/etc/flatkv")),
    ("/usr/bin/flatkv-server exists", os.path.exists("/usr/bin/flatkv-server"))] if bad]
check(not problems, "nothing of a flatkv install is on this machine already %s" % problems)
if problems:
    harness.finish(work)
user_existed = True
try:
    pwd.getpwnam("flatkv")
except KeyError:
    user_existed = False

deb1, deb2 = build("0.1.0"), build("0.1.1")
if not (deb1 and deb2):
    harness.finish(work)
info = sh("dpkg-deb", "-f", deb1, "Depends").stdout
check("libthrift-0.17.0" in info and "libzookeeper-mt2" in info and "libspdlog" in info
      and "libjemalloc2" in info and "libisal2" in info,
      "the package depends on the runtime libraries (%s)" % info.strip())
conffiles = sh("dpkg-deb", "--info", deb1, "conffiles").stdout.split()
check(sorted(conffiles) == ["/etc/flatkv/flatkv.yaml", "/etc/flatkv/ring.yaml"],
      "the configs are conffiles (%s)" % conffiles)

we_installed = False
with open(MARKER, "w") as f:
    f.write("kept-user\n" if user_existed else "created-user\n")
try:
    run = dpkg("-i", deb1)
    we_installed = run.returncode == 0
    check(run.returncode == 0, "dpkg -i installs the package")
    check(installed().endswith("0.1.0"), "dpkg lists flatkv 0.1.0 as installed")
    for f in ["/usr/bin/flatkv-server", "/usr/bin/flatkv"]:
        check(os.access(f, os.X_OK), f + " is installed and executable")
    check(open("/etc/flatkv/flatkv.yaml").read() ==
          open(os.path.join(source, "conf/flatkv.yaml")).read(),
          "/etc/flatkv/flatkv.yaml is conf/flatkv.yaml")
    unit = open(os.path.join(UNITS, "flatkv.service")).read()
    check("ExecStart=/usr/bin/flatkv-server --config /etc/flatkv/flatkv.yaml\n" in unit,
          "flatkv.service runs the installed binary on the installed config")
    template = open(os.path.join(UNITS, "flatkv@.service")).read()
    check("ExecStart=/usr/bin/flatkv-server --config /etc/flatkv/%i.yaml\n" in template,
          "flatkv@.service runs one instance per /etc/flatkv/<name>.yaml")
    for u in ["flatkv.service", "flatkv@a.service"]:
        v = sh("systemd-analyze", "verify", u, ok=False)
        check(v.returncode == 0 and "flatkv" not in v.stdout + v.stderr,
              "systemd-analyze verify %s finds nothing (%s)" % (u, (v.stdout + v.stderr).strip()))
    try:
        pw = pwd.getpwnam("flatkv")
        check(pw.pw_uid < 1000 and pw.pw_shell.endswith("nologin"),
              "flatkv is a system user without a shell (uid %d)" % pw.pw_uid)
    except KeyError:
        pw = None
        check(False, "the package created the flatkv user")
    check(os.path.islink(WANTS) and os.readlink(WANTS).endswith("/flatkv.service"),
          "flatkv.service is enabled (multi-user.target wants it)")
    check(server_processes() == [], "and not started: no /usr/bin/flatkv-server runs")

    # The installed server, as the flatkv user, on the installed config.
    if pw is not None:
        data = os.path.join(work, "data")
        os.makedirs(data)
        os.chown(data, pw.pw_uid, pw.pw_gid)
        port = harness.free_port()

        def as_flatkv():
            os.setgid(pw.pw_gid)
            os.setgroups([])
            os.setuid(pw.pw_uid)

        log = open(os.path.join(work, "server.log"), "wb")
        proc = subprocess.Popen(["/usr/bin/flatkv-server", "--config", "/etc/flatkv/flatkv.yaml",
                                 "--set", "server.port=%d" % port, "--set", "storage.path=" + data],
                                stdout=log, stderr=log, preexec_fn=as_flatkv)
        try:
            harness.wait_port(port, proc)
            kv, t = harness.client(port)
            kv.put(7, b"installed")
            check(kv.get(7).value == b"installed", "the installed server stores and answers")
            check(kv.info().version == "0.1.0", "it reports version 0.1.0")
            t.close()
            owner = os.stat(os.path.join(data, os.listdir(data)[0])).st_uid
            check(owner == pw.pw_uid, "its files belong to the flatkv user")
        finally:
            proc.send_signal(signal.SIGTERM)
            check(proc.wait(timeout=60) == 0, "it stops cleanly on SIGTERM")
        print(open(os.path.join(work, "server.log")).read())

    # Upgrade: an edited config stays, and so does a disabled unit.
    with open("/etc/flatkv/flatkv.yaml", "a") as f:
        f.write("# edited by the operator\n")
    sh("systemctl", "disable", "flatkv.service")
    check(not os.path.lexists(WANTS), "the operator disabled flatkv.service")
    run = dpkg("-i", deb2)
    check(run.returncode == 0, "dpkg -i of 0.1.1 upgrades")
    check(installed().endswith("0.1.1"), "dpkg lists flatkv 0.1.1")
    check(open("/etc/flatkv/flatkv.yaml").read().endswith("# edited by the operator\n"),
          "the upgrade kept the edited /etc/flatkv/flatkv.yaml")
    check(not os.path.lexists(WANTS), "and left flatkv.service disabled")
finally:
    if we_installed or installed():
        run = dpkg("--purge", "flatkv")
        check(run.returncode == 0, "dpkg --purge removes the package")
    if not user_existed:
        sh("userdel", "flatkv", ok=False)
        sh("groupdel", "flatkv", ok=False)
    if not installed():
        os.unlink(MARKER)

check(installed() == "", "no flatkv package is left")
for f in ["/usr/bin/flatkv-server", "/usr/bin/flatkv", "/etc/flatkv",
          os.path.join(UNITS, "flatkv.service"), os.path.join(UNITS, "flatkv@.service"), WANTS,
          "/etc/systemd/system/flatkv.service"]:  # the mask postrm sets on remove
    check(not os.path.lexists(f), "%s is gone" % f)
harness.finish(work)
