"""Instance study: one server per run or per instance across a concurrency sweep (docs/decisions/0011).

Each replicate (seed) simulates one experiment in-process with the simulator's timing model (`specab.sim.timing`,
the h200-known-truth profile: the known-truth pair's forward times and acceptance on the H200, its batched verify
growing with the load): baseline and EAGLE-3 s3 at 1, 8 and 32 requests in flight, interleaved blocks, the same
requests per run. Two designs share every draw but the servers:

- per run: every run is a server instance of its own (its own instance offset, a restart before it);
- per instance: the runs of one arm and block (its loads) share one instance, one restart, the loads in the block's
  seeded order.

A request at c in flight decodes its tokens in draft+verify cycles (or decode steps) of a batch of c: the cycle's
nominal time at that batch (`nominal_spec_cycle_s(c)`), its per-cycle jitter, drawn acceptance per position, the
request factor and its instance's offset. The runs go through `stats.paired_speedup` (the verdict at each load) and
`stats.load_ratio` (one configuration's change across loads), as a real experiment's would. The truth is the
profile's noise-free speed at each batch.

GPU-minutes per design from the profile's run cost (`economics.profile_cost`): a run pays the engine's load, the
dead time (`economics.DEFAULT_DEAD_S`), its warm-up and its requests (in waves of c); a run that continues its
instance's server pays neither the load nor the stop before it (`economics.DEFAULT_STOP_S`), and a cache reset.

Run `python -m tests.analysis.instance_study` to print the table of docs/decisions/0011.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import random
from dataclasses import dataclass, field

import numpy as np
import yaml

from specab.analysis.cost import economics
from specab.analysis.evidence.model import Arm, Experiment, Request, Run
from specab.analysis.measures import stats
from specab.config.plan import make_plan
from specab.sim.profile import PROFILE_DIR, Profile, load_profile
from specab.sim.timing import TimingModel

LOADS = (1, 8, 32)
COMMON = {"model_path": "/models/known-truth-target", "tp_size": 1, "max_running_requests": 48}
EAGLE3_S3 = {"speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "/models/known-truth-eagle3",
             "speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4}
RESET_S = 0.05            # one cache reset (the simulator's and SGLang's /flush_cache answer at once)


@dataclass
class Design:
    blocks: int = 3
    requests: int = 32           # measured requests per run (bench.num_requests >= the largest load)
    warmup: int = 1
    output_len: int = 256
    input_len: int = 64


def study_arms() -> list[Arm]:
    out = []
    for c in LOADS:
        out.append(Arm(f"baseline-c{c}", dict(COMMON), {}, baseline=f"baseline-c{c}", matrix={"concurrency": c}))
        out.append(Arm(f"eagle3-s3-c{c}", {**COMMON, **EAGLE3_S3}, {}, baseline=f"baseline-c{c}",
                       matrix={"concurrency": c}))
    return out


def _load(name: str) -> int:
    return int(name.rsplit("-c", 1)[1])


def _requests(model: TimingModel, c: int, design: Design, rng: random.Random, nrng: np.random.Generator,
              speed: float) -> tuple[list[Request], float]:
    """The run's measured requests at c in flight (per-user decode rate each) and its benchmark's wall seconds
    (its warm-up and its requests in waves of c)."""
    cycle = model.nominal_spec_cycle_s(c) if model.speculative else model.nominal_decode_step_s(c)
    acc = np.array(model.position_acceptance()) if model.speculative else np.zeros(0)
    cv = model.profile.noise.step_cv
    need = design.output_len - 1
    reqs, e2es = [], []
    for i in range(design.requests + design.warmup):
        rate = model.request_factor(rng) * speed
        if model.speculative:
            tokens = 1 + np.cumprod(nrng.random((need, len(acc))) < acc, axis=1).sum(axis=1)
            cycles = int(np.searchsorted(np.cumsum(tokens), need) + 1)
        else:
            cycles = need
        jitter = np.clip(1.0 + cv * nrng.standard_normal(cycles), 1 - 3 * cv, 1 + 3 * cv)
        decode = float(cycle * jitter.sum() / rate)
        prefill = model.prefill_s(design.input_len, 0.0, rng) / speed
        e2es.append(prefill + decode)
        if i >= design.warmup:
            reqs.append(Request(i=i, ok=True, output_tokens=design.output_len, ttft_s=prefill,
                                e2e_s=prefill + decode, decode_tok_s=need / decode))
    waves = math.ceil(design.requests / c) + design.warmup
    return reqs, waves * float(np.mean(e2es))


def simulate(profile: Profile, server: str, seed: int, design: Design) -> tuple[Experiment, float]:
    """One experiment under `server` (per-run | per-instance): the runs, and the GPU-seconds they held."""
    rng, nrng = random.Random(seed), np.random.default_rng(seed)
    arms = study_arms()
    groups = {a.name: a.name.rsplit("-c", 1)[0] for a in arms} if server == "per-instance" else None
    plan = make_plan([a.name for a in arms], design.blocks, seed, groups=groups)
    raw = yaml.safe_load((PROFILE_DIR / f"{profile.name}.yml").read_text())
    cost = {a.name: economics.profile_cost(raw, speculative=a.name.startswith("eagle3"), gpus=1,
                                           output_len=design.output_len, warmup=design.warmup)
            for a in arms}
    runs, gpu_s, instance = [], 0.0, 0
    for pr in plan:
        arm = next(a for a in arms if a.name == pr.arm)
        continues = pr.instance is not None and pr.instance_pos > 1
        if not continues:
            instance += 1
        model = TimingModel.create(profile, arm.server_args, arm.env, seed=seed, instance=instance)
        reqs, bench_s = _requests(model, _load(pr.arm), design, rng, nrng, model.speed(0.0))
        c = cost[pr.arm]
        held = bench_s + (c.dead_s - economics.DEFAULT_STOP_S + RESET_S if continues else c.load_s + c.dead_s)
        gpu_s += held
        runs.append(Run(run_id=pr.run_id, arm=pr.arm, seq=pr.seq, block=pr.block, status="ok", requests=reqs,
                        server_args=arm.server_args, env=arm.env, gpu_seconds=held,
                        server_seq=(pr.instance if continues else None)))
    return Experiment(id=f"instances-{server}-{seed}", arms=arms, runs=runs), gpu_s


def truth(profile: Profile) -> dict[int, dict[str, float]]:
    """The noise-free per-user decode rates at each load: the speedup per load, and each arm's rate at c over c=1."""
    quiet = profile.without_noise()
    rate = {}
    for a in study_arms():
        model = TimingModel.create(quiet, a.server_args, a.env, seed=0, instance=0)
        rate[a.name] = model.true_decode_tok_s(0.0, _load(a.name))
    return {c: {"speedup": rate[f"eagle3-s3-c{c}"] / rate[f"baseline-c{c}"],
                "eagle3_trend": rate[f"eagle3-s3-c{c}"] / rate["eagle3-s3-c1"],
                "baseline_trend": rate[f"baseline-c{c}"] / rate["baseline-c1"]} for c in LOADS}


@dataclass
class Tally:
    """Intervals of one verdict under one design over the replicates: how many, how many covered the truth, their
    mean half-width (relative), and each replicate's verdict word (faster | slower | none)."""
    n: int = 0
    covered: int = 0
    half_widths: list[float] = field(default_factory=list)
    verdicts: list[str] = field(default_factory=list)

    def add(self, ci: stats.Interval | None, true: float) -> None:
        if ci is None or not math.isfinite(ci.lo):
            return
        self.n += 1
        self.covered += ci.lo <= true <= ci.hi
        self.half_widths.append(ci.half_width_rel)
        self.verdicts.append("faster" if ci.lo > 1 else "slower" if ci.hi < 1 else "none")

    @property
    def width_pct(self) -> float:
        return 100 * float(np.mean(self.half_widths)) if self.half_widths else float("nan")


def run_study(seeds: int, profile: Profile, design: Design) -> dict[str, dict]:
    """Per design: its tallies per verdict and its mean GPU-minutes per experiment."""
    t = truth(profile)
    out: dict[str, dict] = {}
    for server in ("per-run", "per-instance"):
        tallies: dict[str, Tally] = {}
        minutes = []
        for s in range(seeds):
            exp, gpu_s = simulate(profile, server, 2000 + s, design)
            minutes.append(gpu_s / 60)
            for c in LOADS:
                sp = stats.paired_speedup(exp, f"eagle3-s3-c{c}", seed=s)
                tallies.setdefault(f"speedup c{c}", Tally()).add(sp.ci, t[c]["speedup"])
                if c > 1:
                    for which, arm in (("eagle3", "eagle3-s3"), ("baseline", "baseline")):
                        lr = stats.load_ratio(exp, f"{arm}-c{c}", f"{arm}-c1", seed=s)
                        tallies.setdefault(f"{which} c{c}/c1", Tally()).add(lr.ci, t[c][f"{which}_trend"])
        out[server] = {"tallies": tallies, "gpu_minutes": float(np.mean(minutes))}
    return out


def with_instance_cv(profile: Profile, cv: float) -> Profile:
    return dataclasses.replace(profile, noise=dataclasses.replace(profile.noise, instance_cv=cv))


def table(res: dict[str, dict], t: dict[int, dict[str, float]]) -> list[str]:
    a, b = res["per-run"], res["per-instance"]
    true = {f"speedup c{c}": v["speedup"] for c, v in t.items()}
    true.update({f"{w} c{c}/c1": v[f"{w}_trend"] for c, v in t.items() for w in ("eagle3", "baseline")})
    lines = [f"GPU-minutes per experiment: per run {a['gpu_minutes']:.1f}, per instance {b['gpu_minutes']:.1f} "
             f"({100 * (1 - b['gpu_minutes'] / a['gpu_minutes']):.0f} % less)",
             "| verdict | truth | per run: CI half-width (coverage) | per instance: CI half-width (coverage) | "
             "verdicts agree |", "|---|---|---|---|---|"]
    for name, ta in a["tallies"].items():
        tb = b["tallies"][name]
        agree = sum(x == y for x, y in zip(ta.verdicts, tb.verdicts)) / max(1, min(len(ta.verdicts), len(tb.verdicts)))
        lines.append(f"| {name} | x{true[name]:.3f} | +-{ta.width_pct:.2f}% ({100 * ta.covered / max(ta.n, 1):.0f}%) | "
                     f"+-{tb.width_pct:.2f}% ({100 * tb.covered / max(tb.n, 1):.0f}%) | {100 * agree:.0f}% |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=100)
    ap.add_argument("--blocks", type=int, default=3)
    ap.add_argument("--instance-cv", type=float, action="append",
                    help="the instance offset's sd (default: the profile's, then 5 %%, the H200's restart spread)")
    args = ap.parse_args()
    base = load_profile("h200-known-truth")
    design = Design(blocks=args.blocks)
    for cv in args.instance_cv or [base.noise.instance_cv, 0.05]:
        print(f"h200-known-truth, instance cv {cv:.1%}, {args.blocks} blocks, {design.requests} requests per run, "
              f"{args.seeds} seeds")
        profile = with_instance_cv(base, cv)
        print("\n".join(table(run_study(args.seeds, profile, design), truth(profile))) + "\n")


if __name__ == "__main__":
    main()
