"""A foreign GPU process for tests: ``python -m specab.sim.hold --gpu 0 --mib 4000 [--state DIR]``.

Registers itself as a compute process holding ``--mib`` MiB on ``--gpu`` of the simulated node
and sits until killed (SIGTERM/SIGINT/SIGKILL). It is not a server and has no parent-death signal.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from specab.sim.gpustate import GpuNode, state_dir_from_env


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specab.sim.hold", description=__doc__)
    p.add_argument("--gpu", type=int, required=True)
    p.add_argument("--mib", type=int, required=True)
    p.add_argument("--state", help="state dir of the node (default: SPECAB_SIM_STATE)")
    p.add_argument("--title", help="process title to show (default: unchanged)")
    p.add_argument("--release-lag", type=float, default=0.15, help="seconds until memory drops after death")
    p.add_argument("--app-exit-lag", type=float, default=0.0,
                   help="seconds a dead holder stays listed in compute-apps (as '[No data]'); <= --release-lag")
    p.add_argument("--die-with-parent", action="store_true",
                   help="arm PR_SET_PDEATHSIG (SIGKILL) so the holder dies with the process that started it")
    a = p.parse_args(argv)
    if a.die_with_parent:
        from specab.sim.procutil import set_parent_death_signal
        parent = os.getppid()
        set_parent_death_signal(signal.SIGKILL)
        if os.getppid() != parent:
            return 1
    node = GpuNode(Path(a.state) if a.state else state_dir_from_env())
    try:
        node.allocate(a.gpu, a.mib, kind="foreign", release_lag_s=a.release_lag, app_exit_lag_s=a.app_exit_lag)
    except ValueError as exc:
        print(f"hold: {exc}", file=sys.stderr)
        return 1
    if a.title:
        from specab.sim.procutil import set_title
        set_title(a.title)
    print(f"holding {a.mib} MiB on GPU {a.gpu} as pid {os.getpid()}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while True:
            signal.pause()
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
