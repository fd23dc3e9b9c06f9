"""GPU mode (``SPECAB_SIM_GPU=cuda``): each scheduler also holds real CUDA memory and joins a real
NCCL communicator, so real ``nvidia-smi`` lists it and real NCCL writes its env-echo lines.

Imported only by a scheduler in GPU mode; torch is imported here and nowhere else in the simulator.

Real-hardware facts this module accounts for (docs/validation/h200.md):

* NCCL writes its ``NCCL_DEBUG`` lines to the C ``stdout`` of the process unless
  ``NCCL_DEBUG_FILE`` is set. A worker's stdout is the JSON pipe to the server process, so
  :func:`route_native_stdout_to_stderr` moves file descriptor 1 to the server log (stderr) and
  keeps the pipe for Python's ``sys.stdout`` only: the NCCL lines land in ``server.log`` as they
  do in SGLang, where the scheduler's stdout is the log.
* The allocation is the scheduler's whole ``mem_fraction_static`` share at communicator time
  (a real SGLang scheduler grows to it while loading); the CUDA context (~0.5-0.9 GiB on an H200)
  comes on top, as it does for SGLang.
"""
from __future__ import annotations

import io
import os
import sys
from dataclasses import dataclass
from typing import Any


class GpuModeError(RuntimeError):
    """GPU mode cannot run here (no torch, no CUDA, too few GPUs)."""


@dataclass
class GpuHold:
    """Keeps the CUDA block and the communicator alive for the life of the scheduler."""
    block: Any
    probe: Any
    device: str


def route_native_stdout_to_stderr() -> None:
    """Point fd 1 at stderr (the server log) and keep the original stdout pipe for ``sys.stdout``.

    Idempotent: a second call finds fd 1 already equal to fd 2's target and does nothing.
    """
    try:
        same = os.path.sameopenfile(1, 2)
    except OSError:
        same = False
    if same:
        return
    sys.stdout.flush()
    pipe_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = io.TextIOWrapper(os.fdopen(pipe_fd, "wb"), encoding="utf-8", line_buffering=True,
                                  write_through=True)


def init_rank(rank: int, world_size: int, local_device: int, dist_init: str, mib: int) -> GpuHold:
    route_native_stdout_to_stderr()  # NCCL INFO lines must not corrupt the JSON pipe to the server
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        raise GpuModeError("SPECAB_SIM_GPU=cuda needs PyTorch with CUDA in the Python running the "
                           "simulator; unset SPECAB_SIM_GPU on machines without GPUs") from exc
    if not torch.cuda.is_available():
        raise GpuModeError("SPECAB_SIM_GPU=cuda but torch.cuda.is_available() is False "
                           f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})")
    count = torch.cuda.device_count()
    if local_device >= count:
        raise GpuModeError(f"rank {rank} wants CUDA device {local_device} but only {count} are visible; "
                           f"lower --tp-size or expose more GPUs")
    torch.cuda.set_device(local_device)
    device = f"cuda:{local_device}"
    block = torch.empty(int(mib) * 1024 * 1024, dtype=torch.uint8, device=device)
    host, port = dist_init.rsplit(":", 1)
    dist.init_process_group("nccl", init_method=f"tcp://{host}:{port}", rank=rank, world_size=world_size,
                            device_id=torch.device(device))
    probe = torch.ones(1024, device=device)
    dist.all_reduce(probe)      # forces communicator init: NCCL reads (and echoes) its env here
    torch.cuda.synchronize()
    want = float(world_size)
    got = float(probe[0].item())
    if got != want:
        raise GpuModeError(f"rank {rank}: the NCCL all-reduce of ones over {world_size} ranks gave {got}, "
                           f"expected {want}; the communicator is broken (check NCCL_* settings)")
    sys.stderr.flush()
    return GpuHold(block=block, probe=probe, device=device)
