"""Which baseline run scores which runs' outputs at temperature > 0 (specab/config/scoring.py): each baseline run
its own and its arms' earlier runs no earlier run of it scored; the runs after the last baseline run, none."""
from __future__ import annotations

from specab.config.plan import PlannedRun, make_plan
from specab.config.scoring import assign


def test_a_block_whose_baseline_runs_first_is_scored_by_the_next_block_s_baseline() -> None:
    # seed 0: block 1 baseline, s2, lossy; block 2 baseline, lossy, s2 (tests/driver/test_e2e_distribution.py)
    plan = make_plan(["baseline", "s2", "lossy"], 2, seed=0)
    assert [p.run_id for p in plan] == ["001-baseline", "002-s2", "003-lossy", "004-baseline", "005-lossy", "006-s2"]
    got = assign(plan, {"baseline": "baseline", "s2": "baseline", "lossy": "baseline"})
    assert got == {1: ["001-baseline"], 4: ["002-s2", "003-lossy", "004-baseline"]}      # 005, 006: none


def test_each_baseline_scores_only_its_own_arms() -> None:
    """Two conditions, each with its own baseline (an engine A/B, a matrix condition): a run goes to the next run of
    its own baseline, never to the other's."""
    plan = [PlannedRun(seq=i + 1, block=1, arm=a, position=i + 1) for i, a in enumerate(
        ["spec-a", "spec-b", "base-b", "base-a"])]
    got = assign(plan, {"base-a": "base-a", "spec-a": "base-a", "base-b": "base-b", "spec-b": "base-b"})
    assert got == {3: ["002-spec-b", "003-base-b"], 4: ["001-spec-a", "004-base-a"]}


def test_blocks_added_later_never_change_what_the_earlier_baselines_score() -> None:
    base = make_plan(["baseline", "s2"], 2, seed=3)
    more = base + make_plan(["baseline", "s2"], 1, seed=3, first_block=3, first_seq=5)
    first, later = assign(base, {"s2": "baseline"}), assign(more, {"s2": "baseline"})
    assert {k: v for k, v in later.items() if k <= 4} == first
