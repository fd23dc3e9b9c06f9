"""A run's measured window is wall clock even on a time-scaled simulated node.

load_store converts a request's e2e_s to simulated seconds (× time scale) while its start_ts stays
a wall-clock epoch; the window (used to pick the GPU samples of the measured period for the
gpu-throttled rule and the report's clock plot) must divide the duration back, or it would reach
time_scale times too far and count samples taken after the benchmark."""
from __future__ import annotations

from specab.analysis.evidence.model import Request, Run


def test_window_of_a_time_scaled_run_is_wall_clock() -> None:
    reqs = [Request(i=0, start_ts=1000.0, e2e_s=20.0), Request(i=1, start_ts=1000.5, e2e_s=40.0)]
    run = Run(run_id="001-baseline", arm="baseline", requests=reqs, time_scale=20.0)
    assert run.window == (1000.0, 1002.5)


def test_window_at_real_time() -> None:
    reqs = [Request(i=0, start_ts=1000.0, e2e_s=2.0), Request(i=1, warmup=True, start_ts=990.0, e2e_s=1.0)]
    run = Run(run_id="001-baseline", arm="baseline", requests=reqs)
    assert run.window == (1000.0, 1002.0)   # warm-ups are outside the measured window
