"""The verdict per load: paired speedups per user and in throughput at each concurrency, and the crossover.

A speculative verdict depends on how many requests share the batch: a batched verify pass checks every request's
drafts at once and grows much faster with the batch than a decode step does (known-truth models on the H200,
docs/validation/known-truth.md, pooled over three leases: EAGLE-3 s3 x2.02 per user at 1 in flight, x1.49 at 8,
x0.98 at 32; in throughput x0.87 from 16 in flight, at an unchanged accept length). An experiment that ran
at several loads (`--matrix ... concurrency=1,8,32`: each load its own arms and its own baseline) is read here
per configuration ("family": the arms that differ only in their load) and per load.

Definitions (docs/analysis.md, "Verdict per load"):
- per-user speedup at load c: the paired speedup (stats.paired_speedup, one rule for every speedup) of the arm's
  runs at c against its baseline's runs at c on each run's median per-request decode tok/s;
- throughput speedup: the same pairing on each run's total output tok/s (model.Run.throughput: every measured
  request's output tokens over the measured window);
- break-even at load c: tau* = cycle / baseline step, both from the runs at c (cycle = tau / per-user tok/s of the
  arm, step = 1 / per-user tok/s of the baseline), so the verify pass is costed at that batch, never from the
  single-stream step;
- at an arrival rate (an open load) each run's offered and achieved rates and queueing (measures.loadserve): where
  both arms of a point kept up in every block, the point "served the offered load": its throughput ratio is ~1 by
  construction and is not stated (nor used for a crossover); the comparison there is latency (TTFT, TPOT, per-token
  ITL percentiles, paired ratios over blocks). A closed loop (requests in flight) saturates by construction and
  keeps its throughput verdict;
- crossover: where the speedup crosses 1 as the load grows (in throughput: over the points whose ratio is stated). Between the two measured loads that bracket the first
  crossing, log speedup is interpolated linearly in log concurrency (the geometric-mean speedup is a mean of logs;
  loads are sown on a doubling scale). Its 95 % range carries the intervals' ends through the same interpolation:
  the curve of interval lower ends crosses 1 first (the low end of the range), the curve of upper ends last (the
  high end). An end the measured loads cannot place is open: below the smallest load (the lower ends are under 1
  already there) or above the largest (the upper ends never fall under 1).
"""
from __future__ import annotations

import math
import re
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from specab.analysis.measures import loadserve, stats
from specab.analysis.measures.latency import RunTimes, times_of
from specab.analysis.evidence.model import Experiment, Run, arm_concurrency, arm_rate, load_label

_LOAD_SUFFIX = re.compile(r"-c(\d+)$")
_RATE_SUFFIX = re.compile(r"-r([0-9.]+)$")
IN_FLIGHT, PER_SECOND = "in flight", "req/s"        # the two kinds of load: requests in flight, arrivals per second


def run_throughput(run: Run) -> float | None:
    """The speedup-in-throughput measure: the run's total output tok/s (model.Run.throughput)."""
    return run.throughput


@dataclass
class LoadPoint:
    """One configuration at one load: its speedups and what they rest on."""
    arm: str
    baseline: str
    concurrency: int
    per_user: stats.Speedup
    throughput: stats.Speedup
    arm_tok_s: float | None            # per-user decode tok/s, median over runs
    baseline_tok_s: float | None
    arm_throughput: float | None       # total output tok/s, median over runs
    baseline_throughput: float | None
    tau: float | None                  # the arm's accept length at this load (mean over runs)
    latency: dict[str, dict[str, dict[str, float | None]]] = field(default_factory=dict)  # arm|baseline -> metric -> pXX
    rate: float = 0.0                  # measured requests per second at arrival times; 0: a closed loop
    serve: dict[str, list[loadserve.Serve]] = field(default_factory=dict)   # arm|baseline -> per run
    latency_ratios: dict[str, stats.Speedup] = field(default_factory=dict)  # label -> paired ratio arm / baseline

    @property
    def served(self) -> bool:
        """Both arms kept up with the offered arrival rate in every run (never at a closed loop): the throughput
        ratio is the arrival rate's by construction and is not stated."""
        runs = [s for who in ("arm", "baseline") for s in self.serve.get(who, [])]
        return self.rate > 0 and bool(runs) and all(s.kept_up for s in runs)

    @property
    def throughput_stated(self) -> bool:
        return not self.served

    def served_text(self) -> str:
        """"both served the offered load (4 req/s offered; achieved 3.98 / 4.01 req/s)" with the latency ratios."""
        def achieved(who: str) -> str:
            v = [s.achieved for s in self.serve.get(who, []) if s.achieved]
            return f"{statistics.median(v):.3g}" if v else "-"
        offered = [s.offered for w in ("arm", "baseline") for s in self.serve.get(w, []) if s.offered]
        lat = ", ".join(loadserve.ratio_text(k, v) for k, v in self.latency_ratios.items()
                        if k in ("TTFT p95", "TPOT p50", "ITL/token p95"))
        return (f"both served the offered load ({statistics.median(offered):.3g} req/s offered; achieved "
                f"{achieved('arm')} / {achieved('baseline')} req/s), no throughput ratio; latency arm/baseline: "
                f"{lat}") if offered else "both served the offered load"

    @property
    def load(self) -> float:
        """What the family sweeps: the arrival rate where there is one, else the requests in flight."""
        return self.rate if self.rate > 0 else self.concurrency

    @property
    def unit(self) -> str:
        return PER_SECOND if self.rate > 0 else IN_FLIGHT

    @property
    def tau_star(self) -> float | None:
        """Break-even accept length from the runs at this load: cycle / baseline step = tau x baseline / arm tok/s."""
        if not self.tau or not self.arm_tok_s or not self.baseline_tok_s:
            return None
        return self.tau * self.baseline_tok_s / self.arm_tok_s

    @property
    def label(self) -> str:
        return load_label(self.concurrency, self.rate)

    def to_dict(self) -> dict[str, Any]:
        return {"arm": self.arm, "baseline": self.baseline, "concurrency": self.concurrency, "rate": self.rate,
                "label": self.label,
                "per_user": self.per_user.to_dict(), "throughput": self.throughput.to_dict(),
                "arm_tok_s": self.arm_tok_s, "baseline_tok_s": self.baseline_tok_s,
                "arm_throughput": self.arm_throughput, "baseline_throughput": self.baseline_throughput,
                "tau": self.tau, "tau_star": self.tau_star, "latency": self.latency,
                "served": self.served, "throughput_stated": self.throughput_stated,
                "serve": {w: [x.to_dict() for x in v] for w, v in self.serve.items()},
                "latency_ratios": {k: v.to_dict() for k, v in self.latency_ratios.items()}}


def served(exp: Experiment, arm: str) -> tuple[int, int] | None:
    """(most requests running at once, most queued) over the arm's runs by the server's own log, where its server
    queued requests while fewer than the requests in flight ran (the load asked was not the load run); else None."""
    logs = [r.log for r in exp.runs_of(arm) if r.log is not None and r.log.running_max is not None]
    running = max((lg.running_max or 0 for lg in logs), default=0)
    queued = max((lg.queued_max or 0 for lg in logs), default=0)
    if not logs or not queued or running >= arm_concurrency(exp, arm):
        return None
    return running, queued


def arm_load_label(exp: Experiment, arm: str) -> str:
    """The load an arm's runs ran at: the requests in flight asked (and rate), and, where its server queued
    requests, what the server ran (`served`)."""
    label = load_label(arm_concurrency(exp, arm), arm_rate(exp, arm))
    ran = served(exp, arm)
    if ran is None:
        return label
    return f"{label}, of which the server ran at most {ran[0]} at once and queued up to {ran[1]} (its own log)"


@dataclass
class Crossover:
    """Where a speedup curve crosses 1 (see the module's definitions). ``estimate`` None: it does not cross within
    the measured loads (``pays`` says on which side it stays)."""
    measure: str                        # "per user" | "throughput"
    estimate: float | None
    lo: float | None                    # None with lo_open: below the smallest measured load
    hi: float | None                    # None with hi_open: above the largest measured load
    lo_open: bool = False
    hi_open: bool = False
    direction: str = "stops"            # "stops": pays below, loses above; "starts": the other way round
    pays: str | None = None             # without a crossing: "everywhere" | "nowhere" | None (too few loads)
    loads: tuple[float, ...] = ()
    unit: str = IN_FLIGHT               # of the loads: requests in flight, or arrivals per second
    note: str | None = None             # why there is no verdict at all (every point served its offered load)

    def text(self) -> str:
        lo_c, hi_c = (f"{min(self.loads):g}", f"{max(self.loads):g}") if self.loads else ("0", "0")
        if self.note:
            return self.note
        if self.estimate is None:
            if self.pays == "everywhere":
                return f"pays {self.measure} at every measured load (up to {hi_c} {self.unit})"
            if self.pays == "nowhere":
                return f"pays {self.measure} at none of the measured loads (from {lo_c} {self.unit})"
            return f"no crossover {self.measure}: fewer than two loads with a speedup"
        lo = f"below {lo_c}" if self.lo_open or self.lo is None else f"{self.lo:.1f}"
        hi = f"above {hi_c}" if self.hi_open or self.hi is None else f"{self.hi:.1f}"
        verb = "stops paying" if self.direction == "stops" else "starts paying"
        return f"{verb} {self.measure} at ~{self.estimate:.1f} {self.unit} (95% range {lo} to {hi})"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "loads": list(self.loads), "text": self.text()}


@dataclass
class Family:
    """One speculative configuration over the loads it ran at."""
    name: str
    points: list[LoadPoint]
    per_user: Crossover
    throughput: Crossover

    def verdict(self) -> str:
        """One line: the speedup at each load, per user then in throughput (where stated: a load both arms served
        says so, with its latency ratios, instead), and the crossovers."""
        def where(i: int, p: LoadPoint) -> str:
            return p.label if i == 0 else f"{p.load:g}" + ("" if p.unit == IN_FLIGHT else f" {p.unit}")

        per_user = ", ".join(f"{_x(p.per_user.estimate)} at {where(i, p)}" for i, p in enumerate(self.points))
        thr = [f"{_x(p.throughput.estimate)} at {where(i, p)}" for i, p in enumerate(self.points)
               if p.throughput_stated]
        served = [f"at {where(i, p)} {p.served_text()}" for i, p in enumerate(self.points) if p.served]
        parts = [f"{self.name}: {per_user} per user"]
        if thr:
            parts.append(f"{', '.join(thr)} in throughput")
        parts += served + [self.per_user.text(), self.throughput.text()]
        return "; ".join(parts) + "."

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "points": [p.to_dict() for p in self.points], "per_user": self.per_user.to_dict(),
                "throughput": self.throughput.to_dict(), "verdict": self.verdict()}


@dataclass
class LoadReport:
    families: list[Family] = field(default_factory=list)
    times: dict[str, RunTimes] | None = None      # the runs' request latencies read for the points (not reported)

    @property
    def loads(self) -> list[float]:
        return sorted({p.load for f in self.families for p in f.points})

    @property
    def unit(self) -> str:
        """The loads' kind when every family sweeps the same kind (rates win the axis when any family has them)."""
        return PER_SECOND if any(p.rate > 0 for f in self.families for p in f.points) else IN_FLIGHT

    @property
    def several_loads(self) -> bool:
        return len(self.loads) > 1

    def to_dict(self) -> dict[str, Any]:
        return {"loads": self.loads, "families": [f.to_dict() for f in self.families]}


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def family_name(arm: str, concurrency: int, matrix: dict[str, Any]) -> str:
    """The arm's configuration without its load: the matrix's `-r<R>` ending removed where it swept arrival rates
    (its requests in flight then stay in the name), else its `-c<N>` ending (the arm's own name when it did not come
    from a load axis)."""
    if "request_rate" in matrix:
        m = _RATE_SUFFIX.search(arm)
        return arm[:m.start()] if m else arm
    if "concurrency" in matrix:
        m = _LOAD_SUFFIX.search(arm)
        if m and int(m.group(1)) == concurrency:
            return arm[:m.start()]
    return arm


def crossing(loads: list[float], speedups: list[float | None]) -> tuple[float | None, str]:
    """The load where a speedup curve first crosses 1, interpolating log speedup linearly in log load between the
    bracketing measured loads; (None, "") when it does not cross. Loads without a value are skipped."""
    pts = [(c, s) for c, s in zip(loads, speedups) if s is not None and s > 0 and math.isfinite(s)]
    for (c0, s0), (c1, s1) in zip(pts, pts[1:]):
        if (s0 >= 1.0) != (s1 >= 1.0):
            y0, y1 = math.log(s0), math.log(s1)
            t = y0 / (y0 - y1)
            return math.exp(math.log(c0) + t * (math.log(c1) - math.log(c0))), ("stops" if s0 >= 1.0 else "starts")
    return None, ""


def crossover(measure: str, points: list[LoadPoint], attr: str) -> Crossover:
    unit = points[0].unit if points else IN_FLIGHT
    if attr == "throughput":        # a ratio that is the arrival rate's by construction places no crossover
        stated = [p for p in points if p.throughput_stated]
        if not stated and points:
            return Crossover(measure, None, None, None, loads=tuple(p.load for p in points), unit=unit,
                             note=f"no verdict {measure}: both arms served the offered load at every measured rate")
        points = stated
    loads = [p.load for p in points]
    sps = [getattr(p, attr) for p in points]
    est = [s.estimate for s in sps]
    have = [e for e in est if e is not None]
    if len(have) < 2:
        return Crossover(measure, None, None, None, pays=None, loads=tuple(loads), unit=unit)
    c, direction = crossing(loads, est)
    if c is None:
        return Crossover(measure, None, None, None, pays="everywhere" if have[0] >= 1.0 else "nowhere",
                         loads=tuple(loads), unit=unit)

    def end(values: list[float | None]) -> tuple[float | None, bool]:
        """The crossing of one curve of interval ends, or (None, True) where the loads cannot place it."""
        x, _ = crossing(loads, values)
        return (x, False) if x is not None else (None, True)

    def ends(which: str) -> list[float | None]:
        out: list[float | None] = []
        for s in sps:
            if s.ci is not None and math.isfinite(s.ci.lo) and math.isfinite(s.ci.hi):
                out.append(s.ci.lo if which == "lo" else s.ci.hi)
            else:       # no interval (one block): the end cannot be placed
                out.append(None)
        return out

    # the curve that crosses first as the load grows: the lower ends when speculation stops paying, the upper ends
    # when it starts
    first, last = ("lo", "hi") if direction == "stops" else ("hi", "lo")
    lo, lo_open = end(ends(first))
    hi, hi_open = end(ends(last))
    if lo is not None and lo > c:       # a lower-end curve that crosses back later, not where it first fell
        lo, lo_open = None, True
    if hi is not None and hi < c:
        hi, hi_open = None, True
    return Crossover(measure, c, lo, hi, lo_open, hi_open, direction, None, tuple(loads), unit)


def _median(values: list[float | None]) -> float | None:
    v = [x for x in values if x is not None and math.isfinite(x)]
    return statistics.median(v) if v else None


def _latency(runs: list[Run]) -> dict[str, dict[str, float | None]]:
    """Median over runs of each latency percentile the client recorded (seconds)."""
    out: dict[str, dict[str, float | None]] = {}
    for r in runs:
        for metric, qs in (r.latency or {}).items():
            for q in qs:
                out.setdefault(metric, {}).setdefault(q, None)
    return {m: {q: _median([(r.latency or {}).get(m, {}).get(q) for r in runs]) for q in qs}
            for m, qs in out.items()}


def _latency_of(runs: list[Run], times: dict[str, RunTimes]) -> dict[str, dict[str, float | None]]:
    """Median over runs of each latency percentile: recomputed from the requests (latency.RunTimes, TTFT and e2e from
    the scheduled arrival under an arrival rate, ITL per chunk and per token) where read, else the client's."""
    if not runs or not all(r.run_id in times for r in runs):
        return _latency(runs)
    per = [times[r.run_id].percentiles() for r in runs]
    return {m: {q: _median([p[m][q] for p in per]) for q in per[0][m]} for m in per[0]}


def _serve(points: list[LoadPoint], exp: Experiment, times: dict[str, RunTimes], seed: int) -> None:
    """Each point's runs' offered and achieved rates and queueing, and its paired latency ratios."""
    for p in points:
        for who, name in (("arm", p.arm), ("baseline", p.baseline)):
            p.serve[who] = [loadserve.serve_of(r, times[r.run_id]) for r in exp.runs_of(name) if r.run_id in times]
            p.latency[who] = _latency_of(exp.runs_of(name), times)
        p.latency_ratios = loadserve.latency_ratios(exp, p.arm, times, seed)


def analyse_loads(exp: Experiment, seed: int = stats.DEFAULT_SEED,
                  per_user: dict[str, stats.Speedup] | None = None) -> LoadReport:
    """Every speculative arm as a point (configuration, load), grouped into families. ``per_user``: speedups
    already computed (stats.analyse), reused rather than drawn again. The runs' request latencies
    (latency.times_of) are read where several loads or an arrival rate need them."""
    groups: dict[str, list[LoadPoint]] = {}
    for a in exp.spec_arms:
        c = arm_concurrency(exp, a.name)
        base = exp.baseline_of(a.name)
        arm_runs, base_runs = exp.runs_of(a.name), exp.runs_of(base)
        taus = [r.accept_len for r in arm_runs if r.accept_len]
        pu = (per_user or {}).get(a.name) or stats.paired_speedup(exp, a.name, seed)
        point = LoadPoint(
            arm=a.name, baseline=base, concurrency=c, per_user=pu,
            throughput=stats.paired_speedup(exp, a.name, seed, metric=run_throughput),
            arm_tok_s=_median([r.tok_s for r in arm_runs]), baseline_tok_s=_median([r.tok_s for r in base_runs]),
            arm_throughput=_median([r.throughput for r in arm_runs]),
            baseline_throughput=_median([r.throughput for r in base_runs]),
            tau=statistics.fmean(taus) if taus else None,
            latency={"arm": _latency(arm_runs), "baseline": _latency(base_runs)}, rate=arm_rate(exp, a.name))
        groups.setdefault(family_name(a.name, c, a.matrix), []).append(point)
    rep = LoadReport()
    points = [p for pts in groups.values() for p in pts]
    if len({p.load for p in points}) > 1 or any(p.rate > 0 for p in points):
        wanted = list({r.run_id: r for p in points for name in (p.arm, p.baseline) for r in exp.runs_of(name)}.values())
        times = times_of(exp, wanted)
        _serve(points, exp, times, seed)
        rep.times = times
    for name, pts in groups.items():
        pts.sort(key=lambda p: p.load)
        rep.families.append(Family(name, pts, crossover("per user", pts, "per_user"),
                                   crossover("in throughput", pts, "throughput")))
    return rep
