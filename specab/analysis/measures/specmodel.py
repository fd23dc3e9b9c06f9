"""The arithmetic of speculative decoding: break-even accept length, chain-model acceptance, predictions.

Definitions (single-stream decode, topk = 1):

- baseline step time      t_step  = 1 / baseline tok/s
- speculative cycle time  t_cycle = tau / spec tok/s      (one draft+verify cycle emits tau tokens)
- break-even accept length tau*   = t_cycle / t_step      (speculation wins iff tau > tau*)
- margin                          = tau - tau*
- chain model (EAGLE, topk = 1, k draft steps, per-position conditional acceptance alpha):
      tau = sum_{i=0..k} alpha^i = (1 - alpha^(k+1)) / (1 - alpha)        (the 1 is the bonus token)
  so tau lies in [1, k+1]; alpha is solved from tau numerically (Brent's method, tau is monotone in alpha).
- with infinitely many steps tau -> 1 / (1 - alpha): the limit a given alpha can never beat.
- chain with per-position rates (alpha_i measured per draft position, analysis/measures/positions.py):
      tau = 1 + sum_{i=1..k} prod_{j=1..i} alpha_j
  Where the engine reports per-position acceptance, predictions use these rates (position i's rate pooled over the
  arms that drafted it; past the deepest measured position the last rate carries on) instead of one alpha.

Example from the seed: verify 30 ms vs a 12.2 ms CUDA-graph decode step gives tau* = 2.46; the
retest (baseline 82.2 tok/s, EAGLE-3 2-step 60.5 tok/s at tau 2.1) gives tau* = 2.85, margin -0.75.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass, field
from typing import Sequence

from specab.analysis.subcommand import standalone_main
# scipy is imported in the functions that use it: importing scipy.stats takes ~1.3 s, which every start of
# driver.py paid (status, --help, a run before its first report: 1.8 s -> 0.55 s for --help).


class SpecModelError(ValueError):
    """Inputs that the model cannot use; the message says which and what to pass instead."""


def chain_tau(alpha: float, steps: int) -> float:
    """Expected tokens per cycle for k = steps draft tokens each accepted with conditional probability alpha."""
    if steps < 0:
        raise SpecModelError(f"steps must be >= 0, got {steps}")
    if not 0.0 <= alpha <= 1.0:
        raise SpecModelError(f"alpha must lie in [0, 1], got {alpha}")
    if alpha == 1.0:
        return float(steps + 1)
    return (1.0 - alpha ** (steps + 1)) / (1.0 - alpha)


def chain_tau_rates(rates: Sequence[float], steps: int) -> float:
    """Expected tokens per cycle for k = steps draft tokens where position i is accepted with conditional probability
    rates[i-1] (positions past the list take its last rate)."""
    if steps < 0:
        raise SpecModelError(f"steps must be >= 0, got {steps}")
    if steps and not rates:
        raise SpecModelError("per-position rates are empty: give one conditional acceptance per draft position")
    if any(not 0.0 <= a <= 1.0 for a in rates):
        raise SpecModelError(f"per-position rates must lie in [0, 1], got {list(rates)}")
    tau, reach = 1.0, 1.0
    for i in range(steps):
        reach *= rates[min(i, len(rates) - 1)]
        tau += reach
    return tau


def conditional_rates(cycles: int, accepted_per_pos: Sequence[int]) -> list[float | None]:
    """The chain's alpha_i from counts: of the cycles that accepted position i-1 (all ``cycles`` for position 1), the
    share that accepted position i; None where position i-1 was never accepted."""
    out: list[float | None] = []
    prev = cycles
    for n in accepted_per_pos:
        out.append(n / prev if prev else None)
        prev = n
    return out


def chain_alpha(tau: float, steps: int | None) -> float:
    """Conditional acceptance alpha for which chain_tau(alpha, steps) == tau (steps None: the 1/(1-alpha) limit).

    Raises SpecModelError when tau is impossible (below 1, or above steps+1)."""
    from scipy import optimize
    if tau < 1.0:
        raise SpecModelError(
            f"accept length {tau} is below 1; it counts the bonus token, so 1.0 means no draft was accepted")
    if steps is None:
        return 1.0 - 1.0 / tau
    if steps < 1:
        raise SpecModelError(f"steps must be >= 1 to fit alpha, got {steps}")
    if tau > steps + 1 + 1e-12:
        raise SpecModelError(
            f"accept length {tau} exceeds steps+1 = {steps + 1}: a chain of {steps} draft tokens "
            f"cannot emit more than {steps + 1} tokens per cycle; check --steps")
    tau = min(tau, steps + 1.0)      # within the 1e-12 tolerance above: the root sits at alpha = 1
    # chain_tau is increasing in alpha on [0, 1], from 1 to steps+1: one root, bracketed
    return float(optimize.brentq(lambda a: chain_tau(a, steps) - tau, 0.0, 1.0, xtol=1e-15))


@dataclass(frozen=True)
class SpecArm:
    """One measured speculative arm."""
    steps: int
    tok_s: float
    accept_len: float
    name: str = ""
    position_rates: tuple[float, ...] = ()   # measured conditional acceptance per draft position (empty: not measured)

    @property
    def cycle_ms(self) -> float:
        return 1000.0 * self.accept_len / self.tok_s


@dataclass
class CycleFit:
    """cycle_ms(steps) = intercept_ms + slope_ms * steps."""
    intercept_ms: float
    slope_ms: float
    source: str            # "fitted from N arms" or the stated assumption

    def cycle_ms(self, steps: int) -> float:
        return self.intercept_ms + self.slope_ms * steps


@dataclass
class ArmAnalysis:
    name: str
    steps: int
    tok_s: float
    accept_len: float
    cycle_ms: float
    tau_star: float
    margin: float
    alpha: float
    speedup: float | None
    position_rates: list[float] = field(default_factory=list)


@dataclass
class Prediction:
    steps: int
    cycle_ms: float
    tau: float
    tok_s: float
    speedup: float | None
    tau_star: float | None = None     # break-even at this cycle against the baseline step


@dataclass
class TargetNeed:
    """What a target tok/s needs: tau = target * cycle; alpha per steps (None: impossible at that k)."""
    target_tok_s: float
    steps: int | None           # None: any number of steps (only the 1/(1-alpha) limit applies)
    cycle_ms: float
    tau_needed: float
    alpha_needed: float | None
    alpha_limit: float          # alpha needed with infinitely many steps at this cycle: 1 - 1/tau
    note: str


@dataclass
class ModelResult:
    baseline_tok_s: float | None
    step_ms: float | None
    arms: list[ArmAnalysis] = field(default_factory=list)
    break_even: dict | None = None          # from --verify-ms/--decode-ms
    cycle_fit: CycleFit | None = None
    predictions: list[Prediction] = field(default_factory=list)
    targets: list[TargetNeed] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def break_even(cycle_ms: float, step_ms: float) -> float:
    """tau* = cycle / step."""
    if step_ms <= 0 or cycle_ms <= 0:
        raise SpecModelError(f"times must be positive (cycle {cycle_ms} ms, step {step_ms} ms)")
    return cycle_ms / step_ms


def analyse_arm(arm: SpecArm, baseline_tok_s: float) -> ArmAnalysis:
    if arm.tok_s <= 0 or baseline_tok_s <= 0:
        raise SpecModelError(f"tok/s must be positive (baseline {baseline_tok_s}, arm {arm.tok_s})")
    step_ms = 1000.0 / baseline_tok_s
    tau_star = break_even(arm.cycle_ms, step_ms)
    return ArmAnalysis(name=arm.name or f"steps={arm.steps}", steps=arm.steps, tok_s=arm.tok_s,
                       accept_len=arm.accept_len, cycle_ms=arm.cycle_ms, tau_star=tau_star,
                       margin=arm.accept_len - tau_star, alpha=chain_alpha(arm.accept_len, arm.steps),
                       speedup=arm.tok_s / baseline_tok_s, position_rates=list(arm.position_rates))


def fit_cycle(arms: Sequence[SpecArm], draft_step_ms: float | None = None) -> CycleFit:
    """Cycle time linear in steps: least squares over arms with >= 2 distinct steps, else an assumption."""
    from scipy import stats as scipy_stats
    distinct = sorted({a.steps for a in arms})
    if len(distinct) >= 2:
        fit = scipy_stats.linregress([float(a.steps) for a in arms], [a.cycle_ms for a in arms])
        n = len(arms)
        return CycleFit(intercept_ms=float(fit.intercept), slope_ms=float(fit.slope),
                        source=f"fitted from {n} measured arms (steps {', '.join(map(str, distinct))})")
    if not arms:
        raise SpecModelError("no speculative arm to fit a cycle time from")
    a = arms[0]
    slope = 0.0 if draft_step_ms is None else draft_step_ms
    why = ("assumed: each extra draft step adds 0 ms (verify-dominated cycle, as measured in the seed: "
           "verify = 97% of speculative time); pass --draft-step-ms or measure a second steps value to fit it"
           if draft_step_ms is None else f"assumed: each extra draft step adds {draft_step_ms:g} ms (--draft-step-ms)")
    return CycleFit(intercept_ms=a.cycle_ms - slope * a.steps, slope_ms=slope, source=why)


def predict(fit: CycleFit, alpha: float, steps: int, baseline_tok_s: float | None,
            rates: Sequence[float] = ()) -> Prediction:
    """tok/s at ``steps`` from the cycle fit and the chain: per-position ``rates`` where given, else one alpha."""
    cycle = fit.cycle_ms(steps)
    if cycle <= 0:
        raise SpecModelError(f"the cycle fit gives a non-positive cycle ({cycle:.2f} ms) at steps={steps}; "
                             "the fit does not extrapolate that far")
    tau = chain_tau_rates(rates, steps) if rates else chain_tau(alpha, steps)
    tok_s = 1000.0 * tau / cycle
    return Prediction(steps=steps, cycle_ms=cycle, tau=tau, tok_s=tok_s,
                      speedup=tok_s / baseline_tok_s if baseline_tok_s else None,
                      tau_star=cycle * baseline_tok_s / 1000.0 if baseline_tok_s else None)


def target_need(target_tok_s: float, cycle_ms: float, steps: int | None) -> TargetNeed:
    if target_tok_s <= 0:
        raise SpecModelError(f"--target-tok-s must be positive, got {target_tok_s}")
    tau = target_tok_s * cycle_ms / 1000.0
    limit = chain_alpha(tau, None) if tau >= 1 else 0.0
    if tau <= 1.0:
        alpha, note = 0.0, "reached without speculation at this cycle time"
    elif steps is None:
        alpha, note = limit, "with unbounded steps"
    elif tau > steps + 1:
        alpha, note = None, (f"impossible at steps={steps}: needs {tau:.2f} tokens per cycle, "
                             f"at most {steps + 1} fit in a chain of {steps} drafts")
    else:
        alpha, note = chain_alpha(tau, steps), ""
    return TargetNeed(target_tok_s=target_tok_s, steps=steps, cycle_ms=cycle_ms, tau_needed=tau,
                      alpha_needed=alpha, alpha_limit=limit, note=note)


def pooled_rates(arms: Sequence[SpecArm]) -> list[float]:
    """Per draft position the mean conditional acceptance over the arms that drafted it; empty unless every arm
    measured its positions (one arm without them: the chain falls back to one alpha for all)."""
    if not arms or not all(a.position_rates for a in arms):
        return []
    k = max(len(a.position_rates) for a in arms)
    return [sum(a.position_rates[i] for a in arms if i < len(a.position_rates)) /
            sum(1 for a in arms if i < len(a.position_rates)) for i in range(k)]


def build(baseline_tok_s: float | None = None, arms: Sequence[SpecArm] = (), *,
          verify_ms: float | None = None, decode_ms: float | None = None, draft_ms: float = 0.0,
          target_tok_s: float | None = None, predict_steps: Sequence[int] = (1, 2, 3, 4, 5, 6),
          draft_step_ms: float | None = None) -> ModelResult:
    """Everything the `model` command prints, from hand-given or measured numbers."""
    res = ModelResult(baseline_tok_s=baseline_tok_s,
                      step_ms=1000.0 / baseline_tok_s if baseline_tok_s else None)
    if verify_ms is not None or decode_ms is not None:
        if verify_ms is None or (decode_ms is None and res.step_ms is None):
            raise SpecModelError("--verify-ms needs --decode-ms (or --baseline-tok-s) to give a break-even")
        step = decode_ms if decode_ms is not None else res.step_ms
        cycle = verify_ms + draft_ms
        res.break_even = {"cycle_ms": cycle, "step_ms": step, "tau_star": break_even(cycle, step)}
        if res.step_ms is None:
            res.step_ms = step
    if arms and baseline_tok_s is None:
        raise SpecModelError("speculative arms need --baseline-tok-s to compute the break-even")
    res.arms = [analyse_arm(a, baseline_tok_s) for a in arms]   # type: ignore[arg-type]
    if arms:
        res.cycle_fit = fit_cycle(arms, draft_step_ms)
        if len({a.steps for a in arms}) < 2:
            res.assumptions.append(res.cycle_fit.source)
        # alpha: a property of the draft head; take the mean over arms
        alpha = sum(a.alpha for a in res.arms) / len(res.arms)
        rates = pooled_rates(arms)
        if rates:
            res.assumptions.append(
                "predictions use the measured conditional acceptance per draft position "
                f"({', '.join(f'{r:.3f}' for r in rates)}: mean over the arms that drafted each position; past "
                f"position {len(rates)} the last rate) instead of one alpha")
        else:
            res.assumptions.append(f"predictions use alpha = {alpha:.3f} (mean over measured arms) for every steps "
                                   f"value")
        for k in predict_steps:
            try:
                res.predictions.append(predict(res.cycle_fit, alpha, k, baseline_tok_s, rates))
            except SpecModelError as e:
                res.assumptions.append(str(e))
    if target_tok_s is not None:
        if res.break_even is not None:
            cycles = {a.steps: res.break_even["cycle_ms"] for a in arms} or {None: res.break_even["cycle_ms"]}
        elif res.cycle_fit is not None:
            cycles = {k: res.cycle_fit.cycle_ms(k) for k in sorted({a.steps for a in arms})}
        else:
            raise SpecModelError("--target-tok-s needs a cycle time: give --verify-ms, or --spec-tok-s with "
                                 "--accept-len and --steps")
        for k, c in cycles.items():
            res.targets.append(target_need(target_tok_s, c, k))
    return res


# ----------------------------------------------------------------------------------------- CLI

def render_text(res: ModelResult) -> str:
    out: list[str] = []
    if res.baseline_tok_s:
        out.append(f"baseline: {res.baseline_tok_s:.1f} tok/s -> step {res.step_ms:.2f} ms")
    if res.break_even:
        b = res.break_even
        out.append(f"break-even from step times: cycle {b['cycle_ms']:.2f} ms / step {b['step_ms']:.2f} ms "
                   f"-> tau* = {b['tau_star']:.2f}")
    for a in res.arms:
        verdict = "wins" if a.margin > 0 else "loses"
        out.append(f"{a.name}: {a.tok_s:.1f} tok/s at tau {a.accept_len:.2f} -> cycle {a.cycle_ms:.2f} ms, "
                   f"tau* = {a.tau_star:.2f}, margin {a.margin:+.2f} ({verdict}), alpha = {a.alpha:.3f}, "
                   f"speedup x{a.speedup:.3f}")
    if res.cycle_fit:
        f = res.cycle_fit
        out.append(f"cycle(steps) = {f.intercept_ms:.2f} + {f.slope_ms:.2f}*steps ms ({f.source})")
    for p in res.predictions:
        sp = f", x{p.speedup:.3f}" if p.speedup else ""
        out.append(f"  predicted steps={p.steps}: cycle {p.cycle_ms:.2f} ms, tau {p.tau:.2f}, {p.tok_s:.1f} tok/s{sp}")
    for t in res.targets:
        k = "any steps" if t.steps is None else f"steps={t.steps}"
        a = f"alpha {t.alpha_needed:.3f}" if t.alpha_needed is not None else "not reachable"
        out.append(f"target {t.target_tok_s:g} tok/s at {t.cycle_ms:.2f} ms cycle ({k}): tau {t.tau_needed:.2f}, "
                   f"{a}; 1/(1-alpha) limit: alpha >= {t.alpha_limit:.3f}" + (f" — {t.note}" if t.note else ""))
    for s in res.assumptions:
        out.append(f"assumption: {s}")
    return "\n".join(out)


def _arms_from_args(ns: argparse.Namespace) -> list[SpecArm]:
    tok, acc, steps = ns.spec_tok_s or [], ns.accept_len or [], ns.steps or []
    if not (len(tok) == len(acc) == len(steps)):
        raise SpecModelError(
            f"give --spec-tok-s, --accept-len and --steps once per speculative arm, in the same order "
            f"(got {len(tok)}, {len(acc)}, {len(steps)})")
    return [SpecArm(steps=k, tok_s=t, accept_len=a, name=f"steps={k}") for t, a, k in zip(tok, acc, steps)]


def cmd_model(ns: argparse.Namespace, out=None) -> int:
    import sys
    out = out or sys.stdout
    try:
        res = build(ns.baseline_tok_s, _arms_from_args(ns), verify_ms=ns.verify_ms, decode_ms=ns.decode_ms,
                    draft_ms=ns.draft_ms, target_tok_s=ns.target_tok_s, draft_step_ms=ns.draft_step_ms,
                    predict_steps=range(1, ns.max_steps + 1))
    except SpecModelError as e:
        print(f"specab model: {e}", file=out)
        return 2
    if ns.format == "json":
        print(json.dumps(res.to_dict(), indent=2), file=out)
    else:
        print(render_text(res), file=out)
    return 0


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "model", help="speculative-decoding arithmetic: break-even accept length, alpha, predictions",
        description="Break-even accept length tau* = cycle/step, margin, chain-model alpha, predicted tok/s "
                    "for other steps and what a target tok/s needs. Repeat --spec-tok-s/--accept-len/--steps "
                    "once per measured arm.")
    p.add_argument("--baseline-tok-s", type=float)
    p.add_argument("--spec-tok-s", type=float, action="append")
    p.add_argument("--accept-len", type=float, action="append", help="tokens per cycle incl. the bonus token")
    p.add_argument("--steps", type=int, action="append", help="speculative_num_steps (topk=1 chain)")
    p.add_argument("--verify-ms", type=float, help="verify (cycle) time in ms")
    p.add_argument("--draft-ms", type=float, default=0.0, help="draft time per cycle added to --verify-ms")
    p.add_argument("--decode-ms", type=float, help="baseline decode step in ms")
    p.add_argument("--target-tok-s", type=float)
    p.add_argument("--draft-step-ms", type=float, help="cost of one extra draft step (with one measured arm)")
    p.add_argument("--max-steps", type=int, default=6, help="predict steps 1..N")
    p.add_argument("--format", choices=["text", "json"], default="text")
    p.set_defaults(func=cmd_model)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    return standalone_main(register, argv)


if __name__ == "__main__":
    raise SystemExit(main())
