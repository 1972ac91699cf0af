"""Log rotation by size (log.file, log.max_size, log.max_files) with the real
server: restarts append to the log until it would pass log.max_size, then it
moves to NAME.1.EXT (older ones shift up), at most log.max_files rotated
files are kept and the oldest lines are gone; log.max_size: 0 never rotates.

Usage: log_rotation_test.py FLATKV_SERVER THRIFT_COMPILER FLATKV_THRIFT"""
import glob
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import check  # noqa: E402

server_bin = sys.argv[1]
work = harness.workdir("flatkv-logrot-")
log = os.path.join(work, "logs", "flatkv.log")
os.makedirs(os.path.dirname(log))
data = os.path.join(work, "data")
MAX = 1024


def run_once(*extra):
    """One start and clean stop; each writes a few info lines (~0.7 KB)."""
    port = harness.free_port()
    proc = harness.start(server_bin, port, data, "--set", "log.file=" + log, *extra)
    check(harness.stop(proc) == 0, "the server on port %d stops cleanly" % port)
    return port


ports = [run_once("--set", "log.max_size=%d" % MAX, "--set", "log.max_files=2")
         for _ in range(8)]
files = sorted(os.path.basename(f) for f in glob.glob(os.path.join(work, "logs", "*")))
check(files == ["flatkv.1.log", "flatkv.2.log", "flatkv.log"],
      "the current log and exactly 2 rotated ones (%s)" % files)
texts = {f: open(os.path.join(work, "logs", f)).read() for f in files}
for f, text in texts.items():
    # spdlog rotates before a line that would pass the limit: a file holds
    # at most MAX bytes unless one line alone is longer.
    longest = max((len(line) + 1 for line in text.splitlines()), default=0)
    check(len(text) <= max(MAX, longest), "%s holds %d bytes, within log.max_size" % (f, len(text)))
check("serving FlatKV on port %d" % ports[-1] in texts["flatkv.log"] and
      "stopped cleanly" in texts["flatkv.log"].split("serving FlatKV on port %d" % ports[-1])[1],
      "the current file ends with the last run")
everything = "".join(texts.values())
check("port %d" % ports[0] not in everything, "the first run's lines were rotated away")
check("port %d" % ports[-2] in texts["flatkv.log"] + texts["flatkv.1.log"],
      "the run before the last is in the newest two files")

# 0 = never rotate: the file only grows.
before = os.path.getsize(log)
for _ in range(3):
    run_once("--set", "log.max_size=0")
after = sorted(os.path.basename(f) for f in glob.glob(os.path.join(work, "logs", "*")))
check(after == files and os.path.getsize(log) > max(before, MAX),
      "with log.max_size: 0 the file grows past %d bytes (%d) and nothing rotates"
      % (MAX, os.path.getsize(log)))
harness.finish(work)
