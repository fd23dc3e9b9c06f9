"""The driver's closing per-arm summary: its numbers are the analysis's (the report's), and when the analysis
cannot read the store the summary says why instead of printing other numbers."""
from __future__ import annotations

import io
from pathlib import Path

import pytest

from specab.analysis.evidence import model
from specab.analysis.measures import stats
from specab.driver import progress
from specab.results.store import Store
from tests.stores import copy_store

H200 = Path(__file__).resolve().parents[1] / "fixtures" / "known-truth" / "h200" / "known-truth-h200-20261204-125956"


def _cells(text: str, arm: str) -> list[str]:
    line = next(x for x in text.splitlines() if x.startswith(f"│ {arm} "))
    return [c.strip() for c in line.strip("│").split("│")]


def test_the_summary_prints_the_analysis_numbers_the_h200_run_printed(tmp_path: Path) -> None:
    """The store of the `--target-ci 2%` run on the H200; its driver printed this table when it ended."""
    d = copy_store(H200, tmp_path / H200.name)
    out = io.StringIO()
    progress.print_summary(Store.open(d), out)
    recorded = (H200 / "driver-resume.out").read_text()
    # the recorded table's columns, then the outputs column added since: the known-truth outputs, identical; the
    # interval of run tok/s (column 5) is taken on the logs since, the geometric mean's, and is the analysis's
    res = stats.analyse(model.load_store(d))
    for arm in ("baseline", "eagle3"):
        now, then = _cells(out.getvalue(), arm), _cells(recorded, arm)
        assert now[:5] + now[6:-1] == then[:5] + then[6:]
        ci = res.arms[arm].tok_s_run.ci
        assert now[5] == f"[{ci.lo:.1f}, {ci.hi:.1f}]" and ci.method.endswith(" of logs")
    assert _cells(out.getvalue(), "eagle3")[5] == "[813.8, 869.3]"        # recorded [814.1, 868.8], the linear one
    assert _cells(out.getvalue(), "eagle3")[-2:] == ["1.976 [1.892, 2.057]", "266/266 identical"]
    assert _cells(out.getvalue(), "baseline")[-1] == "-"
    assert "no statistics" not in out.getvalue()


def test_a_store_the_analysis_cannot_read_gets_its_counts_and_the_reason(tmp_path: Path, monkeypatch) -> None:
    d = copy_store(H200, tmp_path / H200.name)

    def unreadable(_e):
        raise model.AnalysisError("runs/x/001-baseline/bench.jsonl:3: not a bench.jsonl record")
    monkeypatch.setattr(stats, "analyse", unreadable)
    out = io.StringIO()
    progress.print_summary(Store.open(d), out)
    text = out.getvalue()
    assert _cells(text, "baseline") == ["baseline", "5", "0", "1", "-", "-", "-", "-", "-"]
    assert _cells(text, "eagle3") == ["eagle3", "6", "0", "0", "-", "-", "-", "-", "-"]
    assert "no statistics: runs/x/001-baseline/bench.jsonl:3: not a bench.jsonl record" in text


def test_a_fault_in_the_analysis_is_not_hidden_behind_the_summary(tmp_path: Path, monkeypatch) -> None:
    d = copy_store(H200, tmp_path / H200.name)

    def broken(_e):
        raise AttributeError("'Interval' object has no attribute 'low'")
    monkeypatch.setattr(stats, "analyse", broken)
    with pytest.raises(AttributeError):
        progress.print_summary(Store.open(d), io.StringIO())
