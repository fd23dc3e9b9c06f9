#!/usr/bin/env python3
"""A run's teardown, the same on both paths: its server stopped (the run's helpers first), then its GPUs verified
free, the wait started as soon as stop has seen our processes gone, so that its polls overlap stop's GPU sweep
(server.json still names our session: an orphan the sweep kills is ours to wait for, never refused).

``stop_and_free`` is the one sequence: the run queue's ``RunSteps.teardown`` runs it in the sequencer's process (then
writes the manifest and done.json); this tool runs it for a failed run of the per-run playbook (run_arm.yml's rescue,
whose collect role then writes the manifest and fetches the run), and reports the phases it began with their times
from its start, for the driver to record as the run queue's phases.jsonl records them. stdlib only.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from specab.node import cli, gpufree
from specab.node import stop as stop_tool
from specab.node.cli import ToolError

Result = Optional[Dict[str, Any]]


def stop_and_free(stop: Callable[[Callable[[], None]], Dict[str, Any]], wait_free: Callable[[], Dict[str, Any]],
                  begin: Callable[[str], None], stop_needed: bool) -> Tuple[Result, Result, Optional[Tuple[str, str]]]:
    """Stop the server (when ``stop_needed``; ``stop(on_gone)`` calls ``on_gone`` once our processes are gone), then
    wait until the GPUs are free (``wait_free``), ``begin`` told each phase as it begins ("stopping", "gpus free").
    Returns stop's result, the wait's result and the (phase, error) of the step that failed, if one did: a failed
    stop leaves the wait's outcome unused (the GPUs cannot be ours to judge)."""
    free: Dict[str, Any] = {}

    def run_free() -> None:
        try:
            free["out"] = wait_free()
        except ToolError as exc:
            free["error"] = exc.message
        except Exception as exc:  # reported as a failed GPU check, never lost in the thread
            free["error"] = "internal error: %s: %s" % (type(exc).__name__, exc)

    def start_free() -> None:
        if "thread" not in free:
            begin("gpus free")
            free["thread"] = threading.Thread(target=run_free, name="gpus-free", daemon=True)
            free["thread"].start()

    stopped: Result = None
    failed: Optional[Tuple[str, str]] = None
    if stop_needed:
        begin("stopping")
        try:
            stopped = stop(start_free)
        except ToolError as exc:
            failed = ("stopping", exc.message)
    if failed is None:
        start_free()
    if "thread" in free:
        free["thread"].join()
    else:
        begin("gpus free")
    if failed is None and "error" in free:
        failed = ("gpus free", free["error"])
    return stopped, free.get("out"), failed


@dataclass
class TeardownSpec:
    """A failed run's teardown on the per-run path (every setting from the controller, none from a literal here)."""
    node_dir: str
    smi: List[str]
    gpus: str
    grace: float = cli.arg("stop: seconds from SIGTERM to SIGKILL (specab_stop_grace_s)")
    gpu_free_timeout: float = cli.arg("seconds to wait for free GPUs (specab_gpu_free_timeout_s)")
    threshold_mib: float = cli.arg("a GPU is free at most this many MiB used (specab_gpu_free_threshold_mib)")
    run_dir: Optional[str] = cli.arg("the run's directory once its server was started: stop.json, gpu_free.json and "
                                     "gpu_free.csv are written there (none: nothing of the run is recorded)",
                                     default=None)


def teardown(a: TeardownSpec) -> Dict[str, Any]:
    t0 = time.time()
    out: Dict[str, Any] = {"phases": []}

    def path(name: str) -> Optional[str]:
        return os.path.join(a.run_dir, name) if a.run_dir else None

    def begin(phase: str) -> None:
        out["phases"].append({"phase": phase, "t_rel_s": round(time.time() - t0, 4)})

    def stop(on_gone: Callable[[], None]) -> Dict[str, Any]:
        s = stop_tool.StopSpec(node_dir=a.node_dir, smi=list(a.smi), grace=a.grace, out=path("stop.json"))
        return cli.recorded(s.out, lambda: stop_tool.stop(s, on_gone=on_gone))

    def wait_free() -> Dict[str, Any]:
        g = gpufree.GpuFreeSpec(smi=list(a.smi), gpus=a.gpus, threshold_mib=a.threshold_mib,
                                timeout=a.gpu_free_timeout, node_dir=a.node_dir, out=path("gpu_free.json"),
                                csv=path("gpu_free.csv"))
        return cli.recorded(g.out, lambda: gpufree.wait_free(g))

    out["stop"], out["gpu_free"], failed = stop_and_free(stop, wait_free, begin, True)
    if failed is not None:
        raise ToolError("%s: %s" % ("the stop" if failed[0] == "stopping" else "the wait for free GPUs", failed[1]),
                        out)
    return out


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    return teardown(cli.parse_spec(TeardownSpec, argv, "teardown", __doc__))


if __name__ == "__main__":
    sys.exit(cli.run_tool(main))
