"""`driver.py plan --target-ci`: the design by cost and today's design with expected GPU-minutes, before any run."""
from __future__ import annotations

import io
import re

from specab.driver import cli


def test_plan_with_target_ci_prints_both_designs_with_a_range():
    out = io.StringIO()
    assert cli.main(["plan", "--target-ci", "2%"], out=out) == 0
    text = out.getvalue()
    assert "design by cost for --target-ci 2.0%" in text and "simulator profile default" in text
    ranges = re.findall(r"expected ([\d.]+) GPU-minutes \(range ([\d.]+)-([\d.]+)\)", text)
    assert len(ranges) == 2                     # the design by cost, and what `run --target-ci` does now
    for est, lo, hi in ranges:
        assert float(lo) <= float(est) <= float(hi)
    assert "today's sequential design" in text


def test_plan_without_target_ci_prints_no_cost_design():
    out = io.StringIO()
    assert cli.main(["plan"], out=out) == 0
    assert "design by cost" not in out.getvalue()
