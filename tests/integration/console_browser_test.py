#!/usr/bin/python3
"""The operator console (GET /ui) in a real browser: Debian's chromium,
headless, driven by chromedriver through python3-selenium, against a real
ring of two marks x two members (ZooKeeper by deploy/zookeeper.sh).

The page, loaded from one member, shows both marks and all four members
with their chain roles (it asks the others itself); an action with a wrong
token shows the CLI's error line; a write-mode switch through the page
changes the other member's getWriteMode(); a remove-mark started in the
page shows as a ring change with its state and percent, and the page's
abort rolls it back; a member killed with kill -9 turns into a gap in its
chain within the session timeout plus a refresh; a new member shows as
syncing while it catches up, then as the tail; with ZooKeeper stopped
every member shows itself fenced, and its role again once it is back. The
member boxes show the members' own figures (ops/s and p99 under load,
live bytes, disk use). Screenshots are kept in OUT_DIR (console_ring.png,
console_change.png, console_gap.png, console_fenced.png).

Usage: console_browser_test.py FLATKV_SERVER FLATKV_CLI THRIFT_COMPILER FLATKV_THRIFT OUT_DIR"""
import http.client
import os
import re
import signal
import subprocess
import sys
import threading
import time

import harness
from harness import check, free_port

server_bin, cli_bin, thrift_bin, idl, out_dir = sys.argv[1:6]
work = harness.workdir("flatkv-console-ui-", thrift_bin, idl)
from flatkv.ttypes import WriteMode  # noqa: E402

try:
    from selenium import webdriver
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
except ImportError as e:
    check(False, "python3-selenium is installed (deploy/install-deps.sh): %s" % e)
    harness.finish(work)

TOKEN = "ui-token"
SESSION_MS = 1500
REFRESH_S = 1.5  # the page's REFRESH_MS
LOW, HIGH = 500000, 1500000  # each owns half of [0, 2,000,000)
zk = harness.ZooKeeper(work)


class Member:
    def __init__(self, name, mark, *extra):
        self.name, self.mark = name, mark
        self.port, self.http = free_port(), free_port()
        self.address = "127.0.0.1:%d" % self.port
        self.proc = harness.start_member(
            server_bin, self.port, os.path.join(work, name), zk, mark,
            "--set", "storage.key_max=2000000", "--set", "cluster.hash_bound=2000000",
            "--set", "server.http_port=%d" % self.http, "--set", "admin.token=" + TOKEN,
            "--set", "cluster.migrate_mb_per_sec=1", "--set", "cluster.resync_mb_per_sec=1", *extra,
            log=os.path.join(work, name + ".log"), session_timeout_ms=SESSION_MS)
        harness.wait_port(self.http, self.proc)

    def call(self, fn):
        return harness.call(self.port, fn)


t0 = time.monotonic()
low_head = Member("low-a", LOW)
harness.wait_ring([low_head.port], {LOW: [low_head.address]})
low_tail = Member("low-b", LOW)
high_head = Member("high-a", HIGH)
harness.wait_ring([high_head.port], {LOW: [low_head.address, low_tail.address],
                                     HIGH: [high_head.address]})
high_tail = Member("high-b", HIGH)
members = [low_head, low_tail, high_head, high_tail]
expected = {LOW: [low_head.address, low_tail.address], HIGH: [high_head.address, high_tail.address]}
took = harness.wait_ring([m.port for m in members], expected, timeout=30)
check(took is not None, "the ring of 2 marks x 2 members forms")
if took is None:
    harness.finish(work)
harness.wait_serving(low_head.port, [1, HIGH - 1])
# About 5 MB in the high mark's range: at 1 MB/s its removal copies, and a
# new member catches up, for a few seconds.
value = b"x" * 10000
for k in range(500):
    low_head.call(lambda c: c.put(LOW + 1 + k * 1500, value))
print("ring up in %.1f s" % (time.monotonic() - t0))

# A light load for the figures: puts to the low mark, gets from the high.
load_stop = threading.Event()


def load(port, fn):
    conn = None
    while not load_stop.is_set():
        try:
            conn = conn or harness.client(port, 2000)
            fn(conn[0])
        except Exception:
            conn = None
            time.sleep(0.1)
        time.sleep(0.005)


loaders = [threading.Thread(target=load, args=(low_head.port, lambda c: c.put(7, b"v" * 64)),
                            daemon=True),
           threading.Thread(target=load, args=(high_head.port, lambda c: c.get(HIGH - 1)), daemon=True)]
for th in loaders:
    th.start()

opts = webdriver.ChromeOptions()
opts.binary_location = "/usr/bin/chromium"
for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
          "--window-size=1440,1000", "--user-data-dir=" + os.path.join(work, "chromium")):
    opts.add_argument(a)
try:
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
except WebDriverException as e:
    check(False, "chromium starts under chromedriver (deploy/install-deps.sh): %s" % e.msg)
    harness.finish(work)
driver.set_page_load_timeout(30)


def boxes():
    """{address: (role, mark, state)} of the member boxes on the page now."""
    out = {}
    for e in driver.find_elements(By.CSS_SELECTOR, ".member"):
        try:
            out[e.get_attribute("data-address")] = (e.get_attribute("data-role"),
                                                    int(e.get_attribute("data-mark")),
                                                    e.get_attribute("data-state"))
        except WebDriverException:
            return {}  # re-rendered meanwhile
    return out


def figures(address):
    """{row name: text} of a member box's table of figures."""
    box = driver.find_element(By.CSS_SELECTOR, '.member[data-address="%s"]' % address)
    out = {}
    for tr in box.find_elements(By.CSS_SELECTOR, "tr"):
        tds = tr.find_elements(By.CSS_SELECTOR, "td")
        if len(tds) == 2:
            out[tds[0].text] = tds[1].text
    return out


UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def parse_bytes(text):
    """"4.8 MiB" -> bytes; None if it is not a size."""
    m = re.fullmatch(r"([0-9.]+) (B|KiB|MiB|GiB|TiB)", text.strip())
    return float(m.group(1)) * UNITS[m.group(2)] if m else None


def http_call(member, method, path, body=None, token=None):
    """(status, body) of one request to the member's HTTP port."""
    c = http.client.HTTPConnection("127.0.0.1", member.http, timeout=30)
    try:
        c.request(method, path, body=body,
                  headers={"Authorization": "Bearer " + token} if token else {})
        r = c.getresponse()
        return r.status, r.read().decode(errors="replace")
    finally:
        c.close()


def health_of(member):
    """(status, body) of the member's /health."""
    return http_call(member, "GET", "/health")


def text_of(element_id):
    """The rendered text of the element with "element_id", read in one
    script (a refresh may replace elements between two WebDriver calls)."""
    return driver.execute_script(
        "const e = document.getElementById(arguments[0]); return e ? e.innerText : ''",
        element_id)


def wait(what, cond, timeout=20.0):
    t = time.monotonic()
    while time.monotonic() - t < timeout:
        try:
            if cond():
                return time.monotonic() - t
        except WebDriverException:
            pass
        time.sleep(0.1)
    check(False, "%s within %.0f s" % (what, timeout))
    return None


def click(selector, timeout=10.0):
    """Clicks the element (re-found if a refresh replaced it)."""
    def go():
        driver.find_element(By.CSS_SELECTOR, selector).click()
        return True
    return wait("click " + selector, go, timeout) is not None


def confirm_and_read():
    """Confirms the page's question; returns (class, text) of its answer."""
    driver.execute_script("document.getElementById('result').className = '';")
    click("#confirm-yes")
    got = {}

    def answered():
        r = driver.find_element(By.ID, "result")
        got["v"] = (r.get_attribute("class"), r.text)
        return got["v"][0] in ("ok", "error")
    wait("an answer to the action", answered)
    return got.get("v", ("", ""))


def set_token(token):
    t = driver.find_element(By.ID, "token")
    t.clear()
    t.send_keys(token)


def shot(name):
    path = os.path.join(out_dir, name)
    driver.save_screenshot(path)
    check(os.path.getsize(path) > 10000, "screenshot %s kept (%d bytes)" % (path, os.path.getsize(path)))


try:
    driver.get("http://127.0.0.1:%d/ui" % low_head.http)
    want = {low_head.address: ("head", LOW, "serving"), low_tail.address: ("tail", LOW, "serving"),
            high_head.address: ("head", HIGH, "serving"),
            high_tail.address: ("tail", HIGH, "serving")}
    took = wait("the page shows both marks and four members with their roles",
                lambda: boxes() == want and
                len(driver.find_elements(By.CSS_SELECTOR, ".mark-card")) == 2 and
                len(driver.find_elements(By.CSS_SELECTOR, "#ring g.mark")) == 2)
    check(took is not None, "both marks and four members with roles: %r" % boxes())
    # Read in one script: the page re-renders every second, and elements
    # found one call earlier may be gone by the next.
    cards = driver.execute_script(
        "return Array.from(document.querySelectorAll('.mark-card'), e => Number(e.dataset.mark))")
    check(cards == [LOW, HIGH], "the marks in ring order: %r" % cards)
    legend = text_of("legend")
    check("50.0 %" in legend, "each mark holds half of the keys: %r" % legend)
    wait("every member's figures", lambda: all(
        "ops/s" in driver.find_element(By.CSS_SELECTOR, '.member[data-address="%s"]' % m.address).text
        for m in members))
    # The figures are the members' own: the puts' member counts calls and
    # a latency, the high mark's members hold its ~5 MB, and each shows
    # its disk's use.
    got = {}

    def figures_in():
        got["low"], got["high"] = figures(low_head.address), figures(high_head.address)
        return (got["low"].get("ops/s", "0").isdigit() and int(got["low"]["ops/s"]) > 0 and
                re.fullmatch(r"[0-9.]+ (µs|ms)", got["low"].get("p99", "")) is not None)
    took = wait("the put load's ops/s and p99 in its member's box", figures_in)
    check(took is not None, "ops/s and p99 shown for %s: %r" % (low_head.name, got.get("low")))
    live = parse_bytes(got["high"].get("live", ""))
    check(live is not None and 4.5e6 <= live <= 16e6,
          "the high mark's head shows the ~5 MB it holds as live bytes: %r" % got["high"].get("live"))
    disk = re.fullmatch(r"(.+) used of (.+)", got["high"].get("disk", ""))
    used, total = (parse_bytes(disk.group(1)), parse_bytes(disk.group(2))) if disk else (None, None)
    check(used is not None and total is not None and 0 < used <= total,
          "the disk row shows used of total: %r" % got["high"].get("disk"))
    check(got["high"].get("compaction") == "idle" and got["high"].get("lag", "").endswith("writes"),
          "compaction idle and the lag in writes: %r" % got["high"])
    shot("console_ring.png")

    # A wrong token: the CLI's error line, nothing done.
    set_token("wrong")
    click('.member[data-address="%s"] .act-compact' % high_head.address)
    text = driver.find_element(By.ID, "confirm-text").text
    check(high_head.address in text, "the page asks first: %r" % text)
    cls, text = confirm_and_read()
    cli = subprocess.run([cli_bin, "--port", str(high_head.port), "--token", "wrong", "admin", "compact"],
                         capture_output=True, text=True, timeout=30)
    check(cls == "error" and text == cli.stderr.strip() == "flatkv: Unauthorized: wrong admin token",
          "a wrong token shows the CLI's line: %r (CLI: %r)" % (text, cli.stderr.strip()))

    # Cancel asks nothing of the server.
    set_token(TOKEN)
    click('.member[data-address="%s"] .act-write-mode' % high_tail.address)
    click("#confirm-no")
    time.sleep(0.3)
    check(high_tail.call(lambda c: c.getWriteMode()) == WriteMode.SAFE, "cancel leaves the mode safe")

    # The switch, on another member than the one serving the page.
    click('.member[data-address="%s"] .act-write-mode' % high_tail.address)
    cls, text = confirm_and_read()
    check(cls == "ok" and text == "write mode of %s is now async" % high_tail.address,
          "the page reports the switch: %r" % text)
    check(high_tail.call(lambda c: c.getWriteMode()) == WriteMode.ASYNC,
          "getWriteMode() of %s is ASYNC" % high_tail.name)
    wait("the page shows the new mode", lambda: "write mode async" in driver.find_element(
        By.CSS_SELECTOR, '.member[data-address="%s"]' % high_tail.address).text.replace("\n", " "))

    # A ring change: started and aborted in the page.
    click('.mark-card[data-mark="%d"] .act-remove-mark' % HIGH)
    cls, text = confirm_and_read()
    check(cls == "ok" and text == "removal of mark %d started" % HIGH, "remove-mark started: %r" % text)
    def copying():
        t = driver.find_element(By.ID, "change-table")
        p = t.get_attribute("data-percent")
        return t.get_attribute("data-state") in ("precopy", "copy") and p and 0 < int(p) < 100
    took = wait("the change with its state and a percent between 0 and 100", copying)
    change_text = text_of("change")
    check(took is not None and "remove mark %d" % HIGH in change_text,
          "the page shows the change: %r" % change_text.replace("\n", " | "))
    shot("console_change.png")
    click(".act-abort-change")
    cls, text = confirm_and_read()
    check(cls == "ok" and text == "ring change rolled back", "the page's abort rolls it back: %r" % text)
    wait("the change gone from the page", lambda: driver.find_element(By.ID, "change").text == "none")
    check(harness.ring_change_of(low_head.port) is None, "no change node after the abort")
    took = harness.wait_ring([m.port for m in members], expected, timeout=20)
    check(took is not None, "the ring is as before the change: %r, change %r" % (
        harness.ring_of(low_head.port)[0], harness.ring_change_of(low_head.port)))

    # kill -9: a gap within the session timeout plus a refresh.
    high_tail.proc.send_signal(signal.SIGKILL)
    high_tail.proc.wait()
    t_kill = time.monotonic()
    limit = SESSION_MS / 1000 + REFRESH_S
    took = wait("the killed member as a gap", lambda: boxes().get(high_tail.address, ("",))[0] == "gone"
                and boxes().get(high_head.address, ("",))[0] == "single", timeout=30)
    took = time.monotonic() - t_kill if took is not None else None
    print("gap shown %.1f s after kill -9 (session %.1f s + refresh %.1f s)" %
          (took or -1, SESSION_MS / 1000, REFRESH_S))
    # ZooKeeper expires a session within its timeout plus its tick; the
    # slack is for a loaded CI machine.
    check(took is not None and took <= limit + 3.0,
          "the gap shows within session + refresh (+3 s slack): %.1f s" % (took or -1))
    gap = driver.find_elements(By.CSS_SELECTOR, '.member.gap[data-address="%s"]' % high_tail.address)
    check(len(gap) == 1, "the gap is drawn in mark %d's chain" % HIGH)
    shot("console_gap.png")

    # A new member catching up from the tail (1 MB/s): syncing, then tail.
    joiner = Member("high-c", HIGH)
    members.append(joiner)
    took = wait("the joiner shown as syncing", lambda: boxes().get(joiner.address, ("",))[0] == "syncing")
    check(took is not None and boxes()[joiner.address][2] == "joining",
          "a member catching up is shown as syncing: %r" % (boxes().get(joiner.address),))
    took = wait("the joiner as the new tail", lambda: boxes().get(joiner.address) == ("tail", HIGH, "serving"),
                timeout=40)
    check(took is not None, "once caught up it is the tail of mark %d" % HIGH)
    # ZooKeeper down: every member's lease lapses within half a session
    # timeout and each shows itself fenced; back, so are the roles.
    live_members = [low_head, low_tail, high_head, joiner]
    zk.stop()
    took = wait("every member shown fenced while ZooKeeper is down",
                lambda: all(boxes().get(m.address, ("",))[0] == "fenced" for m in live_members))
    check(took is not None, "every member fenced without ZooKeeper: %r" % boxes())
    shot("console_fenced.png")
    health = health_of(low_head)
    check(health[0] == 503 and "no ZooKeeper lease" in health[1],
          "/health says the member refuses calls without a lease: %r" % (health,))
    zk.start()
    # (A session that expired meanwhile re-registers, and may come back as
    # the other end of its chain.)
    back = sorted([("head", LOW, "serving"), ("tail", LOW, "serving"),
                   ("head", HIGH, "serving"), ("tail", HIGH, "serving")])
    wait("/health ok again once ZooKeeper answers", lambda: health_of(low_head)[0] == 200)
    took = wait("the roles back once ZooKeeper is", lambda: sorted(
        r for a, r in boxes().items() if a in {m.address for m in live_members}) == back, timeout=40)
    check(took is not None, "roles back after ZooKeeper restarts: %r" % boxes())
    # An action on a member that does not answer (SIGSTOP) waits for it, up
    # to cluster.peer_timeout_ms, and so does a /kv write to its mark (its
    # chain waits for it): both off the HTTP loop, so the instance's
    # /health answers meanwhile, before either does.
    t_stop = time.monotonic()
    stopped = harness.pause(joiner.proc)
    check(stopped, "every thread of the joiner stopped (SIGSTOP) within %.3f s" %
          (time.monotonic() - t_stop))
    done = {}

    def timed(name, method, path, body=None, token=None):
        status, text = http_call(low_head, method, path, body, token)
        done[name] = (time.monotonic(), status, text)
    action = threading.Thread(target=timed, args=(
        "action", "PUT", "/admin/members/%s/write-mode" % joiner.address, "async", TOKEN))
    kv = threading.Thread(target=timed, args=("kv", "PUT", "/kv/%d" % (HIGH - 1), "while stopped"))
    action.start()
    kv.start()
    time.sleep(0.3)  # both are waiting on the stopped member
    timed("health", "GET", "/health")
    action.join(timeout=30)
    kv.join(timeout=30)
    joiner.proc.send_signal(signal.SIGCONT)
    check("action" in done and "kv" in done and "health" in done and done["health"][1] == 200 and
          done["health"][0] < min(done["action"][0], done["kv"][0]),
          "/health answers while an action and a write wait on a stopped member: %r" % done)
    check(done.get("action", (0, 0, ""))[1] >= 500 and joiner.address in done["action"][2],
          "the action on the stopped member fails naming it: %r" % (done.get("action"),))
    # (The 401 of the wrong token is logged by the browser as a network
    # error: expected; a script error is not.)
    logs = [e for e in driver.get_log("browser")
            if e.get("level") == "SEVERE" and e.get("source") != "network"]
    check(not logs, "no error in the browser's console: %r" % logs[:3])
finally:
    load_stop.set()
    driver.quit()
print("console browser test took %.1f s" % (time.monotonic() - t0))
for m in members:
    if m.proc.poll() is None:
        harness.stop(m.proc)
harness.finish(work)
