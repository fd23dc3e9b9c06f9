"""Output validity: whether a speculative arm did its baseline's work, on the same requests.

A speedup claims that the speculative arm generated what its baseline generates, faster. Speculative decoding with
exact verification is lossless, so at temperature 0 each measured request's output is the baseline's output on the
same prompt (same seed, same request index), up to the late divergences batch-dependent numerics give real models.
An engine mode or bug that commits unchecked draft tokens (SGLang's ``SGLANG_SIMULATE_ACC_LEN``, vLLM's synthetic
rejection sampling) runs fast and generates other text. Per speculative arm, against its baseline:

- **greedy parity** (temperature 0): per request, identical or not, the first position where the outputs differ and
  the share of the baseline's output agreed before it; per arm, the identical share with its 95 % (Wilson) interval
  and the first divergences. A request passes the rule when its output is identical or agrees with the baseline's
  on at least ``validity.greedy_min_match`` of the baseline's tokens before the first difference (a late
  divergence); an arm passes when every compared request does. Runs are paired within blocks, as the speedup is;
  the baseline's own restarts compared with each other give the engine's own floor.
- **lengths and endings**: each arm's mean output length within ``validity.length_window`` (MLPerf's +-10 %) of its
  baseline's, and the finish-reason mix (``ignore_eos: false``; at ``true`` every answer runs to the limit).
- **loops**: the share of a request's n-grams (``validity.loop_ngram``) that repeat an earlier one; an output at or
  above ``validity.loop_share`` where its baseline's is not is a loop (loops are easy to draft: tok/s rises).

At temperature > 0 outputs differ by design and greedy parity does not apply; lengths, endings and loops still do.
An arm declared ``cost_only`` is checked the same way and never gets a speedup claim. docs/analysis.md has the rules.

The deterministic pass (``driver.py run --correctness``, ``Experiment.deterministic``): each speculative arm and its
baseline ran once more in the engine's deterministic mode, where a greedy output depends neither on the batch nor on
speculation, so the pass is judged with ``greedy_min_match`` 1: any difference is an engine bug, not numerics.
"""
from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from specab.analysis.evidence import outputs as outs
from specab.analysis.measures import distribution
from specab.analysis.evidence.model import Experiment, Run, bench_of
from specab.config.validity import DEFAULTS
from specab.vocab import engines

KEYS = tuple(DEFAULTS)

VALID, NOT_VALID, UNCHECKED = "valid", "NOT VALID", "unchecked"
IDENTICAL, BUG = "identical", "BUG"         # the deterministic pass of an arm


@dataclass(frozen=True)
class Rules:
    greedy_min_match: float = DEFAULTS["greedy_min_match"]
    length_window: float = DEFAULTS["length_window"]
    loop_ngram: int = DEFAULTS["loop_ngram"]
    loop_share: float = DEFAULTS["loop_share"]

    @classmethod
    def of(cls, config: Any) -> "Rules":
        """The stored experiment config's `validity:` section over the defaults (validated when it was loaded)."""
        section = config.get("validity") if isinstance(config, dict) else None
        section = section if isinstance(section, dict) else {}
        return cls(**{k: type(DEFAULTS[k])(section[k]) for k in KEYS if section.get(k) is not None})


@dataclass
class RequestParity:
    i: int
    block: int
    tokens: int                 # the baseline's output length (in its unit)
    identical: bool
    agreed: int                 # leading tokens that agree (the first difference's 0-based position)
    passes: bool                # identical, or agreed >= greedy_min_match x tokens

    @property
    def agreed_share(self) -> float:
        return self.agreed / self.tokens if self.tokens else 1.0


@dataclass
class ArmValidity:
    arm: str
    baseline: str
    status: str                 # VALID | NOT_VALID | UNCHECKED
    line: str                   # the verdict's validity part, in words
    cost_only: bool = False
    temperature: float = 0.0
    unit: str = "tokens"
    compared: int = 0
    identical: int = 0
    identical_ci: tuple[float, float] | None = None
    failing: int = 0            # compared requests that break the greedy rule
    requests: list[RequestParity] = field(default_factory=list)
    mean_len: float | None = None
    baseline_mean_len: float | None = None
    finish: dict[str, int] = field(default_factory=dict)
    baseline_finish: dict[str, int] = field(default_factory=dict)
    loops: list[int] = field(default_factory=list)          # request indexes whose output loops
    problems: list[str] = field(default_factory=list)       # each reason it is not valid

    @property
    def divergences(self) -> list[int]:
        return sorted(q.agreed for q in self.requests if not q.identical)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)             # its requests too: asdict converts the dataclasses in a list


@dataclass
class DeterministicPass:
    """A speculative arm's deterministic pass: its outputs against its baseline's, both in the engine's deterministic
    mode (the pass's own arms, ``<arm>-det``), any difference a bug."""
    arm: str                    # the measured arm it checks
    det_arm: str
    det_baseline: str
    mode: str | None            # the mode in the engine's words (--enable-deterministic-inference, ...)
    status: str                 # IDENTICAL | BUG | UNCHECKED
    line: str                   # the verdict's deterministic part, in words
    compared: int = 0
    identical: int = 0
    unit: str = "tokens"
    requests: list[RequestParity] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)           # the pass's runs of the arm and of its baseline
    gpu_seconds: float | None = None                        # what those runs cost

    @property
    def first(self) -> RequestParity | None:
        """The differing request whose difference comes first (None: every compared request is identical)."""
        return min((q for q in self.requests if not q.identical), key=lambda q: (q.agreed, q.i), default=None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)             # its requests too: asdict converts the dataclasses in a list


@dataclass
class Validity:
    rules: Rules
    arms: dict[str, ArmValidity] = field(default_factory=dict)
    baseline_self: dict[str, tuple[int, int]] = field(default_factory=dict)   # baseline: (identical, compared)
    deterministic: dict[str, DeterministicPass] = field(default_factory=dict)   # measured arm: its pass
    # temperature > 0: each sampled arm's distribution check (measures/distribution.py), in its verdict
    distribution: dict[str, distribution.DistributionCheck] = field(default_factory=dict)

    def invalid(self) -> list[ArmValidity]:
        return [a for a in self.arms.values() if a.status == NOT_VALID]

    def bugs(self) -> list[DeterministicPass]:
        return [d for d in self.deterministic.values() if d.status == BUG]

    def to_dict(self) -> dict[str, Any]:
        return {"rules": asdict(self.rules), "arms": {k: v.to_dict() for k, v in self.arms.items()},
                "baseline_self": {k: {"identical": v[0], "compared": v[1]} for k, v in self.baseline_self.items()},
                "deterministic": {k: v.to_dict() for k, v in self.deterministic.items()}}


# --------------------------------------------------------------------------- the measures

def agreed_prefix(a: tuple[Any, ...] | str, b: tuple[Any, ...] | str) -> int:
    """How many leading tokens (characters of a text) two outputs share."""
    n = min(len(a), len(b))
    return next((k for k in range(n) if a[k] != b[k]), n)


def wilson(k: int, n: int) -> tuple[float, float] | None:
    if n <= 0:
        return None
    from scipy import stats as sps      # (imported where used: the driver's start does not load scipy.stats)
    ci = sps.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    return (float(ci.low), float(ci.high))


def repeated_share(tokens: tuple[Any, ...], n: int) -> float:
    """The share of an output's n-grams that repeat an n-gram seen earlier in it (0: none, ~1: a loop)."""
    grams = [tokens[k:k + n] for k in range(len(tokens) - n + 1)]
    if not grams:
        return 0.0
    return 1.0 - len(set(grams)) / len(grams)


def _compare(spec: outs.Output, base: outs.Output, block: int, rules: Rules) -> RequestParity:
    a, b = spec.comparable, base.comparable
    identical = a == b
    agreed = agreed_prefix(a, b)
    if spec.text is not None:       # texts: agreement in characters, reported as the share of the baseline's words
        words = len(base.tokens)
        agreed = len(base.text[:agreed].split()) if agreed < len(b) else words   # type: ignore[index]
        tokens = words
    else:
        tokens = len(b)
    passes = identical or (tokens > 0 and agreed >= rules.greedy_min_match * tokens)
    return RequestParity(i=base.i, block=block, tokens=tokens, identical=identical,
                         agreed=agreed if not identical else tokens, passes=passes)


def _temperature(exp: Experiment, arm: str) -> float:
    bench = dict(bench_of(exp.meta.get("config") if isinstance(exp.meta, dict) else None) or {})
    with contextlib.suppress(Exception):  # an arm not in the experiment: the experiment's bench
        bench.update(exp.arm(arm).matrix.get("bench") or {})
    try:
        return float(bench.get("temperature") or 0.0)
    except (TypeError, ValueError):
        return 0.0


def cost_only_arms(exp: Experiment) -> set[str]:
    """Arms the experiment file declares ``cost_only: true`` (a cost measurement, never a verdict arm)."""
    config = exp.meta.get("config") if isinstance(exp.meta, dict) else None
    arms = config.get("arms") if isinstance(config, dict) else None
    return {str(a.get("name")) for a in arms or [] if isinstance(a, dict) and a.get("cost_only") is True}


# --------------------------------------------------------------------------- per arm

def _pairs(exp: Experiment, arm: str, baseline: str, got: dict[int, dict[int, outs.Output]]
           ) -> list[tuple[Run, Run]]:
    """Each run of ``arm`` with outputs, with its block's baseline run (another block's where that one has none)."""
    base_runs = [r for r in exp.runs_of(baseline) if r.seq in got]
    by_block = {r.block: r for r in base_runs}
    return [(r, by_block.get(r.block, base_runs[0])) for r in exp.runs_of(arm) if r.seq in got and base_runs]


def _mean_len(outputs: list[outs.Output]) -> float | None:
    return sum(len(o.tokens) for o in outputs) / len(outputs) if outputs else None


def _parity_problem(v: ArmValidity, rules: Rules) -> str | None:
    differ = v.compared - v.identical
    if not v.failing:
        return None
    median = sorted(q.agreed for q in v.requests if not q.passes)[v.failing // 2]
    unit = v.unit if median != 1 else v.unit[:-1]
    early = "" if v.failing == differ else (f", {v.failing} of them before {rules.greedy_min_match:.0%} of their "
                                            f"{v.unit} (validity.greedy_min_match)")
    return (f"outputs differ from the baseline on {differ}/{v.compared} requests{early}, after {median} agreeing "
            f"{unit} (median)")


def _length_problem(v: ArmValidity, rules: Rules) -> str | None:
    if not v.mean_len or not v.baseline_mean_len:
        return None
    ratio = v.mean_len / v.baseline_mean_len
    if abs(ratio - 1.0) <= rules.length_window:
        return None
    return (f"mean output length {v.mean_len:.0f} {v.unit} is {ratio:.2f}x the baseline's {v.baseline_mean_len:.0f} "
            f"(window +-{rules.length_window:.0%})")


def _distribution_problem(v: ArmValidity, dist: distribution.DistributionCheck | None) -> str | None:
    if v.temperature > 0 and dist is not None and dist.same is False:
        return f"outputs not drawn from the target's distribution: {dist.reason}"
    return None


def _valid_line(v: ArmValidity, dist: distribution.DistributionCheck | None = None) -> str:
    if v.temperature > 0:
        law = ("distribution not checked (no scored outputs)" if dist is None else
               f"same distribution as the baseline's ({dist.reason})" if dist.same else
               f"distribution not checked ({dist.reason})")
        return (f"sampled at temperature {v.temperature:g}: {law}; lengths and loops checked on {v.compared} "
                f"requests")
    late = v.compared - v.identical
    line = f"outputs identical to the baseline on {v.identical}/{v.compared} requests"
    if late:
        low = min(q.agreed_share for q in v.requests if not q.identical)
        line += f"; the other {late} diverge late (after {low:.0%} or more of their {v.unit})"
    return line


def check_arm(exp: Experiment, arm: str, baseline: str, got: dict[int, dict[int, outs.Output]], rules: Rules,
              cost_only: bool = False, dist: distribution.DistributionCheck | None = None) -> ArmValidity:
    """One speculative arm against its baseline; ``dist``: its distribution check at temperature > 0
    (measures/distribution.py: the baseline server's scores of both arms' samples)."""
    temperature = _temperature(exp, arm)
    v = ArmValidity(arm=arm, baseline=baseline, status=UNCHECKED, line="", cost_only=cost_only,
                    temperature=temperature)
    pairs = _pairs(exp, arm, baseline, got)
    if not pairs:
        why = "no outputs recorded" if not any(r.seq in got for r in exp.runs_of(arm)) else \
            f"its baseline {baseline} has no run with outputs"
        v.line = f"outputs not checked ({why})"
        return v
    mine: list[outs.Output] = []
    theirs: list[outs.Output] = []
    for run, base in pairs:
        for i, o in sorted(got[run.seq].items()):
            b = got[base.seq].get(i)
            if b is None:
                continue
            mine.append(o)
            theirs.append(b)
            v.unit = o.unit
            if temperature == 0:
                v.requests.append(_compare(o, b, run.block, rules))
            share = repeated_share(o.tokens, rules.loop_ngram)
            if share >= rules.loop_share > repeated_share(b.tokens, rules.loop_ngram):
                v.loops.append(i)
    v.compared = len(mine)
    v.identical = sum(q.identical for q in v.requests)
    v.failing = sum(not q.passes for q in v.requests)
    v.identical_ci = wilson(v.identical, v.compared) if v.requests else None
    v.mean_len, v.baseline_mean_len = _mean_len(mine), _mean_len(theirs)
    v.finish = dict(Counter(str(o.finish_reason) for o in mine))
    v.baseline_finish = dict(Counter(str(o.finish_reason) for o in theirs))
    loops = (f"{len(v.loops)}/{v.compared} outputs loop ({rules.loop_ngram}-grams repeating, "
             f"{rules.loop_share:.0%} or more)" if v.loops else None)
    v.problems = [p for p in (_parity_problem(v, rules), _distribution_problem(v, dist), _length_problem(v, rules),
                              loops) if p]
    v.status = NOT_VALID if v.problems else VALID
    v.line = "NOT VALID: " + "; ".join(v.problems) if v.problems else _valid_line(v, dist)
    return v


def _baseline_self(exp: Experiment, baseline: str, got: dict[int, dict[int, outs.Output]]) -> tuple[int, int]:
    """The baseline's restarts against its first: (identical, compared) requests at temperature 0."""
    runs = [r for r in exp.runs_of(baseline) if r.seq in got]
    same = n = 0
    for r in runs[1:]:
        for i, o in got[r.seq].items():
            first = got[runs[0].seq].get(i)
            if first is not None:
                n += 1
                same += o.comparable == first.comparable
    return same, n


def check(exp: Experiment) -> Validity:
    """Every speculative arm's outputs against its baseline's (an arm with no outputs recorded: unchecked)."""
    config = exp.meta.get("config") if isinstance(exp.meta, dict) else None
    v = Validity(rules=Rules.of(config))
    spec = exp.spec_arms
    if not spec:
        return v
    got = outs.read(exp, [r for r in exp.runs if r.ok])
    declared = cost_only_arms(exp)
    v.distribution = distribution.check(exp)        # {} for a greedy experiment
    for a in spec:
        base = exp.baseline_of(a.name)
        v.arms[a.name] = check_arm(exp, a.name, base, got, v.rules, a.name in declared, v.distribution.get(a.name))
    for base in {exp.baseline_of(a.name) for a in spec}:
        if _temperature(exp, base) == 0:
            same, n = _baseline_self(exp, base, got)
            if n:
                v.baseline_self[base] = (same, n)
    v.deterministic = check_deterministic(exp)
    return v


# --------------------------------------------------------------------------- the deterministic pass

def _det_line(d: DeterministicPass) -> str:
    if d.status == BUG and d.first is not None:
        return (f"BUG: differs in deterministic mode on {d.compared - d.identical}/{d.compared} requests from "
                f"{d.unit[:-1]} {d.first.agreed}")
    return f"deterministic pass: identical on {d.identical}/{d.compared} requests"


def _det_pass(det: Experiment, arm: str, got: dict[int, dict[int, outs.Output]]) -> DeterministicPass:
    base = det.baseline_of(arm)
    a = det.arm(arm)
    runs = det.runs_of(arm, ok_only=False) + det.runs_of(base, ok_only=False)
    cost = [r.gpu_seconds for r in runs if r.gpu_seconds is not None]
    d = DeterministicPass(arm=str(a.matrix.get("deterministic_of") or arm), det_arm=arm, det_baseline=base,
                          mode=engines.deterministic_mode_of(a.server_args, a.env), status=UNCHECKED, line="",
                          runs=[r.run_id for r in runs], gpu_seconds=sum(cost) if cost else None)
    v = check_arm(det, arm, base, got, Rules(greedy_min_match=1.0))
    if not v.requests:
        failed = [f"{r.run_id} {r.status}" for r in runs if not r.ok]
        why = v.line[len("outputs not checked ("):-1] if v.line.startswith("outputs not checked (") else v.line
        d.line = f"deterministic pass: not checked ({'; '.join(failed) or why})"
        return d
    d.compared, d.identical, d.unit, d.requests = v.compared, v.identical, v.unit, v.requests
    d.status = IDENTICAL if v.identical == v.compared else BUG
    d.line = _det_line(d)
    return d


def check_deterministic(exp: Experiment) -> dict[str, DeterministicPass]:
    """Each speculative arm's deterministic pass (--correctness), by the measured arm it checks; empty without one."""
    det = exp.deterministic
    if det is None:
        return {}
    got = outs.read(det, [r for r in det.runs if r.ok])
    out = {}
    for a in det.spec_arms:
        d = _det_pass(det, a.name, got)
        out[d.arm] = d
    return out


def verdict(speedup_text: str, v: ArmValidity | None, det: DeterministicPass | None = None) -> str:
    """One arm's verdict with both parts: '1.52x (95 % CI ...), outputs identical ...' / '... NOT VALID: ...', and
    with a deterministic pass its outcome: '...; deterministic pass: identical on 4/4 requests' / '...; BUG: ...'."""
    tail = f"; {det.line}" if det is not None else ""
    if v is None:
        return speedup_text + tail
    if v.cost_only:
        return f"cost only (declared: its outputs are not the target's), no speedup claim; {v.line}{tail}"
    if v.status == NOT_VALID:
        return f"{speedup_text} -- {v.line}{tail}"
    return f"{speedup_text}, {v.line}{tail}"


def cell(v: ArmValidity | None) -> str:
    """An arm's outputs in a table cell: "12/12 identical", "NOT VALID", "cost only, NOT VALID", "-"."""
    if v is None:
        return "-"
    if v.status == VALID and v.requests:
        return f"{v.identical}/{v.compared} identical"
    return ("cost only, " if v.cost_only else "") + v.status
