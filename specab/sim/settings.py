"""The simulator's environment variables, parsed and validated in one place.

SPECAB_SIM_STATE       per-node state directory (default /tmp/specab-sim/default)
SPECAB_SIM_PROFILE     shipped profile name or YAML path (default: default)
SPECAB_SIM_TIME_SCALE  speed factor: 10 => every duration / 10 (default 1)
SPECAB_SIM_SEED        seed of jitter, offsets, acceptance draws and text (default 0)
SPECAB_SIM_FAULT       comma list of faults (see Faults)
SPECAB_SIM_GPU         "cuda" => GPU mode (real CUDA memory + NCCL in each scheduler); unset on CPU
SPECAB_SIM_TRACE       file: one JSON line per finished request with its chunk emission times (ground truth)
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from specab.sim.gpustate import DEFAULT_STATE
from specab.sim.outputs import Departure
from specab.sim.throttle import FaultSpecError, SlowInstance, Throttle

KNOWN_FAULTS = ("oom_at_start", "crash_after=N", "ignore_sigterm", "orphan_workers", "slow_release=S",
                "port_in_use", "throttle=FROM_S:RATIO:REASON", "slow_instance=K[-K2]:PCT", "buffered_stream",
                "lossy=P", "late_divergence=FROM:SHARE", "loop=N")


class SettingsError(ValueError):
    """A SPECAB_SIM_* variable has a value the simulator cannot use."""


@dataclass(frozen=True)
class Faults:
    oom_at_start: bool = False          # rank 0 fails with CUDA's out-of-memory error while loading
    crash_after: Optional[int] = None   # scheduler TP0 dies after N finished requests (SIGQUIT path)
    ignore_sigterm: bool = False        # the main process ignores SIGTERM
    orphan_workers: bool = False        # no parent-death signal; workers outlive the main process
    slow_release: Optional[float] = None  # memory released S (simulated) seconds after a holder died
    port_in_use: bool = False           # behave as if the HTTP port were taken (uvicorn's bind error)
    throttle: Optional[Throttle] = None   # GPU clocks drop (with an NVML reason) from a moment on
    slow_instance: Optional[SlowInstance] = None  # the k-th (to k2-th) start on the node decodes pct % slower
    buffered_stream: bool = False       # the HTTP front end holds a stream's chunks and sends them when it ends
    # a speculative server's outputs depart from the target's (specab/sim/outputs.py); a baseline ignores them
    lossy: float = 0.0                  # each committed decode token is not the target's with probability P
    late_divergence: Optional[tuple[float, float]] = None   # (FROM, SHARE): a share departs late, once
    loop: Optional[int] = None          # outputs fall into a repeated N-token cycle and run to the token limit

    def departure(self, forced: bool, deterministic: bool = False) -> Departure:
        """How this server's outputs depart from the target's. In the deterministic mode
        (--enable-deterministic-inference: batch-invariant kernels) there are no batch-dependent numerics, so the
        late divergence they cause is off; forced acceptance, lossy commits and loops are the engine's own doing and
        stay (a deterministic pass catches them)."""
        return Departure(forced=forced, lossy=self.lossy, late=None if deterministic else self.late_divergence,
                         loop=self.loop)

    @classmethod
    def parse(cls, text: str) -> "Faults":
        values: dict[str, object] = {}
        for item in (p.strip() for p in text.split(",")):
            if not item:
                continue
            name, _, arg = item.partition("=")
            if name in ("oom_at_start", "ignore_sigterm", "orphan_workers", "port_in_use", "buffered_stream") and not arg:
                values[name] = True
            elif name in ("crash_after", "slow_release") and arg:
                kind, what = (int, "an integer") if name == "crash_after" else (float, "seconds")
                try:
                    n = kind(arg)
                except ValueError:
                    raise SettingsError(f"SPECAB_SIM_FAULT: {name} needs {what}, got {arg!r}") from None
                if n < 0:
                    raise SettingsError(f"SPECAB_SIM_FAULT: {name} must be >= 0")
                values[name] = n
            elif name in ("lossy", "late_divergence", "loop") and arg:
                values[name] = _departure_arg(name, arg)
            elif name in ("throttle", "slow_instance") and arg:
                try:
                    values[name] = Throttle.parse(arg) if name == "throttle" else SlowInstance.parse(arg)
                except FaultSpecError as exc:
                    raise SettingsError(f"SPECAB_SIM_FAULT: {exc}") from None
            else:
                raise SettingsError(f"SPECAB_SIM_FAULT: unknown fault {item!r}; known: {', '.join(KNOWN_FAULTS)}")
        return cls(**values)  # type: ignore[arg-type]


def _departure_arg(name: str, arg: str) -> object:
    """lossy=P (0 <= P <= 1), late_divergence=FROM:SHARE (both in [0, 1]), loop=N (N >= 1)."""
    try:
        if name == "loop":
            n = int(arg)
            if n < 1:
                raise ValueError
            return n
        parts = [float(x) for x in arg.split(":")]
        if len(parts) != (1 if name == "lossy" else 2) or not all(0.0 <= x <= 1.0 for x in parts):
            raise ValueError
    except ValueError:
        example = {"lossy": "lossy=0.05 (each committed token wrong with probability 0.05)",
                   "late_divergence": "late_divergence=0.5:0.25 (a quarter of requests depart once, in the second "
                                      "half of their length)",
                   "loop": "loop=4 (a repeated 4-token cycle)"}[name]
        raise SettingsError(f"SPECAB_SIM_FAULT: {name}={arg!r}: expected {example}") from None
    return parts[0] if name == "lossy" else (parts[0], parts[1])


@dataclass(frozen=True)
class SimSettings:
    state: Path
    profile_ref: str
    time_scale: float
    seed: int
    faults: Faults
    gpu_mode: str
    trace: Optional[str] = None

    @classmethod
    def from_env(cls) -> "SimSettings":
        env = os.environ
        raw_scale = env.get("SPECAB_SIM_TIME_SCALE", "") or "1"
        try:
            scale = float(raw_scale)
        except ValueError:
            raise SettingsError(f"SPECAB_SIM_TIME_SCALE={raw_scale!r} is not a number (use e.g. 10)") from None
        if not scale > 0:
            raise SettingsError(f"SPECAB_SIM_TIME_SCALE must be > 0, got {raw_scale!r}")
        raw_seed = env.get("SPECAB_SIM_SEED", "") or "0"
        try:
            seed = int(raw_seed)
        except ValueError:
            raise SettingsError(f"SPECAB_SIM_SEED={raw_seed!r} is not an integer") from None
        gpu = env.get("SPECAB_SIM_GPU", "")
        if gpu not in ("", "cuda"):
            raise SettingsError(f"SPECAB_SIM_GPU={gpu!r}: only 'cuda' (GPU mode) or unset are supported")
        return cls(state=Path(env.get("SPECAB_SIM_STATE") or DEFAULT_STATE),
                   profile_ref=env.get("SPECAB_SIM_PROFILE") or "default",
                   time_scale=scale, seed=seed,
                   faults=Faults.parse(env.get("SPECAB_SIM_FAULT", "")), gpu_mode=gpu,
                   trace=env.get("SPECAB_SIM_TRACE") or None)
