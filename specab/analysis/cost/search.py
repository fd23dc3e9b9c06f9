"""The capacity search's probe design: which loads each block runs, when to stop, and what it is expected to cost.

The search (``--search request_rate|concurrency``, docs/analysis.md "SLO and capacity") decides between blocks, as
the design by cost does: after each block the controller reads the stored runs and plans the next block's probe
loads, the same loads for every arm (each probe a paired comparison, one server instance per arm and block where the
runs of one arm share a server). Per configuration (measures.capacity):

1. block 1 brackets: the ladder, the search's start doubling up to its end (grid points 0, n, 2n, ...; n grid steps
   per doubling);
2. every later block probes, per configuration, two grid points ``j`` steps apart that straddle the geometric mean of
   its capacity estimates so far (its bracketed blocks), so the block brackets the capacity by itself and gives its
   own estimate: j halves after a bracketed block (bisection: n/2, n/4, ... down to one grid step, the tolerance) and
   doubles after a censored one (the window moves past the side it missed, bracketing again); a configuration never
   bracketed extends the ladder beyond the side it passed or failed everywhere;
3. it stops when every configuration has at least ``min_blocks`` bracketed blocks and its last block bracketed it at
   one grid step, or at ``max_blocks``, or when a configuration's capacity lies beyond the search's reach.

The loads of a block are the union of its configurations' probes. Each block's estimate is its own (the blocks are
the replicates of the interval); the later blocks' narrower brackets make their estimates the more exact.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from specab.analysis.cost import design
from specab.analysis.evidence.model import Experiment
from specab.analysis.measures.capacity import CapacityReport, FamilyCapacity, analyse_capacity
from specab.analysis.measures.latency import times_of
from specab.config.search import Search
from specab.config.slo import Slo


@dataclass
class SearchStep:
    """The controller's decision after a block: another block at these loads, or stop, and why."""
    more: bool
    loads: list[float]
    reason: str
    windows: dict[str, str] = field(default_factory=dict)     # configuration -> what its probes are

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def widths(fc: FamilyCapacity, n: int) -> list[int]:
    """The window (grid steps between its two probes) each of the configuration's blocks used: n for the ladder, then
    halved after a bracketed block down to 1, doubled after a censored one up to n (the policy replayed)."""
    out, j = [], n
    for b in fc.blocks:
        out.append(j)
        j = max(1, j // 2) if b.estimate is not None else min(n, 2 * j)
    return out + [j]


def _distinct(search: Search, lo: int, hi: int) -> tuple[int, int]:
    """A pair whose loads differ (on a concurrency grid neighbouring points can round to one number)."""
    while search.load(hi) <= search.load(lo):
        hi += 1
    return lo, hi


def window(fc: FamilyCapacity, search: Search) -> tuple[list[int], str]:
    """The configuration's grid points for the next block, and in words why."""
    n = search.steps_per_doubling
    j = widths(fc, n)[-1]
    est = [search.index(b.estimate) for b in fc.bracketed]          # type: ignore[arg-type]
    last = fc.blocks[-1] if fc.blocks else None
    probed = sorted({search.index(p.load) for p in fc.probes})
    if not est:
        if last is None or not probed:
            return [round(k) for k in map(search.index, search.ladder())], "the ladder"
        if all(b.censored == "above" for b in fc.blocks):
            top = round(max(probed))
            return [top + n, top + 2 * n], f"met the SLO up to {search.load(top):g}: the ladder goes on up"
        low = round(min(probed))
        return [low - 2 * n, low - n], f"missed the SLO from {search.load(low):g}: the ladder goes on down"
    x = sum(est) / len(est)
    if last is not None and last.censored == "above" and last.passed is not None:
        x = max(x, search.index(last.passed) + j / 2)
    elif last is not None and last.censored == "below" and last.failed is not None:
        x = min(x, search.index(last.failed) - j / 2)
    lo, hi = _distinct(search, math.floor(x - j / 2 + 0.5), math.floor(x - j / 2 + 0.5) + j)
    return [lo, hi], f"{search.load(lo):g}-{search.load(hi):g} around {search.load(x):.3g} ({j} grid step(s))"


def _converged(fc: FamilyCapacity, n: int, min_blocks: int) -> bool:
    used = widths(fc, n)[:-1]
    return (len(fc.bracketed) >= min_blocks and bool(fc.blocks) and fc.blocks[-1].estimate is not None
            and used[-1] <= 1)


def next_block(exp: Experiment, search: Search, slo: Slo, *, min_blocks: int, max_blocks: int) -> SearchStep:
    """After the blocks stored so far: the next block's loads, or stop (see the module's rule)."""
    cap = analyse_capacity(exp, slo, times_of(exp), search.axis)
    blocks = max((r.block for r in exp.runs), default=0)
    if cap is None or not cap.families:
        return SearchStep(blocks == 0, search.ladder(), "the ladder" if blocks == 0 else "no probe measured")
    n = search.steps_per_doubling
    if all(_converged(fc, n, min_blocks) for fc in cap.families.values()):
        return SearchStep(False, [], f"every configuration bracketed in {min_blocks}+ blocks, the last at one grid "
                                     f"step ({search.tol:.0%}): " + summary(cap))
    if blocks >= max_blocks:
        return SearchStep(False, [], f"stopped at --max-repeats {max_blocks} blocks: " + summary(cap))
    points: set[int] = set()
    windows = {}
    for name, fc in cap.families.items():
        ks, why = window(fc, search)
        if not all(search.in_reach(k) for k in ks):
            return SearchStep(False, [], f"{name}: its capacity lies beyond the search's reach ({why}); widen "
                                         f"--search {search.axis}=LO..HI" + (
                                             f" or measure more than {search.most:g} requests per run"
                                             if math.isfinite(search.most) else ""))
        points.update(ks)
        windows[name] = why
    loads = sorted({search.load(k) for k in points})
    return SearchStep(True, loads, f"block {blocks + 1}: {', '.join(f'{x:g}' for x in loads)} {search.unit} ("
                                   + "; ".join(f"{k}: {v}" for k, v in windows.items()) + ")", windows)


def summary(cap: CapacityReport) -> str:
    return ", ".join(f"{name} {fc.estimate:.3g} {cap.unit}" if fc.estimate is not None else f"{name} not placed"
                     for name, fc in cap.families.items())


def probe_run_s(cost: design.RunCost, search: Search, load: float, requests: int) -> float:
    """What one probe run is expected to hold its GPUs for: its restart, then its requests, which an arrival rate
    spreads over requests / rate seconds (plus one request's time), and a closed loop of c in flight over
    requests / c request times."""
    return cost.restart_s + (requests / load + cost.per_request_s if search.axis == "request_rate"
                             else math.ceil(requests / load) * cost.per_request_s)


def plan_lines(search: Search, slo: Slo, *, families: int, arms: int, requests: int, min_blocks: int,
               max_blocks: int, cost: design.RunCost | None) -> list[str]:
    """What `run --search` will do and its expected GPU-minutes, before anything runs."""
    ladder = search.ladder()
    n = search.steps_per_doubling
    refine = max(min_blocks - 1, int(math.log2(n)))
    per_later = min(2 * families, len(ladder) + 1)
    expected = 1 + refine
    lines = [f"{search.text()}, SLO {slo.text()}: per configuration the highest load that meets it.",
             f"block 1 (the ladder): {', '.join(f'{x:g}' for x in ladder)} {search.unit} x {arms} arms = "
             f"{len(ladder) * arms} runs;",
             f"then per block two probes per configuration ({families} configurations: at most {per_later} loads x "
             f"{arms} arms = {per_later * arms} runs), halving the window from {n} grid steps to 1; expected "
             f"{expected} blocks (at least {min_blocks} bracketed, at most --max-repeats {max_blocks})."]
    if cost is None:
        lines.append("no run cost known for this node yet: GPU-minutes not estimated (the history of an earlier "
                     "experiment with this fingerprint, or a simulated node's profile, gives one).")
        return lines
    first = sum(probe_run_s(cost, search, x, requests) for x in ladder) * arms
    mid = math.exp(sum(math.log(x) for x in ladder) / len(ladder))
    later = probe_run_s(cost, search, mid, requests) * per_later * arms * refine
    most = probe_run_s(cost, search, min(ladder), requests) * per_later * arms * (max_blocks - 1)
    lines.append(f"expected {cost.gpus * (first + later) / 60:.1f} GPU-minutes (block 1: {cost.gpus * first / 60:.1f};"
                 f" at most {cost.gpus * (first + most) / 60:.1f} at --max-repeats), one server start per run "
                 f"({cost.restart_s:.0f} s each, {cost.source}).")
    return lines
