"""Report: `report.md` and a self-contained `report.html` (plots embedded) for one experiment.

`python driver.py report <experiment-dir-or-id>` loads the experiment from its results store, runs
the statistics, the spec model and the doctor, writes both files into the experiment directory
(plots also as PNG files under `report/`) and prints the summary. The driver calls
`write_report(exp_dir)` at the end of an experiment.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import warnings
from pathlib import Path
from typing import Any, Collection, Sequence, TextIO

from specab.analysis.evidence import combine
from specab.analysis.measures import concurrency
from specab.analysis.measures import distribution
from specab.analysis.findings import doctor
from specab.analysis.cost import economics
from specab.analysis.cost import instances
from specab.analysis.measures import phases
from specab.analysis.measures import positions
from specab.analysis.measures import specmodel
from specab.analysis.measures import stats
from specab.analysis.measures import truthcheck
from specab.analysis.measures import workload
from specab.analysis.evidence.model import (AnalysisError, Experiment, Run, arm_concurrency, arm_rate,
                                            bench_concurrency, gc_paused, load_label, load_store, tok_s_meaning)
from specab.analysis.measures import validity
# the document model (Report and its blocks, Markdown and HTML), used here and by the callers as report.<name>
from specab.analysis.render.document import (Bullets, Heading, Image, Para, Report, Table,  # noqa: F401
                                             legend_outside, subplots, to_html, to_markdown)
from specab.analysis.render.document import fig_png as _fig_png     # the name tests/analysis patch
from specab.analysis.render.capacity import CapacityOptions, capacity_section
from specab.analysis.render.loadserve import serve_blocks
from specab.config.yamlfile import ConfigError
from specab.results.locate import NotFound, locate
from specab.analysis.subcommand import standalone_main

# ------------------------------------------------------------------------------ plots

def plot_tok_s(exp: Experiment, st: stats.ExperimentStats) -> bytes:
    """Each run's tok/s, each arm's median over runs (the Arms table's headline) and the table's 95 % interval, on
    an axis from zero so a gap of a few percent looks like one."""
    fig, ax = subplots()
    for i, a in enumerate(exp.arms):
        s = st.arms[a.name]
        vals = [r["tok_s"] for r in s.per_run if r["tok_s"]]
        ax.scatter([i] * len(vals), vals, s=14, alpha=.6, color="#57606a", zorder=3,
                   label="one run" if i == 0 else None)
        if s.tok_s_run.median:
            ax.scatter([i + .15], [s.tok_s_run.median], marker="D", s=36, color="#0969da", zorder=5,
                       label="median over runs" if i == 0 else None)
        if s.tok_s_run.ci and math.isfinite(s.tok_s_run.ci.lo):
            ax.vlines([i + .15], s.tok_s_run.ci.lo, s.tok_s_run.ci.hi, color="#0969da", lw=2, zorder=4,
                      label="95% interval (Arms table)" if i == 0 else None)
    ax.set_xticks(range(len(exp.arms)), [a.name for a in exp.arms], rotation=20, ha="right")
    ax.set_ylim(bottom=0)
    ax.set_ylabel("output tok/s per run (median of requests)")
    ax.set_title("tok/s per arm: runs, median and 95% interval over runs")
    ax.grid(axis="y", alpha=.3)
    if ax.get_legend_handles_labels()[0]:
        legend_outside(ax)
    return _fig_png(fig)


def _model_for(exp: Experiment, st: stats.ExperimentStats, baseline: str,
               target_tok_s: float | None = None, skip: Collection[str] = ()) -> specmodel.ModelResult | None:
    """The spec model over the speculative arms compared with ``baseline``; ``skip``: arms whose accept length is
    not their draft's (outputs not valid: a forced acceptance's tau would distort alpha)."""
    base = st.arms[baseline].tok_s_run.median
    arms = []
    measured = {p.arm: p for p in positions.table(exp) if not p.runs_without}
    for a in exp.spec_arms:
        s = st.arms[a.name]
        if a.name in skip:
            continue
        if exp.baseline_of(a.name) == baseline and a.steps and s.tok_s_run.median and s.accept_len.mean:
            rates = tuple(measured[a.name].pooled.chain_rates()[:a.steps]) if a.name in measured else ()
            arms.append(specmodel.SpecArm(a.steps, s.tok_s_run.median, s.accept_len.mean, a.name, rates))
    if not base or not arms:
        return None
    try:
        return specmodel.build(base, arms, target_tok_s=target_tok_s,
                               predict_steps=range(1, max(6, max(x.steps for x in arms) + 1) + 1))
    except specmodel.SpecModelError:
        return None


def plot_speedup_vs_steps(exp: Experiment, st: stats.ExperimentStats, model: specmodel.ModelResult | None) -> bytes:
    fig, ax = subplots()
    for a in exp.spec_arms:
        sp = st.speedups.get(a.name)
        if not sp or not a.steps or sp.estimate is None:
            continue
        lo, hi = (sp.ci.lo, sp.ci.hi) if sp.ci and math.isfinite(sp.ci.lo) else (sp.estimate, sp.estimate)
        ax.errorbar([a.steps], [sp.estimate], yerr=[[sp.estimate - lo], [hi - sp.estimate]], fmt="o", capsize=5,
                    color="#0969da")
        ax.annotate(a.name, (a.steps, sp.estimate), textcoords="offset points", xytext=(6, 6), fontsize=8)
    if model and model.predictions:
        ks = [p.steps for p in model.predictions]
        ax.plot(ks, [p.speedup for p in model.predictions], "--", color="#cf222e",
                label=f"spec model (alpha {sum(m.alpha for m in model.arms) / len(model.arms):.2f}; "
                      f"{model.cycle_fit.source[:60]})")
        ax.legend(fontsize=8)
    ax.axhline(1.0, color="#57606a", lw=1)
    ax.set_xlabel("steps (drafted tokens per cycle: speculative_num_steps, vLLM num_speculative_tokens)")
    ax.set_ylabel("speedup vs baseline (paired)")
    ax.set_title("speedup vs steps, measured (95% CI) and predicted")
    ax.grid(alpha=.3)
    return _fig_png(fig)


def plot_tau(exp: Experiment, st: stats.ExperimentStats, model: specmodel.ModelResult | None) -> bytes:
    fig, ax = subplots()
    arms = model.arms if model else []
    for i, m in enumerate(arms):
        s = st.arms[m.name]
        ci = s.accept_len.ci
        ax.bar([i], [m.accept_len], color="#2da44e" if m.margin > 0 else "#cf222e", alpha=.7,
               label="accept length tau (requests)" if i == 0 else None)
        if ci and math.isfinite(ci.lo):
            # the interval is the geometric mean's (stats._dist): where the runs agree to rounding it can sit a hair
            # above or below the bar's mean
            ax.errorbar([i], [m.accept_len], yerr=[[max(0.0, m.accept_len - ci.lo)], [max(0.0, ci.hi - m.accept_len)]],
                        color="k", capsize=4)
        ax.plot([i - .4, i + .4], [m.tau_star] * 2, color="#0969da", lw=3, label="break-even tau*" if i == 0 else None)
    ax.set_xticks(range(len(arms)), [m.name for m in arms], rotation=20, ha="right")
    ax.set_ylabel("tokens per cycle")
    ax.set_title("accept length against break-even (green: wins, red: loses)")
    ax.grid(axis="y", alpha=.3)
    if arms:
        ax.legend(fontsize=8)
    return _fig_png(fig)


def plot_baseline_over_time(exp: Experiment, st: stats.ExperimentStats) -> bytes:
    fig, ax = subplots()
    t0 = min((r.midpoint for r in exp.runs if r.midpoint is not None), default=0.0)
    for a in exp.arms:
        pts = sorted(((r.midpoint - t0) / 60, r.tok_s) for r in exp.runs_of(a.name) if r.midpoint and r.tok_s)
        if pts:
            style = dict(marker="o", lw=2) if a.name == exp.baseline else dict(marker=".", lw=.8, alpha=.6)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=a.name, **style)
    d = st.drift
    if d.slope_per_hour is not None and d.points:
        base_t0 = min(r.midpoint for r in exp.runs_of(exp.baseline) if r.midpoint)
        xs = [p[0] for p in d.points]
        ys = [p[1] for p in d.points]
        mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
        line = [(mean_y + d.slope_per_hour * (x - mean_x) / 3600) for x in xs]
        ax.plot([(x + base_t0 - t0) / 60 for x in xs], line, "--", color="#cf222e",
                label=f"baseline trend {d.slope_per_hour:+.2f} tok/s/h" + (" (beyond noise)" if d.beyond_noise else ""))
    ax.set_xlabel("minutes since the first run")
    ax.set_ylabel("tok/s")
    ax.set_title("runs over time (baseline drift)")
    ax.grid(alpha=.3)
    legend_outside(ax)
    return _fig_png(fig)


def plot_speedup_vs_concurrency(rep: concurrency.LoadReport) -> bytes:
    """Speedup per user (solid) and in throughput (dashed) against requests in flight (log scale), each point with
    its 95 % interval, the per-user crossover and its range shaded."""
    fig, ax = subplots()
    colors = ["#0969da", "#cf222e", "#1a7f37", "#8250df", "#bf8700", "#57606a"]
    for i, f in enumerate(rep.families):
        color = colors[i % len(colors)]
        for attr, style, what in (("per_user", "-o", "per user"), ("throughput", "--s", "throughput")):
            xs, ys, lo, hi = [], [], [], []
            for p in f.points:
                sp = getattr(p, attr)
                if sp.estimate is None:
                    continue
                xs.append(p.load)
                ys.append(sp.estimate)
                ok = sp.ci is not None and math.isfinite(sp.ci.lo)
                lo.append(sp.estimate - (sp.ci.lo if ok else sp.estimate))   # type: ignore[union-attr]
                hi.append((sp.ci.hi if ok else sp.estimate) - sp.estimate)   # type: ignore[union-attr]
            if xs:
                ax.errorbar(xs, ys, yerr=[lo, hi], fmt=style, color=color, capsize=4, alpha=1.0 if attr == "per_user"
                            else .7, label=f"{f.name} {what}")
        x = f.per_user
        if x.estimate is not None:
            ax.axvline(x.estimate, color=color, lw=1, ls=":")
            left = x.lo if x.lo is not None else min(x.loads)
            right = x.hi if x.hi is not None else max(x.loads)
            ax.axvspan(left, right, color=color, alpha=.08)
    ax.axhline(1.0, color="#57606a", lw=1)
    ax.set_xscale("log", base=2)
    loads = rep.loads
    ax.set_xticks(loads, [f"{c:g}" for c in loads])
    ax.set_xlabel("requests per second (arrival rate)" if rep.unit == concurrency.PER_SECOND else "requests in flight (concurrency)")
    ax.set_ylabel("speedup vs the baseline at the same load")
    ax.set_title(f"speedup vs {'arrival rate' if rep.unit == concurrency.PER_SECOND else 'concurrency'} (95% intervals; "
                 "dotted: per-user crossover, shaded: its range)")
    ax.grid(alpha=.3)
    if ax.get_legend_handles_labels()[0]:
        legend_outside(ax)
    return _fig_png(fig)


# Points closer than this share of the data range (x, y) draw the same pixels: at 8 x 4 inches and 100 dpi
# the axes are ~620 x 310 px, so a 2,000 x 1,000 grid is 1/3 px or finer, and a 3 pt marker is ~4 px wide.
PLOT_GRID = (2000, 1000)


def distinct_points(x, y, grid: tuple[int, int] = PLOT_GRID, bounds=None):
    """Indices (ascending) of the points that stay distinct on a grid of grid[0] x grid[1] cells over the data
    range (or bounds = (x0, x1, y0, y1)): the first point of each occupied cell. Plotting only these draws the
    same picture as plotting every point (a 1,000-run experiment has ~330,000 GPU samples, a few thousand
    distinct pixels per GPU), so every outlier — a throttled sample, a clock drop — is still drawn."""
    import numpy as np
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) == 0:
        return np.zeros(0, dtype=int)
    x0, x1, y0, y1 = bounds if bounds else (x.min(), x.max(), y.min(), y.max())
    cx = np.rint((x - x0) / ((x1 - x0) or 1.0) * grid[0]).astype(np.int64)
    cy = np.rint((y - y0) / ((y1 - y0) or 1.0) * grid[1]).astype(np.int64)
    _, first = np.unique(cx * (grid[1] + 1) + cy, return_index=True)
    return np.sort(first)


BASELINE_WINDOW, OTHER_WINDOW = "#0969da", "#bf8700"      # the measured windows' shading: baseline, other arms


def _shade_windows(ax, exp: Experiment, t0: float) -> set[str]:
    """Each run's measured window as a full-height band (blue: baseline), as axvspan draws it, but drawn as one
    collection per colour: 1,000 axvspan patches cost ~0.7 s to add and draw, a collection ~0.05 s. Returns the
    colours drawn (the legend explains those, and only those)."""
    from matplotlib.collections import PatchCollection
    from matplotlib.patches import Rectangle
    bands: dict[str, list[Rectangle]] = {}
    lo, hi = math.inf, -math.inf
    for r in exp.runs:
        w = r.window
        if w:
            x0, x1 = (w[0] - t0) / 60, (w[1] - t0) / 60
            bands.setdefault(BASELINE_WINDOW if r.arm == exp.baseline else OTHER_WINDOW, []).append(
                Rectangle((x0, 0), x1 - x0, 1))
            lo, hi = min(lo, x0), max(hi, x1)
    trans = ax.get_xaxis_transform(which="grid")
    for color, rects in bands.items():
        ax.add_collection(PatchCollection(rects, facecolor=color, edgecolor=color, alpha=.08, linewidth=1.0,
                                          transform=trans), autolim=False)
        for rect in rects:      # not drawn; the legend's "best" placement avoids them as it avoided axvspan's
            rect.set_transform(trans)
            rect.set_visible(False)
            ax.add_artist(rect)
    if bands:
        ax.update_datalim([(lo, 0), (hi, 0)], updatey=False)     # x only, as axvspan does
        ax.autoscale_view(scaley=False)
    return set(bands)


def identical_gpus(ts: dict[int, list[float]], sm: dict[int, list[float]]) -> list[list[int]]:
    """The GPUs grouped by identical clock series (the same sample times and MHz to 1 MHz), in index order: such
    GPUs draw the same points, so they are drawn once and named together."""
    groups: dict[tuple, list[int]] = {}
    for g in sorted(ts):
        groups.setdefault((tuple(ts[g]), tuple(round(v) for v in sm[g])), []).append(g)
    return list(groups.values())


def _gpu_list(gpus: list[int]) -> str:
    """``0-3, 6``: runs of consecutive indices as ranges."""
    runs: list[list[int]] = []
    for g in gpus:
        if runs and g == runs[-1][-1] + 1:
            runs[-1].append(g)
        else:
            runs.append([g])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 2 else ", ".join(map(str, r)) for r in runs)


def _gpu_colors(n: int) -> list[Any]:
    """n distinct colours: matplotlib's ten default ones up to ten series, else n steps of viridis (by index)."""
    import matplotlib
    if n <= 10:
        return [matplotlib.colormaps["tab10"](i) for i in range(n)]
    return [matplotlib.colormaps["viridis"](i / (n - 1)) for i in range(n)]


def plot_gpu_clocks(exp: Experiment, grid: tuple[int, int] | None = PLOT_GRID) -> bytes:
    """SM clock of every GPU sample over time (grid: see distinct_points; None draws every sample)."""
    import numpy as np
    fig, ax = subplots()
    ts: dict[int, list[float]] = {}
    sm: dict[int, list[float]] = {}
    mx = 0.0
    for r in exp.runs:
        for s in r.gpu_samples:
            if s.sm_mhz is not None:
                ts.setdefault(s.index, []).append(s.ts)
                sm.setdefault(s.index, []).append(s.sm_mhz)
                mx = max(mx, s.max_sm_mhz or 0)
    if ts:
        t0 = min(min(v) for v in ts.values())
        xs = {g: (np.asarray(v) - t0) / 60 for g, v in ts.items()}
        ys = {g: np.asarray(v, dtype=float) for g, v in sm.items()}
        bounds = (min(float(v.min()) for v in xs.values()), max(float(v.max()) for v in xs.values()),
                  min(float(v.min()) for v in ys.values()), max(float(v.max()) for v in ys.values()))
        groups = identical_gpus(ts, sm)
        named = len(groups) <= 8          # more series than that get one legend line, not one each
        colors = _gpu_colors(len(groups))
        for color, gpus in zip(colors, groups):     # identical GPUs: one series, said in its label
            g = gpus[0]
            keep = distinct_points(xs[g], ys[g], grid, bounds) if grid else slice(None)
            label = (f"all {len(gpus)} GPUs (identical)" if len(gpus) == len(ts) > 1 else
                     f"GPUs {_gpu_list(gpus)} (identical)" if len(gpus) > 1 else f"GPU {g}") if named else None
            ax.plot(xs[g][keep], ys[g][keep], ".", ms=3, color=color, label=label)
        shaded = _shade_windows(ax, exp, t0)
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch
        handles, labels = ax.get_legend_handles_labels()
        if not named:
            handles.append(Line2D([], [], ls="", marker=".", color=colors[len(colors) // 2]))
            labels.append(f"{len(ts)} GPUs in {len(groups)} series, coloured by index (dark: first, light: last)"
                          if len(groups) < len(ts) else f"{len(ts)} GPUs, coloured by index (dark: first, light: last)")
        for color, what in ((BASELINE_WINDOW, f"measured window, {exp.baseline}"),
                            (OTHER_WINDOW, "measured window, other arms")):
            if color in shaded:
                handles.append(Patch(color=color, alpha=.15))
                labels.append(what)
        if mx:
            handles.append(ax.axhline(mx, color="#57606a", lw=1, ls="--"))
            labels.append("max SM clock")
        legend_outside(ax, handles=handles, labels=labels)
    else:
        ax.text(.5, .5, "no GPU samples recorded", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("minutes since the first sample")
    ax.set_ylabel("SM clock (MHz)")
    ax.set_title("GPU clocks during runs")
    ax.grid(alpha=.3)
    return _fig_png(fig)


# ------------------------------------------------------------------------------ building the report

def _host_blocks(exp: Any, st: Any) -> list[Any]:
    """Fleets: each host's median tok/s and paired speedup, and the host-to-host spread per arm."""
    import statistics
    rows = []
    for h, d in st.host_speedups.items():
        base = [r.tok_s for r in exp.runs_of(exp.baseline) if r.host == h and r.tok_s]
        for a, s in d.items():
            arm = [r.tok_s for r in exp.runs_of(a) if r.host == h and r.tok_s]
            rows.append([h, a, str(len(s.ratios)), _f(statistics.median(base) if base else None),
                         _f(statistics.median(arm) if arm else None), _f(s.estimate, ".3f"), _ci(s.ci, ".3f"),
                         s.verdict])
    spread = []
    for a in sorted({a for d in st.host_speedups.values() for a in d}):
        est = {h: d[a].estimate for h, d in st.host_speedups.items()
               if a in d and d[a].estimate is not None and math.isfinite(d[a].estimate)}
        if len(est) >= 2:
            lo, hi = min(est, key=est.__getitem__), max(est, key=est.__getitem__)
            spread.append(f"{a}: {est[lo]:.3f} ({lo}) to {est[hi]:.3f} ({hi}), "
                          f"spread {(est[hi] - est[lo]) / statistics.mean(est.values()) * 100:.1f}% of the mean")
    out: list[Any] = [Table(["host", "arm", "blocks", "baseline tok/s", "arm tok/s", "speedup", "95% CI", "verdict"],
                            rows)]
    if spread:
        out.append(Para("Host-to-host spread of the speedup: " + "; ".join(spread) + "."))
    return out


def _f(v: float | None, fmt: str = ".1f") -> str:
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, fmt)


def _ci(ci: stats.Interval | None, fmt: str = ".1f") -> str:
    if not ci or not math.isfinite(ci.lo):
        return "-"
    return f"{format(ci.lo, fmt)}-{format(ci.hi, fmt)}"


def _iv(iv: phases.Interval) -> str:
    return f"{iv.mean:.2f}" + (f" ({iv.lo:.2f}-{iv.hi:.2f})" if iv.n > 1 else "")


def plot_phases(ph: phases.PhaseReport) -> bytes:
    """Stacked bar per speculative arm (draft, draft-extend, verify, other) with the baseline step beside it."""
    names = list(ph.arms)
    fig, ax = subplots((max(5, 1.6 * len(names) + 2), 4))
    bottom = [0.0] * len(names)
    for label, key, color in (("draft", "draft_ms", "#4c72b0"), ("draft-extend", "draft_extend_ms", "#8172b2"),
                              ("verify", "verify_ms", "#c44e52"), ("other", "other_ms", "#999999")):
        vals = [max(0.0, getattr(ph.arms[n], key).mean) for n in names]
        ax.bar(names, vals, bottom=bottom, label=label, color=color)
        bottom = [b + v for b, v in zip(bottom, vals)]
    steps = [ph.arms[n].baseline_step_ms for n in names]
    if any(steps):
        ax.scatter(names, [s or 0 for s in steps], marker="_", s=900, color="black", zorder=3,
                   label="baseline step")
    ax.set_ylabel("ms per cycle")
    legend_outside(ax, markerscale=0.3)       # the baseline step's bar marker is wide: keep it in its row
    return _fig_png(fig)


DESIGN_NAMES = {"cost": "design by cost", "sequential": "sequential design"}


def stopping_statement(exp: Experiment) -> str | None:
    if exp.target_ci is None:
        return None
    steps = exp.meta.get("design_steps") or []
    if steps:           # the driver's own decisions (the design by cost's stop rule is not the sequential one alone)
        last = steps[-1]
        name = DESIGN_NAMES.get(last["design"], last["design"])
        if last["more"]:
            return (f"--target-ci {exp.target_ci:.1%} ({name}): the experiment ended while the design asked for "
                    f"another block ({last['reason']}).")
        return f"--target-ci {exp.target_ci:.1%} ({name}): {last['reason']}."
    limit = exp.max_repeats or stats.complete_blocks(exp)
    more, why = stats.decide_more_blocks(exp, exp.target_ci, limit)
    if more:
        return f"--target-ci {exp.target_ci:.1%}: the experiment ended before the target was met ({why})."
    return f"--target-ci {exp.target_ci:.1%}: {why}."


def _model_blocks(rep: Report, model: specmodel.ModelResult | None) -> None:
    """The spec-model tables of one baseline (or why there is nothing to model)."""
    if model:
        rows = [[m.name, str(m.steps), _f(m.tok_s), _f(m.accept_len, ".2f"), _f(m.cycle_ms, ".2f"),
                 _f(m.tau_star, ".2f"), f"{m.margin:+.2f}", _f(m.alpha, ".3f")] for m in model.arms]
        rep.add(Para(f"Baseline step {model.step_ms:.2f} ms ({model.baseline_tok_s:.1f} tok/s). Cycle = tau / tok/s; "
                     f"break-even tau* = cycle / step; alpha from the chain model tau = (1 - alpha^(k+1)) / (1 - alpha)."),
                Table(["arm", "steps", "tok/s", "tau", "cycle ms", "tau*", "margin", "alpha"], rows))
        rows = [[str(p.steps), _f(p.cycle_ms, ".2f"), _f(p.tau, ".2f"), _f(p.tok_s), _f(p.speedup, ".3f"),
                 _f(p.tau_star, ".2f")] for p in model.predictions]
        fit = model.cycle_fit
        rep.add(Para(f"Predicted for other steps: cycle(steps) = {fit.intercept_ms:.2f} + {fit.slope_ms:.2f} x steps ms "
                     f"({fit.source}); " + "; ".join(a for a in model.assumptions if a != fit.source)),
                Table(["steps", "cycle ms", "tau", "tok/s", "speedup", "tau*"], rows))
        for t in model.targets:
            rep.add(Para(f"Target {t.target_tok_s:g} tok/s at a {t.cycle_ms:.1f} ms cycle needs tau {t.tau_needed:.2f}: "
                         + (f"alpha {t.alpha_needed:.3f} at steps={t.steps}" if t.alpha_needed is not None else t.note)
                         + f"; with unbounded steps alpha >= {t.alpha_limit:.3f} (1/(1-alpha) limit)."))
    else:
        rep.add(Para("No speculative arm with measured tok/s, accept length and steps: nothing to model."))


STEPS_KEYS = ("speculative_num_steps", "speculative_num_draft_tokens", "speculative_config")


def _known_truth_blocks(rep: Report, exp: Experiment, truth: truthcheck.TruthReport,
                        model: specmodel.ModelResult | None) -> None:
    """The measurement against the exact truth of known-truth models (specab.knowntruth)."""
    unchecked = ("" if not truth.unchecked else
                 f" Not checked: {sum(len(u.runs) for u in truth.unchecked)} run(s) "
                 f"({'; '.join(u.reason for u in truth.unchecked)}): the doctor's known-truth-unchecked names them.")
    if not truth.runs:
        rep.add(Heading("Known truth"), Para("The served models are known-truth models, but no run could be checked "
                                             "against the truth." + unchecked))
        return
    bad = truth.problems
    spec_runs = [r for r in truth.runs if r.steps]
    reqs = [q for r in spec_runs for q in r.requests]
    exact = sum(q.cycles_exact for q in reqs)
    follows = sum(q.rule_ok for r in truth.runs for q in r.requests)
    total = sum(len(r.requests) for r in truth.runs)
    rep.add(Heading("Known truth"),
            Para(f"The served models carry known_truth.json, so every verify cycle's accepted count is known exactly "
                 f"(the chain rule over the draft's agreement set). Cycle counts equal to the truth on {exact} of "
                 f"{len(reqs)} speculative requests; greedy output follows the rule on every token in {follows} of "
                 f"{total} requests. " + ("Every measurement agrees with the truth." if not bad else
                                          f"{len(bad)} disagreement(s): the doctor's known-truth-mismatch names them.")
                 + "".join(f" {a} is not checked against the truth: {why}, which exact verification's truth does not "
                           f"model." for a, why in truth.skipped.items()) + unchecked))
    rows = []
    for r in spec_runs:
        counted = [q for q in r.requests if q.measured_cycles is not None]
        rows.append([r.run_id, r.arm, str(r.steps), r.draft or "-", _f(r.p, ".2f"), _f(r.density, ".4f"),
                     f"{sum(q.measured_cycles or 0 for q in counted)} / {sum(q.true_cycles for q in r.requests)}",
                     _f(r.measured_tau, ".4f"), _f(r.true_tau, ".4f"),
                     (f"{r.engine_tau:.4f} / {r.true_engine_tau:.4f}" if r.engine_tau is not None else "-"),
                     _f(r.fitted_alpha, ".3f"), _f(r.realized_alpha, ".3f"), "yes" if r.exact else "NO"])
    if rows:
        rep.add(Para("Per run: cycles measured / true (summed over the measured requests), accept length (output "
                     "tokens / cycles) measured and true, vLLM's own 1 + accepted / drafts against the truth counted "
                     "the same way (its last cycle counts drafts accepted past max_tokens), alpha fitted from the "
                     "accept length (chain model) and the acceptance realized along the requests' trajectories "
                     "(right proposals / proposals checked), against the agreement set's density."),
                Table(["run", "arm", "steps", "draft", "p", "density", "cycles m / t", "tau", "true tau",
                       "engine tau m / t", "alpha fitted", "alpha realized", "exact"], rows))
    per_req = [[r.run_id, str(q.line), str(q.prompt_last_token), str(q.tokens), str(q.measured_cycles),
                str(q.true_cycles), "yes" if q.cycles_exact else "NO"] for r in spec_runs for q in r.requests]
    if per_req:
        rep.add(Para("Per request: the engine's cycle count (SGLang spec_verify_ct, vLLM's drafts delta) and the truth "
                     "from the prompt's last token and the output length."),
                Table(["run", "line", "prompt last token", "tokens", "cycles", "true cycles", "equal"], per_req))
    if model is not None and model.arms and model.baseline_tok_s:
        _known_truth_model_blocks(rep, exp, truth, model)


def _known_truth_model_blocks(rep: Report, exp: Experiment, truth: truthcheck.TruthReport,
                              model: specmodel.ModelResult) -> None:
    """Per draft (arms alike but for the steps), the spec model fitted on its measured arms against the exact tau of
    that draft on the same prompts, and per steps the break-even accept length measured on this node."""
    base = model.baseline_tok_s
    assert base is not None
    draft_of = {r.arm: r.draft for r in truth.runs if r.draft}
    by_arm = {a.name: a for a in exp.arms}
    groups: dict[tuple, list[specmodel.ArmAnalysis]] = {}
    for a in model.arms:
        arm = by_arm.get(a.name)
        if a.name not in draft_of or arm is None:
            continue
        rest = {k: v for k, v in arm.server_args.items() if k not in STEPS_KEYS}
        groups.setdefault((draft_of[a.name], repr(sorted(rest.items(), key=str))), []).append(a)
    for (draft, _), arms in groups.items():
        taus = truth.true_tau_by_steps.get(draft, {})
        try:
            m = specmodel.build(base, [specmodel.SpecArm(a.steps, a.tok_s, a.accept_len, a.name) for a in arms],
                                predict_steps=sorted(taus) or range(1, 7))
        except specmodel.SpecModelError:
            continue
        measured = {a.steps: a for a in arms}
        rows = [[str(p.steps), "run" if p.steps in measured else "predicted", f"{p.tau:.3f}",
                 f"{taus[p.steps]:.3f}" if p.steps in taus else "-",
                 f"{(p.tau - taus[p.steps]) / taus[p.steps]:+.1%}" if p.steps in taus else "-",
                 _f(p.speedup, ".3f"), _f(measured[p.steps].speedup, ".3f") if p.steps in measured else "-"]
                for p in m.predictions]
        rep.add(Para(f"Draft {draft} ({', '.join(a.name for a in arms)}): the spec model fitted on these arms "
                     f"(alpha {_f(_mean_alpha(m), '.3f')}; {m.cycle_fit.source if m.cycle_fit else ''}) against the "
                     "exact tau of this draft on the same prompts, and its speedup beside the measured one."),
                Table(["steps", "", "model tau", "true tau", "error", "model speedup", "measured speedup"], rows))
    # one row per steps and per setting besides the draft (an eager arm's cycle is not a graphed one's)
    by_steps: dict[tuple[int, str], list[specmodel.ArmAnalysis]] = {}
    for (draft, rest), arms in groups.items():
        for a in arms:
            by_steps.setdefault((a.steps, rest), []).append(a)
    if by_steps:
        step = 1000.0 / base
        rows = []
        for k, rest in sorted(by_steps):
            arms = by_steps[(k, rest)]
            cycle = sum(a.cycle_ms for a in arms) / len(arms)
            rows.append([str(k), f"{cycle:.2f}", f"{cycle / step:.2f}",
                         ", ".join(f"{a.name} tau {a.accept_len:.2f} -> {a.speedup:.2f}x" for a in arms)])
        rep.add(Para(f"What a draft must reach to win on this node and engine build: per steps, the cycle measured "
                     f"(mean over the arms above) over the baseline step {step:.2f} ms is the break-even accept "
                     "length tau*; a draft wins at that steps when its accept length exceeds tau*."),
                Table(["steps", "cycle ms", "break-even tau*", "measured arms"], rows))


def _mean_alpha(model: specmodel.ModelResult) -> float | None:
    return sum(a.alpha for a in model.arms) / len(model.arms) if model.arms else None


def _failed(exp: Experiment) -> tuple[list[Run], list[Run]]:
    """The runs that failed or measured nothing, and those the user interrupted."""
    return ([r for r in exp.runs if not r.ok and r.status not in ("running", "interrupted")],
            [r for r in exp.runs if r.status == "interrupted"])


def _summary(rep: Report, exp: Experiment, st: stats.ExperimentStats, val: validity.Validity,
             loads: concurrency.LoadReport, findings: list[doctor.Finding]) -> dict[str, str]:
    """The summary (what was measured, the verdicts, the runs that did not finish, the doctor's count, what the
    experiment pooled or mixed) and the order paragraph; returns each speculative arm's verdict line."""
    rep.summary.append(f"Workload: {workload.label(exp)}.")
    verdicts: dict[str, str] = {}       # each speculative arm's verdict, speed and validity in one line
    for a in exp.spec_arms:
        sp = st.speedups[a.name]
        conc, rate = arm_concurrency(exp, a.name), arm_rate(exp, a.name)
        speed = f"{sp.verdict} over {len(sp.ratios)} paired block(s)" + (
            f", per user at {concurrency.arm_load_label(exp, a.name)}" if loads.several_loads or conc > 1 or rate
            else "")
        verdicts[a.name] = (f"{a.name} vs {sp.baseline}: "
                            f"{validity.verdict(speed, val.arms.get(a.name), val.deterministic.get(a.name))}.")
        rep.summary.append(verdicts[a.name])
    if loads.several_loads:     # the verdict at each load, per configuration
        rep.summary.extend(f"Per load: {f.verdict()}" for f in loads.families if len(f.points) > 1)
    rep.summary.append(st.drift.message)
    stop = stopping_statement(exp)
    if stop:
        rep.summary.append(stop)
    failed, interrupted = _failed(exp)
    running = [r for r in exp.runs if r.status == "running"]
    if running:
        rep.summary.append(f"{len(running)} run(s) still running or cut short without a result: "
                           f"{', '.join(r.run_id for r in running)}.")
    if interrupted:
        rep.summary.append(f"{len(interrupted)} run(s) interrupted by the user (not failures; a --resume runs "
                           f"them): {', '.join(r.run_id for r in interrupted)}.")
    if failed:
        rep.summary.append(f"{len(failed)} run(s) failed or measured nothing: {', '.join(r.run_id for r in failed)}.")
    sev = {s: sum(1 for f in findings if f.severity == s) for s in doctor.SEVERITIES}
    rep.summary.append("doctor: " + ("; ".join(
        f"{n} {s}{'s' if n > 1 else ''} ({', '.join(sorted({f.rule for f in findings if f.severity == s}))})"
        for s, n in sev.items() if n) or "no findings") + ".")

    if exp.meta.get("combined"):
        rep.summary.append(f"Pooled from {len(exp.meta['combined'])} experiments, each one's blocks after the "
                           f"previous one's; the arms they share are the same by content (run ids <experiment "
                           f"date-time>/<run>): {', '.join(exp.meta['combined'])}.")
    by_fp: dict[str, list[str]] = {}
    for run_id, fp in sorted((exp.meta.get("run_fingerprints") or {}).items()):
        by_fp.setdefault(fp, []).append(run_id)
    if len(by_fp) > 1:       # a resume under --force-changed: the runs are not all of one experiment
        rep.summary.append(f"Runs of {len(by_fp)} different experiment fingerprints (resumed with --force-changed; "
                           f"they may not be comparable): " + "; ".join(f"{fp}: {', '.join(ids)}"
                                                                        for fp, ids in by_fp.items()) + ".")
    scales = [x for x in exp.meta.get("time_scales", []) if x != 1.0]
    if scales:
        rep.summary.append(f"Simulated node at SPECAB_SIM_TIME_SCALE {', '.join(f'{x:g}' for x in scales)}: request "
                           f"times and tok/s are converted back to simulated seconds (a rehearsal, not a measurement).")
    rep.add(Para(f"Order: {exp.order}; {st.blocks} complete block(s); {len(exp.runs)} run(s); hosts: "
                 f"{', '.join(st.hosts)}. Intervals are 95% over runs (requests are not pooled as if independent); "
                 f"speedups are paired within blocks (see docs/statistics.md)."))
    return verdicts


def _arm_blocks(rep: Report, exp: Experiment, st: stats.ExperimentStats, loads: concurrency.LoadReport) -> None:
    """The per-arm table, with what its tok/s means at the arms' load."""
    rows = []
    for a in exp.arms:
        s = st.arms[a.name]
        acc = _f(s.accept_len.mean, ".2f") if s.accept_len.mean else "-"
        if s.log_accept_len is not None:
            acc += f" (log {s.log_accept_len:.2f}{', DISAGREES' if s.accept_len_disagrees else ''})"
        extra = ", ".join(x for x in (f"+{s.runs_failed} failed" if s.runs_failed else "",
                                       f"+{s.runs_interrupted} interrupted" if s.runs_interrupted else "") if x)
        rows.append([a.name, str(s.runs) + (f" ({extra})" if extra else ""), str(s.requests),
                     _f(s.tok_s_run.median), _f(s.tok_s_run.mean), _ci(s.tok_s_run.ci),
                     _f(s.tok_s_request_median), _f(s.ttft_s.median and s.ttft_s.median * 1000),
                     _f(s.tpot_s.median and s.tpot_s.median * 1000, ".2f"), _f(s.e2e_s.median, ".2f"), acc,
                     "-" if s.cuda_graph_share is None else f"{s.cuda_graph_share:.0%}"])
    rep.add(Heading("Arms"))
    conc = bench_concurrency(exp.meta.get("config") if isinstance(exp.meta, dict) else None)
    if loads.several_loads:
        rep.add(Para("tok/s = per-request (per-user) decode speed at the arm's own load (the requests in flight its "
                     "name ends in, c<N>, or the arrival rate, r<R> requests per second): single-stream only at c1, "
                     "not total throughput (see Verdict per load)."))
    elif conc > 1:
        rep.add(Para(f"tok/s = {tok_s_meaning(conc)}."))
    rep.add(Table(["arm", "runs", "requests", "tok/s median (runs)", "tok/s mean", "95% CI",
                   "tok/s median (requests)", "TTFT ms", "TPOT ms", "e2e s", "accept length", "cuda graph share"],
                  rows))


def _speedup_blocks(rep: Report, exp: Experiment, st: stats.ExperimentStats,
                    val: validity.Validity) -> None:
    """The paired speedups, their validity, and per host."""
    rows = []
    for a in exp.spec_arms:
        sp = st.speedups[a.name]
        v = val.arms.get(a.name)
        rows.append([a.name, sp.baseline, str(len(sp.ratios)), _f(sp.estimate, ".3f"), _ci(sp.ci, ".3f"),
                     "-" if not sp.ci or not math.isfinite(sp.ci.lo) else f"+-{sp.ci.half_width_rel * 100:.1f}%",
                     (sp.verdict if v is None or v.status != validity.NOT_VALID else
                      ("cost only: no claim" if v.cost_only else f"{sp.verdict} -- NOT VALID (outputs)"))
                     + (" -- BUG (deterministic pass)" if a.name in {d.arm for d in val.bugs()} else "")])
    rep.add(Heading("Speedup (paired within blocks)"),
            Table(["arm", "baseline", "blocks", "speedup", "95% CI", "half-width", "verdict"], rows))
    _validity_blocks(rep, val)
    if st.host_speedups:
        rep.add(Heading("Speedup per host", 3), *_host_blocks(exp, st))


def _models_blocks(rep: Report, exp: Experiment, st: stats.ExperimentStats, model: specmodel.ModelResult | None,
                   target_tok_s: float | None, invalid: set[str], loads: concurrency.LoadReport
                   ) -> dict[str, specmodel.ModelResult | None]:
    """The spec model: one per baseline with speculative arms (e.g. per engine build of an engine A/B, per load)."""
    models = {exp.baseline: model}
    for b in exp.baselines:
        if b != exp.baseline and b in st.arms:
            models[b] = _model_for(exp, st, b, target_tok_s, invalid)
    several = len([m for m in models.values() if m]) > 1
    for b, m in models.items():
        if m is None and (several or b != exp.baseline):
            continue
        at = f" ({load_label(arm_concurrency(exp, b), arm_rate(exp, b))})" if loads.several_loads else ""
        rep.add(Heading(f"Speculative-decoding model vs {b}{at}" if several else "Speculative-decoding model"))
        _model_blocks(rep, m)
        left = sorted(a for a in invalid if exp.baseline_of(a) == b)
        if left:
            rep.add(Para(f"Left out of the model: {', '.join(left)} (outputs not valid: an accept length that is not "
                         f"the draft's would distort alpha)."))
    return models


def _phase_blocks(rep: Report, exp: Experiment, ph: phases.PhaseReport, plots: bool) -> None:
    """The per-phase breakdown (measured)."""
    if exp.spec_arms:
        rep.add(Heading("Where the cycle goes (measured)"))
        if ph.arms:
            rows = [[name, str(len(a.runs)), _iv(a.draft_ms), _iv(a.draft_extend_ms), _iv(a.verify_ms),
                     _iv(a.other_ms), _iv(a.implied_cycle_ms), f"{a.verify_share:.0%}",
                     "-" if a.graph_share is None else f"{a.graph_share:.0%}",
                     _f(a.baseline_step_ms, ".2f") + (f" (timer {a.baseline_step_measured_ms:.2f})"
                                                      if a.baseline_step_measured_ms else ""),
                     _f(a.tau_star(), ".2f"), f"{a.consistency:.0%}"] for name, a in ph.arms.items()]
            batched = {name: a.batch for name, a in ph.arms.items() if a.batch > 1.05}
            rep.add(Para("ms per cycle from the engine's device timer (sglang:forward_execution_seconds_total by "
                         "category over the measured window / verify passes); other = implied cycle (tau / tok/s) "
                         "minus the measured phases; means with 95% intervals over runs. The baseline step is "
                         "1000 / tok/s (its device-timer decode ms per step where measured)."
                         + ("" if not batched else
                            " A verify pass served several requests at once (" + ", ".join(
                                f"{n}: {b:.1f} per pass" for n, b in batched.items()) + "): each phase is the whole "
                            "batched pass, the cycle each request waited for, and other includes the prefills of "
                            "arriving requests that paused the batch.")),
                    Table(["arm", "runs", "draft ms", "draft-extend ms", "verify ms", "other ms", "cycle ms",
                           "verify share", "graph share of verify", "baseline step ms", "tau*", "measured / cycle"],
                          rows))
        for name, why in ph.unavailable.items():
            rep.add(Para(f"{name}: per-phase breakdown {why}."))
    if plots and ph.arms:
        rep.add(Image("cycle_phases.png", "per-phase ms per cycle, per arm, against the baseline step",
                      plot_phases(ph)))


def _doctor_blocks(rep: Report, exp: Experiment, findings: list[doctor.Finding]) -> None:
    """The doctor's findings, then the runs that failed or were interrupted."""
    rep.add(Heading("Doctor"))
    if findings:
        for f in findings:
            rep.add(Para(f"[{f.severity}] {f.rule}: {f.message}"), Bullets(f.evidence))
    else:
        rep.add(Para("No rule fired: CUDA graph, env propagation, like-for-like args, break-even, clocks, drift, "
                     "client and outliers all look clean."))

    failed, interrupted = _failed(exp)
    if failed or interrupted:
        rep.add(Heading("Failed and interrupted runs" if interrupted else "Failed runs"),
                Table(["run", "status", "reason"], [[r.run_id, r.status, (r.error or "no measured requests")[:200]]
                                                    for r in failed + interrupted]))


def _plot_blocks(rep: Report, exp: Experiment, st: stats.ExperimentStats,
                 model: specmodel.ModelResult | None) -> None:
    """The plots of the whole experiment."""
    rep.add(Heading("Plots"),
            Image("tok_s_per_arm.png", "tok/s per arm with 95% intervals", plot_tok_s(exp, st)),
            Image("speedup_vs_steps.png", "speedup vs steps with the model's prediction",
                  plot_speedup_vs_steps(exp, st, model)),
            Image("tau_vs_break_even.png", "accept length vs break-even", plot_tau(exp, st, model)),
            Image("baseline_over_time.png", "baseline over time", plot_baseline_over_time(exp, st)),
            Image("gpu_clocks.png", "GPU clocks during runs", plot_gpu_clocks(exp)))


def _cost_blocks(rep: Report, exp: Experiment) -> tuple[economics.Spend, list[str]]:
    """What the verdict cost: always last (docs/statistics.md, "Design by cost")."""
    spent = economics.spend(exp)
    cost = economics.cost_lines(exp)
    rep.add(Heading("Verdict cost"), Para(" ".join(cost)))
    if spent.per_arm:
        rep.add(Table(["arm", "restarts", "GPU-minutes"],
                      [[a, str(spent.restarts_per_arm[a]), f"{g / 60:.1f}"] for a, g in spent.per_arm.items()]
                      + ([["burn-in (not analysed)", str(spent.burn_in_runs), f"{spent.burn_in / 60:.1f}"]]
                         if spent.burn_in_runs else [])
                      + _pass_cost_row(exp)))
    steps = exp.meta.get("design_steps") or []
    if steps:           # --target-ci: what the design decided after each block, and why
        rep.add(Para("The design's decisions (--target-ci): after each block, another block or not, with how many "
                     "measured requests per run."),
                Table(["blocks started", "design", "decision", "requests per run", "why"],
                      [[str(d["blocks"]), DESIGN_NAMES.get(d["design"], d["design"]),
                        "another block" if d["more"] else "stop", str(d["requests"] or "-"), d["reason"]]
                       for d in steps]))
    return spent, cost


def build_report(exp: Experiment, *, config: doctor.DoctorConfig | None = None,
                 target_tok_s: float | None = None, plots: bool = True,
                 capacity: CapacityOptions | None = None) -> Report:
    st = stats.analyse(exp)
    val = validity.check(exp)
    findings = doctor.diagnose(exp, st, config, validity=val)
    rep = Report(title=f"specab report: {exp.id}")
    invalid = {v.arm for v in val.invalid()}        # their tau is not their draft's: left out of the model
    model = _model_for(exp, st, exp.baseline, target_tok_s, invalid)
    loads = concurrency.analyse_loads(exp, per_user=st.speedups)
    verdicts = _summary(rep, exp, st, val, loads, findings)
    _arm_blocks(rep, exp, st, loads)
    lengths, cats = _workload_blocks(rep, exp)
    _speedup_blocks(rep, exp, st, val)
    per_pos = _position_blocks(rep, exp)
    spread = instances.analyse(exp)
    rep.add(Heading("Instance spread"), Para(instances.INTRO), Table(instances.InstanceReport.HEADER, spread.rows()),
            *[Para(n) for n in spread.notes()])
    if loads.several_loads:
        _load_blocks(rep, loads, plots)
    slo_data = capacity_section(rep, exp, times=loads.times, plots=plots, opts=capacity)
    models = _models_blocks(rep, exp, st, model, target_tok_s, invalid, loads)
    ph = phases.analyse_phases(exp)
    _phase_blocks(rep, exp, ph, plots)
    truth = truthcheck.check(exp)
    if truth is not None:
        _known_truth_blocks(rep, exp, truth, model)
    dist = distribution.section(exp)        # temperature > 0: each arm's outputs against its baseline's law
    if dist is not None:
        rep.add(Heading("Output distribution"), Para(dist.intro), Table(dist.header, dist.rows), Bullets(dist.notes))
    rep.add(Heading("Drift"), Para(st.drift.message))
    _doctor_blocks(rep, exp, findings)
    if plots:
        _plot_blocks(rep, exp, st, model)
    spent, cost = _cost_blocks(rep, exp)
    rep.summary.extend(cost)
    # "model": the experiment's first baseline (as before); "models": one per baseline (an engine A/B, a matrix
    # condition), each over the arms compared with it
    rep.data = {"stats": st.to_dict(), "model": model.to_dict() if model else None,
                "models": {b: m.to_dict() if m else None for b, m in models.items()}, "phases": ph.to_dict(),
                "findings": [f.to_dict() for f in findings], "summary": rep.summary, "cost": spent.to_dict(),
                "known_truth": truth.to_dict() if truth is not None else None,
                "validity": val.to_dict(), "verdicts": verdicts,
                "loads": loads.to_dict(), "instances": spread.to_dict(), "capacity": slo_data,
                "workload": {"label": workload.label(exp), "ignore_eos": workload.ignore_eos(exp),
                             "lengths": {r.arm: r.to_dict() for r in lengths},
                             "categories": {a: [r.to_dict() for r in rows] for a, rows in cats.items()}}}
    if per_pos:           # only where measured: reports of engines without per-position counts keep their shape
        rep.data["positions"] = {p.arm: p.to_dict() for p in per_pos}
    if dist is not None:
        rep.data["distribution"] = dist.data
    return rep


def _sp_cell(sp: stats.Speedup) -> str:
    if sp.estimate is None:
        return "-"
    if sp.ci is None or not math.isfinite(sp.ci.lo):
        return f"{sp.estimate:.3f} (no interval: {len(sp.ratios)} block)"
    return f"{sp.estimate:.3f} ({sp.ci.lo:.3f}-{sp.ci.hi:.3f})"


# (the latency's key, its column): the client's summary names the per-chunk ITL itl_s, the recomputed one itl_chunk_s
LATENCY_COLUMNS = (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_chunk_s", "ITL per chunk"),
                   ("itl_token_s", "ITL per token"))


def _ms(lat: dict, metric: str, q: str) -> str:
    v = (lat.get(metric) or (lat.get("itl_s") if metric == "itl_chunk_s" else None) or {}).get(q)
    return "-" if v is None else f"{v * 1000:.1f}"


def _load_blocks(rep: Report, loads: concurrency.LoadReport, plots: bool) -> None:
    """The verdict at each load: speedups per user and in throughput with their intervals, the break-even from the
    runs at that load, latency percentiles, the crossover and its plot."""
    rep.add(Heading("Verdict per load"),
            Para("Each load ran its own arms against its own baseline at the same requests in flight. Per user: the "
                 "paired speedup of each run's median per-request decode tok/s; in throughput: of each run's total "
                 "output tok/s (all measured output tokens over the measured window), stated only where a "
                 "closed loop saturates or an arm could not keep up with its arrival rate (below saturation an open "
                 "load's throughput is its arrival rate: see Offered and achieved load); 95% intervals over blocks. "
                 "tau* is the break-even accept length from the runs at that load (cycle = tau / per-user tok/s, "
                 "step = 1 / the baseline's per-user tok/s), so the batched verify pass is costed at its own batch. "
                 "The crossover interpolates log speedup linearly in the log of the load (requests in flight, or "
                 "arrivals per second for a rate axis) between the two loads that "
                 "bracket the first crossing of 1; its range is where the curves of the intervals' lower and upper "
                 "ends cross 1 (docs/analysis.md, Verdict per load)."))
    rows = []
    for f in loads.families:
        for p in f.points:
            margin = f"{p.tau - p.tau_star:+.2f}" if p.tau and p.tau_star else "-"
            thr = _sp_cell(p.throughput) if p.throughput_stated else "both served the offered load: no ratio"
            rows.append([f.name, p.label, _sp_cell(p.per_user), thr, _f(p.arm_tok_s),
                         _f(p.baseline_tok_s), _f(p.arm_throughput), _f(p.baseline_throughput),
                         _f(p.tau, ".2f"), _f(p.tau_star, ".2f"), margin])
    rep.add(Table(["configuration", "load", "speedup per user (95% CI)", "speedup in throughput (95% CI)",
                   "per-user tok/s", "baseline per-user tok/s", "throughput tok/s", "baseline throughput tok/s",
                   "tau", "tau* at this load", "margin"], rows))
    rep.add(Bullets([f.verdict() for f in loads.families]))
    lat_rows = []
    for f in loads.families:
        for p in f.points:
            for who, name in (("arm", p.arm), ("baseline", p.baseline)):
                lat = p.latency.get(who) or {}
                if not lat:
                    continue
                lat_rows.append([name, p.label] + [_ms(lat, m, q) for m, _ in LATENCY_COLUMNS
                                                   for q in ("p50", "p95", "p99")])
    if lat_rows:
        seen: set[str] = set()
        lat_rows = [r for r in lat_rows if not (r[0] in seen or seen.add(r[0]))]   # a baseline once
        rep.add(Heading("Latency per load", 3),
                Para("Percentiles over each run's measured requests, median over runs, ms. TTFT from each request's "
                     "scheduled arrival under an arrival rate. ITL per chunk: every gap between streamed chunks (a "
                     "speculative chunk carries several tokens); ITL per token: each chunk's gap spread over the "
                     "tokens it carried. Compare each definition with itself, never one with the other."),
                Table(["arm", "load"] + [f"{label} {q}" for _, label in LATENCY_COLUMNS for q in ("p50", "p95", "p99")],
                      lat_rows))
    serve_blocks(rep, loads)
    if plots:
        rep.add(Image("speedup_vs_concurrency.png", "speedup per user and in throughput vs "
                      + ("arrival rate" if loads.unit == concurrency.PER_SECOND else "requests in flight"),
                      plot_speedup_vs_concurrency(loads)))


def _position_blocks(rep: Report, exp: Experiment) -> list[positions.ArmPositions]:
    """The section "Acceptance per draft position": per speculative arm that measured it, the conditional acceptance
    at each position pooled over its runs (the lowest-highest run in brackets)."""
    rows = positions.table(exp)
    if not rows:
        return rows
    k = max(len(p.pooled.accepted) for p in rows)
    body = []
    for p in rows:
        cells = []
        for i in range(k):
            c = p.conditional[i] if i < len(p.conditional) else None
            sp = p.spread(i)
            cells.append("-" if c is None else f"{c:.3f}" + (f" ({sp[0]:.3f}-{sp[1]:.3f})" if sp else ""))
        runs = str(p.runs) + (f" (+{p.runs_without} without)" if p.runs_without else "")
        body.append([p.arm, _f(p.steps, "d"), runs, str(p.pooled.cycles), *cells, f"{p.pooled.tokens_per_cycle:.3f}",
                     {"requests": "each request's counts", "metrics": "engine counters over the window"}.get(
                         p.pooled.source, p.pooled.source)])
    rep.add(Heading("Acceptance per draft position"),
            Para("Conditional acceptance at each draft position: of the verify cycles that accepted position i-1 (all "
                 "cycles for position 1), the share that accepted position i, pooled over the arm's runs (lowest-"
                 "highest run in brackets). The chain model's alpha is one number for all positions; these are its "
                 "per-position values, and the spec model uses them where every run of an arm measured them. Tokens "
                 "per cycle = 1 + accepted drafts / cycles (the engine counts a last cycle's drafts also past the "
                 "request's end)."),
            Table(["arm", "steps", "runs", "cycles", *[f"position {i + 1}" for i in range(k)], "tokens per cycle",
                   "from"], body))
    return rows


def _speedup_cell(row: workload.CategoryRow) -> str:
    if row.speedup is None:
        return "-"
    if row.ci is None:
        return f"{row.speedup:.3f} (interval: none, {len(row.ratios)} block)"
    return f"{row.speedup:.3f} ({row.ci.lo:.3f}-{row.ci.hi:.3f}, {len(row.ratios)} blocks)"


def _validity_blocks(rep: Report, val: validity.Validity) -> None:
    """The section "Output validity": each speculative arm's outputs against its baseline's, on the same requests."""
    if not val.arms:
        return
    r = val.rules
    rows = []
    for v in val.arms.values():
        div = v.divergences
        rows.append([v.arm, v.baseline, f"{v.identical}/{v.compared}" if v.requests else "-",
                     f"{v.identical_ci[0]:.0%}-{v.identical_ci[1]:.0%}" if v.identical_ci else "-",
                     f"{div[0]}/{div[len(div) // 2]}/{div[-1]}" if div else "-",
                     f"{v.mean_len:.1f} / {v.baseline_mean_len:.1f}" if v.mean_len and v.baseline_mean_len else "-",
                     ", ".join(f"{k} {n}" for k, n in sorted(v.finish.items())) or "-",
                     str(len(v.loops)), ("cost only: " if v.cost_only else "") + v.status])
    rep.add(Heading("Output validity"),
            Para(f"Each speculative arm's measured outputs against its baseline's on the same requests (same prompt, "
                 f"same request index, the baseline run of the same block). At temperature 0 a request passes when "
                 f"its output is identical, or agrees on at least {r.greedy_min_match:.0%} of the baseline's tokens "
                 f"before the first difference (a late divergence; validity.greedy_min_match); an arm's mean output "
                 f"length must be within +-{r.length_window:.0%} of its baseline's (validity.length_window), and an "
                 f"output whose {r.loop_ngram}-grams repeat at {r.loop_share:.0%} or more loops. Agreed before the "
                 f"first difference: min/median/max over the requests that differ."),
            Table(["arm", "baseline", "identical", "95% CI", "agreed before the first difference",
                   "mean length (arm / baseline)", "finish reasons", "loops", "outputs"], rows),
            Bullets([f"{v.arm}: {v.line}" for v in val.arms.values()]
                    + [f"{b} against its own restarts: identical on {same}/{n} requests"
                       + ("" if same == n else " (the engine is not deterministic across restarts: judge the arms' "
                                               "differences against this floor)")
                       for b, (same, n) in val.baseline_self.items()]))
    _deterministic_blocks(rep, val)


def _pass_cost_row(exp: Experiment) -> list[list[str]]:
    """The verdict cost's row of the deterministic pass (--correctness): its runs and what they held of the GPUs."""
    runs = exp.deterministic.runs if exp.deterministic is not None else []
    if not runs:
        return []
    gpu_s = sum(r.gpu_seconds or 0.0 for r in runs)
    return [["deterministic pass (not measured)", str(len(runs)), f"{gpu_s / 60:.1f}"]]


def _deterministic_blocks(rep: Report, val: validity.Validity) -> None:
    """The part "Deterministic pass" of Output validity (driver.py run --correctness): each speculative arm and its
    baseline once more in the engine's deterministic mode, after the measured blocks, any difference a bug."""
    if not val.deterministic:
        return
    rows = []
    for d in val.deterministic.values():
        first = d.first
        rows.append([d.arm, f"{d.det_arm} vs {d.det_baseline}", d.mode or "-",
                     f"{d.identical}/{d.compared}" if d.requests else "-",
                     f"request {first.i}, {d.unit[:-1]} {first.agreed}" if first is not None else "-",
                     "-" if d.gpu_seconds is None else f"{d.gpu_seconds / 60:.1f}", d.status])
    rep.add(Heading("Deterministic pass", 3),
            Para("After the measured blocks, each speculative arm and its baseline ran once more in the engine's "
                 "deterministic (batch-invariant) mode, where a request's greedy output depends neither on its "
                 "batch nor on speculation: any difference is an engine bug, not numerics (judged with "
                 "greedy_min_match 1). These runs are not measured: they are in no speedup, interval or fit."),
            Table(["arm", "deterministic runs", "mode", "identical", "first difference", "GPU-minutes", "outcome"],
                  rows),
            Bullets([f"{d.arm}: {d.line}" for d in val.deterministic.values()]))


def _workload_blocks(rep: Report, exp: Experiment
                     ) -> tuple[list[workload.Lengths], dict[str, list[workload.CategoryRow]]]:
    """The section "Workload and output lengths": the answers' real lengths per arm with what they mean for the
    accept length, and per category of a dataset a table per arm compared with a baseline."""
    lengths = [workload.lengths(exp, a.name) for a in exp.arms]
    rep.add(Heading("Workload and output lengths"), Para(f"Workload: {workload.label(exp)}."),
            Table(["arm", "requests", "output tokens median", "p10-p90", "finish: stop", "finish: length",
                   "finish: not recorded"],
                  [[r.arm, str(r.requests), _f(r.median, ".0f"),
                    "-" if r.p10 is None else f"{r.p10:.0f}-{r.p90:.0f}", str(r.stopped), str(r.length),
                    str(r.unknown)] for r in lengths]),
            Para(workload.length_note(exp, lengths)))
    cats = {a.name: workload.category_rows(exp, a.name) for a in exp.spec_arms}
    cats = {a: rows for a, rows in cats.items() if rows}
    for arm, rows in cats.items():
        rep.add(Heading(f"Per category: {arm} vs {rows[0].baseline}", 3),
                Table(["category", "requests", "accept length median", "accept length mean (per request)",
                       "decode tok/s median", "baseline tok/s median", "speedup (95% CI over blocks)"],
                      [[r.category, str(r.requests), _f(r.accept_len_median, ".2f"), _f(r.accept_len_mean, ".2f"),
                        _f(r.tok_s_median), _f(r.baseline_tok_s_median), _speedup_cell(r)] for r in rows]))
    if cats:
        rep.add(Para("Per category: each block's ratio is the arm's median decode tok/s over the category's "
                     "requests divided by the baseline's in the same block; the speedup is their geometric mean, "
                     "with a 95% interval over blocks where there are two or more."))
    return lengths, cats


def _write(exp_dir: Path, config: doctor.DoctorConfig | None, target_tok_s: float | None,
           pooled: list[Path] | None = None, capacity: CapacityOptions | None = None
           ) -> tuple[dict[str, str], Report]:
    """The report of the experiment in ``exp_dir``, or with ``pooled`` (the experiments' directories, the first
    naming it) the report of their stores as one, written into ``exp_dir``; one experiment's store elsewhere (its
    directory on read-only media) is ``pooled`` of one."""
    with gc_paused():       # a 1,000-run experiment: ~0.7 s of cyclic-GC passes over objects that hold no cycles
        exp = None if not pooled else load_store(pooled[0]) if len(pooled) == 1 else combine.combine(pooled)
        return _write_unpaused(exp_dir, config, target_tok_s, exp, capacity)


def _write_unpaused(exp_dir: Path, config: doctor.DoctorConfig | None, target_tok_s: float | None,
                    exp: Experiment | None = None, capacity: CapacityOptions | None = None
                    ) -> tuple[dict[str, str], Report]:
    exp = exp or load_store(exp_dir)
    rep = build_report(exp, config=config, target_tok_s=target_tok_s, capacity=capacity)
    if exp.meta.get("status") == "running":     # the store's own word (a driver that died without one leaves it so)
        done = sum(1 for r in exp.runs if r.status != "running")
        rep.summary.insert(0, f"The experiment is still running (its store's status): this report covers the {done} "
                              f"run(s) finished so far.")
    exp_dir.mkdir(parents=True, exist_ok=True)
    img_dir = exp_dir / "report"
    img_dir.mkdir(exist_ok=True)
    for b in rep.blocks:
        if isinstance(b, Image):
            (img_dir / b.name).write_bytes(b.png)
    md, page, js = exp_dir / "report.md", exp_dir / "report.html", exp_dir / "report.json"
    md.write_text(to_markdown(rep), encoding="utf-8")
    page.write_text(to_html(rep), encoding="utf-8")
    js.write_text(json.dumps(rep.data, indent=2, default=str), encoding="utf-8")
    return {"markdown": str(md), "html": str(page), "json": str(js)}, rep


def write_report(exp_dir: str | Path, *, config: doctor.DoctorConfig | None = None,
                 target_tok_s: float | None = None) -> dict[str, str]:
    """Write report.md, report.html, report.json and report/*.png into the experiment directory.

    Returns the paths {"markdown", "html", "json"}; the summary lines are in report.json ("summary")."""
    return _quiet_write(Path(exp_dir), config, target_tok_s)[0]


def _quiet_write(exp_dir: Path, config: doctor.DoctorConfig | None, target_tok_s: float | None,
                 pooled: list[Path] | None = None, capacity: CapacityOptions | None = None) -> Any:
    """`_write` with the libraries' warnings (matplotlib, scipy) kept from the user's terminal: the report
    itself says what is uncertain."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _write(exp_dir, config, target_tok_s, pooled, capacity)


# ------------------------------------------------------------------------------ CLI

def cmd_report(ns: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    try:
        exp_dir = locate(ns.experiment, ns.runs_dir)
        pooled = [exp_dir] + [locate(x, ns.runs_dir) for x in ns.with_ or []]
    except NotFound as e:
        print(f"specab report: {e}", file=out)
        return 2
    if len(pooled) > 1 and ns.out is None:
        print("specab report: --with pools several experiments into one report; give --out DIR for it (the "
              "experiments' own reports stay as they are).", file=out)
        return 2
    if ns.out is None and not os.access(exp_dir, os.W_OK):
        print(f"specab report: {exp_dir} cannot be written (read-only media?): the report reads the store there as "
              f"it is; give --out DIR for the report files.", file=out)
        return 2
    cfg = doctor.DoctorConfig(usual_baseline_tok_s=ns.usual_baseline_tok_s)
    try:
        paths, rep = _quiet_write(Path(ns.out) if ns.out else exp_dir, cfg, ns.target_tok_s,
                                  pooled if ns.out else None,
                                  CapacityOptions(slo=list(ns.slo or []), gpu_hour_usd=ns.gpu_hour_usd))
    except (AnalysisError, ConfigError) as e:
        print(f"specab report: {e}", file=out)
        return 2
    print("\n".join(rep.summary), file=out)
    for k, v in paths.items():
        print(f"{k}: {v}", file=out)
    return 0


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("report", help="write report.md + report.html for an experiment and print the summary",
                              description="Statistics, spec model, doctor and plots for one experiment.")
    p.add_argument("experiment", help="experiment id (under --runs-dir) or its directory")
    p.add_argument("--runs-dir", help="where experiments live (default: runs)")
    p.add_argument("--usual-baseline-tok-s", type=float, help="what this node's baseline normally reaches")
    p.add_argument("--target-tok-s", type=float, help="show the acceptance a target tok/s needs")
    p.add_argument("--with", dest="with_", action="append", metavar="EXPERIMENT",
                   help="pool this experiment's blocks with the first's into one report (repeatable; the arms two "
                        "stores share must be the same by content); needs --out")
    p.add_argument("--out", metavar="DIR", help="where the report is written (default: the experiment's directory; "
                                                "needed with --with, and for a store on read-only media)")
    p.add_argument("--slo", action="append", metavar="TERM:pQ=TARGET",
                   help="judge the runs at this latency target (over the experiment's SLO; repeatable), e.g. "
                        "--slo tpot_ms:p95=10")
    p.add_argument("--gpu-hour-usd", type=float, metavar="USD",
                   help="price of one GPU-hour: the cost per million output tokens at the SLO")
    p.set_defaults(func=cmd_report)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    return standalone_main(register, argv)


if __name__ == "__main__":
    raise SystemExit(main())
