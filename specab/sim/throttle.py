"""Slow-down faults of the simulated node: GPU clock throttling and a slow server instance.

``throttle=<from_s>:<ratio>:<reason>``: from ``from_s`` simulated seconds after the server process
started, the GPUs run at ``ratio`` x their busy SM clock (what ``smi`` reports as ``clocks.sm``), with
``reason`` in ``clocks_event_reasons.active`` (NVML's nvmlClocksEventReason* bits), and every forward
takes ``1 / ratio`` as long: decode is compute-bound, so tok/s falls with the clock.

``slow_instance=<k>:<pct>``: the k-th server start on the node (the launch counter of the state dir,
0-based) decodes ``pct`` % slower than its siblings, as an instance placed on a degraded GPU would;
``slow_instance=<k>-<k2>:<pct>``: every start from the k-th to the k2-th (``0-1``: a freshly started node
whose first two server starts run slow, as the H200's did).

Pure: nothing here sleeps or touches files.
"""
from __future__ import annotations

from dataclasses import dataclass

# nvml.h nvmlClocksEventReason* bits (the vLLM, nvidia-smi and NCCL reference).
CLOCK_EVENT_REASONS: dict[str, int] = {
    "GpuIdle": 0x1, "ApplicationsClocksSetting": 0x2, "SwPowerCap": 0x4, "HwSlowdown": 0x8,
    "SyncBoost": 0x10, "SwThermalSlowdown": 0x20, "HwThermalSlowdown": 0x40,
    "HwPowerBrakeSlowdown": 0x80, "DisplayClockSetting": 0x100,
}
REASON_IDLE = 0x1


class FaultSpecError(ValueError):
    """A throttle / slow_instance fault spec the simulator cannot use."""


def parse_reasons(text: str) -> int:
    """``0x20``, ``32``, ``SwThermalSlowdown`` or ``SwPowerCap+HwSlowdown`` -> bitmask."""
    mask = 0
    by_lower = {k.lower(): v for k, v in CLOCK_EVENT_REASONS.items()}
    for part in (p.strip() for p in text.split("+")):
        if not part:
            raise FaultSpecError(f"empty clock event reason in {text!r}")
        if part.lower() in by_lower:
            mask |= by_lower[part.lower()]
            continue
        try:
            mask |= int(part, 16) if part.lower().startswith("0x") else int(part)
        except ValueError:
            raise FaultSpecError(f"clock event reason {part!r}: give an NVML bit (0x4, 0x8, 0x20, ...) or a name "
                                 f"({', '.join(CLOCK_EVENT_REASONS)})") from None
    if mask & ~sum(CLOCK_EVENT_REASONS.values()) or mask <= 0:
        raise FaultSpecError(f"clock event reason {text!r} is not a combination of NVML's bits "
                             f"(0x1 .. 0x100)")
    if mask == REASON_IDLE:
        raise FaultSpecError("throttle: GpuIdle (0x1) alone is not a slowdown; use e.g. SwPowerCap (0x4), "
                             "HwSlowdown (0x8) or SwThermalSlowdown (0x20)")
    return mask


@dataclass(frozen=True)
class Throttle:
    from_s: float        # simulated seconds after the server process started
    clock_ratio: float   # SM clock while throttled / busy SM clock, in (0, 1]
    reasons: int         # clocks_event_reasons.active bitmask while throttled

    @classmethod
    def parse(cls, arg: str) -> "Throttle":
        parts = arg.split(":")
        if len(parts) != 3:
            raise FaultSpecError(f"throttle={arg!r}: expected throttle=<from_s>:<ratio>:<reason>, "
                                 f"e.g. throttle=0:0.7:SwThermalSlowdown")
        try:
            from_s, ratio = float(parts[0]), float(parts[1])
        except ValueError:
            raise FaultSpecError(f"throttle={arg!r}: <from_s> and <ratio> must be numbers") from None
        if from_s < 0:
            raise FaultSpecError(f"throttle={arg!r}: <from_s> must be >= 0")
        if not 0 < ratio <= 1:
            raise FaultSpecError(f"throttle={arg!r}: <ratio> is the clock fraction, in (0, 1]")
        return cls(from_s, ratio, parse_reasons(parts[2]))

    def active(self, elapsed_sim_s: float) -> bool:
        return elapsed_sim_s >= self.from_s

    def time_factor(self, elapsed_sim_s: float) -> float:
        """Multiplier of a forward's duration at this moment (1 / clock ratio while throttled)."""
        return 1.0 / self.clock_ratio if self.active(elapsed_sim_s) else 1.0

    def to_dict(self) -> dict:
        return {"from_s": self.from_s, "clock_ratio": self.clock_ratio, "reasons": f"0x{self.reasons:x}"}


@dataclass(frozen=True)
class SlowInstance:
    instance: int        # the node's launch counter value (0-based) of the (first) slow start
    pct: float           # how much slower it decodes, in percent of tok/s
    last: int | None = None   # the last slow start of a range k-k2 (None: the one start `instance`)

    @classmethod
    def parse(cls, arg: str) -> "SlowInstance":
        k, sep, pct = arg.partition(":")
        first, dash, last = k.partition("-")
        try:
            inst, slower = int(first), float(pct)
            end = int(last) if dash else None
        except ValueError:
            raise FaultSpecError(f"slow_instance={arg!r}: expected slow_instance=<k>:<pct> or <k>-<k2>:<pct>, e.g. "
                                 f"slow_instance=2:15 (the third start on the node decodes 15 % slower) or "
                                 f"slow_instance=0-1:20 (its first two starts 20 % slower)") from None
        if not sep or inst < 0 or not 0 < slower < 100 or (end is not None and end < inst):
            raise FaultSpecError(f"slow_instance={arg!r}: <k> >= 0, <k2> >= <k> and 0 < <pct> < 100")
        return cls(inst, slower, end)

    def is_slow(self, instance: int) -> bool:
        return self.instance <= instance <= (self.instance if self.last is None else self.last)

    def speed_factor(self, instance: int) -> float:
        return 1.0 - self.pct / 100.0 if self.is_slow(instance) else 1.0
