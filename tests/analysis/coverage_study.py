"""Coverage study: does the paired-speedup interval cover the simulator's true speedup?

Each replicate (seed) simulates one experiment in-process with the simulator's timing model
(`specab.sim.timing`, default profile: step jitter, per-request factor, per-instance offset and the
slow drift all on): every run is a fresh server instance (its own instance offset) started at its
own wall-clock time; each request decodes token by token through the model (draft+verify cycles
with drawn acceptance for EAGLE-3 arms). The runs go through `specab.analysis.measures.stats.paired_speedup`
exactly as a real experiment's would. Two designs share everything but the order:

- interleaved: each block runs every arm once, in a seeded random order;
- blocked: all baseline runs first, then all runs of the next arm, and so on.

Run `python -m tests.analysis.coverage_study` to print the table in docs/validation/statistics.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import random
from dataclasses import dataclass

import numpy as np

from specab.analysis.measures import stats
from specab.analysis.evidence.model import Arm, Experiment, Request, Run
from specab.sim.profile import Profile, load_profile
from specab.sim.timing import TimingModel, true_decode_tok_s

TUNED_ENV = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_P2P_LEVEL": "SYS", "NCCL_MAX_NCHANNELS": "16",
             "NCCL_BUFFSIZE": "16777216", "NCCL_NTHREADS": "512"}
COMMON = {"model_path": "/models/Kimi-K2.5-INT4", "tp_size": 8, "mem_fraction_static": 0.88}


def study_arms(steps=(1, 2, 3)) -> list[Arm]:
    out = [Arm("baseline", dict(COMMON), dict(TUNED_ENV))]
    for k in steps:
        out.append(Arm(f"eagle3-s{k}", {**COMMON, "speculative_algorithm": "EAGLE3",
                                        "speculative_draft_model_path": "/models/eagle3-head",
                                        "speculative_num_steps": k, "speculative_eagle_topk": 1,
                                        "speculative_num_draft_tokens": k + 1}, dict(TUNED_ENV)))
    return out


@dataclass
class Design:
    blocks: int = 6
    requests: int = 6
    output_len: int = 256
    load_s: float = 240.0          # server restart + model load + graph capture between runs (simulated s)


def simulate_run(model: TimingModel, t0: float, design: Design, rng: random.Random,
                 nrng: np.random.Generator) -> tuple[list[Request], float]:
    """Decode `requests` requests one after another through the timing model; returns records and end time.

    Per request: the sim's prefill time and request factor, then draw+verify cycles (or decode steps)
    with the sim's nominal forward time, its per-forward jitter (normal, step_cv, clipped at 3 sd) and
    its per-position acceptance, drawn in bulk with numpy. The instance offset and drift are taken at
    the request's start (the drift moves ~0.001 % during one request)."""
    t = t0
    reqs = []
    spec = model.speculative
    nominal = model.nominal_spec_cycle_s(1) if spec else model.nominal_decode_step_s(1)
    acc = np.array(model.position_acceptance()) if spec else np.zeros(0)
    cv = model.profile.noise.step_cv
    need = design.output_len - 1                      # tokens after the first one
    for i in range(design.requests):
        speed = model.request_factor(rng) * model.speed(t)
        start = t
        t += model.prefill_s(128, t, rng)             # first token
        first = t
        if spec:
            n = need                                   # at most one cycle per token
            ok = nrng.random((n, len(acc))) < acc      # acceptance draws per cycle and position
            tokens = 1 + np.cumprod(ok, axis=1).sum(axis=1)
            cycles = int(np.searchsorted(np.cumsum(tokens), need) + 1)
            emitted = int(np.cumsum(tokens)[cycles - 1])
        else:
            cycles, emitted = need, need
        jitter = np.clip(1.0 + cv * nrng.standard_normal(cycles), 1 - 3 * cv, 1 + 3 * cv)
        t += float(nominal * jitter.sum() / speed)
        out = 1 + min(emitted, need)
        reqs.append(Request(i=i, ok=True, start_ts=start, output_tokens=out, ttft_s=first - start,
                            e2e_s=t - start, decode_tok_s=(out - 1) / (t - first)))
    return reqs, t


def simulate_experiment(profile: Profile, arms: list[Arm], order: str, seed: int, design: Design) -> Experiment:
    rng = random.Random(seed)
    nrng = np.random.default_rng(seed)
    names = [a.name for a in arms]
    if order == "blocked":
        sched = [(b, n) for n in names for b in range(design.blocks)]
    else:
        sched = []
        for b in range(design.blocks):
            perm = names[:]
            rng.shuffle(perm)
            sched += [(b, n) for n in perm]
    t = 0.0
    runs = []
    for seq, (b, n) in enumerate(sched, 1):
        arm = next(a for a in arms if a.name == n)
        model = TimingModel.create(profile, arm.server_args, arm.env, seed=seed, instance=seq)
        t += design.load_s
        reqs, t = simulate_run(model, t, design, rng, nrng)
        runs.append(Run(run_id=f"{seq:03d}-{n}", arm=n, seq=seq, block=b, status="ok", started=t,
                        requests=reqs, server_args=arm.server_args, env=arm.env))
    return Experiment(id=f"coverage-{order}-{seed}", arms=arms, runs=runs, order=order)


def true_speedups(profile: Profile, arms: list[Arm]) -> dict[str, float]:
    quiet = profile.without_noise()
    base = true_decode_tok_s(quiet, arms[0].server_args, arms[0].env)
    return {a.name: true_decode_tok_s(quiet, a.server_args, a.env) / base for a in arms[1:]}


@dataclass
class DesignResult:
    order: str
    intervals: int
    covered: int
    mean_bias_pct: float          # mean of (estimate / truth - 1)
    mean_half_width_pct: float

    @property
    def coverage(self) -> float:
        return self.covered / self.intervals


def run_study(seeds: int = 20, profile: Profile | None = None, design: Design | None = None,
              steps=(1, 2, 3), orders=("interleaved", "blocked")) -> tuple[dict[str, float], dict[str, DesignResult]]:
    profile = profile or load_profile("default")
    design = design or Design()
    arms = study_arms(steps)
    truth = true_speedups(profile, arms)
    out = {}
    for order in orders:
        cov, n, bias, hw = 0, 0, [], []
        for s in range(seeds):
            exp = simulate_experiment(profile, arms, order, 1000 + s, design)
            for a in arms[1:]:
                sp = stats.paired_speedup(exp, a.name, seed=s)
                n += 1
                cov += sp.ci.lo <= truth[a.name] <= sp.ci.hi
                bias.append(sp.ci.estimate / truth[a.name] - 1)
                hw.append(sp.ci.half_width_rel)
        out[order] = DesignResult(order, n, cov, 100 * float(np.mean(bias)), 100 * float(np.mean(hw)))
    return truth, out


def with_drift(profile: Profile, pct_per_hour: float) -> Profile:
    return dataclasses.replace(profile, noise=dataclasses.replace(profile.noise, drift_pct_per_hour=pct_per_hour))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--drift-pct-per-hour", type=float, action="append")
    args = ap.parse_args()
    base = load_profile("default")
    for d in args.drift_pct_per_hour or [base.noise.drift_pct_per_hour]:
        truth, res = run_study(args.seeds, with_drift(base, d))
        print(f"drift {d:+.1f}%/h, {args.seeds} seeds, true speedups "
              + ", ".join(f"{k} x{v:.4f}" for k, v in truth.items()))
        print("| design | intervals | covered | coverage | mean bias | mean CI half-width |")
        print("|---|---|---|---|---|---|")
        for r in res.values():
            print(f"| {r.order} | {r.intervals} | {r.covered} | {r.coverage * 100:.0f}% | "
                  f"{r.mean_bias_pct:+.2f}% | +-{r.mean_half_width_pct:.2f}% |")


if __name__ == "__main__":
    main()
