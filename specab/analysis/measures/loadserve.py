"""Whether a run served the load it was offered, and the latency comparison where both arms did.

Below saturation an open load's throughput is its arrival rate: two arms that both keep up deliver the same tokens per
second whatever their speed, so their throughput ratio is ~1 by construction and says nothing (the H200's 4 req/s:
471 and 474 tok/s of 512 offered). What differs is latency. Definitions (docs/analysis.md, "Verdict per load"):

- offered rate: (n - 1) / the span of the n measured requests' scheduled arrivals (the seeded Poisson schedule the
  client recorded, ``arrival_s``); achieved rate: (n - 1) / the span of their completions (arrival + end-to-end);
  equal spans shapes, so a server that keeps up achieves the offered rate up to the spread of its latencies;
- a run kept up unless its achieved rate fell short of the offered by more than KEEP_UP_TOL, or its queueing grew
  (latency.RunTimes.queue_s: the mean of its last third of requests, by arrival, above that of its first third by
  more than two arrival gaps and more than its unloaded TTFT: a backlog that builds up);
- a load point (one configuration against its baseline at one arrival rate) "served the offered load" when every run
  of both arms kept up; there the report states no throughput ratio and compares latency instead: TTFT, TPOT and
  the per-token ITL at p50 and p95, each the paired ratio arm / baseline over blocks (stats.paired_speedup on that
  percentile of each run; below 1 the arm is faster). A closed loop (requests in flight) saturates by construction:
  its throughput verdict stands.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Callable

from specab.analysis.evidence.model import Experiment, Run
from specab.analysis.measures import stats
from specab.analysis.measures.latency import RunTimes, percentile

KEEP_UP_TOL = 0.10      # achieved below (1 - this) x offered: the arm could not keep up
# (metric, percentile, label) of the paired latency ratios where both arms served the offered load
LATENCY_RATIOS = (("ttft_s", 50.0, "TTFT p50"), ("ttft_s", 95.0, "TTFT p95"), ("tpot_s", 50.0, "TPOT p50"),
                  ("tpot_s", 95.0, "TPOT p95"), ("itl_token_s", 50.0, "ITL/token p50"),
                  ("itl_token_s", 95.0, "ITL/token p95"))


@dataclass
class Serve:
    """How one run met its offered load."""
    run_id: str
    offered: float | None           # requests per second of its arrival schedule; None: a closed loop
    achieved: float | None          # requests per second of its completions
    queue_p50_s: float | None
    queue_p95_s: float | None
    queue_growth_s: float | None    # mean queueing of its last third of requests minus its first third
    engine_queue_max: int | None    # the engine's most waiting requests (LogStats.queued_max), where its log says
    kept_up: bool | None            # None: a closed loop (nothing offered to keep up with)
    why: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _span_rate(times: list[float]) -> float | None:
    times = sorted(times)
    return (len(times) - 1) / (times[-1] - times[0]) if len(times) >= 3 and times[-1] > times[0] else None


def serve_of(run: Run, t: RunTimes) -> Serve:
    """Offered vs achieved rate and queueing of one run (its requests' times ``t``)."""
    engine_q = run.log.queued_max if run.log else None
    arrived = [r for r in t.requests if r.arrival_s is not None and r.e2e_s is not None]
    queue = [r.queue_s for r in t.requests if r.queue_s is not None]
    q50, q95 = percentile(queue, 50), percentile(queue, 95)
    if not t.open_load or len(arrived) < 3:
        return Serve(run.run_id, None, None, q50, q95, None, engine_q, None, "closed loop")
    offered = _span_rate([r.arrival_s for r in arrived])             # type: ignore[misc]
    achieved = _span_rate([r.arrival_s + r.e2e_s for r in arrived])  # type: ignore[operator]
    by_arrival = [r.queue_s or 0.0 for r in sorted(arrived, key=lambda r: r.arrival_s or 0.0)]
    third = max(1, len(by_arrival) // 3)
    growth = statistics.fmean(by_arrival[-third:]) - statistics.fmean(by_arrival[:third])
    short = offered is not None and achieved is not None and achieved < (1.0 - KEEP_UP_TOL) * offered
    grows = growth > max(2.0 / offered if offered else 0.0, t.unloaded_ttft_s or 0.0)
    why = "; ".join(x for x in (
        f"achieved {achieved:.3g} of {offered:.3g} req/s offered" if short and achieved and offered else "",
        f"queueing grew by {growth * 1000:.0f} ms over the run" if grows else "") if x)
    return Serve(run.run_id, offered, achieved, q50, q95, growth, engine_q, not (short or grows), why or "kept up")


def latency_metric(times: dict[str, RunTimes], metric: str, q: float) -> Callable[[Run], float | None]:
    """A run's percentile q of a latency metric, as stats.paired_speedup's measure of a run."""
    def of(run: Run) -> float | None:
        t = times.get(run.run_id)
        return None if t is None else t.percentile(metric, q)
    return of


def latency_ratios(exp: Experiment, arm: str, times: dict[str, RunTimes],
                   seed: int = stats.DEFAULT_SEED) -> dict[str, stats.Speedup]:
    """label -> the paired ratio arm / baseline of each latency percentile (LATENCY_RATIOS), interval over blocks."""
    return {label: stats.paired_speedup(exp, arm, seed, metric=latency_metric(times, m, q))
            for m, q, label in LATENCY_RATIOS}


def ratio_text(label: str, sp: stats.Speedup) -> str:
    """"TTFT p95 x0.98 (95% CI 0.95-1.02)": a latency ratio arm / baseline (below 1: the arm is faster)."""
    if sp.estimate is None:
        return f"{label} -"
    if sp.ci is None or not math.isfinite(sp.ci.lo):
        return f"{label} x{sp.estimate:.2f} (one block)"
    return f"{label} x{sp.estimate:.2f} ({sp.ci.lo:.2f}-{sp.ci.hi:.2f})"
