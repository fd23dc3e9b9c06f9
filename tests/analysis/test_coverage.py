"""Against the simulator's timing model (drift and jitter on), the interleaved
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


def _blocks_until_stop(profile, target: float, max_repeats: int, seed: int = 7) -> tuple[int, str]:
    from specab.analysis.measures import stats
    from tests.analysis.coverage_study import simulate_experiment, study_arms
    arms = study_arms((2, 3))
    for n in range(1, max_repeats + 1):
        exp = simulate_experiment(profile, arms, "interleaved", seed, Design(blocks=n))
        more, why = stats.decide_more_blocks(exp, target, max_repeats)
        if not more:
            return n, why
    raise AssertionError(f"decide_more_blocks asked for block {max_repeats + 1} beyond --max-repeats")


def test_sequential_stopping_on_simulator_profiles():
    """--target-ci 2%: a low-noise profile stops earlier than a high-noise one; never beyond --max-repeats."""
    import dataclasses
    base = load_profile("default")
    low = dataclasses.replace(base, noise=dataclasses.replace(base.noise, step_cv=0.005, instance_cv=0.001))
    high = dataclasses.replace(base, noise=dataclasses.replace(base.noise, step_cv=0.03, instance_cv=0.03))
    n_low, why_low = _blocks_until_stop(low, 0.02, 10)
    n_high, why_high = _blocks_until_stop(high, 0.02, 10)
    assert n_low < n_high <= 10, (why_low, why_high)
    assert "within" in why_low
    n_cap, why_cap = _blocks_until_stop(high, 0.002, 4)
    assert n_cap == 4 and "--max-repeats 4" in why_cap and "not met" in why_cap
