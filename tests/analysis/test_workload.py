"""The workload in the report: its label, the answers' real lengths and the per-category table, checked against the
requests they are computed from (tests/analysis/factory.py's experiments with categories assigned)."""
from __future__ import annotations

import math
import statistics

import numpy as np
import pytest

from specab.analysis.measures import workload
from specab.analysis.render import report
from specab.analysis.evidence.model import Arm, Run
from tests.analysis import factory

FILE = {"kind": "file", "path": "/data/prompts.jsonl", "sha256": "sha256:ab12", "records": 2,
        "categories": ["chat", "code"]}


def _categorised(blocks: int, ignore_eos: bool = False, code_factor: float = 1.0):
    """Even requests are code, odd ones chat; a spec arm's code requests decode code_factor times as fast, and
    under ignore_eos false a third of the answers stop early."""
    def tweak(run: Run, arm: Arm) -> None:
        run.workload = dict(FILE, ignore_eos=ignore_eos)
        for q in run.requests:
            q.category = "code" if q.i % 2 == 0 else "chat"
            q.finish_reason = "stop" if not ignore_eos and q.i % 3 == 0 else "length"
            if q.finish_reason == "stop":
                q.output_tokens = 40 + q.i
            if arm.is_spec and q.category == "code":
                q.decode_tok_s *= code_factor
    return factory.experiment({"baseline": 80.0, "eagle3-s2": 100.0}, blocks=blocks, tweak=tweak)


def _expected_ratios(exp, cat: str) -> list[float]:
    base = {r.block: r for r in exp.runs_of("baseline")}
    out = []
    for r in sorted(exp.runs_of("eagle3-s2"), key=lambda r: r.block):
        med = [statistics.median(q.decode_tok_s for q in x.measured if q.category == cat) for x in (r, base[r.block])]
        out.append(med[0] / med[1])
    return out


def test_per_category_rows_are_the_requests_paired_within_blocks() -> None:
    exp = _categorised(blocks=3, code_factor=1.5)
    rows = {r.category: r for r in workload.category_rows(exp, "eagle3-s2")}
    assert set(rows) == {"chat", "code"}
    for cat, row in rows.items():
        reqs = [q for r in exp.runs_of("eagle3-s2") for q in r.measured if q.category == cat]
        assert row.requests == len(reqs) == 12
        assert row.accept_len_median == statistics.median(q.accept_len for q in reqs)
        assert row.accept_len_mean == pytest.approx(statistics.fmean(q.accept_len for q in reqs), rel=1e-15)
        assert row.tok_s_median == statistics.median(q.decode_tok_s for q in reqs)
        ratios = _expected_ratios(exp, cat)
        assert row.ratios == ratios
        assert row.speedup == pytest.approx(math.exp(statistics.fmean(np.log(ratios))), rel=1e-12)
        assert row.ci is not None and row.ci.lo <= row.speedup <= row.ci.hi
    # the code requests' 1.5x shows in their category only
    assert rows["code"].speedup == pytest.approx(1.5 * rows["chat"].speedup, rel=0.02)


def test_one_block_gives_the_ratio_and_says_there_is_no_interval() -> None:
    exp = _categorised(blocks=1)
    rows = workload.category_rows(exp, "eagle3-s2")
    assert all(r.ci is None and r.speedup == r.ratios[0] for r in rows)
    md = report.to_markdown(report.build_report(exp, plots=False))
    assert "(interval: none, 1 block)" in md and "### Per category: eagle3-s2 vs baseline" in md


def test_no_categories_no_table() -> None:
    exp = factory.experiment({"baseline": 80.0, "eagle3-s2": 100.0}, blocks=2)
    assert workload.category_rows(exp, "eagle3-s2") == []
    rep = report.build_report(exp, plots=False)
    assert "Per category" not in report.to_markdown(rep) and rep.data["workload"]["categories"] == {}


def test_labels_name_the_file_the_word_list_or_that_nothing_was_recorded() -> None:
    exp = _categorised(blocks=1)
    assert workload.label(exp) == "/data/prompts.jsonl (sha256:ab12, 2 records); ignore_eos false"
    for r in exp.runs:
        r.workload = {"kind": "synthetic", "ignore_eos": True}
    assert workload.label(exp) == "synthetic (seeded word list); ignore_eos true"
    for r in exp.runs:
        r.workload = None
    assert workload.label(exp).startswith("not recorded")
    assert workload.ignore_eos(exp) is None


def test_lengths_are_the_real_output_tokens_and_how_the_answers_ended() -> None:
    exp = _categorised(blocks=2)
    got = workload.lengths(exp, "eagle3-s2")
    toks = [q.output_tokens for r in exp.runs_of("eagle3-s2") for q in r.measured]
    assert (got.requests, got.median) == (len(toks), float(np.percentile(toks, 50)))
    assert (got.p10, got.p90) == (float(np.percentile(toks, 10)), float(np.percentile(toks, 90)))
    stops = sum(1 for r in exp.runs_of("eagle3-s2") for q in r.measured if q.finish_reason == "stop")
    assert (got.stopped, got.length, got.unknown) == (stops, len(toks) - stops, 0) and 0 < stops < len(toks)
    note = workload.length_note(exp, [workload.lengths(exp, a.name) for a in exp.arms])
    assert f"{2 * stops} of {2 * len(toks)} measured requests ended at the model's end" in note


def test_forced_continuations_are_named_with_ignore_eos_true() -> None:
    exp = _categorised(blocks=2, ignore_eos=True)
    rep = report.build_report(exp, plots=False)
    md = report.to_markdown(rep)
    assert "Acceptance was measured on forced continuations" in md and "bench.ignore_eos: false" in md
    assert rep.summary[0] == "Workload: /data/prompts.jsonl (sha256:ab12, 2 records); ignore_eos true."
    assert rep.data["workload"]["ignore_eos"] is True
    assert rep.data["workload"]["lengths"]["baseline"]["length"] == 16
