"""GPU mode (``SPECAB_SIM_GPU=cuda``): each scheduler also holds real CUDA memory and joins a real
NCCL communicator, so real ``nvidia-smi`` lists it and real NCCL writes its env-echo lines.

Imported only by a scheduler in GPU mode; torch is imported here and nowhere else in the simulator.
"""
from __future__ import annotations

import os
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


def init_rank(rank: int, world_size: int, local_device: int, dist_init: str, mib: int) -> GpuHold:
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
    return GpuHold(block=block, probe=probe, device=device)
