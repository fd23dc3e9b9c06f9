#!/usr/bin/env python3
"""Sample GPU clocks, power, temperature, utilization and clock-event reasons to CSV until stopped.

    gpusample.py --smi '["nvidia-smi"]' --interval S --out F [--gpus all|0,1] [--count N] [--duration S]

One row per GPU per sample, with a unix ``timestamp`` column first; every row is flushed as it
is written, so a SIGKILL loses at most the sample in flight. SIGTERM/SIGINT end the loop cleanly
(the JSON summary is printed), and so does the exit of the process that started the sampler
(unless --keep-after-parent-exit): a caller that dies or loses the sampler's pid (a shell that
backgrounds a function and kills the subshell) cannot leak a sampler that runs nvidia-smi forever. An nvidia-smi error or hang (bounded by --smi-timeout) skips that
sample and is counted; it is fatal only when no sample at all succeeded.
"""
from __future__ import annotations

import contextlib
import csv
import os
import select
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

from specab.node import cli, nvsmi
from specab.node.cli import ToolError

SAMPLE_FIELDS = ("index", "uuid", "clocks.sm", "clocks.mem", "clocks.max.sm", "power.draw", "temperature.gpu",
                 "utilization.gpu", "clocks_event_reasons.active", "memory.used")


@dataclass
class SampleSpec:
    """GPU sampling into a CSV: every interval until signalled, or count samples, or duration seconds."""
    smi: List[str]
    interval: float = cli.arg("seconds between samples (specab_bench_sample_interval_s)")
    out: str
    gpus: str = "all"
    count: int = cli.arg("stop after N samples (0: until signalled)", default=0)
    duration: float = cli.arg("stop after S seconds (0: until signalled)", default=0.0)
    smi_timeout: float = nvsmi.DEFAULT_SMI_TIMEOUT
    keep_after_parent_exit: bool = cli.arg(
        "keep sampling when the process that started us exits (default: stop, so a sampler whose caller died or "
        "lost track of it never runs on forever)", default=False)


def parse_args(argv: Optional[Sequence[str]]) -> SampleSpec:
    p = cli.spec_parser(SampleSpec, "gpusample.py", __doc__)
    a = p.parse_args(argv)
    if a.interval <= 0:
        p.error("--interval must be > 0")
    return SampleSpec(**vars(a))


class StopFlag(object):
    """SIGTERM/SIGINT set the flag and wake the sleeping loop through a self-pipe."""

    def __init__(self, install: bool = True) -> None:
        """``install=False``: no signal handlers (a caller sampling in-process, e.g. one sample
        from the sequencer, keeps its own handlers; signal.signal works in the main thread only)."""
        self.stop = False
        self.signal: Optional[str] = None
        self.r, self.w = os.pipe()
        os.set_blocking(self.w, False)
        if install:
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self._handler)

    def close(self) -> None:
        for fd in (self.r, self.w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _handler(self, signum: int, frame: Any) -> None:
        self.stop = True
        self.signal = signal.Signals(signum).name
        with contextlib.suppress(OSError):
            os.write(self.w, b"x")

    def sleep(self, seconds: float) -> None:
        if self.stop or seconds <= 0:
            return
        try:
            ready, _, _ = select.select([self.r], [], [], seconds)
        except InterruptedError:  # pragma: no cover - PEP 475 retries select on Python >= 3.5
            return
        if ready:
            os.read(self.r, 64)


def sample(a: SampleSpec, flag: Optional[StopFlag] = None) -> Dict[str, Any]:
    """Sample until stopped (or --count/--duration). ``flag``: a StopFlag the caller owns (default:
    a new one that installs the SIGTERM/SIGINT handlers, as the CLI needs)."""
    if flag is None:
        flag = StopFlag()
    parent = os.getppid()
    t0 = time.monotonic()
    samples = rows = errors = 0
    last_error: Optional[str] = None
    selected: Optional[List[int]] = None
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["timestamp"] + list(SAMPLE_FIELDS))
        fh.flush()
        while not flag.stop:
            tick = time.monotonic()
            try:
                data = nvsmi.query_gpus(a.smi, SAMPLE_FIELDS, a.smi_timeout)
                ts = time.time()
                if selected is None:
                    selected = nvsmi.select_gpus(a.gpus, [g["index"] for g in data])
                for g in data:
                    if g["index"] in selected:
                        w.writerow(["%.3f" % ts] + ["" if g[f] is None else g[f] for f in SAMPLE_FIELDS])
                        rows += 1
                fh.flush()
                samples += 1
            except nvsmi.SmiError as exc:
                errors += 1
                last_error = exc.message
                cli.log("sample skipped: %s" % exc.message)
            if a.count and samples + errors >= a.count:
                break
            if a.duration and time.monotonic() - t0 >= a.duration:
                break
            if not a.keep_after_parent_exit and os.getppid() != parent:
                flag.signal = "parent exited"
                cli.log("the process that started the sampler (pid %d) exited: stopping" % parent)
                break
            flag.sleep(a.interval - (time.monotonic() - tick))
    out: Dict[str, Any] = {"out": a.out, "samples": samples, "rows": rows, "errors": errors,
                           "gpus": selected, "duration_s": round(time.monotonic() - t0, 3),
                           "stopped_by": flag.signal or "limit"}
    if last_error:
        out["last_error"] = last_error
    if samples == 0 and errors:
        raise ToolError("no GPU sample succeeded (%d attempts): %s" % (errors, last_error), out)
    return out


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    return sample(parse_args(argv))


if __name__ == "__main__":
    sys.exit(cli.run_tool(main))
