"""What a verdict costs and will cost: GPU-seconds per run, arm and experiment; the variance components of an
experiment; the run cost of a simulated node's profile; the plan's text (docs/statistics.md, "Design by cost").

The pure model lives in specab.analysis.design; this module feeds it from an Experiment and a profile."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from specab.analysis import design
from specab.analysis.model import Experiment, Run

# Dead time of a run when nothing measured it yet: stop, GPUs-free wait, env check, collect, the playbook's own
# start (docs/performance.md section 1 measures 5-20 s per transition on the simulated node).
DEFAULT_DEAD_S = 15.0


def gpus_of(server_args: Mapping[str, Any]) -> int:
    """GPUs one server holds: tensor parallel x pipeline parallel (SGLang's --tp-size, --pp-size; vLLM's
    --tensor-parallel-size, --pipeline-parallel-size; 1 if unset)."""
    n = 1
    for k in ("tp_size", "pp_size", "tensor_parallel_size", "pipeline_parallel_size"):
        try:
            n *= max(1, int(server_args.get(k) or 1))
        except (TypeError, ValueError):
            pass
    return n


def run_gpu_seconds(run: Run) -> float | None:
    """What the run cost: the store's runs.gpu_seconds (the node's phases from the first to the last, times the
    GPUs held). None for a store written before that column: its cost was not recorded, and is not guessed."""
    return None if run.gpu_seconds is None else float(run.gpu_seconds)


@dataclass
class Spend:
    """GPU-seconds spent: per arm, in all, and how much of it went to runs that failed."""
    per_arm: dict[str, float] = field(default_factory=dict)
    total: float = 0.0
    failed: float = 0.0
    runs: int = 0
    restarts_per_arm: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"per_arm_gpu_s": self.per_arm, "total_gpu_s": self.total, "total_gpu_minutes": self.total / 60.0,
                "failed_gpu_s": self.failed, "runs": self.runs, "restarts_per_arm": self.restarts_per_arm}


def spend(exp: Experiment) -> Spend:
    s = Spend()
    for r in exp.runs:
        g = run_gpu_seconds(r)
        if g is None:
            continue
        s.per_arm[r.arm] = s.per_arm.get(r.arm, 0.0) + g
        s.restarts_per_arm[r.arm] = s.restarts_per_arm.get(r.arm, 0) + 1
        s.total += g
        s.runs += 1
        if not r.ok:
            s.failed += g
    return s


def components_of(exp: Experiment, arm: str, prior: design.Components | None = None) -> design.Components:
    """Variance components of the arm's paired log ratio against its baseline, from the complete blocks."""
    baseline = exp.baseline_of(arm)
    base = {(r.host, r.block): r for r in exp.runs_of(baseline)}
    ratios, reqs = [], []
    for r in sorted(exp.runs_of(arm), key=lambda r: (r.host, r.block)):
        b = base.get((r.host, r.block))
        if b is None or not r.tok_s or not b.tok_s:
            continue
        ratios.append(math.log(r.tok_s / b.tok_s))
        reqs.append(([math.log(q.decode_tok_s) for q in r.measured if q.decode_tok_s],
                     [math.log(q.decode_tok_s) for q in b.measured if q.decode_tok_s]))
    return design.estimate_components(ratios, reqs, prior=prior)


def profile_cost(profile: Mapping[str, Any], *, speculative: bool, gpus: int, output_len: int, warmup: int,
                 time_scale: float = 1.0, dead_s: float = DEFAULT_DEAD_S) -> design.RunCost:
    """A run's cost on a simulated node from its profile (specab/sim/profiles/*.yml): load phases, one request
    (prefill + output_len decode steps, or draft+verify cycles at the profile's acceptance), in wall seconds
    at the node's time scale."""
    load = profile.get("load") or {}
    keys = ["init_s", "weights_s", "kv_cache_s", "cuda_graph_s", "http_start_s"]
    if speculative:
        keys += ["draft_weights_s", "draft_cuda_graph_s"]
    load_s = sum(float(load.get(k, 0.0)) for k in keys)
    dec = profile.get("decode") or {}
    pre = profile.get("prefill") or {}
    prefill_s = (float(pre.get("base_ms", 0.0)) + float(pre.get("per_token_ms", 0.0)) * 128) / 1000.0
    if speculative:
        sp = profile.get("spec") or {}
        acc = [float(a) for a in (sp.get("acceptance") or [0.0])][:2]
        tokens_per_cycle = 1.0
        p = 1.0
        for a in acc:
            p *= a
            tokens_per_cycle += p
        cycle_ms = (2 * float(sp.get("draft_step_ms", 0.0)) + float(sp.get("verify_base_ms", 0.0))
                    + 3 * float(sp.get("verify_per_token_ms", 0.0)) + float(sp.get("overhead_ms", 0.0)))
        decode_s = output_len / tokens_per_cycle * cycle_ms / 1000.0
    else:
        decode_s = output_len * float(dec.get("step_ms", 0.0)) / 1000.0
    per_request = max((prefill_s + decode_s) / max(time_scale, 1e-9), 1e-3)
    return design.RunCost(load_s=load_s / max(time_scale, 1e-9), per_request_s=per_request,
                          fixed_bench_s=warmup * per_request, dead_s=dead_s, gpus=gpus,
                          source=f"simulator profile {profile.get('name', '?')} at time scale {time_scale:g}")


def acceptance_cv2(acceptance: list[float], steps: int, output_len: int) -> float:
    """Squared coefficient of variation of a request's decode speed from drawn acceptance alone: tokens per
    draft/verify cycle are 1 + the accepted drafts (conditional acceptance per position, up to `steps`), and a
    request of output_len tokens averages output_len / mean such cycles."""
    probs, p = [], 1.0
    for a in acceptance[:steps]:
        probs.append(p * (1.0 - a))
        p *= a
    probs.append(p)                                   # every draft accepted
    mean = sum((k + 1) * q for k, q in enumerate(probs))
    var = sum((k + 1) ** 2 * q for k, q in enumerate(probs)) - mean ** 2
    cycles = max(output_len / mean, 1.0)
    return var / mean ** 2 / cycles


def profile_components(profile: Mapping[str, Any], output_len: int, spec_steps: int = 0) -> design.Components:
    """The profile's noise as variance components of a paired log ratio (a prior worth one block's degrees of
    freedom: the profile is a model of the node, not a measurement of it). A speculative arm's requests vary
    also by their drawn acceptance (`acceptance_cv2`)."""
    noise = profile.get("noise") or {}
    request = float(noise.get("request_cv", 0.0)) ** 2 + float(noise.get("step_cv", 0.0)) ** 2 / max(output_len, 1)
    instance = float(noise.get("instance_cv", 0.0)) ** 2
    spec = request
    if spec_steps > 0:
        acc = [float(a) for a in ((profile.get("spec") or {}).get("acceptance") or [])]
        spec += acceptance_cv2(acc, spec_steps, output_len)
    return design.Components(between=2 * instance, within=request + spec, between_df=1.0, within_df=1.0,
                             source=f"simulator profile {profile.get('name', '?')}")


def cost_lines(exp: Experiment) -> list[str]:
    """The report's closing lines: what the verdict cost."""
    s = spend(exp)
    if not s.runs:
        return ["Verdict cost: not recorded (no run of this store has runs.gpu_seconds: it was written before "
                "specab recorded what runs cost)."]
    arms = ", ".join(f"{a} {g / 60:.1f} ({s.restarts_per_arm[a]} restarts)" for a, g in s.per_arm.items())
    failed = f"; {s.failed / 60:.1f} of them on failed runs" if s.failed else ""
    return [f"Verdict cost: {s.total / 60:.1f} GPU-minutes over {s.runs} runs ({arms}){failed}."]


@dataclass
class PlanEstimate:
    """`driver.py plan --target-ci`: the design by cost and today's sequential design, both in GPU-minutes."""
    design: design.Design
    today: design.Design
    cost: design.RunCost
    components: design.Components
    requests: int

    def lines(self, target_rel: float) -> list[str]:
        d = self.design
        c = self.components
        return [
            f"design by cost for --target-ci {target_rel:.1%} (95% interval of the paired speedup):",
            f"  {d.blocks} restarts per arm x {d.requests} measured requests per run ({d.reason})",
            f"  expected {d.gpu_s / 60:.1f} GPU-minutes (range {d.gpu_s_low / 60:.1f}-{d.gpu_s_high / 60:.1f}), "
            f"{d.arms} arms x {self.cost.gpus} GPUs",
            f"  run cost ({self.cost.source}): load {self.cost.load_s:.1f} s, {self.cost.per_request_s:.2f} s per "
            f"request, dead time {self.cost.dead_s:.1f} s",
            f"  noise ({c.source}): between instances sd {math.sqrt(c.between / 2):.2%} per arm, "
            f"requests sd {math.sqrt(c.within / 2):.2%} per request and arm",
            f"what `driver.py run --target-ci {target_rel:.0%}` does now (today's sequential design, the experiment's "
            f"{self.requests} requests per run):",
            f"  {self.today.blocks} restarts per arm{'' if self.today.feasible else ' (the cap: target not reached)'}"
            f", expected {self.today.gpu_s / 60:.1f} GPU-minutes "
            f"(range {self.today.gpu_s_low / 60:.1f}-{self.today.gpu_s_high / 60:.1f})",
        ]


def plan_estimate(cost: design.RunCost, comps: design.Components, target_rel: float, *, arms: int, requests: int,
                  today_max_blocks: int, max_blocks: int = 60) -> PlanEstimate:
    """The plan before anything runs: the cost design from the prior components, and today's fixed-requests
    design for comparison (its expected blocks at `requests` per run, at most `today_max_blocks`: --max-repeats).
    The ranges cover the components' uncertainty and a dead time from half to twice its estimate."""
    d = design.plan_design(comps, cost, target_rel, arms=arms, max_blocks=max_blocks, keep_requests=requests,
                           min_requests=min(2, requests))
    today = design.plan_design(comps, cost, target_rel, arms=arms, max_blocks=max(today_max_blocks, 3),
                               min_requests=requests, max_requests=requests, min_blocks=min(3, today_max_blocks))
    lo, hi = today.gpu_s_low, today.gpu_s_high
    d_lo, d_hi = d.gpu_s_low, d.gpu_s_high
    for f in (0.5, 2.0):
        c = replace(cost, dead_s=cost.dead_s * f)
        t = design.plan_design(comps, c, target_rel, arms=arms, max_blocks=max(today_max_blocks, 3),
                               min_requests=requests, max_requests=requests, min_blocks=min(3, today_max_blocks))
        lo, hi = min(lo, t.gpu_s_low), max(hi, t.gpu_s_high)
        dd = design.plan_design(comps, c, target_rel, arms=arms, max_blocks=max_blocks, keep_requests=requests,
                                min_requests=min(2, requests))
        d_lo, d_hi = min(d_lo, dd.gpu_s_low), max(d_hi, dd.gpu_s_high)
    return PlanEstimate(replace(d, gpu_s_low=d_lo, gpu_s_high=d_hi), replace(today, gpu_s_low=lo, gpu_s_high=hi),
                        cost, comps, requests)
