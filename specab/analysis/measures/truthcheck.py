"""The measurement checked against known truth: runs of known-truth models (specab.knowntruth) recomputed exactly.

When a run's summary carries ``known_truth`` (loadgen found known_truth.json next to the served models), every
measured request's true cycle count follows from its ``prompt_last_token``, its output length and the draft's
agreement set (the chain rule, :mod:`specab.knowntruth.truth`). This module compares, per request, run and arm:
the engine's cycle count (SGLang's ``spec_verify_ct``, vLLM's ``spec_decode_num_drafts`` delta) with the true one,
the run's accept length with the true one (same definition: output tokens / cycles), vLLM's own
``1 + accepted / drafts`` with the truth counted as vLLM counts (every draft the last cycle accepted, also those past
max_tokens), the cycles that accepted each draft position (SGLang's per-request histogram, vLLM's per-position
counter around each request) with the true ones (each cycle's right proposals, the last cycle's also past the
request's end: both engines count them so), the greedy output with the rule on every token, and the fitted alpha with
the acceptance realized along the requests' trajectories. For steps that were not run it gives the true accept length on the same prompts, to hold
the spec model's predictions against.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from specab.analysis.evidence.model import Experiment, Run
from specab.analysis.measures.specmodel import SpecModelError, chain_alpha, conditional_rates
from specab.knowntruth import truth as kt
from specab.vocab import engines
from specab.vocab.engines import speculative_view


@dataclass
class RequestCheck:
    line: int
    prompt_last_token: int
    tokens: int
    measured_cycles: int | None
    true_cycles: int
    follows_rule: int                 # output tokens that are the rule's next token
    measured_accepted: int | None     # vLLM: accepted drafts (its per-request delta)
    true_accepted_engine: int         # accepted drafts counted as vLLM counts (the last cycle uncapped)
    measured_per_pos: list[int] | None = None   # cycles that accepted draft position i (i = 1..steps), as recorded
    true_per_pos: list[int] = field(default_factory=list)

    @property
    def cycles_exact(self) -> bool:
        return self.measured_cycles == self.true_cycles

    @property
    def rule_ok(self) -> bool:
        return self.follows_rule == self.tokens


@dataclass
class RunCheck:
    run_id: str
    arm: str
    steps: int | None
    draft: str | None                 # the draft's folder, None for the baseline
    p: float | None
    density: float | None             # the agreement set's density over the non-special tokens
    requests: list[RequestCheck] = field(default_factory=list)
    measured_tau: float | None = None
    true_tau: float | None = None
    engine_tau: float | None = None   # vLLM: 1 + accepted / drafts over the run's requests (its own counters)
    true_engine_tau: float | None = None
    realized_alpha: float | None = None   # right proposals / proposals checked, along the true trajectories
    fitted_alpha: float | None = None     # chain_alpha(measured tau per cycle, steps)
    measured_conditional: list[float | None] | None = None   # per position, over the run's requests (positions.py)
    true_conditional: list[float | None] | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return not self.problems


@dataclass
class ArmCheck:
    arm: str
    steps: int | None
    runs: int
    measured_tau: float | None
    true_tau: float | None
    fitted_alpha: float | None
    realized_alpha: float | None
    density: float | None
    p: float | None


@dataclass
class Unchecked:
    """Runs of known-truth models that could not be checked, and why (naming the file that stopped it)."""
    runs: list[str]
    arms: list[str]
    reason: str


@dataclass
class TruthReport:
    runs: list[RunCheck] = field(default_factory=list)
    arms: list[ArmCheck] = field(default_factory=list)
    # per draft: steps -> true accept length (tokens / cycles) over the measured requests' prompts
    true_tau_by_steps: dict[str, dict[int, float]] = field(default_factory=dict)
    # arms left out: their settings force or relax acceptance (engines.output_departures), which the truth (exact
    # verification) does not model; arm -> why
    skipped: dict[str, str] = field(default_factory=dict)
    unchecked: list[Unchecked] = field(default_factory=list)

    @property
    def problems(self) -> list[tuple[RunCheck, str]]:
        return [(r, p) for r in self.runs for p in r.problems]

    def to_dict(self) -> dict[str, Any]:
        return {"runs": [dict(asdict(r), exact=r.exact) for r in self.runs], "arms": [asdict(a) for a in self.arms],
                "true_tau_by_steps": self.true_tau_by_steps, "skipped": self.skipped,
                "unchecked": [asdict(u) for u in self.unchecked]}


def _draft_truth(summary: dict[str, Any], where: str) -> tuple[kt.Rule, kt.DraftTruth | None]:
    doc = summary["known_truth"]
    rule = kt.rule_of(doc["target"], f"{where}: known_truth.target")
    draft = doc.get("draft")
    if not draft:
        return rule, None
    if draft.get("role") == "target":     # the target as its own draft: it agrees everywhere
        return rule, kt.DraftTruth(rule, frozenset(range(rule.vocab_size)), 1.0, None, "target")
    return rule, kt.draft_of(draft, f"{where}: known_truth.draft")


def _check_run(run: Run, summary: dict[str, Any], rows: list[dict[str, Any]]) -> tuple[RunCheck, kt.DraftTruth | None]:
    rule, draft = _draft_truth(summary, run.run_id)
    view = speculative_view(run.server_args)
    steps = view.steps if draft is not None else None
    info = summary["known_truth"].get("draft") or {}
    rc = RunCheck(run.run_id, run.arm, steps, Path(str(info.get("path", ""))).parent.name if draft else None,
                  draft.p if draft else None, draft.density if draft else None)
    right = checked = 0
    for row in rows:
        extra = row.get("extra") or {}
        last, ids = extra.get("prompt_last_token"), extra.get("output_ids")
        n = row.get("output_tokens")
        if not row.get("ok") or last is None or n is None:
            rc.problems.append(f"request line {row['line']}: no prompt_last_token or output length recorded")
            continue
        follows = rule.follows(int(last), ids or [])
        if draft is not None and steps:
            t = draft.request(int(last), int(n), steps)
            q = RequestCheck(row["line"], int(last), int(n), row.get("spec_verify_ct"), t.cycles, follows,
                             extra.get("spec_accepted_drafts"), t.engine_accepted,
                             _padded(extra.get("spec_accepted_per_pos"), steps),
                             [sum(1 for h in t.hits if h >= i) for i in range(1, steps + 1)])
            right, checked = right + t.drafted_accepted, checked + t.proposals_checked(steps)
        else:
            q = RequestCheck(row["line"], int(last), int(n), None, 0, follows, None, 0)
        rc.requests.append(q)
        if not q.rule_ok:
            rc.problems.append(f"request line {q.line}: {q.follows_rule} of {q.tokens} output tokens follow the rule "
                               f"(ids recorded: {len(ids or [])}): the engine did not serve the known-truth target")
        if draft is not None and steps and q.measured_cycles is None:
            rc.problems.append(f"request line {q.line}: the engine reported no cycle count")
        elif draft is not None and steps and not q.cycles_exact:
            rc.problems.append(f"request line {q.line}: {q.measured_cycles} cycles measured, {q.true_cycles} true")
        if q.measured_per_pos is not None and q.measured_per_pos != q.true_per_pos:
            rc.problems.append(f"request line {q.line}: cycles that accepted each draft position {q.measured_per_pos} "
                               f"measured, {q.true_per_pos} true")
    counted = [q for q in rc.requests if q.measured_cycles]
    if draft is not None and steps and counted and len(counted) == len(rc.requests):
        tokens = sum(q.tokens for q in counted)
        rc.measured_tau = tokens / sum(q.measured_cycles or 0 for q in counted)
        rc.true_tau = tokens / sum(q.true_cycles for q in counted)
        if all(q.measured_accepted is not None for q in counted):
            rc.engine_tau = 1 + sum(q.measured_accepted or 0 for q in counted) / sum(q.measured_cycles or 0 for q in counted)
            rc.true_engine_tau = 1 + sum(q.true_accepted_engine for q in counted) / sum(q.true_cycles for q in counted)
            if any(q.measured_accepted != q.true_accepted_engine for q in counted):
                rc.problems.append("accepted drafts per request differ from the truth counted as vLLM counts: "
                                   + ", ".join(f"line {q.line}: {q.measured_accepted} vs {q.true_accepted_engine}"
                                               for q in counted if q.measured_accepted != q.true_accepted_engine))
        if all(q.measured_per_pos is not None for q in counted):
            rc.measured_conditional = conditional_rates(sum(q.measured_cycles or 0 for q in counted),
                                                   [sum(x) for x in zip(*(q.measured_per_pos or [] for q in counted))])
            rc.true_conditional = conditional_rates(sum(q.true_cycles for q in counted),
                                               [sum(x) for x in zip(*(q.true_per_pos for q in counted))])
        per_cycle = (tokens - len(counted)) / sum(q.measured_cycles or 0 for q in counted)
        try:
            rc.fitted_alpha = chain_alpha(per_cycle, steps)
        except SpecModelError:
            rc.fitted_alpha = None
        rc.realized_alpha = right / checked if checked else None
    return rc, draft


def _padded(recorded: Any, steps: int) -> list[int] | None:
    """A request's recorded per-position counts up to ``steps`` (SGLang's histogram stops at the largest count seen:
    the positions after it accepted nothing); None when not recorded, and as recorded when longer than steps."""
    if not isinstance(recorded, list):
        return None
    return [int(x) for x in recorded] + [0] * (steps - len(recorded))


def _unchecked_reason(run: Run) -> str | None:
    """Why a run of known-truth models cannot be checked from its summary alone: what the client could not use (its
    known_truth_problems), or a speculative run recorded without its draft's truth; None when it can be."""
    if run.known_truth_problems:
        return "; ".join(run.known_truth_problems)
    view = speculative_view(run.server_args)
    if view.algorithm and not (run.known_truth or {}).get("draft"):
        where = f"{Path(view.draft_model) / kt.FILE}" if view.draft_model else f"{view.algorithm} (no draft model)"
        return f"{where}: not recorded: the run speculates, but its draft has no truth, so its cycles are not checked"
    return None


def check(exp: Experiment) -> TruthReport | None:
    """The known-truth check of every ok run whose summary carries known truth; None when no run's does or names a
    problem with it. A run that cannot be checked (an unusable known_truth.json, a draft without truth, a pooled
    store that is gone) is listed in ``unchecked`` with the file that stopped it, never dropped in silence."""
    from specab.results.store import Store
    skipped = {}
    for a in exp.arms:
        departs = engines.output_departures(a.server_args, a.env)
        if departs:
            skipped[a.name] = "; ".join(departs)
    runs = [r for r in exp.runs if r.ok and (r.known_truth or r.known_truth_problems) and r.arm not in skipped]
    if not runs:
        return None
    rep = TruthReport(skipped={a: why for a, why in skipped.items() if any(r.arm == a for r in exp.runs)})
    why: dict[str, list[Run]] = {}
    for r in runs:
        reason = _unchecked_reason(r)
        if reason is not None:
            why.setdefault(reason, []).append(r)
    # each run's request rows from its own store (a pooled experiment's come from several)
    by_store, gone = exp.stores_of(r for r in runs if r.known_truth and not r.known_truth_problems)
    sources = exp.meta.get("sources") or {}
    for r in gone:
        path = sources.get(r.seq, (exp.root / "results.sqlite" if exp.root is not None else None, r.seq))[0]
        why.setdefault(f"{path or 'the experiment'}: the store these runs were read from is missing: their "
                       f"requests cannot be checked against the truth", []).append(r)
    rows: dict[int, list[dict[str, Any]]] = {}
    for path, seqs in by_store.items():
        store = Store.open(path)
        try:
            rows.update({seq: store.requests(there) for seq, there in seqs})
        finally:
            store.close()
    rep.unchecked = [Unchecked([r.run_id for r in rs], list(dict.fromkeys(r.arm for r in rs)), reason)
                     for reason, rs in why.items()]
    runs = [r for r in runs if r.seq in rows and _unchecked_reason(r) is None]
    drafts: dict[str, tuple[kt.DraftTruth, list[tuple[int, int]]]] = {}
    for run in runs:
        try:
            rc, draft = _check_run(run, {"known_truth": run.known_truth}, rows[run.seq])
        except kt.KnownTruthError as exc:
            rep.unchecked.append(Unchecked([run.run_id], [run.arm], f"bench_summary.json of run {exc}"))
            continue
        rep.runs.append(rc)
        if draft is not None and rc.draft:
            reqs = drafts.setdefault(rc.draft, (draft, []))[1]
            for q in rc.requests:
                if (q.prompt_last_token, q.tokens) not in reqs:
                    reqs.append((q.prompt_last_token, q.tokens))
    for name in dict.fromkeys(r.arm for r in rep.runs):
        rs = [r for r in rep.runs if r.arm == name]
        def mean(vals: list[float | None]) -> float | None:
            v = [x for x in vals if x is not None]
            return sum(v) / len(v) if v else None
        rep.arms.append(ArmCheck(name, rs[0].steps, len(rs), mean([r.measured_tau for r in rs]),
                                 mean([r.true_tau for r in rs]), mean([r.fitted_alpha for r in rs]),
                                 mean([r.realized_alpha for r in rs]), rs[0].density, rs[0].p))
    for name, (draft, reqs) in drafts.items():
        out = {}
        for k in range(1, 7):
            ts = kt.run_truth(draft, reqs, k)
            out[k] = sum(t.tokens for t in ts) / sum(t.cycles for t in ts)
        rep.true_tau_by_steps[name] = out
    return rep
