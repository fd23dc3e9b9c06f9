"""The report's section "SLO and capacity": each run against the SLO (goodput, the term that bound), each
configuration's capacity at the SLO with its interval over blocks, the iso-SLO ratios, the cost per million output
tokens at the SLO, and the throughput-per-GPU against per-user tok/s plot (docs/analysis.md, "SLO and capacity")."""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from specab.analysis.cost.economics import gpus_of
from specab.analysis.evidence.model import Experiment, Run
from specab.analysis.measures import stats
from specab.analysis.measures.capacity import (CONCURRENCY, RATE, CapacityReport, FamilyCapacity, analyse_capacity,
                                               load_axis)
from specab.analysis.measures.latency import RunTimes, times_of
from specab.analysis.measures.slo import evaluate
from specab.analysis.render.document import Bullets, Heading, Image, Para, Report, Table, legend_outside, subplots
from specab.analysis.render.document import fig_png as _fig_png     # the name tests/analysis patch
from specab.config import slo as slocfg
from specab.config.slo import Slo


@dataclass
class CapacityOptions:
    """What the report is asked beyond the stored experiment: an SLO over the stored one (report --slo), a GPU-hour
    price (--gpu-hour-usd: the run's, or the report command's)."""
    slo: list[str] = field(default_factory=list)
    gpu_hour_usd: float | None = None


def _argv_values(argv: list[str], flag: str) -> list[str]:
    return ([argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]
            + [a.split("=", 1)[1] for a in argv if a.startswith(flag + "=")])


def resolve(exp: Experiment, opts: CapacityOptions) -> tuple[Slo | None, str | None, float | None]:
    """(the SLO, the load axis, the GPU-hour price): the stored experiment's slo: and --slo with the report's --slo
    over them, its --search axis (else the matrix's load axis), and the report's price over the run's."""
    argv = list(exp.meta.get("argv") or [])
    stored = slocfg.from_config(exp.meta.get("config"), argv)
    slo = slocfg.resolve(stored.terms if stored else (), slocfg.parse_cli(opts.slo))
    search = _argv_values(argv, "--search")
    axis = search[-1].partition("=")[0] if search else load_axis(exp)
    usd = opts.gpu_hour_usd
    if usd is None and _argv_values(argv, "--gpu-hour-usd"):
        usd = float(_argv_values(argv, "--gpu-hour-usd")[-1])
    return slo, axis if axis in (RATE, CONCURRENCY) else None, usd


def _interp(x0: float, x1: float, t: float) -> float:
    return math.exp(math.log(x0) + t * (math.log(x1) - math.log(x0)))


def per_gpu_at_capacity(fc: FamilyCapacity) -> float | None:
    """Output tok/s per GPU at the capacity: per bracketed block, the throughput of its passing and failing probes
    interpolated (in logs) where the capacity lies between their loads; the geometric mean over blocks."""
    vals = []
    for b in fc.bracketed:
        runs = {p.load: p.run for p in fc.probes if p.block == b.block}
        lo, hi = runs.get(b.passed or -1.0), runs.get(b.failed or -1.0)
        if lo is None or hi is None or not lo.throughput or not hi.throughput or not b.estimate:
            continue
        t = math.log(b.estimate / b.passed) / math.log(b.failed / b.passed)    # type: ignore[operator]
        vals.append(_interp(lo.throughput / gpus_of(lo.server_args), hi.throughput / gpus_of(hi.server_args), t))
    return math.exp(statistics.fmean(map(math.log, vals))) if vals else None


def _cap_cell(fc: FamilyCapacity) -> str:
    if fc.estimate is None:
        return "-"
    if fc.ci is None or not math.isfinite(fc.ci.lo):
        return f"{fc.estimate:.3g} (one block)"
    return f"{fc.estimate:.3g} ({fc.ci.lo:.3g}-{fc.ci.hi:.3g})"


def _block_cell(fc: FamilyCapacity) -> str:
    parts = []
    for b in fc.blocks:
        again = f", met again at {', '.join(f'{x:g}' for x in b.met_above)}" if b.met_above else ""
        if b.estimate is not None:
            parts.append(f"b{b.block}: {b.estimate:.3g} ({b.passed:g}-{b.failed:g}{again})")
        elif b.censored == "above":
            parts.append(f"b{b.block}: above {b.passed:g}")
        elif b.censored == "below":
            parts.append(f"b{b.block}: below {b.failed:g}{again}")
    return "; ".join(parts) or "-"


def not_monotone(cap: CapacityReport) -> list[str]:
    """One line per block whose SLO result was not monotone in load: a miss with a pass above it. Its capacity is
    taken at the first miss, which rests on one run's percentile: the requests beyond it are few."""
    out = []
    for name, fc in cap.families.items():
        for b in fc.blocks:
            if not b.met_above:
                continue
            miss = next((p for p in fc.probes if p.block == b.block and p.load == b.failed), None)
            n = miss.slo.requests if miss else 0
            term = b.bound.text() if b.bound else "the SLO"
            tail = (f" ({term} over {n} requests rests on its {max(1, math.ceil(n * (1 - b.bound.q / 100)))}"
                    f" slowest)" if b.bound and n else "")
            out.append(f"{name}, block {b.block}: missed at {b.failed:g} {cap.unit}{tail} but met the SLO again at "
                       f"{', '.join(f'{x:g}' for x in b.met_above)}: the block's capacity, taken at the first miss, "
                       f"is that run's noise as much as the load's; more measured requests per run "
                       f"(bench.num_requests) steady a percentile, more blocks average it.")
    return out


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.1f}"


def _run_rows(exp: Experiment, slo: Slo, times: dict[str, RunTimes], axis: str | None) -> list[list[str]]:
    rows = []
    for r in sorted((r for r in exp.runs if r.ok and r.run_id in times), key=lambda r: (r.arm, r.block)):
        ev = evaluate(r, times[r.run_id], slo)
        load = exp.arm(r.arm).matrix.get(axis or "", "-")
        rows.append([r.arm, str(load), str(r.block), {True: "met", False: "missed", None: "-"}[ev.met]]
                    + [(_ms(t.observed_s) if t.term.name != "e2e_s" else f"{t.observed_s:.2f}")
                       if t.observed_s is not None else "-" for t in ev.terms]
                    + [ev.bound.text() if ev.bound else "-", f"{ev.good}/{ev.requests}",
                       "-" if ev.goodput is None else f"{ev.goodput:.3g}"])
    return rows


def _family_rows(cap: CapacityReport, usd: float | None) -> tuple[list[list[str]], dict[str, Any]]:
    rows, data = [], {}
    for name, fc in cap.families.items():
        per_gpu = per_gpu_at_capacity(fc)
        cost = usd * 1e6 / (3600.0 * per_gpu) if usd and per_gpu else None
        data[name] = {"per_gpu_tok_s_at_capacity": per_gpu, "usd_per_million_output_tokens": cost}
        rows.append([name, f"{len(fc.bracketed)}/{len(fc.blocks)}", _cap_cell(fc),
                     fc.bound_text(), _block_cell(fc),
                     "-" if per_gpu is None else f"{per_gpu:.0f}", "-" if cost is None else f"${cost:.3f}"])
    return rows, data


def capacity_section(rep: Report, exp: Experiment, *, times: dict[str, RunTimes] | None = None, plots: bool = True,
                     opts: CapacityOptions | None = None) -> dict[str, Any] | None:
    """Add the section to ``rep`` (and its verdicts to the summary); returns its report.json data, None without an
    SLO."""
    slo, axis, usd = resolve(exp, opts or CapacityOptions())
    if slo is None:
        return None
    times = times if times is not None else times_of(exp)
    rep.add(Heading("SLO and capacity"),
            Para(f"SLO: {slo.text()}. A run meets a term when the term's percentile over its requests is within the "
                 f"target (TTFT and end-to-end from each request's scheduled arrival under an arrival rate; ITL per "
                 f"token), and the SLO when it meets every term; the term that bound is the one furthest beyond (or "
                 f"nearest to) its target. Goodput: the requests that met every term per second of the run's "
                 f"measured window. A configuration's capacity in a block lies between its highest load that met "
                 f"the SLO and the lowest that did not, where the run's margin (log observed / target of the bounding "
                 f"term) crosses 0, interpolated in log load; its interval is over blocks (docs/analysis.md, SLO and "
                 f"capacity)."),
            Table(["arm", axis or "load", "block", "SLO"] + [t.text() for t in slo.terms]
                  + ["bound", "requests within", "goodput req/s"], _run_rows(exp, slo, times, axis)))
    data: dict[str, Any] = {"slo": slo.to_dict(), "axis": axis, "gpu_hour_usd": usd}
    cap = analyse_capacity(exp, slo, times, axis) if axis else None
    if cap is None or not cap.families:
        return data
    rows, per_family = _family_rows(cap, usd)
    rep.add(Heading("Capacity at the SLO", 3),
            Table(["configuration", "blocks bracketed", f"capacity {cap.unit} (95% CI)", "bound by",
                   "per block (passed-failed)", "output tok/s per GPU at capacity",
                   "USD per million output tokens" + (f" (at ${usd:g}/GPU-hour)" if usd else " (--gpu-hour-usd)")],
                  rows),
            Bullets(cap.verdicts() + not_monotone(cap)))
    rep.summary.extend(f"Capacity: {v}" for v in cap.verdicts())
    if plots:
        rep.add(Image("throughput_vs_per_user.png", "output tok/s per GPU against per-user tok/s, per configuration "
                      "over the loads (95% intervals over blocks)", plot_pareto(exp, cap)))
    return {**data, **cap.to_dict(), "cost": per_family}


def _ci(values: list[float], seed: int = stats.DEFAULT_SEED) -> tuple[float, float, float]:
    """(median, low, high): the 95 % interval over blocks where there are two or more values, taken on their logs (a
    rate is positive: with two blocks a linear t interval reaches below zero)."""
    med = statistics.median(values)
    if len(values) < 2 or min(values) <= 0:
        return med, med, med
    iv = stats.log_interval(values, seed)
    return med, min(med, iv.lo), max(med, iv.hi)                                   # type: ignore[union-attr]


def plot_pareto(exp: Experiment, cap: CapacityReport) -> bytes:
    """Per configuration, its loads as points of (per-user decode tok/s, output tok/s per GPU), joined in load order,
    each with its 95 % interval over blocks; hollow where the load missed the SLO in most blocks."""
    fig, ax = subplots((8, 5))
    colors = ["#57606a", "#0969da", "#cf222e", "#1a7f37", "#8250df", "#bf8700"]
    for i, (name, fc) in enumerate(cap.families.items()):
        by_load: dict[float, list[tuple[Run, bool | None]]] = {}
        for p in fc.probes:
            by_load.setdefault(p.load, []).append((p.run, p.slo.met))
        pts = []
        for load in sorted(by_load):
            runs = [(r, m) for r, m in by_load[load] if r.tok_s and r.throughput]
            if not runs:
                continue
            x = _ci([r.tok_s for r, _ in runs])                                     # type: ignore[misc]
            y = _ci([r.throughput / gpus_of(r.server_args) for r, _ in runs])       # type: ignore[operator]
            pts.append((load, x, y, sum(1 for _, m in runs if m) * 2 > len(runs)))
        color = colors[i % len(colors)]
        ax.plot([p[1][0] for p in pts], [p[2][0] for p in pts], "-", color=color, alpha=.5)
        for load, x, y, met in pts:
            ax.errorbar([x[0]], [y[0]], xerr=[[x[0] - x[1]], [x[2] - x[0]]], yerr=[[y[0] - y[1]], [y[2] - y[0]]],
                        fmt="o", color=color, mfc=color if met else "white", capsize=3)
            ax.annotate(f"{load:g}", (x[0], y[0]), textcoords="offset points", xytext=(4, 4), fontsize=7,
                        color=color)
        ax.plot([], [], "o-", color=color, label=name)
    ax.plot([], [], "o", color="#57606a", mfc="white", label="missed the SLO")
    ax.set_xlabel("per-user decode tok/s (median over the run's requests)")
    ax.set_ylabel("output tok/s per GPU (the run's throughput / GPUs)")
    ax.set_title(f"throughput per GPU vs per-user speed over the loads ({cap.unit} beside each point)")
    ax.grid(alpha=.3)
    legend_outside(ax)
    return _fig_png(fig)
