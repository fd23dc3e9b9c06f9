"""Statistics on runs: per-arm intervals, paired speedup, drift, hosts, sequential stopping."""
import math

import numpy as np
import pytest

from specab.analysis.measures import stats
from tests.analysis import factory as F


def test_t_quantiles_match_tables():
    assert stats.t_ppf(0.975, 1) == pytest.approx(12.706, abs=1e-3)
    assert stats.t_ppf(0.975, 4) == pytest.approx(2.776, abs=1e-3)
    assert stats.t_ppf(0.975, 30) == pytest.approx(2.042, abs=1e-3)


def test_bootstrap_is_seeded_and_reproducible():
    v = [1.0, 1.2, 0.9, 1.1, 1.05, 0.97]
    a, b = stats.bootstrap_ci(v, seed=3), stats.bootstrap_ci(v, seed=3)
    assert (a.lo, a.hi) == (b.lo, b.hi)
    assert a.lo < np.mean(v) < a.hi


def test_arm_interval_is_over_runs_not_pooled_requests():
    # runs differ by ~3 % (instance noise), requests within a run by 0.3 %: a pooled-request
    # interval would be far too narrow; the run-level one must reflect the run spread
    exp = F.experiment({"baseline": 82.2, "eagle3-s2": 60.5}, blocks=8, run_cv=0.03, seed=5)
    st = stats.arm_stats(exp, "baseline")
    run_vals = [r.tok_s for r in exp.runs_of("baseline")]
    sem_runs = np.std(run_vals, ddof=1) / math.sqrt(len(run_vals))
    ci = st.tok_s_run.ci
    assert st.tok_s_run.n == 8 and st.requests == 64
    assert (ci.hi - ci.lo) / 2 > 1.5 * sem_runs        # at least a ~95 % interval over runs
    reqs = [q.decode_tok_s for r in exp.runs_of("baseline") for q in r.measured]
    sem_pooled = np.std(reqs, ddof=1) / math.sqrt(len(reqs))
    assert (ci.hi - ci.lo) / 2 > 3 * 1.96 * sem_pooled * 0.5


def test_an_arm_interval_over_two_runs_is_the_geometric_means_and_never_below_zero():
    # two runs 57 % apart (51 and 80 tok/s): the linear t interval (12.7 standard errors) reaches below zero tok/s; the interval is
    # taken on the logs, recomputed here with scipy's t quantile
    from scipy.stats import t
    exp = F.experiment({"baseline": 82.2, "eagle3-s2": 60.5}, blocks=2, run_cv=0.2, seed=12)
    v = [r.tok_s for r in exp.runs_of("baseline")]
    linear = np.mean(v) - t.ppf(0.975, 1) * np.std(v, ddof=1) / math.sqrt(2)
    logs = np.log(v)
    h = t.ppf(0.975, 1) * np.std(logs, ddof=1) / math.sqrt(2)
    ci = stats.arm_stats(exp, "baseline").tok_s_run.ci
    assert linear < 0 < ci.lo
    assert (ci.estimate, ci.lo, ci.hi) == pytest.approx(tuple(np.exp([logs.mean(), logs.mean() - h, logs.mean() + h])))


def test_paired_speedup_of_the_seed_is_slower_with_a_covering_interval():
    exp = F.experiment({"baseline": 82.2, "eagle3-s2": 60.5}, blocks=6, accept={"eagle3-s2": 2.1})
    sp = stats.paired_speedup(exp, "eagle3-s2")
    assert len(sp.ratios) == 6
    assert sp.ci.lo < 60.5 / 82.2 < sp.ci.hi
    assert sp.verdict.startswith("slower")
    a = stats.arm_stats(exp, "eagle3-s2")
    assert a.accept_len.mean == pytest.approx(2.1, rel=0.02)
    assert not a.accept_len_disagrees
    assert a.cuda_graph_share == 1.0


def test_verdicts_faster_and_no_detectable_difference():
    fast = F.experiment({"baseline": 82.2, "eagle3-s2": 94.0}, blocks=6)
    assert stats.paired_speedup(fast, "eagle3-s2").verdict.startswith("faster")
    same = F.experiment({"baseline": 82.2, "eagle3-s2": 82.2}, blocks=6, run_cv=0.02)
    assert stats.paired_speedup(same, "eagle3-s2").verdict.startswith("no detectable difference")


def test_accept_length_disagreeing_with_the_log_is_flagged():
    def tweak(run, arm):
        if arm.is_spec:
            run.log.accept_len_mean = 2.6
    exp = F.experiment({"baseline": 82.2, "eagle3-s2": 60.5}, blocks=3, accept={"eagle3-s2": 2.1}, tweak=tweak)
    assert stats.arm_stats(exp, "eagle3-s2").accept_len_disagrees


def test_drift_beyond_noise_is_reported_with_its_size():
    exp = F.experiment({"baseline": 89.0, "eagle3-s2": 60.5}, blocks=8, drift_per_run=-0.005, run_cv=0.003)
    d = stats.drift(exp)
    assert d.beyond_noise and d.slope_per_hour < 0
    # 16 runs of 300 s, -0.5 % per run: about -7 % between the first and last baseline run
    assert -0.09 < d.change_rel < -0.05
    assert "moved" in d.message and not d.exposed
    clean = stats.drift(F.experiment({"baseline": 82.2, "eagle3-s2": 60.5}, blocks=8, run_cv=0.003))
    assert not clean.beyond_noise and "no trend" in clean.message


def test_blocked_design_is_flagged_as_exposed_and_biased_by_drift():
    true = 60.5 / 82.2
    blocked = F.experiment({"baseline": 82.2, "eagle3-s2": 60.5}, blocks=6, order="blocked",
                           drift_per_run=-0.005)
    assert stats.drift(blocked).exposed and "blocked order" in stats.drift(blocked).message
    sp = stats.paired_speedup(blocked, "eagle3-s2")
    assert not sp.ci.lo < true < sp.ci.hi          # drift leaks into the ratio
    inter = F.experiment({"baseline": 82.2, "eagle3-s2": 60.5}, blocks=6, drift_per_run=-0.005)
    sp = stats.paired_speedup(inter, "eagle3-s2")
    assert sp.ci.lo < true < sp.ci.hi


def test_host_is_a_blocking_factor():
    def slow_host(run, arm):
        if run.host == "node-b":          # node-b is 15 % slower for every arm
            for q in run.requests:
                q.decode_tok_s *= 0.85
    exp = F.experiment({"baseline": 82.2, "eagle3-s2": 60.5}, blocks=4, hosts=("node-a", "node-b"),
                       tweak=slow_host)
    sp = stats.paired_speedup(exp, "eagle3-s2")
    assert len(sp.ratios) == 8 and {h for h, _ in sp.blocks} == {"node-a", "node-b"}
    assert sp.ci.lo < 60.5 / 82.2 < sp.ci.hi
    assert sp.ci.half_width_rel < 0.01          # the host difference cancels within blocks
    res = stats.analyse(exp)
    assert set(res.host_speedups) == {"node-a", "node-b"}


def _blocks_until_stop(run_cv: float, target: float, max_repeats: int, seed: int) -> tuple[int, str]:
    for n in range(1, max_repeats + 1):
        exp = F.experiment({"baseline": 82.2, "eagle3-s2": 60.5, "eagle3-s3": 60.0}, blocks=n,
                           run_cv=run_cv, seed=seed)
        more, why = stats.decide_more_blocks(exp, target, max_repeats)
        if not more:
            return n, why
    raise AssertionError(f"decide_more_blocks asked for block {max_repeats + 1} beyond --max-repeats")


def test_sequential_stopping_low_noise_stops_earlier_and_never_beyond_max():
    low, why_low = _blocks_until_stop(0.003, 0.02, 12, seed=2)
    high, why_high = _blocks_until_stop(0.04, 0.02, 12, seed=2)
    assert low < high <= 12
    assert "within" in why_low
    assert "--max-repeats 12" in why_high or "within" in why_high
    capped, why = _blocks_until_stop(0.10, 0.005, 5, seed=2)
    assert capped == 5 and "max-repeats 5" in why and "not met" in why
