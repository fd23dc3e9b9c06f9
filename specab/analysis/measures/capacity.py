"""Capacity at the SLO: per configuration, the highest load whose runs meet the SLO, one estimate per block, and
the iso-SLO ratio of each speculative configuration to its baseline's with an interval over blocks.

Definitions (docs/analysis.md, "SLO and capacity"):
- a configuration ("family": the arms that differ only in their load) has in each block one run per probe load; the
  block's capacity lies between its highest load that met the SLO below its lowest load that did not (``passed`` and
  ``failed``), where the run's SLO margin (measures.slo: log(observed / target) of the term furthest beyond, <= 0
  met) crosses 0, interpolated linearly in the log of the load. A block whose probes all met the SLO places the
  capacity above its highest load, one whose probes all missed it (or missed it below every pass) below its lowest:
  such a block is censored and gives no estimate;
- the configuration's capacity: the geometric mean of its blocks' estimates with a 95 % interval over blocks (the
  interval of stats.bootstrap_ci on their logs, a t interval below 5 blocks);
- the iso-SLO ratio: per block where both the arm's and its baseline's configuration were bracketed, the ratio of
  their capacities; the geometric mean with its interval over blocks, as every paired speedup (stats.paired_speedup);
  a block where one of the two was censored still bounds its ratio from one side (the arm above its highest probe
  against the baseline's estimate: at least that ratio), and the verdict states those bounds beside the estimate:
  the paired blocks alone can point the other way;
- the term that bound: the term furthest beyond its target at the failing probe, the configuration's most common.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from specab.analysis.evidence.model import Experiment, Run, arm_concurrency, arm_rate
from specab.analysis.measures import stats
from specab.analysis.measures.concurrency import family_name
from specab.analysis.measures.latency import RunTimes
from specab.analysis.measures.slo import RunSlo, evaluate
from specab.config.slo import Slo, Term

RATE, CONCURRENCY = "request_rate", "concurrency"


@dataclass
class Probe:
    """One run of a configuration at one load."""
    family: str
    arm: str
    load: float
    block: int
    run: Run
    slo: RunSlo


@dataclass
class BlockCapacity:
    block: int
    loads: list[float]
    estimate: float | None = None
    passed: float | None = None      # the highest load that met the SLO below the first that did not
    failed: float | None = None      # the lowest load that did not
    censored: str | None = None      # "above": every probe met it; "below": none below the first miss did
    bound: Term | None = None        # the term furthest beyond its target at ``failed``
    # loads above ``failed`` that met the SLO again: pass and fail not monotone in load, so the block's capacity
    # rests on the noise of one run's percentile (kept at the first miss: the capacity is the load it holds up to)
    met_above: list[float] = field(default_factory=list)

    def span(self) -> tuple[float, float] | None:
        """The capacities the block allows: its estimate, above its highest probe, or below its first miss."""
        if self.estimate is not None:
            return self.estimate, self.estimate
        if self.censored == "above" and self.passed is not None:
            return self.passed, math.inf
        if self.censored == "below" and self.failed is not None:
            return 0.0, self.failed
        return None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "bound": self.bound.key if self.bound else None}


@dataclass
class FamilyCapacity:
    family: str
    baseline: str | None               # the baseline's configuration (None: this is a baseline)
    blocks: list[BlockCapacity] = field(default_factory=list)
    ci: stats.Interval | None = None
    probes: list[Probe] = field(default_factory=list)

    @property
    def bracketed(self) -> list[BlockCapacity]:
        return [b for b in self.blocks if b.estimate is not None]

    @property
    def estimate(self) -> float | None:
        if self.ci is not None:
            return self.ci.estimate
        est = [b.estimate for b in self.bracketed]
        return est[0] if est else None

    def _bound_terms(self) -> Counter[Term]:
        return Counter(b.bound for b in self.bracketed if b.bound is not None)

    @property
    def bound(self) -> Term | None:
        terms = self._bound_terms()
        return terms.most_common(1)[0][0] if terms else None

    def bound_text(self) -> str:
        """The term that bound the bracketed blocks; where blocks differ, each with its count of blocks (a tie
        names no one term)."""
        terms = self._bound_terms()
        if len(terms) <= 1:
            return self.bound.text() if self.bound else "-"
        return ", ".join(f"{t.text()} ({n} of {len(self.bracketed)} blocks)" for t, n in terms.most_common())

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, "baseline": self.baseline, "estimate": self.estimate,
                "ci": self.ci.to_dict() if self.ci else None, "bound": self.bound.key if self.bound else None,
                "blocks": [b.to_dict() for b in self.blocks],
                "probes": [{"arm": p.arm, "load": p.load, "block": p.block, **p.slo.to_dict()} for p in self.probes]}


@dataclass
class CapacityRatio:
    family: str
    baseline: str
    ratios: list[float]
    blocks: list[int]
    ci: stats.Interval | None
    # per block with one capacity censored: (block, lowest, highest ratio) the two capacities allow, one side finite
    bounds: list[tuple[int, float, float]] = field(default_factory=list)

    @property
    def estimate(self) -> float | None:
        return self.ci.estimate if self.ci else (self.ratios[0] if self.ratios else None)

    def text(self, slo: Slo, axis: str) -> str:
        what = "the request rate" if axis == RATE else "the requests in flight"
        if self.estimate is None:
            return (f"at {slo.text()}, no iso-SLO ratio of {self.family} to {self.baseline}: no block placed both "
                    f"capacities (see Capacity at the SLO)" + self._bounds_text())
        iv = ("one block, no interval" if self.ci is None or not math.isfinite(self.ci.lo)
              else f"95% CI {self.ci.lo:.2f}-{self.ci.hi:.2f}, {len(self.ratios)} blocks")
        return (f"at {slo.text()}, {self.family} serves {self.estimate:.2f}x {what} of {self.baseline} ({iv})"
                + self._bounds_text())

    def _bounds_text(self) -> str:
        if not self.bounds:
            return ""
        each = ", ".join(f">= {lo:.2f}x (block {b})" if math.isinf(hi) else f"<= {hi:.2f}x (block {b})"
                         for b, lo, hi in self.bounds)
        est = self.estimate
        against = est is not None and all((lo > 1.0 >= est) or (hi < 1.0 <= est) for _, lo, hi in self.bounds)
        more = "more " if self.ratios else ""
        return (f"; {len(self.bounds)} {more}block(s) placed one of the two capacities beyond its probes and bound the "
                f"ratio from one side: {each}" + (", all against the estimate: the paired blocks do not decide it"
                                                  if against else ""))

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, "baseline": self.baseline, "ratios": self.ratios, "blocks": self.blocks,
                "estimate": self.estimate, "ci": self.ci.to_dict() if self.ci else None,
                "bounds": [{"block": b, "lo": lo, "hi": None if math.isinf(hi) else hi} for b, lo, hi in self.bounds]}


@dataclass
class CapacityReport:
    axis: str
    slo: Slo
    families: dict[str, FamilyCapacity] = field(default_factory=dict)
    ratios: list[CapacityRatio] = field(default_factory=list)

    @property
    def unit(self) -> str:
        return "req/s" if self.axis == RATE else "in flight"

    def verdicts(self) -> list[str]:
        return [r.text(self.slo, self.axis) + "." for r in self.ratios]

    def to_dict(self) -> dict[str, Any]:
        return {"axis": self.axis, "unit": self.unit, "slo": self.slo.to_dict(),
                "families": {k: v.to_dict() for k, v in self.families.items()},
                "ratios": [r.to_dict() for r in self.ratios], "verdicts": self.verdicts()}


def load_axis(exp: Experiment) -> str | None:
    """The load the arms vary: request_rate where any arm has one in its matrix, else concurrency, else None."""
    keys = {k for a in exp.arms for k in a.matrix}
    return RATE if RATE in keys else CONCURRENCY if CONCURRENCY in keys else None


def _load(exp: Experiment, arm: str, axis: str) -> float:
    return arm_rate(exp, arm) if axis == RATE else float(arm_concurrency(exp, arm))


def block_capacity(block: int, probes: list[Probe]) -> BlockCapacity:
    """The block's capacity from its probes (see the module's definitions)."""
    ps = sorted((p for p in probes if p.slo.met is not None), key=lambda p: p.load)
    out = BlockCapacity(block, [p.load for p in ps])
    fail = next((p for p in ps if not p.slo.met), None)
    if fail is None:
        out.censored = "above" if ps else None
        out.passed = ps[-1].load if ps else None
        return out
    below = [p for p in ps if p.load < fail.load and p.slo.met]
    out.failed, out.bound = fail.load, fail.slo.bound
    out.met_above = [p.load for p in ps if p.load > fail.load and p.slo.met]
    if not below:
        out.censored = "below"
        return out
    ok = below[-1]
    out.passed = ok.load
    m0, m1 = ok.slo.margin, fail.slo.margin
    t = 0.5 if m0 is None or m1 is None or not math.isfinite(m0) or not math.isfinite(m1) or m1 <= m0 \
        else (0.0 - m0) / (m1 - m0)
    out.estimate = math.exp(math.log(ok.load) + min(1.0, max(0.0, t)) * (math.log(fail.load) - math.log(ok.load)))
    return out


def one_sided(fc: FamilyCapacity, base: FamilyCapacity, paired: set[int]) -> list[tuple[int, float, float]]:
    """Per block outside ``paired`` where both configurations probed: the ratio's range their spans allow, kept
    where one side of it is finite and informative (both censored the same way bound nothing)."""
    bspan = {b.block: b.span() for b in base.blocks}
    out = []
    for b in fc.blocks:
        a, s = b.span(), bspan.get(b.block)
        if b.block in paired or a is None or s is None:
            continue
        lo = a[0] / s[1] if s[1] > 0 else 0.0
        hi = a[1] / s[0] if s[0] > 0 else math.inf
        if lo > 0 or math.isfinite(hi):
            out.append((b.block, lo, hi))
    return out


def probes_of(exp: Experiment, slo: Slo, axis: str, times: dict[str, RunTimes]) -> dict[str, FamilyCapacity]:
    """Every ok run as a probe of its configuration, evaluated against the SLO."""
    fams: dict[str, FamilyCapacity] = {}
    for a in exp.arms:
        base = exp.baseline_of(a.name)
        fam = family_name(a.name, arm_concurrency(exp, a.name), a.matrix)
        bfam = None if base == a.name else family_name(base, arm_concurrency(exp, base), exp.arm(base).matrix)
        fc = fams.setdefault(fam, FamilyCapacity(fam, bfam))
        for r in exp.runs_of(a.name):
            if r.run_id in times:
                fc.probes.append(Probe(fam, a.name, _load(exp, a.name, axis), r.block, r,
                                       evaluate(r, times[r.run_id], slo)))
    return fams


def analyse_capacity(exp: Experiment, slo: Slo, times: dict[str, RunTimes], axis: str | None = None,
                     seed: int = stats.DEFAULT_SEED) -> CapacityReport | None:
    """Each configuration's capacity per block and over blocks, and the iso-SLO ratios; None without a load axis."""
    axis = axis or load_axis(exp)
    if axis is None:
        return None
    rep = CapacityReport(axis, slo, probes_of(exp, slo, axis, times))
    for fc in rep.families.values():
        blocks = sorted({p.block for p in fc.probes})
        fc.blocks = [block_capacity(b, [p for p in fc.probes if p.block == b]) for b in blocks]
        fc.ci = stats.log_interval([b.estimate for b in fc.bracketed], seed) if len(fc.bracketed) >= 2 else None
    for fc in rep.families.values():
        base = rep.families.get(fc.baseline or "")
        if base is None:
            continue
        bcap = {b.block: b.estimate for b in base.bracketed}
        pairs = [(b.block, b.estimate / bcap[b.block]) for b in fc.bracketed if b.block in bcap]
        ratios = [r for _, r in pairs]
        rep.ratios.append(CapacityRatio(fc.family, base.family, ratios, [b for b, _ in pairs],
                                        stats.log_interval(ratios, seed) if len(ratios) >= 2 else None,
                                        one_sided(fc, base, {b for b, _ in pairs})))
    return rep
