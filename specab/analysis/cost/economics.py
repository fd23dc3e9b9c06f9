"""What a verdict costs and will cost: GPU-seconds per run, arm and experiment; the variance components of an
experiment; the run cost of a simulated node's profile; the plan's text (docs/statistics.md, "Design by cost").

The pure model lives in specab.analysis.cost.design; this module feeds it from an Experiment and a profile."""
from __future__ import annotations

import contextlib
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Mapping

from specab.analysis.measures import stats
from specab.analysis.cost import design
from specab.analysis.evidence.model import Experiment, Run

# Dead time of a run when nothing measured it yet: what a run holds its GPUs for besides the engine's load and the
# benchmark. Measured on a real H200 with SGLang 0.5.17 under the run queue (21 runs of the known-truth experiments,
# tests/fixtures/known-truth/h200, run_phases medians): the final stop 5.7 s (SGLang's drain, SIGQUIT and process
# tree kill), collect 1.3 s, warm-up 0.7 s, env check and GPUs-free waits 0.05 s: 7.7 s a run.
DEFAULT_DEAD_S = 7.7
# Of that dead time, the final stop (SGLang's drain and process tree kill): what a run that continues its instance's
# server (docs/decisions/0011) does not wait for before it, besides the engine's load.
DEFAULT_STOP_S = 5.7


def gpus_of(server_args: Mapping[str, Any]) -> int:
    """GPUs one server holds: tensor parallel x pipeline parallel (SGLang's --tp-size, --pp-size; vLLM's
    --tensor-parallel-size, --pipeline-parallel-size; 1 if unset)."""
    n = 1
    for k in ("tp_size", "pp_size", "tensor_parallel_size", "pipeline_parallel_size"):
        with contextlib.suppress(TypeError, ValueError):
            n *= max(1, int(server_args.get(k) or 1))
    return n


def instance_saving_s(cost: design.RunCost, continued: int) -> float:
    """GPU-seconds a plan does not spend when `continued` runs continue their instance's server instead of starting
    one (docs/decisions/0011): each saves the engine's load and the stop before it (at most DEFAULT_STOP_S of the dead
    time; a measured cost's restart, which holds all of a run's time besides its requests, counts whole)."""
    return continued * (cost.load_s + min(DEFAULT_STOP_S, cost.dead_s)) * cost.gpus


def run_gpu_seconds(run: Run) -> float | None:
    """What the run cost: the store's runs.gpu_seconds (the node's phases from the first to the last, times the
    GPUs held). None for a store written before that column: its cost was not recorded, and is not guessed."""
    return None if run.gpu_seconds is None else float(run.gpu_seconds)


@dataclass
class Spend:
    """GPU-seconds spent: per arm, in all, how much of it went to runs that failed, and to the burn-in starts (counted
    in the total: a verdict bought with a burn-in cost that much more)."""
    per_arm: dict[str, float] = field(default_factory=dict)
    total: float = 0.0
    failed: float = 0.0
    runs: int = 0
    restarts_per_arm: dict[str, int] = field(default_factory=dict)
    burn_in: float = 0.0
    burn_in_runs: int = 0

    def to_dict(self) -> dict:
        return {"per_arm_gpu_s": self.per_arm, "total_gpu_s": self.total, "total_gpu_minutes": self.total / 60.0,
                "failed_gpu_s": self.failed, "runs": self.runs, "restarts_per_arm": self.restarts_per_arm,
                "burn_in_gpu_s": self.burn_in, "burn_in_runs": self.burn_in_runs}


def spend(exp: Experiment) -> Spend:
    s = Spend()
    burned = {id(r) for r in exp.burn_in}
    for r in exp.runs + exp.burn_in:
        g = run_gpu_seconds(r)
        if g is None:
            continue
        if id(r) in burned:
            s.burn_in += g
            s.burn_in_runs += 1
        else:
            s.per_arm[r.arm] = s.per_arm.get(r.arm, 0.0) + g
            # a run that continued its instance's server (docs/decisions/0011) is no restart
            s.restarts_per_arm[r.arm] = s.restarts_per_arm.get(r.arm, 0) + int(r.instance == r.seq)
        s.total += g
        s.runs += 1
        if not r.ok:
            s.failed += g
    return s


def paired_blocks(exp: Experiment, arm: str) -> tuple[list[float], list[tuple[list[float], list[float]]]]:
    """The arm's complete blocks against its baseline, in (host, block) order: the log ratio of each block and the
    measured requests' log speeds of its two runs. A block's runs may have their own requests per run (the design
    by cost chooses them per block); the ratio is of the two runs' medians, as the report's paired speedup."""
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
    return ratios, reqs


def components_of(exp: Experiment, arm: str, prior: design.Components | None = None) -> design.Components:
    """Variance components of the arm's paired log ratio against its baseline, from the complete blocks."""
    ratios, reqs = paired_blocks(exp, arm)
    return design.estimate_components(ratios, reqs, prior=prior)


def measured_cost(exp: Experiment, arms: set[str] | None = None) -> design.RunCost | None:
    """A run's cost as this experiment measured it (its ok runs with a recorded cost; `arms`: only these): a
    measured request's wall seconds (mean e2e), and the rest of the time the run held its GPUs (stop, GPUs-free
    wait, start, load, warm-up, env check, collect on the node) as the price of a restart. None before such a run."""
    return measured_cost_runs(exp, arms)[0]


def measured_cost_runs(exp: Experiment, arms: set[str] | None = None) -> tuple[design.RunCost | None, int]:
    """`measured_cost` and the number of runs it averages."""
    restart, per_req, gpus, n = 0.0, [], 1, 0
    for r in exp.runs:
        if arms is not None and r.arm not in arms:
            continue
        g = run_gpu_seconds(r)
        gp = gpus_of(r.server_args)
        walls = [q.e2e_s / max(r.time_scale, 1e-9) for q in r.measured if q.e2e_s]
        if not r.ok or g is None or not walls:
            continue
        held = g / gp
        restart += max(0.0, held - sum(walls))
        per_req += walls
        gpus, n = max(gpus, gp), n + 1
    if not n:
        return None, 0
    return design.RunCost(load_s=restart / n, per_request_s=max(sum(per_req) / len(per_req), 1e-3), gpus=gpus,
                          source=f"measured: {n} run(s) of {exp.id}"), n


@dataclass
class Decision:
    """The design's decision after a block: another block? with how many measured requests per run? why, and the
    design's plan then (its expected GPU-seconds for the whole experiment: the progress display's projection)."""
    more: bool
    requests: int
    reason: str
    design: str = "cost"
    plan: design.Design | None = None
    arms: dict[str, str] = field(default_factory=dict)      # per compared arm, its own step in words

    def to_dict(self) -> dict:
        return {**asdict(self), "plan": self.plan.to_dict() if self.plan else None}


def decide_block(exp: Experiment, target_rel: float, *, max_blocks: int, keep_requests: int,
                 prior: design.Components | None = None, cost: design.RunCost | None = None,
                 min_requests: int = 2, max_requests: int = 400, seed: int = stats.DEFAULT_SEED) -> Decision:
    """The design by cost after a block (`driver.py run --target-ci`, docs/statistics.md "Design by cost"): for
    every compared arm, the variance components from its complete blocks (the node's history or the profile as
    the prior), the report's interval, and design.next_step at this experiment's measured run cost (else `cost`).
    Another block when any arm needs one, with the most requests per run any of them asks for (the block runs
    them all); stop when every arm may stop. `max_blocks`: the blocks the experiment may have in all (started
    blocks count: a block with a failed run is one of them). `keep_requests`: the experiment's requests per run."""
    run_cost = measured_cost(exp) or cost
    started = len({(r.host, r.block) for r in exp.runs})
    lo = min(keep_requests, min_requests)
    hi = max(keep_requests, max_requests)
    if run_cost is None:
        more, why = stats.decide_more_blocks(exp, target_rel, max_blocks, seed=seed)
        return Decision(more, keep_requests, f"no run cost measured or known yet, the sequential rule: {why}",
                        design="sequential")
    steps: dict[str, design.Step | None] = {}
    spent = spend(exp).total
    for a in exp.spec_arms:
        ratios, reqs = paired_blocks(exp, a.name)
        try:
            comps = design.estimate_components(ratios, reqs, prior=prior)
        except design.DesignError:        # no block with requests yet and no prior: the next block at the start's
            steps[a.name] = None
            continue
        m_blocks = [(len(x) + len(y)) / 2.0 for x, y in reqs]
        sp = stats.paired_speedup(exp, a.name, seed)
        ci = sp.ci.half_width_rel if sp.ci and math.isfinite(sp.ci.lo) else math.inf
        cap = len(ratios) + max(0, max_blocks - started)
        steps[a.name] = design.next_step(comps, run_cost, target_rel, m_blocks, ci, arms=len(exp.arms),
                                         min_blocks=max(2, min(design.MIN_RESTARTS, cap)), max_blocks=max(cap, 2),
                                         min_requests=lo, max_requests=hi, done_gpu_s=spent,
                                         keep_requests=keep_requests)
    words = {k: (v.why if v is not None else "no complete block yet") for k, v in steps.items()}
    going = {k: v for k, v in steps.items() if v is None or v.more}
    if not going:
        return Decision(False, keep_requests, "; ".join(f"{k}: {w}" for k, w in words.items()), arms=words,
                        plan=max((v.plan for v in steps.values() if v is not None), key=lambda d: d.gpu_s,
                                 default=None))
    m = max((v.requests for v in going.values() if v is not None), default=keep_requests)
    plan = max((v.plan for v in going.values() if v is not None), key=lambda d: d.gpu_s, default=None)
    return Decision(True, m, "; ".join(f"{k}: {w}" for k, w in words.items() if k in going), arms=words, plan=plan)


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
    # the store of an experiment still running (its status; a driver that ended without a word leaves it so):
    # its runs in progress have no cost yet
    running = exp.meta.get("status") == "running" or any(r.status == "running" for r in exp.runs)
    if not s.runs and running:
        return ["Verdict cost: not known yet: the experiment is still running and none of its runs has finished "
                "(each run's cost is recorded when it ends)."]
    if not s.runs:
        return ["Verdict cost: not recorded (no run of this store has runs.gpu_seconds: it was written before "
                "specab recorded what runs cost)."]
    arms = ", ".join(f"{a} {g / 60:.1f} ({s.restarts_per_arm[a]} restarts)" for a, g in s.per_arm.items())
    if s.burn_in_runs:
        arms += f", burn-in {s.burn_in / 60:.1f} ({s.burn_in_runs} unmeasured start{'s' if s.burn_in_runs > 1 else ''})"
    failed = f"; {s.failed / 60:.1f} of them on failed runs" if s.failed else ""
    so_far = " so far (the experiment is still running)" if running else ""
    return [f"Verdict cost: {s.total / 60:.1f} GPU-minutes over {s.runs} runs{so_far} ({arms}){failed}."]


def first_design(comps: design.Components, cost: design.RunCost, target_rel: float, *, arms: int, requests: int,
                 max_blocks: int, min_requests: int = 2, max_requests: int = 400,
                 range_sd: float = 1.0) -> design.Design:
    """The design by cost before the first block (what `run --target-ci` starts with and `plan --target-ci` shows):
    from the prior components and the expected run cost, within `max_blocks` blocks (--max-repeats); the
    experiment's `requests` per run are kept unless moving them saves design.KEEP_UNLESS_SAVING."""
    return design.plan_design(comps, cost, target_rel, arms=arms, max_blocks=max(max_blocks, 2),
                              min_blocks=max(2, min(design.MIN_RESTARTS, max_blocks)), keep_requests=requests,
                              min_requests=min(min_requests, requests), max_requests=max(max_requests, requests),
                              range_sd=range_sd)


@dataclass(frozen=True)
class FirstBlock:
    """What `run --target-ci` with the design by cost starts with, and `plan --target-ci` shows: one block whose runs
    measure `requests` requests each. `design`: the design's plan then (restarts per arm, requests per run,
    expected GPU-seconds); None where the prior noise or the run cost is unknown, and the first block then runs the
    experiment's requests while this experiment's own runs measure the rest."""
    requests: int
    design: design.Design | None
    why: str


def first_block(prior: design.Components | None, cost: design.RunCost | None, target_rel: float, *, arms: int,
                requests: int, max_blocks: int, max_requests: int = 400, min_requests: int = 2) -> FirstBlock:
    """The first block of the design by cost: `first_design` where both the prior and the run cost are known, else
    the experiment's `requests` per run. One function for `run` and `plan`, so the plan shows what the run does."""
    if prior is None or cost is None:
        return FirstBlock(requests, None, "no prior noise or run cost for this node yet: the experiment's requests "
                                          "per run")
    d = first_design(prior, cost, target_rel, arms=arms, requests=requests, max_blocks=max_blocks,
                     min_requests=min_requests, max_requests=max_requests, range_sd=0.0)
    return FirstBlock(d.requests, d, f"from {prior.source} and the run cost of {cost.source}: plan {d.blocks} "
                                     f"restarts per arm x {d.requests} requests per run, expected "
                                     f"{d.gpu_s / 60:.1f} GPU-minutes ({d.reason})")


@dataclass
class PlanEstimate:
    """`driver.py plan --target-ci`: what `run --target-ci` will do (the design `chosen`: by cost, the default, or
    the sequential rule), and the other design for comparison, both in GPU-minutes with a range. `first`: the
    design by cost's first block (`first_block`, what `run` starts with); `repeats`: the blocks the sequential
    design runs before it asks for more."""
    design: design.Design
    sequential: design.Design
    cost: design.RunCost
    components: design.Components
    requests: int
    max_blocks: int
    chosen: str = "cost"
    first: FirstBlock | None = None
    repeats: int = 1

    @property
    def expected(self) -> design.Design:
        """The chosen design's plan: its `blocks` are the restarts per arm `run` is expected to end with."""
        return self.sequential if self.chosen == "sequential" else self.design

    def lines(self, target_rel: float) -> list[str]:
        d, q, c = self.design, self.sequential, self.components
        pct = f"{target_rel:.0%}" if round(target_rel * 100, 6) == round(target_rel * 100) else f"{target_rel:.1%}"
        if self.first is not None and self.first.design is None:
            whose = (" (the experiment's: no prior noise for this node yet; the estimate assumes the default "
                     "between-instance variance)")
        else:
            whose = (" (the experiment's)" if d.requests == self.requests
                     else f" (the experiment has {self.requests})")
        by_cost = [
            f"  design by cost for --target-ci {target_rel:.1%} (95% interval of the paired speedup): the first block "
            f"with {d.requests} measured requests per run{whose}; after every block the variance components are "
            f"re-estimated and the design chooses the next block's requests per run and whether to stop, within "
            f"--max-repeats {self.max_blocks}",
            f"  plan now: {d.blocks} restarts per arm ({d.reason}{'' if d.feasible else '; target out of reach'})",
            f"  expected {d.gpu_s / 60:.1f} GPU-minutes (range {d.gpu_s_low / 60:.1f}-{d.gpu_s_high / 60:.1f}), "
            f"{d.arms} arms x {self.cost.gpus} GPUs",
        ]
        seq = [
            f"  the sequential design (--design sequential): the --repeats {self.repeats} blocks, then one more "
            f"while the interval is wider, the experiment's {self.requests} requests per run in every block, "
            f"{q.blocks} restarts per arm{'' if q.feasible else ' (the cap: target not reached)'}, "
            f"expected {q.gpu_s / 60:.1f} GPU-minutes (range {q.gpu_s_low / 60:.1f}-{q.gpu_s_high / 60:.1f})",
        ]
        common = [
            f"  run cost ({self.cost.source}): load and restart {self.cost.restart_s:.1f} s, "
            f"{self.cost.per_request_s:.2f} s per request",
            f"  noise ({c.source}): between instances sd {math.sqrt(c.between / 2):.2%} per arm, "
            f"requests sd {math.sqrt(c.within / 2):.2%} per request and arm",
        ]
        if self.chosen == "sequential":
            return ([f"what `driver.py run --target-ci {pct} --design sequential` will do:"] + seq + common
                    + ["for comparison, the design by cost (the default of `run --target-ci`):"] + by_cost)
        return ([f"what `driver.py run --target-ci {pct}` will do:"] + by_cost + common
                + ["for comparison:"] + seq)


def plan_estimate(cost: design.RunCost, comps: design.Components, target_rel: float, *, arms: int, requests: int,
                  max_blocks: int, chosen: str = "cost", measured_cost: bool = False,
                  max_requests: int = 400, first: FirstBlock | None = None, repeats: int = 1,
                  min_requests: int = 2) -> PlanEstimate:
    """The plan before anything runs: the design by cost from the prior components (`first_design`; where `first`
    has no design, its requests per run are kept: the run's first block has no prior to move them), and the sequential
    fixed-requests design (at least `repeats` blocks at `requests` per run), both within `max_blocks`
    (--max-repeats). The ranges cover the components' uncertainty and, unless the run cost was measured
    (`measured_cost`: the node's history), a dead time from half to twice its estimate."""
    cap = max(max_blocks, 2)
    min_b = max(2, min(design.MIN_RESTARTS, max_blocks))
    pinned = first is not None and first.design is None

    def sequential(c: design.RunCost) -> design.Design:
        return design.plan_design(comps, c, target_rel, arms=arms, max_blocks=cap, min_requests=requests,
                                  max_requests=requests, min_blocks=min(max(min_b, repeats), cap))

    def by_cost(c: design.RunCost) -> design.Design:
        if pinned:
            return design.plan_design(comps, c, target_rel, arms=arms, max_blocks=cap, min_requests=requests,
                                      max_requests=requests, min_blocks=min_b)
        return first_design(comps, c, target_rel, arms=arms, requests=requests, max_blocks=max_blocks,
                            min_requests=min_requests, max_requests=max_requests)
    d = by_cost(cost)
    seq = sequential(cost)
    lo, hi = seq.gpu_s_low, seq.gpu_s_high
    d_lo, d_hi = d.gpu_s_low, d.gpu_s_high
    for f in (() if measured_cost else (0.5, 2.0)):
        c = replace(cost, dead_s=cost.dead_s * f)
        t = sequential(c)
        lo, hi = min(lo, t.gpu_s_low), max(hi, t.gpu_s_high)
        dd = by_cost(c)
        d_lo, d_hi = min(d_lo, dd.gpu_s_low), max(d_hi, dd.gpu_s_high)
    return PlanEstimate(replace(d, gpu_s_low=d_lo, gpu_s_high=d_hi), replace(seq, gpu_s_low=lo, gpu_s_high=hi),
                        cost, comps, requests, max_blocks, chosen, first, repeats)
