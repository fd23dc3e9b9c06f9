"""Plan: every block runs every arm once in a seeded order; blocked order for comparison."""
from __future__ import annotations

from collections import Counter

import pytest

from specab.config.plan import block_order, make_plan

ARMS = ["baseline", "eagle3-s1-k1-d2", "eagle3-s2-k1-d3", "eagle3-s3-k1-d4"]


def test_interleaved_blocks_contain_every_arm_once_and_are_seeded():
    p = make_plan(ARMS, 3, seed=7)
    assert [r.seq for r in p] == list(range(1, 13))
    for b in (1, 2, 3):
        assert sorted(r.arm for r in p if r.block == b) == sorted(ARMS)
    assert make_plan(ARMS, 3, seed=7) == p
    orders = {tuple(block_order(ARMS, s, 1)) for s in range(20)}
    assert len(orders) > 5            # the seed really changes the order
    assert p[0].run_id == f"001-{p[0].arm}"


def test_blocks_do_not_depend_on_how_many_are_planned():
    assert make_plan(ARMS, 2, seed=3) == make_plan(ARMS, 5, seed=3)[:8]
    extra = make_plan(ARMS, 1, seed=3, first_block=3, first_seq=9)
    assert extra == make_plan(ARMS, 3, seed=3)[8:]


def test_baseline_is_not_always_first():
    firsts = Counter(make_plan(ARMS, 40, seed=1)[i * 4].arm for i in range(40))
    assert len(firsts) == 4


def test_blocked_order_runs_all_repeats_of_an_arm_together():
    p = make_plan(ARMS, 2, seed=1, order="blocked")
    assert [r.arm for r in p] == [a for a in ARMS for _ in range(2)]
    assert [r.block for r in p[:2]] == [1, 2]


def test_bad_inputs():
    with pytest.raises(ValueError):
        make_plan(ARMS, 0, seed=1)
    with pytest.raises(ValueError):
        make_plan(["a", "a"], 1, seed=1)
