"""tests/conftest.py's lanes name real modules: a module renamed or moved would otherwise silently leave the
waiting lane (and run on a computing worker) or lose its early start."""
from __future__ import annotations

from pathlib import Path

from tests import conftest

REPO = Path(__file__).resolve().parents[2]


def test_every_module_the_lanes_name_exists_and_is_listed_once() -> None:
    for named in (conftest.LONG_MODULES, conftest.WAITING_MODULES):
        assert [m for m in named if not (REPO / m).is_file()] == []
        assert len(set(named)) == len(named), "a module is listed twice"
