"""Where a speculative cycle's time goes, measured: per run and per arm ms per cycle in draft, draft-extend,
verify and "other", from the engine's device-timer counters (phase_metrics.json, written by the benchmark
client; schema in docs/results.md).

Definitions (docs/analysis.md, "Per-phase breakdown"):
- cycles = the engine's verify passes over the measured window (``verify_passes``): one pass verifies every
  request in the batch, so a request's cycle costs the whole pass; phase ms per cycle =
  Δ``forward_execution_seconds_total{category}`` / verify passes (``eagle_draft``, ``eagle_draft_extend``,
  ``target_verify``), in the same time base as tok/s (a simulated node's time scale undone). Δ``spec_verify_calls_total``
  counts request cycles (each finished request adds its verify count), so it equals the passes only at one request
  in flight; their ratio is the mean batch of a verify pass;
- implied cycle = 1000 · τ / tok/s, computed per request as decode seconds / verify steps with τ = (output tokens − 1)
  / verify steps (the first token is the prefill's) and pooled over the run's measured requests; other = implied −
  measured;
- verify share = verify / implied cycle; graph share of verify = ``decode_cuda_graph`` / (``decode_cuda_graph`` +
  ``decode_none``) passes under speculation;
- baseline ms per decode step: measured Δ``{category="decode"}`` / decode passes, and implied 1000 / tok/s.
SGLang < 0.5.23 has no draft/verify categories, vLLM no per-phase GPU time at all (only a profile shows it):
those runs read "not available on this engine".
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from specab.analysis.evidence.model import Experiment, Run
# scipy is imported in the functions that use it: importing scipy.stats takes ~1.3 s, which every start of
# driver.py paid (status, --help, a run before its first report: 1.8 s -> 0.55 s for --help).

# measured phases above the implied cycle by more than this are impossible (the window or τ is off); an "other"
# share above OTHER_SHARE_FINDING is engine overhead outside the forward passes worth naming
CONSISTENCY_TOL = 0.05
OTHER_SHARE_FINDING = 0.15
NOT_AVAILABLE = ("not available on this engine: no per-phase forward time (SGLang 0.5.23 with --enable-metrics "
                 "and SGLANG_ENABLE_METRICS_DEVICE_TIMER=1 splits it; vLLM exposes per-position acceptance but no "
                 "per-phase GPU time unless a profile is taken)")
NO_COMPLETED_RUN = "not measured: no run of this arm completed (each failed or was interrupted)"


@dataclass
class RunPhases:
    run_id: str
    arm: str
    cycles: float                # verify passes (batched cycles) over the measured window
    draft_ms: float
    draft_extend_ms: float
    verify_ms: float
    implied_cycle_ms: float
    graph_share: float | None
    request_cycles: float = 0.0  # Δspec_verify_calls_total: the requests' verify steps, summed
    prefill_ms: float = 0.0      # device-timer extend (prefill) ms per verify pass: in a batch, the prefills of
                                 # arriving requests that pause the running ones; alone, the request's own prefill

    @property
    def batch(self) -> float:
        """Mean requests verified per pass (1.0 at one request in flight)."""
        return self.request_cycles / self.cycles if self.cycles and self.request_cycles else 1.0

    @property
    def measured_ms(self) -> float:
        return self.draft_ms + self.draft_extend_ms + self.verify_ms

    @property
    def other_ms(self) -> float:
        return self.implied_cycle_ms - self.measured_ms


@dataclass
class Interval:
    mean: float
    lo: float
    hi: float
    n: int


def interval(values: list[float]) -> Interval:
    """Mean and 95% t interval over runs (a single run: the interval is the point)."""
    from scipy import stats as scipy_stats
    n = len(values)
    m = statistics.fmean(values)
    if n < 2:
        return Interval(m, m, m, n)
    h = scipy_stats.t.ppf(0.975, n - 1) * statistics.stdev(values) / math.sqrt(n)
    return Interval(m, m - h, m + h, n)


@dataclass
class ArmPhases:
    arm: str
    runs: list[RunPhases]
    draft_ms: Interval
    draft_extend_ms: Interval
    verify_ms: Interval
    other_ms: Interval
    implied_cycle_ms: Interval
    graph_share: float | None
    baseline_step_ms: float | None          # implied baseline step (1000 / tok/s) of the arm's baseline
    baseline_step_measured_ms: float | None  # device-timer decode ms per step, when the baseline ran with it

    @property
    def batch(self) -> float:
        """Mean requests verified per pass over the arm's runs (1.0: single-stream)."""
        return statistics.fmean(r.batch for r in self.runs) if self.runs else 1.0

    @property
    def prefill_ms(self) -> float:
        """Prefill (extend) ms per verify pass, mean over runs (see RunPhases.prefill_ms)."""
        return statistics.fmean(r.prefill_ms for r in self.runs) if self.runs else 0.0

    @property
    def measured_ms(self) -> float:
        return self.draft_ms.mean + self.draft_extend_ms.mean + self.verify_ms.mean

    @property
    def verify_share(self) -> float:
        return self.verify_ms.mean / self.implied_cycle_ms.mean

    @property
    def consistency(self) -> float:
        """measured phases / implied cycle (1.0: the forwards are the whole cycle)."""
        return self.measured_ms / self.implied_cycle_ms.mean

    def tau_star(self, verify_ms: float | None = None) -> float | None:
        """Break-even τ from measured phases: cycle / baseline step; with ``verify_ms`` the verify replaced."""
        if not self.baseline_step_ms:
            return None
        cycle = self.implied_cycle_ms.mean
        if verify_ms is not None:
            cycle += verify_ms - self.verify_ms.mean
        return cycle / self.baseline_step_ms

    def dominant(self) -> tuple[str, float]:
        parts = {"draft": self.draft_ms.mean, "draft-extend": self.draft_extend_ms.mean,
                 "verify": self.verify_ms.mean, "other": self.other_ms.mean}
        name = max(parts, key=lambda k: parts[k])
        return name, parts[name]

    def to_dict(self) -> dict[str, Any]:
        d = {k: (asdict(v) if isinstance(v, Interval) else v) for k, v in self.__dict__.items() if k != "runs"}
        d.update(measured_ms=self.measured_ms, batch=self.batch, prefill_ms=self.prefill_ms, verify_share=self.verify_share, consistency=self.consistency,
                 tau_star=self.tau_star(), runs=[{**asdict(r), "other_ms": r.other_ms, "batch": r.batch}
                                                  for r in self.runs])
        return d


@dataclass
class PhaseReport:
    arms: dict[str, ArmPhases] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)   # speculative arm -> why there is no breakdown

    def to_dict(self) -> dict[str, Any]:
        return {"arms": {k: v.to_dict() for k, v in self.arms.items()}, "unavailable": dict(self.unavailable)}


def verify_passes(request_cycles: float | None, graph_passes: dict[str, float] | None) -> float | None:
    """The engine's verify passes over a window: ``cuda_graph_passes_total{mode=decode_*}`` counts forward passes
    of the batch (under speculation one per cycle, whatever the batch), ``spec_verify_calls_total`` counts
    request cycles. A real engine also counts about one decode-mode pass more per request that leaves an emptied
    batch (SGLang 0.5.17 on the H200 at one request in flight: passes exceed verify calls by 5-6 over 6 requests in
    every speculative run of tests/fixtures/known-truth/h200), so the smaller of the two is the verify passes: the request cycles at one in
    flight, the pass count once batches hold several requests (where those extra passes only come when the batch
    empties, a small share). None without a pass count: request cycles alone cannot tell one pass from a batch."""
    g = graph_passes or {}
    passes = float(g.get("decode_cuda_graph", 0.0) or 0.0) + float(g.get("decode_none", 0.0) or 0.0)
    if not request_cycles or not passes:
        return None
    return min(float(request_cycles), passes)


def run_phases(run: Run) -> RunPhases | None:
    pm = run.phase_metrics or {}
    fwd = pm.get("forward_s") or {}
    g = pm.get("graph_passes") or {}
    request_cycles = pm.get("spec_verify_calls")
    cycles = verify_passes(request_cycles, g)
    tau, tok_s = run.accept_len, run.tok_s
    if not pm.get("available") or "target_verify" not in fwd or not cycles or not tau or not tok_s:
        return None
    k = 1000.0 * (run.time_scale or 1.0) / cycles
    graphed, plain = g.get("decode_cuda_graph", 0.0), g.get("decode_none", 0.0)
    draft, draft_extend = fwd.get("eagle_draft", 0.0), fwd.get("eagle_draft_extend", 0.0)
    if "eagle_draft" not in fwd and "decode" in fwd:
        # without CUDA graphs the device timer files the draft passes under "decode" and the draft-extend passes
        # under "extend", with the measured requests' prefills (real SGLang 0.5.17, docs/validation/known-truth.md)
        draft, draft_extend = fwd["decode"], fwd.get("extend", 0.0)
    return RunPhases(run.run_id, run.arm, cycles, draft * k, draft_extend * k, fwd["target_verify"] * k,
                     implied_cycle_ms(run), graphed / (graphed + plain) if graphed + plain else None,
                     float(request_cycles or 0.0), fwd.get("extend", 0.0) * k)


def implied_cycle_ms(run: Run) -> float:
    """The cycle implied by the client's measurement: per request, tokens per cycle over the decode span
    ((output tokens - 1) / verify steps: the first token comes from the prefill) / decode tok/s, pooled over the
    run's measured requests as Σ decode seconds / Σ verify steps; τ / tok/s of the run when the requests lack counts."""
    reqs = [r for r in run.measured if r.spec_verify_ct and r.output_tokens and r.output_tokens > 1 and r.decode_tok_s]
    if reqs:
        decode_s = sum((r.output_tokens - 1) / r.decode_tok_s for r in reqs)  # type: ignore[operator]
        return 1000.0 * decode_s / sum(r.spec_verify_ct for r in reqs)  # type: ignore[misc]
    return 1000.0 * (run.accept_len or 0.0) / (run.tok_s or float("inf"))


def baseline_step(runs: list[Run]) -> tuple[float | None, float | None]:
    """(implied, measured) baseline ms per decode step over the baseline's ok runs."""
    implied = [1000.0 / r.tok_s for r in runs if r.tok_s]
    measured = []
    for r in runs:
        pm = r.phase_metrics or {}
        g = pm.get("graph_passes") or {}
        steps = g.get("decode_cuda_graph", 0.0) + g.get("decode_none", 0.0)
        if pm.get("available") and "decode" in (pm.get("forward_s") or {}) and steps:
            measured.append(pm["forward_s"]["decode"] / steps * 1000.0 * (r.time_scale or 1.0))
    return (statistics.fmean(implied) if implied else None, statistics.fmean(measured) if measured else None)


def analyse_phases(exp: Experiment) -> PhaseReport:
    rep = PhaseReport()
    for arm in exp.spec_arms:
        runs = [p for p in (run_phases(r) for r in exp.runs_of(arm.name)) if p is not None]
        if not runs:
            rep.unavailable[arm.name] = NOT_AVAILABLE if exp.runs_of(arm.name) else NO_COMPLETED_RUN
            continue
        implied, measured = baseline_step(exp.runs_of(exp.baseline_of(arm.name)))
        shares = [r.graph_share for r in runs if r.graph_share is not None]
        rep.arms[arm.name] = ArmPhases(
            arm.name, runs, interval([r.draft_ms for r in runs]), interval([r.draft_extend_ms for r in runs]),
            interval([r.verify_ms for r in runs]), interval([r.other_ms for r in runs]),
            interval([r.implied_cycle_ms for r in runs]), statistics.fmean(shares) if shares else None,
            implied, measured)
    return rep
