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


def test_burn_in_runs_come_first_in_block_ones_order_and_leave_the_measured_plan_as_it_was():
    p = make_plan(ARMS, 2, seed=7, burn_in=6)
    burn, measured = p[:6], p[6:]
    order = block_order(ARMS, 7, 1)
    assert [(r.seq, r.block, r.arm, r.position, r.burn_in) for r in burn] == [
        (i + 1, 1, order[i % 4], i + 1, True) for i in range(6)]          # the arms in turn, cycling
    assert [r.run_id for r in burn] == [f"{i + 1:03d}-{order[i % 4]}" for i in range(6)]
    plain = make_plan(ARMS, 2, seed=7)
    assert not any(r.burn_in for r in measured)
    assert [(r.block, r.arm, r.position) for r in measured] == [(r.block, r.arm, r.position) for r in plain]
    assert [r.seq for r in measured] == [r.seq + 6 for r in plain]
    assert make_plan(ARMS, 2, seed=7, burn_in=0) == plain
    with pytest.raises(ValueError, match="burn_in"):
        make_plan(ARMS, 1, seed=1, burn_in=-1)


def test_a_fleets_burn_in_goes_before_each_hosts_first_block_on_that_host():
    from specab.driver.fleet import assign_blocks
    p = make_plan(ARMS[:2], 4, seed=3, burn_in=1, burn_in_blocks=3)
    per_host = assign_blocks(p, ["h1", "h2", "h3"])
    for host, runs in per_host.items():
        assert runs[0].burn_in and not any(r.burn_in for r in runs[1:]), (host, runs)
        assert runs[0].block == runs[1].block                      # the block it precedes, on the host that runs it
    # a fleet of more hosts than blocks burns in only the hosts that run a block
    assert sum(r.burn_in for r in make_plan(ARMS[:2], 2, seed=3, burn_in=1, burn_in_blocks=3)) == 2


def test_a_planned_burn_in_run_reads_back_from_a_store_row():
    from specab.config.plan import PlannedRun
    r = make_plan(ARMS, 1, seed=1, burn_in=1)[0]
    assert PlannedRun.from_row(r.to_json()) == r
    assert PlannedRun.from_row({k: v for k, v in r.to_json().items() if k != "burn_in"}).burn_in is False
