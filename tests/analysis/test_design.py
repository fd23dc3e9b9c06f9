"""The cost model, the variance components and the two-stage allocation (specab.analysis.cost.design)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from specab.analysis.cost import design

COST = design.RunCost(load_s=360, per_request_s=6, fixed_bench_s=12, dead_s=20, gpus=8)


def test_run_cost_counts_every_second_times_the_gpus():
    assert COST.restart_s == 392
    assert COST.run_s(8) == 392 + 48
    assert COST.gpu_s(8) == 8 * 440


@pytest.mark.parametrize("kw", [{"load_s": -1}, {"per_request_s": 0}, {"gpus": 0}, {"dead_s": math.nan}])
def test_run_cost_rejects_bad_numbers_with_the_field_named(kw):
    args = {"load_s": 1, "per_request_s": 1, **kw}
    with pytest.raises(design.DesignError, match=next(iter(kw))):
        design.RunCost(**args)


def _blocks(rng, n, m, instance, request):
    ratios, reqs = [], []
    for _ in range(n):
        a = rng.normal(0, instance) + rng.normal(0, request, m)
        b = rng.normal(0, instance) + rng.normal(0, request, m)
        ratios.append(float(np.median(a) - np.median(b)))
        reqs.append((a, b))
    return ratios, reqs


def test_components_recover_the_simulated_variances():
    rng = np.random.default_rng(1)
    ratios, reqs = _blocks(rng, 400, 20, instance=0.02, request=0.05)
    c = design.estimate_components(ratios, reqs)
    assert c.within == pytest.approx(2 * 0.05 ** 2, rel=0.05)      # both arms' request variance
    assert c.between == pytest.approx(2 * 0.02 ** 2, rel=0.25)     # both arms' instance variance
    assert c.between_df == 399


def test_components_without_blocks_use_the_default_between_and_a_prior_pools_by_df():
    rng = np.random.default_rng(2)
    ratios, reqs = _blocks(rng, 1, 10, 0.0, 0.05)
    c = design.estimate_components(ratios, reqs)
    assert c.between == design.DEFAULT_BETWEEN and "default between" in c.source
    prior = design.Components(between=0.001, within=0.01, between_df=10, within_df=10, source="history")
    ratios, reqs = _blocks(rng, 3, 10, 0.0, 0.05)
    pooled = design.estimate_components(ratios, reqs, prior=prior)
    assert pooled.between_df == 12 and "history" in pooled.source
    assert min(prior.within, 2 * 0.05 ** 2) * 0.5 < pooled.within < max(prior.within, 2 * 0.05 ** 2) * 1.5


def test_components_need_requests_or_a_prior():
    with pytest.raises(design.DesignError, match="prior"):
        design.estimate_components([0.1], [([1.0], [1.0])])


def test_request_noise_buys_longer_runs_and_instance_noise_more_restarts():
    req = design.Components(between=1e-5, within=0.0128)
    inst = design.Components(between=3e-4, within=2e-4)
    d_req = design.plan_design(req, COST, 0.02)
    d_inst = design.plan_design(inst, COST, 0.02)
    assert d_req.requests > 30 and d_req.blocks <= 7
    assert d_inst.requests <= 8 and d_inst.blocks >= 6
    for d, c in ((d_req, req), (d_inst, inst)):
        assert d.feasible and d.half_width <= 0.02
        assert d.gpu_s == pytest.approx(d.blocks * 2 * COST.gpu_s(d.requests))
        # the chosen design is the cheapest of every (blocks, requests) that meets the target
        for n in range(design.MIN_RESTARTS, 61):
            m = next((m for m in range(2, 401) if design.model_half_width(c, [m] * n) <= 0.02), None)
            assert m is None or n * 2 * COST.gpu_s(m) >= d.gpu_s - 1e-6
        assert d.gpu_s_low <= d.gpu_s <= d.gpu_s_high


def test_the_plan_is_cheaper_than_fixed_requests_per_run_when_requests_dominate():
    req = design.Components(between=1e-5, within=0.0128)
    d = design.plan_design(req, COST, 0.02)
    fixed_blocks = next(n for n in range(3, 200) if design.model_half_width(req, [8] * n) <= 0.02)
    assert d.gpu_s < 0.6 * fixed_blocks * 2 * COST.gpu_s(8)


def test_keep_requests_unless_the_saving_is_worth_it():
    inst = design.Components(between=3e-4, within=2e-4)
    kept = design.plan_design(inst, COST, 0.02, keep_requests=8)
    assert kept.requests == 8
    req = design.Components(between=1e-5, within=0.0128)
    assert design.plan_design(req, COST, 0.02, keep_requests=8).requests > 8


def test_instance_dominated_noise_with_costly_restarts_keeps_a_run_of_several_requests():
    """The bench's instance-dominated regime (docs/performance.md 3b): requests remove only 12 % of a block's
    variance at 8 per run, but a restart costs 392 s = 65 requests, so the textbook m* = sqrt(restart x within
    / (per-request x between)) is about 8, not the fewest requests: short runs need more restarts and cost more."""
    inst = design.Components(between=2 * 0.012 ** 2, within=2 * 0.01 ** 2, between_df=30, within_df=500)
    assert inst.within_share(8) == pytest.approx(0.12, abs=0.01)
    m_star = math.sqrt(COST.restart_s * design.MEDIAN_VAR_FACTOR * inst.within / (COST.per_request_s * inst.between))
    assert 7 < m_star < 10
    free = design.plan_design(inst, COST, 0.02)
    fewest = design.plan_design(inst, COST, 0.02, min_requests=2, max_requests=2)
    assert free.requests > 2 and free.gpu_s < fewest.gpu_s and fewest.blocks > free.blocks
    assert design.plan_design(inst, COST, 0.02, keep_requests=8).requests == 8


def test_infeasible_target_falls_back_to_the_most_restarts_and_says_why():
    huge = design.Components(between=0.01, within=0.0)
    d = design.plan_design(huge, COST, 0.02, max_blocks=10)
    assert not d.feasible and d.blocks == 10 and "between-instance" in d.reason


def test_next_step_minimum_blocks_model_gate_and_cap():
    c = design.Components(between=3e-4, within=2e-4, between_df=10, within_df=100)
    # too few blocks: more, whatever the interval says
    assert design.next_step(c, COST, 0.02, [8, 8], 0.01).more
    # 3 blocks, an interval far narrower than the model makes plausible (their variance < 5 % quantile): one more
    s3 = design.next_step(c, COST, 0.02, [8, 8, 8], 0.005)
    assert s3.more and "variance components expect" in s3.why
    # narrower than the model expects, but within chance (the model's own t interval at 3 blocks is +-4.6 %)
    assert design.model_half_width(c, [8] * 3) > 0.04
    assert not design.next_step(c, COST, 0.02, [8, 8, 8], 0.015).more
    # from MODEL_GATE_BELOW blocks on, the interval decides
    n = design.MODEL_GATE_BELOW
    assert not design.next_step(c, COST, 0.02, [8] * n, 0.019).more
    assert design.next_step(c, COST, 0.02, [8] * n, 0.021).more
    assert not design.next_step(c, COST, 0.02, [8] * 6, 0.05, max_blocks=6).more


def test_plan_with_done_blocks_counts_them():
    c = design.Components(between=1e-5, within=0.0128)
    done = [c.block_var(8)] * 2
    d = design.plan_design(c, COST, 0.02, done_var=done, done_gpu_s=2 * 2 * COST.gpu_s(8))
    assert d.blocks >= 3 and d.done_blocks == 2
    assert d.gpu_s == pytest.approx(2 * 2 * COST.gpu_s(8) + (d.blocks - 2) * 2 * COST.gpu_s(d.requests))


def test_the_experiments_requests_are_kept_unless_the_saving_survives_without_the_steps_of_whole_blocks():
    """At whole blocks, 4 blocks of 12 requests (495 GPU-min) look 16 % cheaper than the 5 blocks of 8 that the
    experiment's requests need just (587): a step of the block count, not a saving (the 4th block of 8 almost
    makes it). The design compares the two with the blocks as a real number and keeps the experiment's 8; in the
    bench's instance-dominated regime moving on such steps cost 0.5-1.2 % more than keeping them (docs/performance.md
    3b). A real saving (requests dominate) still moves them."""
    c = design.Components(between=2 * 0.012 ** 2 * 0.45, within=2 * 0.01 ** 2, between_df=6, within_df=500)
    free = design.plan_design(c, COST, 0.02)
    assert (free.blocks, free.requests) == (4, 12)
    five_of_8 = 5 * 2 * COST.gpu_s(8)
    assert five_of_8 > 1.1 * free.gpu_s and design.model_half_width(c, [8] * 4) < 0.021
    assert design.plan_design(c, COST, 0.02, keep_requests=8).requests == 8
    req = design.Components(between=1e-5, within=0.0128, between_df=6, within_df=500)
    assert design.plan_design(req, COST, 0.02, keep_requests=8).requests > 30


def test_the_early_stop_gate_guards_a_design_that_moved_the_requests_not_the_sequential_one():
    """Blocks far more alike than the components make plausible, after 3 blocks: refused when the design moved the
    requests per run (its plan of few long runs makes every stop an early one), let through when every block ran
    the experiment's requests (that is the sequential design, decision for decision, and its stop)."""
    c = design.Components(between=3e-4, within=2e-4, between_df=10, within_df=100)
    assert design.next_step(c, COST, 0.02, [8, 8, 8], 0.005).more                         # no experiment's m given
    assert not design.next_step(c, COST, 0.02, [8, 8, 8], 0.005, keep_requests=8).more    # the sequential stop
    moved = design.next_step(c, COST, 0.02, [8, 30, 30], 0.005, keep_requests=8)
    assert moved.more and "variance components expect" in moved.why


def test_an_unreachable_target_buys_the_most_precision_per_gpu_second_not_the_longest_runs():
    c = design.Components(between=3e-4, within=2e-4)
    d = design.plan_design(c, COST, 0.005, max_blocks=6, keep_requests=8)
    m_star = math.sqrt(COST.restart_s * design.MEDIAN_VAR_FACTOR * c.within / (COST.per_request_s * c.between))
    assert not d.feasible and d.blocks == 6 and d.requests == round(m_star) and "out of reach" in d.reason
