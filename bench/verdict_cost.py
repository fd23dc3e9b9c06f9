"""Benchmark 3 (issue 8): restarts per arm that a +-2 % verdict costs, sequential vs fixed designs.

    python bench/verdict_cost.py [--seeds 200] [--target-ci 0.02] [--max-repeats 20] [--fixed 3 5 10]

Each replicate (seed) simulates one experiment in-process with the simulator's timing model on the
``default`` profile (the seed-like noise: step jitter, per-request factor, per-server-instance
offset, slow drift): baseline vs EAGLE-3 2-step, interleaved blocks (every block runs both arms
once in a seeded random order), every run a fresh server instance, ``--requests`` requests of
``--output-len`` tokens per run. The simulation is the one of the analysis coverage study
(``tests/analysis/coverage_study.py``: token-by-token decode through ``specab.sim.timing``),
and the speedup interval is ``specab.analysis.stats.paired_speedup``, exactly as a real experiment's.

* sequential: after each block, ``specab.analysis.stats.decide_more_blocks(exp, target, max_repeats)`` (what
  ``driver.py --target-ci 2% --max-repeats N`` calls) says whether to run another block; the
  replicate stops where it says stop. Reported: blocks (= restarts per arm) at stop (mean, median,
  p90, max, share that hit the cap), coverage of the true speedup, half-width at stop.
* fixed: 3, 5, 10 blocks: coverage and half-width, and the share of replicates within the target.

The truth is the noise-free speed ratio (``true_decode_tok_s`` of the profile without noise).
Target: <= 6 restarts per arm at >= 90 % coverage. Prints one JSON object.
"""
from __future__ import annotations

import argparse
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

from specab.analysis import stats# noqa: E402
from specab.analysis.model import Experiment  # noqa: E402
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
    args = ap.parse_args(argv)
    if args.seeds < 1 or args.max_repeats < 2 or min(args.fixed) < 2:
        ap.error("--seeds >= 1, --max-repeats >= 2 and every --fixed >= 2 (an interval needs 2 blocks)")

    def log(msg: str) -> None:
        print(f"[verdict_cost {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    res = run(args.seeds, args.target_ci, args.max_repeats, args.fixed, args.requests, args.output_len,
              args.profile, args.steps, log)
    res = {"benchmark": "verdict cost (restarts per arm for a +-2% 95% CI)",
           "loadavg": [round(x, 2) for x in os.getloadavg()], **res}
    text = json.dumps(res, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
