#!/usr/bin/env python3
"""Wait until the selected GPUs are free: no compute process AND memory.used <= threshold.

    gpufree.py --smi '["nvidia-smi"]' --gpus all|0,1 --threshold-mib 64 --timeout S
               [--node-dir D] [--out F] [--csv F]

Polls every ~0.1 s (both conditions: after SIGKILL the compute-app list empties ~0.1 s before
memory.used drops) and records the time to free. A compute process that is not ours (its session
is not the one recorded in server.json / last_server.json) is refused at once, naming GPU index,
PID, user and command: it is never waited for, and never killed here. On timeout the error holds
the GPU table. ``--csv F`` writes the final GPU state as CSV (e.g. gpu_before.csv/gpu_after.csv).
"""
from __future__ import annotations

import csv
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

from specab.node import cli, nvsmi, ownership, procfs
from specab.node.cli import ToolError

GPU_FIELDS = ("index", "uuid", "name", "memory.used", "memory.total")
# A compute-app PID that /proc cannot show (another PID namespace, or a process that just exited)
# is treated as foreign only when it stays listed this long.
INVISIBLE_GRACE_S = 2.0


@dataclass
class GpuFreeSpec:
    """One wait for free GPUs: no compute process and memory.used at most the threshold, on every selected GPU."""
    smi: List[str]
    gpus: str = cli.arg("'all' or a comma list such as 0,1")
    threshold_mib: float = cli.arg("a GPU is free at most this many MiB used (specab_gpu_free_threshold_mib)")
    timeout: float = cli.arg("seconds to wait (timeouts.gpu_free_s)")
    interval: float = 0.1
    node_dir: Optional[str] = cli.arg("where server.json/last_server.json say what is ours", default=None)
    smi_timeout: float = nvsmi.DEFAULT_SMI_TIMEOUT
    out: Optional[str] = cli.arg("also write the JSON result here (gpu_free.json)", default=None)
    csv: Optional[str] = cli.arg("write the final GPU table as CSV here", default=None)


def parse_args(argv: Optional[Sequence[str]]) -> GpuFreeSpec:
    return cli.parse_spec(GpuFreeSpec, argv, "gpufree.py", __doc__)


def our_sessions(node_dir: Optional[str]) -> List[Dict[str, Any]]:
    if not node_dir:
        return []
    nd = os.path.abspath(os.path.expanduser(node_dir))
    recs = [ownership.load_record(nd, ownership.SERVER_JSON), ownership.load_record(nd, ownership.LAST_SERVER_JSON)]
    return [r for r in recs if r is not None]


def classify(pid: int, recs: List[Dict[str, Any]]) -> str:
    """'ours', 'foreign' or 'invisible' (no /proc entry)."""
    sid = procfs.pid_session(pid)
    if sid is None:
        return "invisible"
    for r in recs:
        _, pgid, rsid = ownership.record_ids(r)
        if sid == rsid and ownership.session_is_ours(r):
            return "ours"
    return "foreign"


def snapshot(smi: Sequence[str], timeout: float, gpus_spec: str) -> Dict[str, Any]:
    # the two nvidia-smi queries run side by side: one poll costs one call's time, not two
    box: Dict[str, Any] = {}

    def query_apps() -> None:
        try:
            box["apps"] = nvsmi.query_compute_apps(smi, timeout)
        except Exception as exc:  # re-raised in the caller's thread
            box["error"] = exc

    worker = threading.Thread(target=query_apps, name="gpufree-apps", daemon=True)
    worker.start()
    try:
        gpus = nvsmi.query_gpus(smi, GPU_FIELDS, timeout)
    finally:
        worker.join()
    if "error" in box:
        raise box["error"]
    apps = box["apps"]
    selected = nvsmi.select_gpus(gpus_spec, [g["index"] for g in gpus if isinstance(g["index"], int)])
    by_uuid = {g["uuid"]: g["index"] for g in gpus}
    table = []
    for g in gpus:
        if g["index"] not in selected:
            continue
        procs = [a for a in apps if by_uuid.get(a.get("gpu_uuid")) == g["index"]]
        table.append({"index": g["index"], "uuid": g["uuid"], "name": g["name"],
                      "memory_used_mib": g["memory.used"], "memory_total_mib": g["memory.total"],
                      "compute_processes": [{"pid": a["pid"], "process_name": a["process_name"],
                                             "used_memory_mib": a["used_memory"]} for a in procs]})
    # compute apps on GPUs nvidia-smi did not map (unknown uuid) are kept visible too
    unmapped = [a for a in apps if a.get("gpu_uuid") not in by_uuid]
    return {"t": time.time(), "gpus": table, "unmapped_apps": unmapped}


def is_free(snap: Dict[str, Any], threshold: float) -> bool:
    """Every GPU of the snapshot has no compute process and a memory.used (a number: nvidia-smi's) <= threshold."""
    return all(not g["compute_processes"] and isinstance(g["memory_used_mib"], (int, float))
               and g["memory_used_mib"] <= threshold for g in snap["gpus"])


def table_text(snap: Dict[str, Any], threshold: float, recs: List[Dict[str, Any]]) -> str:
    lines = []
    for g in snap["gpus"]:
        mem = g["memory_used_mib"]
        procs = []
        for p in g["compute_processes"]:
            pid = p["pid"]
            kind = classify(pid, recs) if isinstance(pid, int) else "invisible"
            procs.append("%s (%s, %s MiB)" % (procfs.describe_text(pid) if isinstance(pid, int) else pid,
                                              kind, p["used_memory_mib"]))
        lines.append("GPU %s: memory.used %s MiB (threshold %g)%s, compute processes: %s"
                     % (g["index"], "[N/A]" if mem is None else mem, threshold,
                        " OK" if isinstance(mem, (int, float)) and mem <= threshold else " BUSY",
                        "; ".join(procs) if procs else "none"))
    return "\n".join(lines)


def write_csv(path: str, snap: Dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["timestamp", "index", "uuid", "name", "memory.used", "memory.total",
                    "compute_pids", "compute_used_mib"])
        for g in snap["gpus"]:
            w.writerow(["%.3f" % snap["t"], g["index"], g["uuid"], g["name"], g["memory_used_mib"],
                        g["memory_total_mib"], " ".join(str(p["pid"]) for p in g["compute_processes"]),
                        " ".join(str(p["used_memory_mib"]) for p in g["compute_processes"])])


def wait_free(a: GpuFreeSpec) -> Dict[str, Any]:
    recs = our_sessions(a.node_dir)
    t0 = time.monotonic()
    deadline = t0 + a.timeout
    first_seen_invisible: Dict[int, float] = {}
    polls = 0
    first: Optional[Dict[str, Any]] = None
    out: Dict[str, Any] = {"threshold_mib": a.threshold_mib, "timeout_s": a.timeout}
    while True:
        snap = snapshot(a.smi, a.smi_timeout, a.gpus)
        polls += 1
        if first is None:
            first = snap
            out["gpus"] = [g["index"] for g in snap["gpus"]]
            out["initial"] = snap["gpus"]
        # a foreign compute process on one of our GPUs: refuse at once
        for g in snap["gpus"]:
            for p in g["compute_processes"]:
                pid = p["pid"]
                if not isinstance(pid, int):
                    continue
                kind = classify(pid, recs)
                if kind == "invisible":
                    since = first_seen_invisible.setdefault(pid, time.monotonic())
                    if time.monotonic() - since < INVISIBLE_GRACE_S:
                        continue
                if kind in ("foreign", "invisible"):
                    d = procfs.describe_process(pid)
                    out.update(final=snap["gpus"], polls=polls, foreign={"gpu": g["index"], "pid": pid,
                                                                        "user": d["user"], "command": d["command"],
                                                                        "used_memory_mib": p["used_memory_mib"]})
                    if a.csv:
                        write_csv(a.csv, snap)
                    raise ToolError(
                        "GPU %s is used by a process that is not ours: %s, holding %s MiB. specab never "
                        "kills it by default: ask its owner to stop it, choose other GPUs "
                        "(specab_gpu_indices), or (only if you own it) rerun stop with --force-foreign"
                        % (g["index"], procfs.describe_text(pid), p["used_memory_mib"]), out)
        if is_free(snap, a.threshold_mib):
            out.update(final=snap["gpus"], polls=polls, time_to_free_s=round(time.monotonic() - t0, 4),
                       free_at=round(snap["t"], 3), was_free_at_first_poll=(polls == 1))
            if a.csv:
                write_csv(a.csv, snap)
            return out
        now = time.monotonic()
        if now >= deadline:
            out.update(final=snap["gpus"], polls=polls, waited_s=round(now - t0, 3))
            if a.csv:
                write_csv(a.csv, snap)
            raise ToolError("GPUs not free after %gs (need no compute process and memory.used <= %g MiB on "
                            "every selected GPU):\n%s" % (a.timeout, a.threshold_mib,
                                                          table_text(snap, a.threshold_mib, recs)), out)
        time.sleep(min(a.interval, max(0.0, deadline - now)))


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    a = parse_args(argv)
    return cli.recorded(a.out, lambda: wait_free(a))


if __name__ == "__main__":
    sys.exit(cli.run_tool(main))
