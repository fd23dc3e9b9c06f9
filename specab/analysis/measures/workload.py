"""What the runs were measured on, and what that means for their numbers.

* the workload: the dataset file (path, sha256, records) or the seeded word list (synthetic), as every run's
  benchmark client recorded it in bench_summary.json (`Run.workload`);
* the answers' real lengths per arm (median, p10-p90) and how they ended: finish reason `stop` (the model's own
  end) or `length` (output_len reached). With `ignore_eos` true the engine never stops at its end-of-sequence token,
  so the client cannot see where an answer would have ended: every token after that point is a forced
  continuation, and the accept length was measured on it too;
* per category of a dataset, per arm compared with a baseline: requests, accept length (median and per-request
  mean), decode tok/s and the paired speedup, requests of one category paired within each block.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

import numpy as np

from specab.analysis.measures import stats
from specab.analysis.evidence.model import Experiment, Request, Run

SYNTHETIC_LABEL = "synthetic (seeded word list)"


# --------------------------------------------------------------------------- the workload's label

def describe(workload: dict) -> str:
    """One run's workload in words: the file with its hash and size, or the synthetic word list."""
    if workload.get("kind") == "file":
        n = workload.get("records")
        b = workload.get("builtin")
        what = (f"built-in {b.get('name')} ({b.get('package')} {b.get('version')}, " if isinstance(b, dict)
                else f"{workload.get('path')} (")
        return f"{what}{workload.get('sha256')}, {n} record{'' if n == 1 else 's'})"
    if workload.get("kind") == "synthetic":
        return SYNTHETIC_LABEL
    return f"unknown kind {workload.get('kind')!r}"


def label(exp: Experiment) -> str:
    """The experiment's workload for the report's header. Runs that recorded different workloads (a resume with a
    changed bench) are all named; runs whose client recorded none are said to be unrecorded."""
    seen = list(dict.fromkeys(describe(r.workload) for r in exp.runs if r.workload))
    if not seen:
        return "not recorded (the runs' benchmark client did not record its prompts' source)"
    eos = sorted({str(r.workload.get("ignore_eos")).lower() for r in exp.runs if r.workload})
    text = seen[0] if len(seen) == 1 else "runs differ: " + "; ".join(seen)
    # the sampling, where any run sampled (greedy runs say nothing: the label of a greedy experiment is unchanged)
    sampled = sorted({f"temperature {r.workload.get('temperature'):g}, top_p {r.workload.get('top_p', 1.0):g}"
                      for r in exp.runs if r.workload and (r.workload.get("temperature") or 0) > 0})
    return f"{text}; ignore_eos {', '.join(eos)}" + "".join(f"; {s}" for s in sampled)


def ignore_eos(exp: Experiment) -> bool | None:
    """True / False when every run that recorded its workload says so alike; None when unrecorded or mixed."""
    vals = {r.workload.get("ignore_eos") for r in exp.runs if r.workload}
    return vals.pop() if len(vals) == 1 and None not in vals else None


# --------------------------------------------------------------------------- output lengths

@dataclass
class Lengths:
    """One arm's measured answers: output tokens and how they ended."""
    arm: str
    requests: int                 # measured ok requests with an output token count
    median: float | None
    p10: float | None
    p90: float | None
    stopped: int                  # finish reason stop: the model ended the answer itself
    length: int                   # finish reason length: output_len reached (forced past the end with ignore_eos)
    unknown: int                  # no finish reason recorded

    def to_dict(self) -> dict:
        return asdict(self)


def _measured(runs: list[Run]) -> list[Request]:
    return [q for r in runs for q in r.measured]


def lengths(exp: Experiment, arm: str) -> Lengths:
    reqs = [q for q in _measured(exp.runs_of(arm)) if q.output_tokens is not None]
    toks = np.array([q.output_tokens for q in reqs], dtype=float)
    p10, med, p90 = (float(x) for x in np.percentile(toks, [10, 50, 90])) if len(toks) else (None, None, None)
    reasons = [q.finish_reason for q in reqs]
    return Lengths(arm=arm, requests=len(reqs), median=med, p10=p10, p90=p90, stopped=reasons.count("stop"),
                   length=reasons.count("length"), unknown=reasons.count(None))


def length_note(exp: Experiment, rows: list[Lengths]) -> str:
    """What the lengths say about the accept length: forced continuations (ignore_eos true), natural answers
    (false: how many ended early), or nothing known."""
    eos = ignore_eos(exp)
    n = sum(r.requests for r in rows)
    if eos is True:
        return ("bench.ignore_eos is true: the engine skipped its end-of-sequence token and every answer ran to "
                "output_len, so the client cannot see where the model would have stopped. Acceptance was measured on "
                "forced continuations past any natural end, where draft and target agree differently from real "
                "answers. To measure natural answers: bench.ignore_eos: false with a dataset of real prompts "
                "(bench.dataset).")
    if eos is False:
        stopped = sum(r.stopped for r in rows)
        return (f"bench.ignore_eos is false: answers end where the model ends them; {stopped} of {n} measured "
                f"requests ended at the model's end (finish reason stop) before output_len, the others reached it.")
    if not any(r.workload for r in exp.runs):
        return "Whether answers ran past the model's end (bench.ignore_eos) was not recorded."
    return "bench.ignore_eos differs between the runs (or some did not record it): read the lengths per arm."


# --------------------------------------------------------------------------- per category

@dataclass
class CategoryRow:
    """One category of one arm compared with its baseline."""
    arm: str
    baseline: str
    category: str
    requests: int                         # the arm's measured requests of this category
    accept_len_median: float | None       # over those requests' own accept lengths
    accept_len_mean: float | None         # per-request mean
    tok_s_median: float | None            # decode tok/s, median over the requests
    baseline_tok_s_median: float | None
    ratios: list[float]                   # per block: arm's category median tok/s / baseline's, same block
    speedup: float | None                 # geometric mean of the ratios
    ci: stats.Interval | None             # over blocks; None with fewer than two

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ci"] = self.ci.to_dict() if self.ci else None
        return d


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _tok_s(reqs: list[Request]) -> list[float]:
    return [q.decode_tok_s for q in reqs if q.decode_tok_s]


def _block_ratios(exp: Experiment, arm: str, baseline: str, category: str) -> list[float]:
    """Per block (and host) with both runs measured: the arm's median decode tok/s over the category's requests
    divided by the baseline's. Pairing within a block keeps the block's conditions (clocks, drift) out of it."""
    def tok_s(run: Run) -> float | None:
        return _median(_tok_s([q for q in run.measured if q.category == category]))
    return stats.block_ratios(exp, arm, baseline, tok_s)[0]


def _geo_ci(ratios: list[float], seed: int) -> tuple[float | None, stats.Interval | None]:
    ci = stats.ratio_ci(ratios, seed)
    return (ci.estimate if ci else ratios[0] if ratios else None), ci


def category_rows(exp: Experiment, arm: str, seed: int = stats.DEFAULT_SEED) -> list[CategoryRow]:
    """One row per category of the arm's measured requests (none when they carry no category)."""
    baseline = exp.baseline_of(arm)
    reqs = _measured(exp.runs_of(arm))
    base_reqs = _measured(exp.runs_of(baseline))
    rows = []
    for cat in sorted({q.category for q in reqs if q.category is not None}):
        mine = [q for q in reqs if q.category == cat]
        acc = [q.accept_len for q in mine if q.accept_len is not None]
        ratios = _block_ratios(exp, arm, baseline, cat)
        est, ci = _geo_ci(ratios, seed)
        rows.append(CategoryRow(
            arm=arm, baseline=baseline, category=cat, requests=len(mine), accept_len_median=_median(acc),
            accept_len_mean=statistics.fmean(acc) if acc else None, tok_s_median=_median(_tok_s(mine)),
            baseline_tok_s_median=_median(_tok_s([q for q in base_reqs if q.category == cat])),
            ratios=ratios, speedup=est, ci=ci))
    return rows
