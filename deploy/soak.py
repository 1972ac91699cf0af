#!/usr/bin/python3
"""The soak of deploy/soak.sh (which builds and calls this): one real
flatkv-server under a mixed load for MINUTES, sampled every SAMPLE seconds.
Default configuration but for two keys sized to the soak's data: the
string-key table has 65536 slots (about the string keys: docs/engine.md, "String
keys"), and segments hold 4096 keys, so the 24,000 integer keys span six
tables as any store of more than 2^24 keys spans many: compaction rewrites
one table at a time, so it needs room for one table's live data, not the
whole store's. The calls are paced (FLATKV_SOAK_RATE, 3000 calls/s in all
by default, about a third of what these clients reach flat out here; 0 =
flat out): a soak looks for drift under a steady load, not for the
ceiling, and flat out on two shared cores the writes (about 5 MB/s)
outrun the single compactor, so garbage, and the disk, grow past 2x.

Load: PROCS processes x THREADS threads, each its own connection and its
own keys, so each thread knows every value its keys must hold and checks
every read against that model: puts, gets, appends (a value is rewritten
whole once it passes 8 KiB, so live data stays bounded), removes, multiPut
and multiGet, key-order scans, string keys (sput/sget/sremove). One admin
thread switches the write mode (safe <-> async) every 20 s and starts a
compaction every 60 s (automatic compactions run as well).

Sampled: the server's RSS (/proc/PID/status VmRSS), open descriptors
(/proc/PID/fd), disk usage (allocated blocks of every file in the data
directory), the live data the threads' models hold (key and value bytes),
calls done, and whether a compaction runs; written to OUT/soak.csv and
drawn in OUT/soak.png.

Checks (the exit status is 1 and the reason printed if one fails): no
call failed and no read differed from the model; the server stayed up;
after the warm-up (a quarter of the run, at least 60 s) RSS and
descriptors stay within +-10 % of their median over the rest of the run
(descriptors judged outside compactions: a compaction holds a second
generation of one table open, 17 more at the default data_files, and
says so in compactionStatus); the disk stays within 2x the live data.

Usage: soak.py SERVER THRIFT IDL OUT MINUTES"""
import multiprocessing as mp
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

SAMPLE = 5.0
PROCS = 2
THREADS = 8
KEYS = 1500        # integer keys per thread
SKEYS = 100        # string keys per thread
MAX_VALUE = 8192   # an appended value past this is rewritten whole
RATE = float(os.environ.get("FLATKV_SOAK_RATE", "3000"))  # calls/s in all; 0 = flat out


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def client(port):
    from thrift.protocol import TBinaryProtocol
    from thrift.transport import TSocket, TTransport
    from flatkv import FlatKV
    sock = TSocket.TSocket("127.0.0.1", port)
    sock.setTimeout(30000)
    t = TTransport.TFramedTransport(sock)
    t.open()
    return FlatKV.Client(TBinaryProtocol.TBinaryProtocol(t)), t


def fresh(rnd, tag):
    n = rnd.randint(100, 2000)
    head = b"%s|" % tag
    return (head + bytes([97 + rnd.randrange(26)]) * n)[:max(n, len(head))]


def worker(port, proc, thread, stop, counters, live, bad):
    """One connection; keys proc*THREADS+thread + n*PROCS*THREADS."""
    from flatkv.ttypes import KvPair
    rnd = random.Random(proc * 1000 + thread)
    me = proc * THREADS + thread
    stride = PROCS * THREADS
    keys = [me + n * stride for n in range(KEYS)]
    skeys = [b"s:%d:%d" % (me, n) for n in range(SKEYS)]
    model, smodel = {}, {}
    kv, t = client(port)

    def note_live():
        live[thread] = sum(8 + len(v) for v in model.values()) + \
            sum(len(k) + len(v) for k, v in smodel.items())

    def fail(what):
        bad.put("proc %d thread %d: %s" % (proc, thread, what))

    ops = 0
    interval = PROCS * THREADS / RATE if RATE > 0 else 0.0
    next_at = time.monotonic()
    while not stop.is_set():
        if interval:
            next_at += interval
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        r = rnd.random()
        try:
            if r < 0.30:
                k = rnd.choice(keys)
                got = kv.get(k)
                want = model.get(k)
                if (got.value if got.found else None) != want:
                    fail("get %d: %r, model %r" % (k, got.value[:30] if got.found else None,
                                                   want and want[:30]))
            elif r < 0.50:
                k = rnd.choice(keys)
                model[k] = fresh(rnd, b"%d" % k)
                kv.put(k, model[k])
            elif r < 0.60:
                k = rnd.choice(keys)
                if len(model.get(k, b"")) > MAX_VALUE:
                    model[k] = fresh(rnd, b"%d" % k)
                    kv.put(k, model[k])
                else:
                    part = b"+%d" % rnd.randrange(10 ** 6) * rnd.randint(1, 20)
                    model[k] = model.get(k, b"") + part
                    kv.append(k, part)
            elif r < 0.66:
                k = rnd.choice(keys)
                existed = kv.remove(k)
                if existed != (k in model):
                    fail("remove %d said %s, model %s" % (k, existed, k in model))
                model.pop(k, None)
            elif r < 0.72:
                batch = rnd.sample(keys, 20)
                for k in batch:
                    model[k] = fresh(rnd, b"%d" % k)
                kv.multiPut([KvPair(k, model[k]) for k in batch])
            elif r < 0.78:
                batch = rnd.sample(keys, 20)
                for k, g in zip(batch, kv.multiGet(batch)):
                    if (g.value if g.found else None) != model.get(k):
                        fail("multiGet %d differs from the model" % k)
            elif r < 0.82:
                frm = rnd.choice(keys)
                rev = rnd.random() < 0.5
                res = kv.scan(frm, 50, rev)
                for p in res.pairs:
                    if p.key % stride == me and model.get(p.key) != p.value:
                        want = model.get(p.key)
                        fail("scan from %d (%s): key %d is %r (%d bytes), the model %r (%s)" %
                             (frm, "reverse" if rev else "forward", p.key, p.value[:40],
                              len(p.value), want and want[:40],
                              "%d bytes" % len(want) if want is not None else "absent"))
            elif r < 0.92:
                k = rnd.choice(skeys)
                smodel[k] = fresh(rnd, k)
                kv.sput(k, smodel[k])
            elif r < 0.97:
                k = rnd.choice(skeys)
                got = kv.sget(k)
                if (got.value if got.found else None) != smodel.get(k):
                    fail("sget %r differs from the model" % k)
            else:
                k = rnd.choice(skeys)
                existed = kv.sremove(k)
                if existed != (k in smodel):
                    fail("sremove %r said %s, model %s" % (k, existed, k in smodel))
                smodel.pop(k, None)
            ops += 1
            if ops % 200 == 0:
                counters[thread] = ops
                note_live()
        except Exception as e:  # noqa: BLE001 (a failed call fails the soak)
            fail("call failed: %r" % e)
            time.sleep(0.5)
            try:
                t.close()
                kv, t = client(port)
            except Exception:
                pass
    counters[thread] = ops
    note_live()
    t.close()


def driver(port, proc, stop, counters, live, bad, gen_dir):
    sys.path.insert(0, gen_dir)
    threads = [threading.Thread(target=worker, args=(port, proc, i, stop, counters, live, bad))
               for i in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()


def admin(port, stop, bad, gen_dir):
    sys.path.insert(0, gen_dir)
    from flatkv.ttypes import WriteMode
    last_mode, last_compact, mode = time.monotonic(), time.monotonic(), WriteMode.SAFE
    while not stop.wait(1.0):
        try:
            kv, t = client(port)
            now = time.monotonic()
            if now - last_mode >= 20:
                mode = WriteMode.ASYNC if mode == WriteMode.SAFE else WriteMode.SAFE
                kv.setWriteMode("", mode)
                last_mode = now
            if now - last_compact >= 60:
                kv.compact("")
                last_compact = now
            t.close()
        except Exception as e:  # noqa: BLE001
            bad.put("admin call failed: %r" % e)


def disk_bytes(path):
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except FileNotFoundError:
                pass  # a compaction removed it meanwhile
    return total


def rss_bytes(pid, field="VmRSS:"):
    """VmRSS (everything resident, mapped file pages too) or RssAnon (heap)."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    return 0


def compacting(port):
    try:
        kv, t = client(port)
        try:
            return kv.compactionStatus().running
        finally:
            t.close()
    except Exception:
        return False


def within(values, pct):
    """(ok, median, lowest, highest): every value within pct of the median."""
    med = statistics.median(values)
    lo, hi = min(values), max(values)
    return lo >= med * (1 - pct) and hi <= med * (1 + pct), med, lo, hi


def plot(rows, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    t = [r["t"] / 60 for r in rows]
    fig, ax = plt.subplots(4, 1, figsize=(10, 11), sharex=True)
    ax[0].plot(t, [r["rss"] / 2 ** 20 for r in rows], label="RSS")
    ax[0].plot(t, [r["anon"] / 2 ** 20 for r in rows], label="of which anonymous (heap)")
    ax[0].set_ylabel("MiB")
    ax[0].legend(loc="lower right")
    ax[1].plot(t, [r["fds"] for r in rows])
    ax[1].set_ylabel("open descriptors")
    ax[2].plot(t, [r["disk"] / 2 ** 20 for r in rows], label="disk (allocated)")
    ax[2].plot(t, [r["live"] / 2 ** 20 for r in rows], label="live data")
    ax[2].plot(t, [2 * r["live"] / 2 ** 20 for r in rows], ":", label="2 x live data")
    ax[2].set_ylabel("MiB")
    ax[2].legend(loc="upper left")
    rate = [0] + [(b["ops"] - a["ops"]) / max(1e-9, b["t"] - a["t"]) for a, b in zip(rows, rows[1:])]
    ax[3].plot(t, rate)
    ax[3].set_ylabel("calls/s")
    ax[3].set_xlabel("minutes")
    for r in rows:
        if r["compacting"]:
            for a in ax:
                a.axvline(r["t"] / 60, color="0.9", zorder=0)
    fig.suptitle("flatkv soak: %d connections, %s calls/s, %.0f min" %
                 (PROCS * THREADS, "%.0f" % RATE if RATE > 0 else "flat out", t[-1]))
    fig.tight_layout()
    fig.savefig(out, dpi=90)


def main():
    server_bin, thrift_bin, idl, out, minutes = sys.argv[1:6]
    seconds = float(minutes) * 60
    os.makedirs(out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="flatkv-soak-")
    subprocess.run([thrift_bin, "--gen", "py", "-out", work, idl], check=True)
    sys.path.insert(0, work)
    data = os.path.join(work, "data")
    port = free_port()
    log = open(os.path.join(out, "server.log"), "wb")
    server = subprocess.Popen([server_bin, "--set", "server.port=%d" % port,
                               "--set", "storage.path=" + data,
                               "--set", "storage.string_slots=65536",
                               "--set", "storage.segment_keys=4096"],
                              stdout=subprocess.DEVNULL, stderr=log)
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    stop = mp.Event()
    bad = mp.Queue()
    counters = [mp.Array("q", THREADS) for _ in range(PROCS)]
    lives = [mp.Array("q", THREADS) for _ in range(PROCS)]
    procs = [mp.Process(target=driver, args=(port, p, stop, counters[p], lives[p], bad, work))
             for p in range(PROCS)]
    procs.append(mp.Process(target=admin, args=(port, stop, bad, work)))
    for p in procs:
        p.start()
    rows, problems = [], []
    t0 = time.monotonic()
    csv = open(os.path.join(out, "soak.csv"), "w")
    csv.write("seconds,rss_bytes,rss_anon_bytes,open_fds,disk_bytes,live_bytes,calls,compacting\n")
    try:
        while time.monotonic() - t0 < seconds:
            time.sleep(SAMPLE)
            if server.poll() is not None:
                problems.append("the server exited with %d" % server.returncode)
                break
            # Whether a compaction runs is asked before and after the
            # descriptors are counted: compactions follow each other closely,
            # and one that ended between the count and a single question
            # would pass its second generation's descriptors for a leak.
            was = compacting(port)
            row = {"t": time.monotonic() - t0, "rss": rss_bytes(server.pid),
                   "anon": rss_bytes(server.pid, "RssAnon:"),
                   "fds": len(os.listdir("/proc/%d/fd" % server.pid)), "disk": disk_bytes(data),
                   "live": sum(sum(a) for a in lives), "ops": sum(sum(a) for a in counters)}
            row["compacting"] = compacting(port) or was
            rows.append(row)
            csv.write("%.1f,%d,%d,%d,%d,%d,%d,%d\n" % (
                row["t"], row["rss"], row["anon"], row["fds"], row["disk"], row["live"], row["ops"],
                row["compacting"]))
            csv.flush()
            print("%6.0f s  rss %6.1f MiB (anon %6.1f)  fds %4d  disk %7.1f MiB  live %7.1f MiB  calls %d%s" %
                  (row["t"], row["rss"] / 2 ** 20, row["anon"] / 2 ** 20, row["fds"], row["disk"] / 2 ** 20,
                   row["live"] / 2 ** 20, row["ops"], "  compacting" if row["compacting"] else ""),
                  flush=True)
    finally:
        stop.set()
        for p in procs:
            p.join(timeout=60)
        try:
            kv, t = client(port)
            st = kv.stats()
            t.close()
            print("compactions: %d tables compacted; writes that waited for the compactor: %d "
                  "(%.1f s in all)" % (st.get("compaction.tables_compacted", -1),
                                      st.get("engine.write_stalls", -1),
                                      st.get("engine.write_stall_ms", 0) / 1000.0))
        except Exception as e:  # noqa: BLE001 (the server may be gone: reported below)
            print("stats at the end: %r" % e)
        server.send_signal(signal.SIGTERM)
        try:
            code = server.wait(timeout=120)
        except subprocess.TimeoutExpired:
            server.kill()
            code = "killed after 120 s"
        if code != 0:
            problems.append("SIGTERM: the server exited with %s" % code)
        csv.close()
    while not bad.empty():
        problems.append(bad.get())
    if rows:
        plot(rows, os.path.join(out, "soak.png"))
    warm = max(60.0, seconds / 4)
    after = [r for r in rows if r["t"] >= warm]
    if len(after) < 3:
        problems.append("too few samples after the %.0f s warm-up (%d)" % (warm, len(after)))
    else:
        ok, med, lo, hi = within([r["rss"] for r in after], 0.10)
        print("RSS after warm-up: median %.1f MiB, %.1f .. %.1f MiB (first sample %.1f, last %.1f;"
              " anonymous %.1f .. %.1f)" %
              (med / 2 ** 20, lo / 2 ** 20, hi / 2 ** 20, rows[0]["rss"] / 2 ** 20,
               rows[-1]["rss"] / 2 ** 20, min(r["anon"] for r in after) / 2 ** 20,
               max(r["anon"] for r in after) / 2 ** 20))
        if not ok:
            problems.append("RSS left +-10%% of its median %.1f MiB: %.1f .. %.1f MiB" %
                            (med / 2 ** 20, lo / 2 ** 20, hi / 2 ** 20))
        quiet = [r["fds"] for r in after if not r["compacting"]] or [r["fds"] for r in after]
        ok, med, lo, hi = within(quiet, 0.10)
        print("open descriptors after warm-up (outside compactions): median %d, %d .. %d "
              "(all samples %d .. %d; first %d, last %d)" %
              (med, lo, hi, min(r["fds"] for r in after), max(r["fds"] for r in after),
               rows[0]["fds"], rows[-1]["fds"]))
        if not ok:
            problems.append("open descriptors left +-10%% of their median %d: %d .. %d" %
                            (med, lo, hi))
        worst = max(after, key=lambda r: r["disk"] / max(1, r["live"]))
        print("disk after warm-up: at most %.2f x live data (%.1f MiB on disk, %.1f MiB live, "
              "at %.0f s); end %.1f MiB on disk, %.1f MiB live" %
              (worst["disk"] / max(1, worst["live"]), worst["disk"] / 2 ** 20,
               worst["live"] / 2 ** 20, worst["t"], rows[-1]["disk"] / 2 ** 20,
               rows[-1]["live"] / 2 ** 20))
        if worst["disk"] > 2 * worst["live"]:
            problems.append("disk %.1f MiB passed 2x the live data (%.1f MiB) at %.0f s" %
                            (worst["disk"] / 2 ** 20, worst["live"] / 2 ** 20, worst["t"]))
    if rows:
        print("%d calls in %.0f s (%.0f/s) from %d connections; CSV and PNG in %s" %
              (rows[-1]["ops"], rows[-1]["t"], rows[-1]["ops"] / rows[-1]["t"], PROCS * THREADS,
               out))
    subprocess.run(["rm", "-rf", work])
    if problems:
        print("SOAK FAILED:")
        for p in problems[:20]:
            print("  " + p)
        if len(problems) > 20:
            print("  ... and %d more" % (len(problems) - 20))
        return 1
    print("SOAK PASSED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
