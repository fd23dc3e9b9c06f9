"""Death watcher of one simulated node: records the exact time each GPU-memory holder dies.

``python -m specab.sim.watcher STATE_DIR`` runs detached (own session, no output), one per state
directory (``watcher.lock``). It opens a pidfd per holder and polls them, so the release lag is
measured from the real death, not from the first nvidia-smi call after it. It deletes allocation
files once their memory is released and exits after ~2 s with nothing left to watch.
"""
from __future__ import annotations

import fcntl
import os
import select
import sys
import time
from pathlib import Path

from specab.sim.gpustate import Allocation, GpuNode
from specab.sim.procutil import set_title

IDLE_EXIT_S = 2.0
# A death wakes poll() at once (the holder's pidfd): this interval only bounds how soon a NEW holder is
# registered and released memory is reaped. At 0.02 s the rescans of the allocation files cost ~6 % of a core
# per node for as long as a server lived (112 s of CPU in one test-suite run, by process accounting); at 0.1 s
# there are five times fewer.
POLL_S = 0.1


def watch(state: Path) -> int:
    node = GpuNode(state)
    node.state.mkdir(parents=True, exist_ok=True)
    lock = open(node.state / "watcher.lock", "a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0  # another watcher serves this node
    poller = select.poll()
    fds: dict[int, Allocation] = {}
    watched: set[Path] = set()
    idle_since = time.monotonic()
    while True:
        now = time.time()
        for a in node.allocations():
            if a.path in watched or a.dead_at is not None:
                continue
            try:
                fd = os.pidfd_open(a.pid)
            except ProcessLookupError:
                node.record_death(a, now)
                continue
            if not a.alive:       # pid reused or a zombie: it is gone
                os.close(fd)
                node.record_death(a, now)
                continue
            fds[fd] = a
            watched.add(a.path)
            poller.register(fd, select.POLLIN)
        for fd, _ in poller.poll(POLL_S * 1000):
            a = fds.pop(fd)
            poller.unregister(fd)
            os.close(fd)
            node.record_death(a, time.time())
            watched.discard(a.path)
        remaining = node.reap_released()
        if remaining or fds:
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since > IDLE_EXIT_S:
            fcntl.flock(lock, fcntl.LOCK_UN)
            if node.allocations() and node.reap_released():
                # a holder registered while we were leaving: keep serving if nobody else took over
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return 0
                idle_since = time.monotonic()
                continue
            return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m specab.sim.watcher STATE_DIR", file=sys.stderr)
        return 2
    set_title(f"specab-sim-watcher {argv[0]}")
    return watch(Path(argv[0]))


if __name__ == "__main__":
    sys.exit(main())
