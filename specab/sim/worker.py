"""A scheduler (``sglang::scheduler_TP{r}``) or detokenizer (``sglang::detokenizer``) process.

Started by the simulated server with ``python -m specab.sim.worker``; reads one JSON line of
configuration on stdin, then commands (``crash``). Reports on stdout as JSON lines. Stdlib only
(plus setproctitle), so eight of them stay light. Logs go to stderr, i.e. the server log.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from specab.sim.gpustate import GpuNode
from specab.sim.nccl import debug_file_path, nccl_info_lines
from specab.sim.procutil import set_parent_death_signal, set_title
from specab.sim.simlog import SimLogger

SCHEDULER_FILE = "/usr/local/lib/python3.12/dist-packages/sglang/srt/managers/scheduler.py"


def _send(msg: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def _traceback(log: SimLogger, last: str, where: str) -> None:
    log.error("Scheduler hit an exception: Traceback (most recent call last):\n"
              f'  File "{SCHEDULER_FILE}", line 2579, in run_scheduler_process\n'
              f"    {where}\n"
              f"{last}\n")


def _oom_text(gpu: int, total_mib: int, free_mib: int, want_mib: int) -> str:
    return (f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {want_mib / 1024:.2f} GiB. "
            f"GPU {gpu} has a total capacity of {total_mib / 1024:.2f} GiB of which {max(0, free_mib) / 1024:.2f} GiB "
            f"is free. Including non-PyTorch memory, this process has {0:.2f} GiB memory in use. "
            "Of the allocated memory 0 bytes is allocated by PyTorch, and 0 bytes is reserved by PyTorch but "
            "unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
            "Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")


def _fail(log: SimLogger, parent: int, text: str, where: str) -> None:
    _traceback(log, text, where)
    with contextlib.suppress(ProcessLookupError):
        os.kill(parent, signal.SIGQUIT)
    sys.exit(1)


def run_scheduler(cfg: dict[str, Any]) -> Any:
    rank, world = cfg["tp_rank"], cfg["world_size"]
    log = SimLogger(cfg["log_prefix"], level=cfg.get("log_level", "info"))
    parent = cfg["parent_pid"]
    node = GpuNode(Path(cfg["state"]))
    gpu = cfg["gpu"]
    total = cfg["plan"]["total_mib"]
    lag = cfg["release_lag_s"]
    env = dict(os.environ)
    registered = False
    gpu_hold: Any = None

    def grow(mib: int) -> None:
        nonlocal registered
        others = sum(a.mib for a in node.allocations()
                     if a.gpu == gpu and a.pid != os.getpid() and a.holds_memory(time.time()))
        if others + mib > total:
            _fail(log, parent, _oom_text(gpu, total, total - others, mib),
                  "scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, moe_ep_rank, pp_rank, dp_rank)")
        node.allocate(gpu, mib, kind="sglang::scheduler", release_lag_s=lag, spawn_watcher=not registered,
                      app_exit_lag_s=cfg.get("app_exit_lag_s", 0.0))
        registered = True

    for st in cfg["plan"]["steps"]:
        if st["sleep"] > 0:
            time.sleep(st["sleep"])
        op = st.get("op")
        if op == "nccl_init":
            # in GPU mode the real NCCL writes these lines itself
            lines = [] if cfg.get("gpu_mode") == "cuda" else \
                nccl_info_lines(env, world, cfg["cuda_dev"], os.getpid(), threading.get_native_id(), rank)
            if lines:
                target = env.get("NCCL_DEBUG_FILE")
                text = "".join(line + "\n" for line in lines)
                if target:
                    with open(debug_file_path(target, os.getpid()), "a") as fh:
                        fh.write(text)
                else:
                    log.raw(text.rstrip("\n"))
            if cfg.get("gpu_mode") == "cuda":
                from specab.sim import gpu_mode
                try:
                    gpu_hold = gpu_mode.init_rank(rank, world, cfg["cuda_dev"], cfg["dist_init"],
                                                  cfg["plan"]["final_mib"])
                except Exception as exc:  # report like a scheduler failure, with the reason
                    _fail(log, parent, f"{type(exc).__name__}: {exc}", "scheduler = Scheduler(server_args, ...)")
        elif op == "oom":
            _fail(log, parent, _oom_text(gpu, total, total - 512, 2048),
                  "scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, moe_ep_rank, pp_rank, dp_rank)")
        elif op == "not_enough_memory":
            _fail(log, parent, "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.",
                  "scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, moe_ep_rank, pp_rank, dp_rank)")
        if st.get("mib") is not None:
            grow(st["mib"])
        if st.get("log"):
            log.info(st["log"])
    nccl_env = {k: v for k, v in env.items() if k.startswith(("NCCL_", "SGLANG_"))}
    _send({"status": "ready", "tp_rank": rank, "pid": os.getpid(), "env": nccl_env})
    return gpu_hold


def main() -> int:
    first = sys.stdin.readline()
    if not first:
        return 1
    cfg = json.loads(first)
    role = cfg["role"]
    title = "sglang::detokenizer" if role == "detokenizer" else f"sglang::scheduler{cfg['log_prefix'].replace(' ', '_')}"
    if not cfg.get("orphan"):
        set_parent_death_signal(signal.SIGKILL)
        if os.getppid() != cfg["parent_pid"]:
            return 0  # the parent died before the death signal was armed
    set_title(title)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if cfg.get("ignore_sigterm"):   # fault ignore_sigterm: a SIGTERM to the process group changes nothing
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if cfg.get("gpu_mode") == "cuda":
        from specab.sim.gpu_mode import route_native_stdout_to_stderr
        route_native_stdout_to_stderr()   # NCCL's lines go to the log, not into the report pipe
    if role == "scheduler":
        cfg["gpu_hold"] = run_scheduler(cfg)   # GPU mode: the reference keeps the CUDA memory alive
    else:
        _send({"status": "ready", "role": "detokenizer", "pid": os.getpid()})
    log = SimLogger(cfg.get("log_prefix", ""))
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "crash":
            _fail(log, cfg["parent_pid"], "RuntimeError: CUDA error: an illegal memory access was encountered\n"
                  "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
                  "below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1",
                  "scheduler.event_loop_normal()")
        elif cmd.startswith("{"):
            msg = json.loads(cmd)
            if msg.get("cmd") == "fail":
                _fail(log, cfg["parent_pid"], str(msg["error"]), "scheduler.event_loop_normal()")
    # stdin closed: the server is gone or going; wait for the death signal (or live on as an orphan)
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main())
