"""Issue 5 Must show: against the simulator's timing model (drift and jitter on), the interleaved
design's 95% CI covers the true speedup in >= 90% of seeds; the blocked design shows the bias."""
from specab.sim.profile import load_profile

from tests.analysis.coverage_study import Design, run_study, with_drift


def test_interleaved_interval_covers_the_true_speedup_and_blocked_is_biased():
    profile = load_profile("default")
    assert profile.noise.drift_pct_per_hour != 0 and profile.noise.step_cv > 0 and profile.noise.instance_cv > 0
    truth, res = run_study(seeds=40, profile=profile, design=Design())
    inter, blocked = res["interleaved"], res["blocked"]
    assert inter.intervals == 120
    assert inter.coverage >= 0.90, inter
    assert abs(inter.mean_bias_pct) < 0.5, inter          # drift cancels within blocks
    # blocked: every arm's runs come after the baseline's, so the drift is read as a slowdown
    assert blocked.mean_bias_pct < -0.6 and abs(blocked.mean_bias_pct) > 3 * abs(inter.mean_bias_pct), blocked
    assert blocked.coverage < inter.coverage


def test_blocked_design_fails_under_seed_like_drift():
    # the seed saw the baseline move 89 -> 82 (~8 %) between sessions: -4 %/h over a 2 h experiment
    _, res = run_study(seeds=20, profile=with_drift(load_profile("default"), -4.0), orders=("blocked",))
    assert res["blocked"].coverage < 0.5 and res["blocked"].mean_bias_pct < -2.5, res["blocked"]
