"""One server per instance in the statistics (docs/statistics.md, "One server per instance"): on the simulator's
timing model (tests/analysis/instance_study.py), a load comparison within an instance loses the instance's effect,
a speedup at one load keeps its width, and the sweep costs less than half the GPU-minutes."""
from __future__ import annotations

from specab.analysis.cost import economics
from specab.analysis.measures import stats
from specab.sim.profile import load_profile
from tests.analysis.instance_study import Design, run_study, simulate, with_instance_cv


def test_within_an_instance_the_load_trend_loses_the_instance_effect_and_the_speedups_keep_their_width():
    profile = with_instance_cv(load_profile("h200-known-truth"), 0.05)       # the H200's restart spread
    res = run_study(8, profile, Design(blocks=3, requests=32))
    per_run, per_instance = res["per-run"]["tallies"], res["per-instance"]["tallies"]
    for trend in ("baseline c8/c1", "baseline c32/c1", "eagle3 c8/c1"):
        assert per_instance[trend].width_pct < per_run[trend].width_pct / 4, (trend, per_run[trend].width_pct,
                                                                              per_instance[trend].width_pct)
    for load in ("speedup c1", "speedup c8", "speedup c32"):
        assert 0.6 < per_instance[load].width_pct / per_run[load].width_pct < 1.6, load
    assert res["per-instance"]["gpu_minutes"] < 0.5 * res["per-run"]["gpu_minutes"]


def test_load_ratio_counts_the_pairs_that_shared_a_server_and_the_cost_counts_the_starts():
    profile = load_profile("h200-known-truth")
    for server, shared, starts in (("per-run", 0, 18), ("per-instance", 3, 6)):
        exp, _ = simulate(profile, server, 7, Design(blocks=3, requests=8))
        lr = stats.load_ratio(exp, "baseline-c8", "baseline-c1")
        assert len(lr.ratios) == 3 and lr.shared == shared and lr.ci is not None
        assert lr.to_dict()["shared_instance"] == shared
        # the verdict cost's restarts: a run that continued its instance's server is none
        assert sum(economics.spend(exp).restarts_per_arm.values()) == starts
