"""docs/reliability.md lists every numbered fault and bad input with tests that exist."""
from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "reliability.md"


def _rows() -> dict[int, str]:
    rows = {}
    for line in DOC.read_text().splitlines():
        m = re.match(r"\|\s*(\d+)\s*\|", line)
        if m:
            rows[int(m.group(1))] = line
    return rows


def _test_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}


def test_every_item_has_a_row_and_every_named_test_exists():
    rows = _rows()
    assert sorted(rows) == list(range(1, 20)), sorted(rows)
    for item, line in rows.items():
        refs = re.findall(r"`(tests/[\w/]+\.py)::(test_\w+)`", line)
        assert refs, f"item {item} names no test"
        for path, name in refs:
            assert name in _test_names(REPO / path), f"item {item}: {path}::{name} does not exist"


def test_every_reliability_test_is_named_after_its_item_and_listed():
    listed = DOC.read_text()
    for f in Path(__file__).parent.glob("test_*.py"):
        if f.name == Path(__file__).name:
            continue
        for name in _test_names(f):
            m = re.match(r"test_item(\d\d)_", name)
            assert m, f"{f.name}::{name} is not named after its item (test_itemNN_...)"
            assert f"tests/reliability/{f.name}::{name}" in listed, f"{name} is missing from {DOC.name}"


def test_integrity_rows_name_tests_that_exist():
    rows = [line for line in DOC.read_text().splitlines() if re.match(r"\|\s*20\.\d+\s*\|", line)]
    assert [r.split("|")[1].strip() for r in rows] == ["20.1", "20.1", "20.1", "20.1", "20.2", "20.3", "20.4", "20.5", "20.5", "20.6", "20.7", "20.8", "20.9"]
    for line in rows:
        for path, name in re.findall(r"`(tests/[\w/]+\.py)::(test_\w+)`", line):
            assert name in _test_names(REPO / path), f"{path}::{name} does not exist"
