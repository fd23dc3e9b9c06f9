"""The report of three fixed experiments equals its golden files (what they are, how they are made and when they
may be regenerated: tests/bench/report_golden.py's docstring).

report.md byte for byte, report.json's numbers to 1e-12 relative, the plots' names: a difference is a change to
what the report says, and is a defect unless the commit meant it (then it regenerates the goldens and says so).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.bench import report_golden as G

GOLDEN = Path(__file__).with_name("data") / "report_golden"
REGEN = "if the report's content changed on purpose: .venv/bin/python -m tests.bench.report_golden --write " \
        "tests/bench/data/report_golden"

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return G.build(tmp_path_factory.mktemp("golden"))


def _diff(a, b, path="$") -> list[str]:
    """Differences between two JSON values; floats equal to 1e-12 relative (no change is expected at all)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}: key {k!r} only in {'golden' if k in a else 'new'}" for k in sorted(set(a) ^ set(b))]
        for k in sorted(set(a) & set(b)):
            out += _diff(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items in golden, {len(b)} now"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _diff(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, (int, float)) and not isinstance(b, bool):
        if math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12) or (math.isnan(a) and math.isnan(b)):
            return []
        return [f"{path}: golden {a!r}, now {b!r}"]
    return [] if a == b else [f"{path}: golden {a!r}, now {b!r}"]


@pytest.mark.parametrize("name", G.FIXTURES)
def test_report_equals_its_golden_files(built, name):
    out = G.outputs(built[name])
    golden_json = json.loads((GOLDEN / f"{name}.json").read_text())
    new_json = json.loads(json.dumps(out["json"], default=str))
    diffs = _diff(golden_json, new_json)
    assert not diffs, f"{name}: report.json differs from the golden report ({REGEN}):\n" + "\n".join(diffs[:30])
    assert out["md"] == (GOLDEN / f"{name}.md").read_text(), f"{name}: report.md differs ({REGEN})"
    # the five plots of every report, and the per-phase stacked bar where the fixture has phase metrics
    assert len(new_json["plots"]) == 5 + (name == "throttled")


def test_golden_fixtures_hold_the_cases_they_guard():
    """The golden files guard only the cases they contain: a quoted no-graph line, a throttled run, per-host
    speedups, a failed run, a time-scaled node, GPU samples of 8 GPUs, measured phases."""
    t = (GOLDEN / "throttled.md").read_text()
    assert "verify-without-cuda-graph" in t and "log: [2025-10-22" in t and "gpu-throttled" in t
    assert "accept-length-mismatch" in t
    # the per-phase section with rows (not only "not available on this engine"), both doctor rules on phases
    phases = t.split("## Where the cycle goes (measured)", 1)[1].split("\n## ", 1)[0]
    assert "| eagle3-s2 | 4 | 4.01 (" in phases and "| eagle3-s3 | 4 | 6.05 (" in phases, phases
    assert "not available on this engine" not in phases and "report/cycle_phases.png" in phases
    assert "dominant-phase: verify 30.7 ms" in t and "phase-accounting: 16.7 ms" in t
    f = (GOLDEN / "fleet.md").read_text()
    assert "Speedup per host" in f and "Failed runs" in f and "SPECAB_SIM_TIME_SCALE 20" in f
    s = json.loads((GOLDEN / "scale.json").read_text())
    assert set(s["stats"]["arms"]) == {"baseline", "eagle3-s1", "eagle3-s2", "eagle3-s3"}
