"""Benchmark 3: restarts per arm that a +-2 % verdict costs, sequential vs fixed designs.

    python bench/verdict_cost.py [--seeds 200] [--target-ci 0.02] [--max-repeats 20] [--fixed 3 5 10]

Each replicate (seed) simulates one experiment in-process with the simulator's timing model on the
``default`` profile (the seed-like noise: step jitter, per-request factor, per-server-instance
offset, slow drift): baseline vs EAGLE-3 2-step, interleaved blocks (every block runs both arms
once in a seeded random order), every run a fresh server instance, ``--requests`` requests of
``--output-len`` tokens per run. The simulation is the one of the analysis coverage study
(``tests/analysis/coverage_study.py``: token-by-token decode through ``specab.sim.timing``),
and the speedup interval is ``specab.analysis.measures.stats.paired_speedup``, exactly as a real experiment's.

* sequential: after each block, ``specab.analysis.measures.stats.decide_more_blocks(exp, target, max_repeats)`` (what
  ``driver.py --target-ci 2% --max-repeats N`` calls) says whether to run another block; the
  replicate stops where it says stop. Reported: blocks (= restarts per arm) at stop (mean, median,
  p90, max, share that hit the cap), coverage of the true speedup, half-width at stop.
* fixed: 3, 5, 10 blocks: coverage and half-width, and the share of replicates within the target.

The truth is the noise-free speed ratio (``true_decode_tok_s`` of the profile without noise).
Target: <= 6 restarts per arm at >= 90 % coverage. Prints one JSON object.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from specab.analysis.measures import stats  # noqa: E402
from specab.analysis.cost import design  # noqa: E402
from specab.analysis.evidence.model import Experiment  # noqa: E402
from specab.sim.profile import load_profile  # noqa: E402
from tests.analysis.coverage_study import Design, simulate_experiment, study_arms, true_speedups  # noqa: E402


def prefix(exp: Experiment, blocks: int) -> Experiment:
    """The experiment as it stood after its first `blocks` blocks (the runs are in execution order)."""
    runs = [r for r in exp.runs if r.block < blocks]
    return Experiment(id=exp.id, arms=exp.arms, runs=runs, order=exp.order)


def sequential(exp: Experiment, target: float, max_repeats: int, seed: int) -> int:
    """Blocks after which decide_more_blocks stops (it never asks beyond max_repeats)."""
    n = 1
    while True:
        more, _ = stats.decide_more_blocks(prefix(exp, n), target, max_repeats, seed=seed)
        if not more:
            return n
        n += 1


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else math.nan


def run(seeds: int, target: float, max_repeats: int, fixed: list[int], requests: int, output_len: int,
        profile_name: str, arm_steps: int, log) -> dict[str, Any]:
    profile = load_profile(profile_name)
    arms = study_arms((arm_steps,))
    spec = arms[1].name
    truth = true_speedups(profile, arms)[spec]
    design = Design(blocks=max(max_repeats, *fixed), requests=requests, output_len=output_len)
    seq_n, seq_cov, seq_hw, capped = [], 0, [], 0
    fx: dict[int, dict[str, list]] = {k: {"cov": [], "hw": []} for k in fixed}
    t0 = time.process_time()
    for s in range(seeds):
        exp = simulate_experiment(profile, arms, "interleaved", 5000 + s, design)
        n = sequential(exp, target, max_repeats, seed=s)
        sp = stats.paired_speedup(prefix(exp, n), spec, seed=s)
        seq_n.append(n)
        capped += n >= max_repeats and sp.ci.half_width_rel > target
        seq_cov += sp.ci.lo <= truth <= sp.ci.hi
        seq_hw.append(sp.ci.half_width_rel)
        for k in fixed:
            spk = stats.paired_speedup(prefix(exp, k), spec, seed=s)
            fx[k]["cov"].append(spk.ci.lo <= truth <= spk.ci.hi)
            fx[k]["hw"].append(spk.ci.half_width_rel)
        if (s + 1) % 50 == 0:
            log(f"{s + 1}/{seeds} replicates")
    cpu = time.process_time() - t0
    return {
        "profile": profile_name, "arms": [a.name for a in arms], "true_speedup": round(truth, 4),
        "design": {"requests_per_run": requests, "output_len": output_len, "order": "interleaved",
                   "target_ci_half_width": target, "max_repeats": max_repeats, "replicates": seeds},
        "sequential": {
            "restarts_per_arm_mean": round(statistics.mean(seq_n), 2),
            "restarts_per_arm_median": statistics.median(seq_n),
            "restarts_per_arm_p90": pct(seq_n, 90), "restarts_per_arm_max": max(seq_n),
            "distribution": {str(k): seq_n.count(k) for k in sorted(set(seq_n))},
            "stopped_at_cap_without_target": capped,
            "coverage": round(seq_cov / seeds, 3),
            "half_width_pct_median": round(100 * statistics.median(seq_hw), 2),
            "half_width_pct_max": round(100 * max(seq_hw), 2),
            "within_target": round(sum(h <= target for h in seq_hw) / seeds, 3),
        },
        "fixed": {str(k): {"restarts_per_arm": k, "coverage": round(sum(v["cov"]) / seeds, 3),
                           "half_width_pct_median": round(100 * statistics.median(v["hw"]), 2),
                           "half_width_pct_p90": round(100 * pct(v["hw"], 90), 2),
                           "within_target": round(sum(h <= target for h in v["hw"]) / seeds, 3)}
                  for k, v in fx.items()},
        "cpu_s": round(cpu, 1),
        "met": (statistics.mean(seq_n) <= 6 and seq_cov / seeds >= 0.90),
    }


# -------------------------------------------------------------- economics: the design by cost vs the sequential design

# Noise regimes (sd on the log scale, per arm): `shared` moves both arms of a block alike (the node's state:
# the seed's 89 -> 82 restart-to-restart shift) and cancels in the paired ratio; `instance` is each server
# instance's own offset; `request` is request-to-request noise inside a run.
REGIMES: dict[str, dict[str, float]] = {
    "instance-dominated": {"shared": 0.04, "instance": 0.012, "request": 0.01},
    "request-dominated": {"shared": 0.01, "instance": 0.0025, "request": 0.08},
}
TRUE_LOG_RATIO = math.log(0.7363)      # the seed's EAGLE-3 2-step vs baseline (the --mode restarts simulation above)


def _medians(noise: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Median over the first m[i] columns of each row of noise (rows of different lengths, vectorised)."""
    width = noise.shape[-1]
    masked = np.where(np.arange(width)[None, :] < m[:, None], noise, np.inf)
    s = np.sort(masked, axis=-1)
    lo = s[np.arange(len(m)), (m - 1) // 2]
    hi = s[np.arange(len(m)), m // 2]
    return (lo + hi) / 2.0


class Draws:
    """Common random numbers for the designs compared: experiment e's block b is one fixed draw whatever the design
    (the node's shared state, both instances, and request k of each run the same whatever the requests per run),
    so two designs differ only where their decisions differ. `width`: the most requests per run any design asks."""

    def __init__(self, seed: int, regime: dict[str, float], experiments: int, width: int):
        self.seed, self.regime, self.experiments, self.width = seed, regime, experiments, width

    def block(self, b: int, ids: list[int], m: np.ndarray) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
        """Block b (0-based) of the experiments `ids` with m[i] requests per run: the paired log ratio and both
        runs' request log speeds."""
        rng = np.random.default_rng([self.seed, b])
        e, r = self.experiments, self.regime
        shared = rng.normal(0, r["shared"], e)[ids]
        inst = rng.normal(0, r["instance"], (2, e))[:, ids]
        req = rng.normal(0, r["request"], (2, e, self.width))[:, ids, :int(m.max())]
        y_arm = TRUE_LOG_RATIO + shared + inst[0] + _medians(req[0], m)
        y_base = shared + inst[1] + _medians(req[1], m)
        reqs = [(TRUE_LOG_RATIO + shared[i] + inst[0, i] + req[0, i, :m[i]], shared[i] + inst[1, i] + req[1, i, :m[i]])
                for i in range(len(ids))]
        return y_arm - y_base, reqs


def interval_half_width(logs: list[float], seed: int) -> tuple[float, float, float]:
    """(half-width relative, lo, hi) of the paired speedup as the report computes it (stats.bootstrap_ci of the
    block log ratios: the expanded percentile bootstrap, never narrower than the t interval)."""
    li = stats.bootstrap_ci(logs, seed=seed)
    lo, hi, est = math.exp(li.lo), math.exp(li.hi), math.exp(li.estimate)
    return (hi - lo) / 2.0 / est, lo, hi


def t_half_width(logs: list[float]) -> float:
    x = np.asarray(logs)
    n = len(x)
    h = stats.t_ppf(0.975, n - 1) * float(x.std(ddof=1)) / math.sqrt(n)
    return math.sinh(h)


def run_sequential(draws: Draws, experiments: int, requests: int, target: float, max_repeats: int,
              cost: design.RunCost) -> dict[str, Any]:
    """The sequential design (`--design sequential`): `requests` per run, a block at a time until the interval is
    within target (at least stats.MIN_BLOCKS blocks) or max_repeats: the rule of stats.decide_more_blocks."""
    m = np.full(experiments, requests)
    logs: list[list[float]] = [[] for _ in range(experiments)]
    stop = [0] * experiments
    result: list[tuple[float, float, float] | None] = [None] * experiments
    active = list(range(experiments))
    for n in range(1, max_repeats + 1):
        d, _ = draws.block(n - 1, active, m[: len(active)])
        still = []
        for i, e in enumerate(active):
            logs[e].append(float(d[i]))
            if n < stats.MIN_BLOCKS:
                still.append(e)
                continue
            if n < max_repeats and t_half_width(logs[e]) > target:   # the bootstrap is never narrower than t
                still.append(e)
                continue
            hw = interval_half_width(logs[e], seed=e)
            if hw[0] <= target or n >= max_repeats:
                stop[e], result[e] = n, hw
            else:
                still.append(e)
        active = still
        if not active:
            break
    return _summary(stop, [requests] * experiments, result, cost, [[requests] * s for s in stop], target)


def run_economics(draws: Draws, experiments: int, pilot_requests: int,
                  target: float, max_blocks: int, cost: design.RunCost, prior: list[design.Components] | None,
                  max_requests: int, min_requests: int = 2,
                  min_blocks: int = design.MIN_RESTARTS) -> dict[str, Any]:
    """The design by cost: block 1 at the experiment's requests (the pilot), then after every block the variance
    components are re-estimated and design.plan_design chooses the requests of the next block and the blocks
    needed; stop at or after the planned blocks once the report's interval is within target."""
    logs: list[list[float]] = [[] for _ in range(experiments)]
    reqs: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(experiments)]
    m_used: list[list[int]] = [[] for _ in range(experiments)]
    next_m = np.full(experiments, pilot_requests)
    priors: list[design.Components | None] = list(prior) if prior is not None else [None] * experiments
    for e, pr in enumerate(priors):
        if pr is not None:          # a history: the first block is already designed by cost
            next_m[e] = design.plan_design(pr, cost, target, max_blocks=max_blocks, max_requests=max_requests,
                                           min_requests=min_requests, range_sd=0.0,
                                           keep_requests=pilot_requests).requests
    result: list[tuple[float, float, float] | None] = [None] * experiments
    stop = [0] * experiments
    active = list(range(experiments))
    for n in range(1, max_blocks + 1):
        m = next_m[active]
        d, rq = draws.block(n - 1, active, m)
        still = []
        for i, e in enumerate(active):
            logs[e].append(float(d[i]))
            reqs[e].append(rq[i])
            m_used[e].append(int(m[i]))
            comps = design.estimate_components(logs[e], reqs[e], prior=priors[e])
            ci = interval_half_width(logs[e], seed=e)[0] if n >= 2 and t_half_width(logs[e]) <= target else math.inf
            step = design.next_step(comps, cost, target, m_used[e], ci, max_blocks=max_blocks,
                                    min_requests=min_requests, max_requests=max_requests, min_blocks=min_blocks,
                                    keep_requests=pilot_requests)
            if not step.more:
                stop[e], result[e] = n, interval_half_width(logs[e], seed=e)
                continue
            next_m[e] = step.requests
            still.append(e)
        active = still
        if not active:
            break
    return _summary(stop, None, result, cost, m_used, target)


def history_priors(draws: Draws, experiments: int, blocks: int, requests: int) -> list[design.Components]:
    """Per experiment, the components of one earlier experiment on the same node with the same fingerprint
    (`blocks` blocks of `requests` requests per run): what the driver's per-node history hands the design."""
    logs: list[list[float]] = [[] for _ in range(experiments)]
    reqs: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(experiments)]
    for _ in range(blocks):
        d, rq = draws.block(_, list(range(experiments)), np.full(experiments, requests))
        for e in range(experiments):
            logs[e].append(float(d[e]))
            reqs[e].append(rq[e])
    return [dataclasses.replace(design.estimate_components(logs[e], reqs[e]), source="history")
            for e in range(experiments)]


def _summary(stop: list[int], _m: Any, result: list, cost: design.RunCost, m_used: list[list[int]],
             target: float) -> dict[str, Any]:
    truth = math.exp(TRUE_LOG_RATIO)
    gpu_min = [sum(2 * cost.gpu_s(k) for k in ms) / 60.0 for ms in m_used]
    cov = [r[1] <= truth <= r[2] for r in result]
    hw = [r[0] for r in result]
    req = [statistics.mean(ms) for ms in m_used]
    return {"gpu_minutes_mean": round(statistics.mean(gpu_min), 1),
            "gpu_minutes_p90": round(pct(gpu_min, 90), 1),
            "restarts_mean": round(statistics.mean(stop), 2),
            "restarts_max": max(stop),
            "requests_per_run_mean": round(statistics.mean(req), 1),
            "coverage": round(sum(cov) / len(cov), 3),
            "within_target": round(sum(h <= target for h in hw) / len(hw), 3),
            "half_width_pct_median": round(100 * statistics.median(hw), 2),
            # per experiment, for a comparison draw by draw (left out of the JSON)
            "_gpu_minutes": gpu_min, "_covered": cov, "_restarts": stop, "_requests": m_used}


def _public(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in summary.items() if not k.startswith("_")}


def economics(experiments: int, target: float, sequential_max_repeats: int, requests: int, load_s: float, bench_s: float,
              warmup: int, dead_s: float, gpus: int, max_requests: int, history_blocks: int, seed: int,
              log) -> dict[str, Any]:
    """The sequential design against the design by cost, per noise regime, on the same simulated blocks
    (common random numbers, `Draws`: experiment e's block b is the same draw in every design, request k of a run
    the same whatever its requests per run, so the designs' GPU-minutes differ only where their decisions do)."""
    per_request = bench_s / (requests + warmup)
    cost = design.RunCost(load_s=load_s, per_request_s=per_request, fixed_bench_s=warmup * per_request,
                          dead_s=dead_s, gpus=gpus, source="bench profile (the seed's: load 6 min, benchmark 1 min)")
    max_blocks = max(3 * sequential_max_repeats, 60)
    out: dict[str, Any] = {}
    t0 = time.process_time()
    for k, (name, regime) in enumerate(REGIMES.items()):
        s = seed + 10 * k
        draws = Draws(s, regime, experiments, max(max_requests, requests))
        seq = run_sequential(draws, experiments, requests, target, sequential_max_repeats, cost)
        priors = history_priors(Draws(s + 1, regime, experiments, requests), experiments, history_blocks, requests)
        new = run_economics(draws, experiments, requests, target, max_blocks, cost,
                            priors, max_requests)
        first = run_economics(draws, experiments, requests, target, max_blocks, cost,
                              None, max_requests)
        comps = design.Components(between=2 * regime["instance"] ** 2, within=2 * regime["request"] ** 2)
        out[name] = {
            "noise_sd_log": regime,
            "within_share_at_sequential_requests": round(comps.within_share(requests), 3),
            "gpu_minutes_mean": new["gpu_minutes_mean"], "gpu_minutes_mean_sequential": seq["gpu_minutes_mean"],
            "ratio_to_sequential": round(new["gpu_minutes_mean"] / seq["gpu_minutes_mean"], 3),
            "coverage": new["coverage"], "coverage_sequential": seq["coverage"],
            "restarts_mean": new["restarts_mean"], "restarts_mean_sequential": seq["restarts_mean"],
            "by_cost": _public(new), "sequential": _public(seq),
            "first_experiment_no_history": {**_public(first), "ratio_to_sequential": round(
                first["gpu_minutes_mean"] / seq["gpu_minutes_mean"], 3)},
        }
        log(f"{name}: {new['gpu_minutes_mean']} GPU-minutes by cost ({first['gpu_minutes_mean']} without history) "
            f"vs {seq['gpu_minutes_mean']} sequential")
    met = (out["request-dominated"]["ratio_to_sequential"] <= 0.60
           and out["instance-dominated"]["ratio_to_sequential"] <= 1.0
           and all(v["coverage"] >= 0.93 for v in out.values()))
    return {"regimes": out, "cost_model": dataclasses.asdict(cost), "target_ci_half_width": target,
            "experiments_per_regime": experiments, "sequential_max_repeats": sequential_max_repeats,
            "history_blocks": history_blocks, "max_requests": max_requests,
            "cpu_s": round(time.process_time() - t0, 1), "met": met}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=200, help="replicates (simulated experiments)")
    ap.add_argument("--target-ci", type=float, default=0.02, help="CI half-width relative to the estimate")
    ap.add_argument("--max-repeats", type=int, default=20, help="cap of the sequential design (blocks)")
    ap.add_argument("--fixed", type=int, nargs="+", default=[3, 5, 10], help="fixed designs (blocks)")
    ap.add_argument("--requests", type=int, default=8, help="measured requests per run (experiments/default.yml: 8)")
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--profile", default="default", help="simulator profile (name or YAML path)")
    ap.add_argument("--steps", type=int, default=2, help="EAGLE-3 steps of the arm compared with the baseline")
    ap.add_argument("--out", help="also write the JSON here")
    ap.add_argument("--mode", choices=("restarts", "economics"), default="restarts",
                    help="restarts: restarts per arm of the sequential design against fixed designs (token-level "
                         "simulation, section 3); economics: GPU-minutes of the sequential design vs the design by "
                         "cost in two noise regimes")
    ap.add_argument("--experiments", type=int, default=1000, help="economics: simulated experiments per regime")
    ap.add_argument("--load-s", type=float, default=360.0, help="economics: seconds from start to ready")
    ap.add_argument("--bench-s", type=float, default=60.0,
                    help="economics: seconds of a run's benchmark in the sequential design "
                         "(warm-up + --requests measured requests)")
    ap.add_argument("--warmup", type=int, default=2, help="economics: warm-up requests per run")
    ap.add_argument("--dead-s", type=float, default=20.0, help="economics: stop, GPUs free, collect, per run")
    ap.add_argument("--gpus", type=int, default=8, help="economics: GPUs a run holds")
    ap.add_argument("--max-requests", type=int, default=400, help="economics: most measured requests per run")
    ap.add_argument("--history-blocks", type=int, default=5,
                    help="economics: blocks of the earlier experiment in the node's history (the prior)")
    ap.add_argument("--seed", type=int, default=19, help="economics: seed of the simulation")
    args = ap.parse_args(argv)
    if args.seeds < 1 or args.max_repeats < 2 or min(args.fixed) < 2:
        ap.error("--seeds >= 1, --max-repeats >= 2 and every --fixed >= 2 (an interval needs 2 blocks)")

    def log(msg: str) -> None:
        print(f"[verdict_cost {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    if args.mode == "economics":
        if args.experiments < 1 or args.history_blocks < 2:
            ap.error("--experiments >= 1 and --history-blocks >= 2 (a between-instance variance needs 2 blocks)")
        res = economics(args.experiments, args.target_ci, args.max_repeats, args.requests, args.load_s, args.bench_s,
                        args.warmup, args.dead_s, args.gpus, args.max_requests, args.history_blocks, args.seed, log)
        return _emit("verdict economics (GPU-minutes for a +-2% 95% CI)", res, args.out)
    res = run(args.seeds, args.target_ci, args.max_repeats, args.fixed, args.requests, args.output_len,
              args.profile, args.steps, log)
    return _emit("verdict cost (restarts per arm for a +-2% 95% CI)", res, args.out)


def _emit(benchmark: str, res: dict, out: str | None) -> int:
    """Print the result as JSON (with the machine's load) and write it to --out when given."""
    text = json.dumps({"benchmark": benchmark, "loadavg": [round(x, 2) for x in os.getloadavg()], **res}, indent=1)
    print(text)
    if out:
        Path(out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
