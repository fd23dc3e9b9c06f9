"""Output distribution at temperature > 0: are a speculative arm's outputs drawn from its target's distribution?

With sampling, an arm's outputs differ from its baseline's by design, so the token-for-token check of greedy runs does
not apply. What must hold is that both are samples of the same law: the target's at the requested temperature and
top_p. Each baseline run's server scores, after its measured window, its own outputs and its arms' under the target
(specab/node/scoring.py: ``scores.jsonl``, the sum of each output's per-token target log-probabilities), and this
module compares, per speculative arm against its baseline, four per-request metrics:

- ``logprob``: the mean target log-probability per output token (scored requests only). A server that samples from
  another law (a lossy verify, forced acceptance, a changed sampler) puts more mass on tokens the target finds less
  likely, or concentrates it on the likeliest: the mean moves either way;
- ``length``: the output tokens (the model's end of sequence, with ``ignore_eos`` false);
- ``eos``: whether the answer ended at the model's end of sequence (finish reason ``stop``);
- ``repetition``: seq-rep-4, the share of a request's 4-grams that repeat an earlier one of it (Welleck et al.,
  2019, "Neural text degeneration with unlikelihood training"): loops.

Each is a two-sided two-sample test (Mann-Whitney U, scipy; Fisher's exact test for the EOS counts); a metric
constant and equal on both sides (every answer at ``output_len``) is not tested. The p-values are adjusted for the
several metrics with Holm's step-down method, and the arm is the "same distribution" when no adjusted p-value is
below ``ALPHA``. The power is stated for the log-probability: the smallest shift of its mean the test detects with
80 % power at these sample sizes (normal approximation of the Mann-Whitney test, asymptotic relative efficiency 3/pi,
at the Bonferroni level ALPHA / tests, Holm's worst case). Fewer than ``MIN_SCORED`` scored requests on either side:
no verdict (``same`` None, and why). docs/analysis.md, "Output distribution".
"""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from specab.analysis.evidence import outputs
from specab.analysis.evidence.model import Experiment, Run

ALPHA = 0.05
POWER = 0.8
MIN_SCORED = 5
REPEAT_N = 4
SCORES_FILE = "scores.jsonl"
LABELS = {"logprob": "mean target log-prob per token", "length": "output tokens", "eos": "EOS rate",
          "repetition": "repeated 4-grams"}


@dataclass
class DistributionCheck:
    """One speculative arm against its baseline (``same`` None: not enough scored requests, ``reason`` says why)."""
    arm: str
    baseline: str
    same: bool | None
    reason: str                                  # one line: which metric differed and by how much, or why unchecked
    p_values: dict[str, float] = field(default_factory=dict)     # Holm-adjusted, per metric tested
    power_note: str = ""
    scored: int = 0                              # the arm's measured requests scored under the target
    unscored: int = 0                            # the arm's measured requests not scored
    baseline_scored: int = 0
    values: dict[str, list[float | None]] = field(default_factory=dict)   # metric -> [arm, baseline]
    temperature: float | None = None
    unscored_why: list[str] = field(default_factory=list)       # per unscored run of the arm: why

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Req:
    """One measured request's metrics (logprob: None where it was not scored)."""
    length: int
    stop: bool
    repetition: float | None
    logprob: float | None = None


@dataclass
class ScoringCost:
    """What the scoring cost the baseline runs that scored (their summaries' last lines)."""
    runs: int
    seconds: float
    requests: int
    tokens: int
    share: float | None          # of those runs' wall time


# --------------------------------------------------------------------------- reading

def _scores_texts(exp: Experiment, runs: list[Run]) -> dict[int, str]:
    """Each run's scores.jsonl text (the runs that scored have one), from its store's run files (a pooled
    experiment's from each source store) or, for a run-directory round, its directory."""
    by_store, elsewhere = exp.stores_of(runs)
    out: dict[int, str] = {}
    for path, pairs in by_store.items():
        from specab.results.store import Store
        store = Store.open(path)
        try:
            out.update({here: text for here, there in pairs
                        if (text := store.files(there).get(SCORES_FILE)) is not None})
        finally:
            store.close()
    for r in elsewhere:
        f = r.run_dir / SCORES_FILE if r.run_dir is not None else None
        if f is not None and f.is_file():
            out[r.seq] = f.read_text(errors="replace")
    return out


def seq_rep(tokens: list[Any], n: int = REPEAT_N) -> float | None:
    """The share of a sequence's n-grams that repeat an earlier one (None: shorter than n)."""
    grams = [tuple(tokens[k:k + n]) for k in range(len(tokens) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams) if grams else None


def temperature(run: Run) -> float:
    return float((run.workload or {}).get("temperature") or 0.0)


def _collect(exp: Experiment) -> tuple[dict[int, dict[int, _Req]], list[dict[str, Any]]]:
    """Each sampled run's requests by index (seq -> i -> metrics, log-probs filled in from the scores), and the
    scoring summaries of the baseline runs that scored."""
    runs = [r for r in exp.runs if r.ok and temperature(r) > 0]
    by_id = {r.run_id: r.seq for r in runs}
    got = outputs.read(exp, runs)
    reqs: dict[int, dict[int, _Req]] = {}
    for r in runs:
        outs = got.get(r.seq, {})
        reqs[r.seq] = {q.i: _Req(length=int(q.output_tokens or 0), stop=q.finish_reason == "stop",
                                 repetition=seq_rep(list(outs[q.i].tokens)) if q.i in outs else None)
                       for q in r.measured}
    summaries: list[dict[str, Any]] = []
    texts = _scores_texts(exp, [r for r in runs if r.arm in exp.baselines])
    for r in runs:
        for line in texts.get(r.seq, "").splitlines():
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict) and isinstance(doc.get("summary"), dict):
                summaries.append(dict(doc["summary"], _wall=(r.finished or 0) - (r.started or 0)))
                continue
            req = reqs.get(by_id.get(str(doc.get("run")), -1), {}).get(doc.get("i"))   # type: ignore[arg-type]
            if req is not None and doc.get("tokens") and isinstance(doc.get("logprob_sum"), (int, float)):
                req.logprob = float(doc["logprob_sum"]) / int(doc["tokens"])
    return reqs, summaries


# --------------------------------------------------------------------------- the tests

def _mann_whitney(a: list[float], b: list[float]) -> float:
    from scipy import stats as sps      # (imported where used: the driver's start does not load scipy.stats)
    return float(sps.mannwhitneyu(a, b, alternative="two-sided").pvalue)


def _holm(p: dict[str, float]) -> dict[str, float]:
    """Holm's step-down adjusted p-values (family-wise error at most ALPHA over the metrics tested)."""
    out, running = {}, 0.0
    for k, (name, value) in enumerate(sorted(p.items(), key=lambda kv: kv[1])):
        running = max(running, min(1.0, (len(p) - k) * value))
        out[name] = running
    return out


def _tests(arm: list[_Req], base: list[_Req]) -> tuple[dict[str, float], dict[str, list[float | None]]]:
    """Raw p-values of the metrics that vary, and each metric's value per side [arm, baseline]."""
    series = {"logprob": ([q.logprob for q in arm if q.logprob is not None],
                          [q.logprob for q in base if q.logprob is not None]),
              "length": ([float(q.length) for q in arm], [float(q.length) for q in base]),
              "repetition": ([q.repetition for q in arm if q.repetition is not None],
                             [q.repetition for q in base if q.repetition is not None])}
    p: dict[str, float] = {}
    values: dict[str, list[float | None]] = {}
    for name, (a, b) in series.items():
        values[name] = [statistics.median(a) if a else None, statistics.median(b) if b else None]
        if a and b and len(set(a) | set(b)) > 1:
            p[name] = _mann_whitney(a, b)   # type: ignore[arg-type]
    ka, kb = sum(q.stop for q in arm), sum(q.stop for q in base)
    values["eos"] = [ka / len(arm) if arm else None, kb / len(base) if base else None]
    if arm and base and 0 < ka + kb < len(arm) + len(base):
        from scipy import stats as sps
        p["eos"] = float(sps.fisher_exact([[ka, len(arm) - ka], [kb, len(base) - kb]]).pvalue)
    return p, values


def power_note(a: list[float], b: list[float], tests: int) -> str:
    """The smallest shift of the mean log-prob per token the test detects with POWER at these sample sizes."""
    if len(a) < 2 or len(b) < 2:
        return ""
    sd = math.sqrt(((len(a) - 1) * statistics.variance(a) + (len(b) - 1) * statistics.variance(b))
                   / (len(a) + len(b) - 2))
    level = ALPHA / max(1, tests)
    from scipy import stats as sps
    z = sps.norm.ppf(1 - level / 2) + sps.norm.ppf(POWER)
    shift = z * sd * math.sqrt(1 / len(a) + 1 / len(b)) * math.sqrt(math.pi / 3)
    return (f"detects a shift of {shift:.3g} nats/token in the mean target log-prob ({shift / sd:.2g} SD of a "
            f"request's mean) with {POWER:.0%} power at {len(a)} vs {len(b)} scored requests (two-sided, "
            f"alpha {ALPHA:g}/{max(1, tests)})" if sd > 0 else
            f"every scored request has the same mean target log-prob: any shift is detected")


def _fmt(name: str, v: float | None, digits: int = 3) -> str:
    if v is None:
        return "-"
    return f"{v:.0%}" if name == "eos" else f"{v:.{digits}g}"


def _pair(name: str, a: float | None, b: float | None) -> str:
    """"A vs B" with the digits that tell them apart (a model whose log-probs differ in the 6th decimal)."""
    if a is None or b is None or a == b or name == "eos":
        return f"{_fmt(name, a)} vs {_fmt(name, b)}"
    digits = max(3, 2 + math.ceil(math.log10(max(abs(a), abs(b), 1e-300) / abs(a - b))))
    return f"{_fmt(name, a, digits)} vs {_fmt(name, b, digits)}"


def _decide(arm: str, base: str, a: list[_Req], b: list[_Req]) -> DistributionCheck:
    p_raw, values = _tests(a, b)
    p = _holm(p_raw)
    la = [q.logprob for q in a if q.logprob is not None]
    lb = [q.logprob for q in b if q.logprob is not None]
    check = DistributionCheck(arm=arm, baseline=base, same=None, reason="", p_values=p, values=values,
                              scored=len(la), unscored=len(a) - len(la), baseline_scored=len(lb),
                              power_note=power_note(la, lb, len(p)))   # type: ignore[arg-type]
    if len(la) < MIN_SCORED or len(lb) < MIN_SCORED:
        check.reason = (f"not checked: {len(la)} of the arm's and {len(lb)} of {base}'s requests were scored under "
                        f"the target (at least {MIN_SCORED} each needed)")
        return check
    differ = sorted((v, k) for k, v in p.items() if v < ALPHA)
    check.same = not differ
    said = lambda k: f"{LABELS[k]} {_pair(k, values[k][0], values[k][1])} (p {p[k]:.2g})"   # noqa: E731
    if differ:
        check.reason = f"differs from {base}'s: " + ", ".join(said(k) for _, k in differ)
    else:
        low = min(p, key=p.get) if p else None                                      # type: ignore[arg-type]
        check.reason = (f"same distribution as {base}'s at alpha {ALPHA:g} over {len(la)} vs {len(lb)} scored "
                        f"requests" + (f" (closest: {said(low)})" if low else ""))
    return check


# --------------------------------------------------------------------------- per arm

def _why_unscored(exp: Experiment, run: Run, summaries: list[dict[str, Any]]) -> str:
    for s in summaries:
        got = (s.get("runs") or {}).get(run.run_id)
        if isinstance(got, dict) and got.get("reason"):
            return f"{run.run_id}: {got['reason']}"
    later = [r for r in exp.runs if r.arm == exp.baseline_of(run.arm) and r.host == run.host and r.seq > run.seq]
    if not later:
        return f"{run.run_id}: no baseline run came after it on {run.host} to score it"
    return f"{run.run_id}: {', '.join(r.run_id for r in later)} did not score it (failed, or cut short)"


def check(exp: Experiment) -> dict[str, DistributionCheck]:
    """Arm name -> its check against its baseline, for every speculative arm whose runs sampled (temperature > 0);
    arms of a greedy experiment have none (their outputs are compared token for token)."""
    return _checks(exp, *_collect(exp))


def _checks(exp: Experiment, reqs: dict[int, dict[int, _Req]], summaries: list[dict[str, Any]]
            ) -> dict[str, DistributionCheck]:
    out: dict[str, DistributionCheck] = {}
    for arm in exp.spec_arms:
        runs = [r for r in exp.runs if r.arm == arm.name and r.seq in reqs]
        if not runs:
            continue
        base = exp.baseline_of(arm.name)
        base_runs = [r for r in exp.runs if r.arm == base and r.seq in reqs]
        temps = {temperature(r) for r in runs + base_runs}
        a = [q for r in runs for q in reqs[r.seq].values()]
        b = [q for r in base_runs for q in reqs[r.seq].values()]
        if len(temps) > 1:
            c = DistributionCheck(arm=arm.name, baseline=base, same=None, reason=(
                f"not checked: the arm and {base} sampled at different temperatures ({', '.join(map(str, temps))})"))
        else:
            c = _decide(arm.name, base, a, b)
        c.temperature = temps.pop() if len(temps) == 1 else None
        c.unscored_why = [_why_unscored(exp, r, summaries) for r in runs
                          if not any(q.logprob is not None for q in reqs[r.seq].values())]
        out[arm.name] = c
    return out


def scoring_cost(summaries: list[dict[str, Any]]) -> ScoringCost | None:
    """What scoring cost the baseline runs, from their scores' summaries (None: nothing was scored)."""
    if not summaries:
        return None
    wall = sum(s["_wall"] for s in summaries)
    seconds = sum(float(s.get("seconds") or 0) for s in summaries)
    return ScoringCost(runs=len(summaries), seconds=seconds, requests=sum(int(s.get("requests") or 0) for s in summaries),
                       tokens=sum(int(s.get("tokens") or 0) for s in summaries),
                       share=seconds / wall if wall > 0 else None)


@dataclass
class Section:
    """The report's "Output distribution" section: an introduction, one row per arm, notes, and its report.json
    part."""
    intro: str
    header: list[str]
    rows: list[list[str]]
    notes: list[str]
    data: dict[str, Any]


def section(exp: Experiment) -> Section | None:
    """The report's "Output distribution" section; None for a greedy experiment."""
    reqs, summaries = _collect(exp)
    checks = _checks(exp, reqs, summaries)
    if not checks:
        return None
    cost = scoring_cost(summaries)
    intro = (f"At temperature > 0 each baseline run's server scored its own and its arms' earlier outputs under the "
             f"target after its measured window; per arm, two-sample tests of {', '.join(LABELS.values())} at alpha "
             f"{ALPHA:g} (Holm over the metrics tested; docs/analysis.md, \"Output distribution\").")
    rows = [[c.arm, c.baseline, str(c.scored), str(c.unscored),
             {True: "same distribution", False: "DIFFERS", None: "not checked"}[c.same], c.reason]
            for c in checks.values()]
    notes = [f"{c.arm}: the test {c.power_note}." for c in checks.values() if c.power_note]
    notes += [f"unscored {why}" for c in checks.values() for why in c.unscored_why]
    if cost is not None:
        share = f", {cost.share:.1%} of those runs' time" if cost.share is not None else ""
        notes.append(f"scoring cost: {cost.seconds:.1f} s in {cost.runs} baseline run(s) for {cost.requests} "
                     f"requests ({cost.tokens} tokens){share}, after their measured windows, no extra server start")
    return Section(intro=intro, header=["arm", "vs", "scored", "unscored", "verdict", "why"], rows=rows, notes=notes,
                   data={"arms": {k: c.to_dict() for k, c in checks.items()},
                         "cost": asdict(cost) if cost is not None else None})
