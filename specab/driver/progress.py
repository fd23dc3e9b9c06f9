"""Live display of an experiment: run n of N, arm, phase, elapsed, estimated time remaining.

On a terminal it is a rich Live panel; otherwise (CI, pipes) one plain line per phase change,
so logs stay readable. Thread-safe: the log tail calls `phase()` from its own thread.
"""
from __future__ import annotations

import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from specab.analysis.evidence import model
from specab.analysis.measures import stats
from specab.analysis.measures import validity
from specab.results.store import FAILED, INTERRUPTED, OK, StoreError


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


@dataclass
class _State:
    experiment_id: str = ""
    total: int = 0
    done: int = 0
    failed: int = 0
    index: int = 0
    run_id: str = ""
    arm: str = ""
    block: int = 0
    phase: str = ""
    run_started: float | None = None
    phase_started: float | None = None
    durations: list[float] = field(default_factory=list)
    gpu_seconds: float = 0.0            # spent so far by the experiment: each run's span x the GPUs its server held
    gpu_runs: int = 0
    projected_s: float | None = None    # the design by cost's expected GPU-seconds still to spend, when it planned
    projected_at: float = 0.0           # gpu_seconds when the design said so
    projected_gpus: int = 1             # GPUs a run holds (the projection's wall seconds: GPU-seconds / GPUs)
    last_line: str = ""
    notices: list[str] = field(default_factory=list)


class Progress:
    """The experiment's live display."""

    def __init__(self, out: TextIO | None = None, live: bool | None = None):
        self.out = out or sys.stderr
        self.console = Console(file=self.out, highlight=False, soft_wrap=True)
        self.live_mode = self.console.is_terminal if live is None else live
        self.state = _State()
        self._lock = threading.Lock()
        self._live: Live | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self, experiment_id: str, total: int, done: int = 0, spent: tuple[float, int] = (0.0, 0)) -> None:
        """`spent`: the (GPU-seconds, runs) the store already holds (a resume), so that the GPU-minutes spent are
        the experiment's since its start, as the report's verdict cost, and the per-run mean counts those runs."""
        with self._lock:
            self.state.experiment_id = experiment_id
            self.state.total = total
            self.state.done = done
            self.state.gpu_seconds, self.state.gpu_runs = float(spent[0]), int(spent[1])
        if self.live_mode:
            self._live = Live(self._render(), console=self.console, refresh_per_second=4,
                              get_renderable=self._render, transient=False)
            self._live.start()
        else:
            self._print(f"experiment {experiment_id}: {total} runs" + (f" ({done} already done)" if done else ""))

    def close(self) -> None:
        if self._live:
            self._live.stop()
            self._live = None

    # ------------------------------------------------------------------ events
    def run_started(self, index: int, run_id: str, arm: str, block: int) -> None:
        now = time.time()
        with self._lock:
            s = self.state
            s.index, s.run_id, s.arm, s.block = index, run_id, arm, block
            s.phase, s.run_started, s.phase_started, s.last_line = "starting run", now, now, ""
        if not self.live_mode:
            self._print(f"[{index}/{self.state.total}] {run_id} (arm {arm}, block {block})")

    def phase(self, phase: str) -> None:
        now = time.time()
        with self._lock:
            s = self.state
            if phase == s.phase:
                return
            s.phase, s.phase_started = phase, now
            elapsed = now - (s.run_started or now)
        if not self.live_mode:
            self._print(f"    {phase}  (+{elapsed:.1f} s)")

    def log_line(self, line: str) -> None:
        with self._lock:
            self.state.last_line = line.strip()[-160:]

    def run_finished(self, status: str, duration: float, reason: str | None = None, gpus: int | None = None,
                     gpu_seconds: float | None = None) -> None:
        """`gpu_seconds`: what the store recorded for the run (the node's phase span x its GPUs), so the console's
        GPU-minutes are the report's; without it, the controller's wall time x gpus."""
        with self._lock:
            s = self.state
            s.done += 1
            s.durations.append(duration)
            if gpus:
                s.gpu_seconds += gpu_seconds if gpu_seconds is not None else duration * gpus
                s.gpu_runs += 1
            if status != "ok":
                s.failed += 1
            s.phase = status
        # the reason's first line whole: its end says what to do, so it is never cut
        first = reason.strip().splitlines()[0] if reason and reason.strip() else ""
        if not self.live_mode:
            extra = f": {first}" if first else ""
            self._print(f"    {status} in {duration:.1f} s{extra}  (ETA {fmt_duration(self.eta())}{self.gpu_text()})")
        elif first:
            self.console.print(Text(f"{self.state.run_id} {status}: {first}", style="red"))
        else:
            self.console.print(Text(f"{self.state.run_id} {status} in {duration:.1f} s"))

    def projection(self, remaining_gpu_s: float, gpus: int = 1) -> None:
        """The design by cost's expected GPU-seconds from now to the verdict, blocks it expects to add included
        (replaces the per-run extrapolation of the GPU-minutes and of the time remaining until the next
        decision; a run holds `gpus` GPUs)."""
        with self._lock:
            self.state.projected_s = max(0.0, float(remaining_gpu_s))
            self.state.projected_at = self.state.gpu_seconds
            self.state.projected_gpus = max(1, int(gpus))

    def notice(self, text: str) -> None:
        if self._live:
            self.console.print(text, markup=False, highlight=False)
        else:
            self._print(text)

    # ------------------------------------------------------------------ helpers
    def gpu_minutes(self) -> tuple[float, float | None] | None:
        """(GPU-minutes spent, projected remainder), or None before a run with GPUs. The remainder is the design by
        cost's expectation when it made one (the blocks it expects to add included, less what was spent since);
        otherwise the planned runs not done at the mean per run so far."""
        with self._lock:
            s = self.state
            if not s.gpu_runs:
                return None
            if s.projected_s is not None:
                return s.gpu_seconds / 60, max(0.0, s.projected_s - (s.gpu_seconds - s.projected_at)) / 60
            per_run = s.gpu_seconds / s.gpu_runs
            return s.gpu_seconds / 60, max(0, s.total - s.done) * per_run / 60

    def gpu_text(self) -> str:
        g = self.gpu_minutes()
        return "" if g is None else f"; {g[0]:.1f} GPU-min spent, ~{g[1]:.1f} to go"

    def eta(self) -> float | None:
        with self._lock:
            s = self.state
            if s.projected_s is not None:       # the design's expectation, its blocks to come included
                return max(0.0, s.projected_s - (s.gpu_seconds - s.projected_at)) / s.projected_gpus
            if not s.durations:
                return None
            mean = sum(s.durations) / len(s.durations)
            remaining = max(0, s.total - s.done)
            return remaining * mean

    def _print(self, text: str) -> None:
        self.console.print(text, markup=False)
        self.out.flush()

    def _render(self) -> Group:
        s = self.state
        now = time.time()
        t = Table.grid(padding=(0, 2))
        t.add_column(style="bold")
        t.add_column()
        t.add_row("experiment", s.experiment_id)
        t.add_row("run", f"{s.index} of {s.total}  ({s.done} done, {s.failed} failed)")
        t.add_row("arm", f"{s.arm}  (block {s.block})" if s.arm else "")
        t.add_row("phase", f"{s.phase}  {fmt_duration(now - s.phase_started) if s.phase_started else ''}")
        t.add_row("elapsed", fmt_duration(now - s.run_started) if s.run_started else "")
        eta = self.eta()
        t.add_row("remaining", f"~{fmt_duration(eta)}" if eta is not None else "estimating after the first run")
        g = self.gpu_minutes()
        if g is not None:
            t.add_row("GPU-minutes", f"{g[0]:.1f} spent, ~{g[1]:.1f} projected for the rest")
        parts: list = [t]
        if s.last_line:
            parts.append(Text(s.last_line, style="dim"))
        return Group(*parts)


# --------------------------------------------------------------------------- end-of-experiment summary

def _stats_rows(store) -> tuple[list[list[str]], str | None]:
    """Rows from specab.analysis.measures.stats, the one analysis the report uses too. When the analysis cannot read the
    store (model.AnalysisError: a damaged bench.jsonl, a run directory of another shape) the rows carry the
    store's run counts alone and the error comes back to be printed under them: the end of an experiment never
    fails on its summary, and never hides why it has no numbers."""
    try:
        with warnings.catch_warnings():     # scipy's warnings on few runs are not the user's business
            warnings.simplefilter("ignore")
            exp = model.load_store(store.path)
            res = stats.analyse(exp)
            val = validity.check(exp)
    except model.AnalysisError as e:
        runs = store.runs()
        return [[a["name"], *(str(sum(r["arm"] == a["name"] and r["status"] == s for r in runs))
                              for s in (OK, FAILED, INTERRUPTED)), "-", "-", "-", "-", "-"]
                for a in store.arms()], str(e)
    rows = []
    for name, a in res.arms.items():
        d = a.tok_s_run
        ci = f"[{d.ci.lo:.1f}, {d.ci.hi:.1f}]" if d.ci else "-"
        sp = res.speedups.get(name)
        if sp is not None and sp.estimate is not None:
            spd = f"{sp.estimate:.3f}" + (f" [{sp.ci.lo:.3f}, {sp.ci.hi:.3f}]" if sp.ci else "")
        else:
            spd = "1 (baseline)" if name not in res.speedups else "-"
        rows.append([name, f"{a.runs}", f"{a.runs_failed}", f"{a.runs_interrupted}",
                     f"{d.median:.1f}" if d.median is not None else "-", ci,
                     f"{a.accept_len.mean:.2f}" if a.accept_len.mean is not None else "-", spd,
                     validity.cell(val.arms.get(name))])
    return rows, None


def print_summary(store, out: TextIO) -> int:
    """Print the per-arm table (failed and interrupted runs counted apart) and the failures; returns the number
    of failed runs (interrupted ones are not failures: a resume runs them)."""
    rows, unreadable = _stats_rows(store)
    console = Console(file=out, highlight=False, width=max(150, Console(file=out).width))
    try:
        concurrency = model.bench_concurrency(store.experiment().get("config"))
    except StoreError:          # a store without its experiment row still gets its table
        concurrency = 1
    loads = {(a["matrix"].get("concurrency"), a["matrix"].get("request_rate")) for a in store.arms()
             if isinstance(a.get("matrix"), dict)} - {(None, None)}
    meaning = (model.tok_s_meaning(concurrency) if len(loads) < 2 else
               "per-user decode speed at the arm's own load, its c<N> or r<R>: single-stream only at c1")
    t = Table(title=f"per-arm summary (tok/s = {meaning}, median over runs)")
    for col in ("arm", "runs ok", "failed", "interrupted", "tok/s", "95% interval", "accept len", "speedup vs baseline",
                "outputs vs baseline"):
        t.add_column(col)
    for r in rows:
        t.add_row(*r)
    console.print(t)
    if unreadable:
        console.print(f"no statistics: {unreadable}", markup=False)
    burned = [r for r in store.runs() if r["burn_in"]]
    if burned:
        console.print("burn-in (unmeasured starts before block 1, not in the table): "
                      + ", ".join(f"{r['run_id']} {r['status']}" for r in burned), markup=False)
    det = {a["name"] for a in store.arms() if isinstance(a.get("matrix"), dict) and a["matrix"].get("deterministic_of")}
    passed = [r for r in store.runs() if r["arm"] in det]
    if passed:
        console.print("deterministic pass (--correctness: not measured, not in the table; its outcome is in the "
                      "verdict lines): " + ", ".join(f"{r['run_id']} {r['status']}" for r in passed), markup=False)
    failed = store.runs(status="failed")
    interrupted = store.runs(status="interrupted")
    for r in failed:
        console.print(f"FAILED {r['run_id']} ({r['failure_phase'] or '?'}): {(r['failure_reason'] or '').strip()[:500]}",
                      markup=False)
    for r in interrupted:
        console.print(f"INTERRUPTED {r['run_id']} ({r['failure_phase'] or '?'}): "
                      f"{(r['failure_reason'] or 'interrupted').strip()[:300]}", markup=False)
    missing = store.missing()
    if missing:
        console.print(f"{len(missing)} planned run(s) not done: {', '.join(m['run_id'] for m in missing[:10])}",
                      markup=False)
    return len(failed)
