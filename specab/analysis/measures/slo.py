"""A run against the SLO: each term's percentile over its requests, whether the run met the SLO, which term bound,
and its goodput (docs/analysis.md, "SLO and capacity").

- a run meets a term when the term's percentile over the run's requests is within its target (ttft, tpot, e2e: one
  value per request; itl: every token's gap of every request), and meets the SLO when it meets every term;
- a request meets a term when its own value is within the target (itl: the term's percentile of its own per-token
  gaps); a value the request does not have (a one-token answer has no TPOT, a request delivered in a burst no
  inter-token timing) does not count against it. Goodput: the requests that met every term per second of the run's
  measured window (first request sent to last one finished);
- the margin of a term is log(observed / target) (0 at the target, > 0 beyond it); the run's margin is its largest,
  and the term that has it is the one that bound: the first to fail as the load grows.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from specab.analysis.evidence.model import Run
from specab.analysis.measures.latency import RequestTimes, RunTimes, percentile
from specab.config.slo import Slo, Term


@dataclass
class TermResult:
    term: Term
    observed_s: float | None          # the term's percentile over the run's requests (seconds)
    margin: float | None              # log(observed / target); None: nothing observed

    @property
    def met(self) -> bool | None:
        return None if self.margin is None else self.margin <= 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**self.term.to_dict(), "observed_s": self.observed_s, "margin": self.margin, "met": self.met}


@dataclass
class RunSlo:
    run_id: str
    terms: list[TermResult] = field(default_factory=list)
    good: int = 0                     # requests that met every term
    requests: int = 0
    goodput: float | None = None      # good requests per second of the measured window

    @property
    def margin(self) -> float | None:
        m = [t.margin for t in self.terms if t.margin is not None]
        return max(m) if m else None

    @property
    def met(self) -> bool | None:
        return None if self.margin is None else self.margin <= 0.0

    @property
    def bound(self) -> Term | None:
        """The term with the largest margin: the one that bound (or binds first as the load grows)."""
        have = [t for t in self.terms if t.margin is not None]
        return max(have, key=lambda t: t.margin).term if have else None   # type: ignore[arg-type, return-value]

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "terms": [t.to_dict() for t in self.terms], "met": self.met,
                "margin": self.margin, "bound": self.bound.key if self.bound else None, "good": self.good,
                "requests": self.requests, "goodput": self.goodput}


def request_meets(r: RequestTimes, term: Term) -> bool:
    v = percentile(r.itl_token_s, term.q) if term.metric == "itl_token_s" else getattr(r, term.metric)
    return v is None or v <= term.target_s


def evaluate(run: Run, times: RunTimes, slo: Slo) -> RunSlo:
    """The run against every term of the SLO, and its goodput."""
    out = RunSlo(run.run_id, requests=len(times.requests))
    for term in slo.terms:
        obs = times.percentile(term.metric, term.q)
        margin = math.log(obs / term.target_s) if obs is not None and obs > 0 else (None if obs is None else -math.inf)
        out.terms.append(TermResult(term, obs, margin))
    out.good = sum(1 for r in times.requests if all(request_meets(r, t) for t in slo.terms))
    w = run.window
    span = (w[1] - w[0]) * (run.time_scale or 1.0) if w else 0.0
    out.goodput = out.good / span if span > 0 else None
    return out
