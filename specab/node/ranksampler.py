#!/usr/bin/env python3
"""The GPU sampler of a non-head rank of a multi-node server, for the head's benchmark: only the head runs the bench
step (benchstep.py), and every other rank samples its own GPUs meanwhile (a throttled GPU on any rank slows the whole
tensor-parallel server). Two calls around the head's bench step, each a typed spec:

    python3 <root>/specab/node ranksampler --spec-json -     {"action": "start" | "stop", "run_dir": ..., ...}

``start`` leaves the sampler running detached (the same files as the bench step's sampler: gpu_samples.csv, .json,
.log) and returns, its pid and start time in helpers.json, the one record of it: ``stop`` ends it from there, and
so does the server's stop when the run's playbook was cut off. stdlib only, like every node tool; imports its siblings.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

from specab.node import cli, osutil, ownership
from specab.node.cli import ToolError, UsageError

# How long a stopped sampler may take to exit (it ends its loop at once on SIGTERM), and how often that is polled.
SAMPLER_STOP_WAIT_S = 10.0
STOP_POLL_S = 0.05
SAMPLER_TOOL = "gpusample"


@dataclass
class RankSamplerSpec:
    """``start``: the sampler of this rank's GPUs, detached (its own session, none of the caller's pipes: Ansible
    waits for them to close), writing the bench step's gpu_samples.csv/.json/.log in ``run_dir`` and its pid and
    start time in helpers.json, ending by itself after ``duration_s`` should nobody stop it; ``stop``: SIGTERM to
    it (its CSV is flushed row by row) and its exit waited for. ``python``, ``smi``, ``gpus``, ``sample_interval_s``
    and ``duration_s`` are ``start``'s."""
    action: str
    run_dir: str
    python: Optional[str] = None
    smi: Optional[List[str]] = None
    gpus: Any = None
    sample_interval_s: Optional[float] = None
    duration_s: Optional[float] = None

    def __post_init__(self) -> None:
        if self.action not in ("start", "stop"):
            raise UsageError("action must be start or stop, got %r" % (self.action,))
        if self.action == "start":
            missing = [k for k in ("python", "smi", "gpus", "sample_interval_s", "duration_s")
                       if getattr(self, k) is None]
            if missing:
                raise UsageError("start needs %s" % ", ".join(missing))
            if isinstance(self.gpus, (list, tuple)):
                self.gpus = ",".join(str(g) for g in self.gpus)

    def path(self, name: str) -> str:
        return os.path.join(self.run_dir, name)


def start_rank_sampler(a: RankSamplerSpec) -> Dict[str, Any]:
    assert a.python is not None and a.smi is not None
    argv = cli.tool_argv(a.python, SAMPLER_TOOL) + [
        "--smi", json.dumps(a.smi), "--gpus", str(a.gpus), "--interval", str(a.sample_interval_s),
        "--out", "gpu_samples.csv", "--duration", str(a.duration_s), "--keep-after-parent-exit"]
    with open(a.path("gpu_samples.json"), "w") as out, open(a.path("gpu_samples.log"), "a") as err:
        proc = subprocess.Popen(argv, cwd=a.run_dir, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                close_fds=True, start_new_session=True)
    # with its start time, for this tool's stop and for the server's stop after a Ctrl-C that cut the run's
    # playbook off (stop.end_helpers): both end it only while that pid is still this sampler
    ownership.record_helpers(a.run_dir, [(SAMPLER_TOOL, proc.pid)])
    return {"started": True, "pid": proc.pid}


def stop_rank_sampler(a: RankSamplerSpec) -> Dict[str, Any]:
    """SIGTERM to the sampler recorded in helpers.json and its exit waited for; a sampler that already ended (its
    duration) or never started is no error, and a recorded pid that is not the recorded sampler any more (another
    start time or command line: the pid reused) is left alone. The record goes once no sampler of it runs; a sampler
    that outlives SIGTERM keeps it, for the server's stop."""
    recorded = [e for e in ownership.recorded_helpers(a.run_dir) if e.get("tool") == SAMPLER_TOOL]
    if not recorded:
        return {"stopped": False, "note": "no sampler"}
    entry = recorded[0]
    out: Dict[str, Any] = {"stopped": False, "pid": entry.get("pid")}
    if ownership.helper_is_ours(entry):
        os.kill(int(entry["pid"]), signal.SIGTERM)
        if not osutil.poll_until(lambda: not ownership.helper_is_ours(entry), SAMPLER_STOP_WAIT_S, STOP_POLL_S):
            raise ToolError("the GPU sampler %s did not exit within %.0f s of SIGTERM"
                            % (entry["pid"], SAMPLER_STOP_WAIT_S), out)
        out["stopped"] = True
    else:
        out["note"] = "sampler already ended"
    ownership.forget_helpers(a.run_dir)
    return out


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    a = cli.spec_from_argv(RankSamplerSpec, argv)
    if a is None:
        raise UsageError("ranksampler takes its spec as JSON: ranksampler --spec-json TEXT|- (the keys of "
                         "RankSamplerSpec)")
    return start_rank_sampler(a) if a.action == "start" else stop_rank_sampler(a)


if __name__ == "__main__":
    sys.exit(cli.run_tool(main))
