"""Replays a REAL engine's shutdown for the stop tests (not the simulator: the recorded engine, replayed).

    python replay_shutdown.py --stop-log F.stop.log --stop-json F.stop.json [--scale 0.25]

The process tree of the recorded stop (``processes_at_start`` of its stop.json: the main process and its
children; the children here die of a SIGTERM to the group, as the real scheduler did: exit -15), and on
SIGTERM the log lines the real SGLang wrote after it (tests/fixtures/sglang-0.5.17/specab-run/*.stop.log),
each at its own log time scaled by ``--scale``, with the recorded pids replaced by this tree's; after the last
line it SIGKILLs its children and then itself, as ``kill_process_tree(include_parent=True)`` does. Until the
SIGTERM it logs SGLang's ready line once and waits.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time

TS_RE = re.compile(r"^\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")
PID_RE = re.compile(r"pid=(\d+)")
READY = "[%s] The server is fired up and ready to roll!"


def log_epoch(line: str) -> float:
    m = TS_RE.match(line)
    if not m:
        raise SystemExit("replay_shutdown: a line without SGLang's time prefix: %r" % line)
    return time.mktime(time.strptime(m.group("ts"), "%Y-%m-%d %H:%M:%S"))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--stop-log", required=True)
    p.add_argument("--stop-json", required=True)
    p.add_argument("--scale", type=float, default=0.25)
    a = p.parse_args()
    with open(a.stop_log) as fh:
        lines = [ln for ln in fh.read().splitlines() if ln.strip()]
    with open(a.stop_json) as fh:
        real = [int(x["pid"]) for x in json.load(fh)["processes_at_start"]]
    children = [subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"], stdin=subprocess.DEVNULL)
                for _ in real[1:]]
    ours = dict(zip(real, [os.getpid()] + [c.pid for c in children]))
    got_term = []
    signal.signal(signal.SIGTERM, lambda *_: got_term.append(time.monotonic()))
    print(READY % time.strftime("%Y-%m-%d %H:%M:%S"), flush=True)
    while not got_term:
        signal.pause()
    t0, ts0 = got_term[0], log_epoch(lines[0])
    for line in lines:
        time.sleep(max(0.0, t0 + (log_epoch(line) - ts0) * a.scale - time.monotonic()))
        print(PID_RE.sub(lambda m: "pid=%d" % ours.get(int(m.group(1)), int(m.group(1))), line), flush=True)
    for c in children:
        try:
            os.kill(c.pid, signal.SIGKILL)
        except OSError:
            pass
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main()
