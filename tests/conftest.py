"""Test-session wide settings: the order in which modules start.

`make test` runs the suite on two pytest-xdist workers, one whole module per worker at a time
(`--dist loadfile --no-loadscope-reorder`). The modules below take minutes each (see the
`--durations` table CI prints), so they start first: a long module that starts last would leave one
worker idle while the other finishes it. The order changes nothing else: tests within a module keep
their order, and every test makes its own nodes, ports and directories.
"""
from __future__ import annotations

import pytest

# longest first, from CI's --durations table (seconds of the whole module, session 2)
LONG_MODULES = (
    "tests/scale/test_fleet.py",               # ~400 s: a fleet and the same blocks one after another
    "tests/driver/test_queue.py",              # ~170 s
    "tests/driver/test_e2e_sim.py",            # ~125 s
    "tests/analysis/test_e2e_rules.py",        # ~125 s
    "tests/scale/test_multinode.py",           # ~110 s
    "tests/scale/test_abtest_multinode.py",    # ~75 s
    "tests/reliability/test_ssh_faults.py",
    "tests/reliability/test_interrupt.py",
)


def _rank(item: pytest.Item) -> int:
    path = item.nodeid.split("::", 1)[0]
    return LONG_MODULES.index(path) if path in LONG_MODULES else len(LONG_MODULES)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=_rank)      # stable: the rest keep pytest's order
