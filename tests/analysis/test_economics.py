"""GPU-seconds spent per run/arm/experiment and the profile's cost model (specab.analysis.cost.economics)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import yaml

from specab.analysis.cost import economics
from specab.analysis.evidence.model import Arm, Experiment, Request, Run
from specab.config.yamlfile import REPO_ROOT
from tests.stores import copy_store


def _exp(rng, blocks=4, m=6, failed_seq=None):
    arms = [Arm("baseline"), Arm("spec", server_args={"speculative_algorithm": "EAGLE3"}, baseline="baseline")]
    runs = []
    seq = 0
    for b in range(1, blocks + 1):
        for arm, mu in (("baseline", 80.0), ("spec", 60.0)):
            seq += 1
            reqs = [Request(i=k, decode_tok_s=float(mu * math.exp(rng.normal(0, 0.05)))) for k in range(m)]
            runs.append(Run(run_id=f"{seq:03d}-{arm}", arm=arm, seq=seq, block=b, status="failed" if seq == failed_seq
                            else "ok", server_args={"tp_size": 8}, requests=reqs, gpu_seconds=240.0))
    return Experiment(id="e", arms=arms, runs=runs)


def test_gpus_of_is_tp_times_pp():
    assert economics.gpus_of({"tp_size": 8}) == 8
    assert economics.gpus_of({"tp_size": 4, "pp_size": 2}) == 8
    assert economics.gpus_of({}) == 1 and economics.gpus_of({"tp_size": "x"}) == 1


def test_spend_sums_per_arm_counts_failed_runs_and_the_report_line_says_it():
    exp = _exp(np.random.default_rng(1), blocks=3, failed_seq=2)
    s = economics.spend(exp)
    assert s.total == pytest.approx(6 * 30 * 8) and s.failed == pytest.approx(30 * 8)
    assert s.per_arm == {"baseline": pytest.approx(720), "spec": pytest.approx(720)}
    assert s.restarts_per_arm == {"baseline": 3, "spec": 3}
    line = economics.cost_lines(exp)[0]
    assert line.startswith("Verdict cost: 24.0 GPU-minutes over 6 runs") and "failed runs" in line
    for r in exp.runs:                                # a store written before runs.gpu_seconds: not guessed
        r.gpu_seconds = None
    assert economics.spend(exp).runs == 0 and "not recorded" in economics.cost_lines(exp)[0]


def test_components_of_an_experiment_see_the_request_noise():
    exp = _exp(np.random.default_rng(2), blocks=30, m=20)
    c = economics.components_of(exp, "spec")
    assert c.within == pytest.approx(2 * 0.05 ** 2, rel=0.15) and c.between_df == 29


def test_profile_cost_of_the_realistic_profile_takes_minutes_to_load_and_speculation_loads_a_draft():
    prof = yaml.safe_load((REPO_ROOT / "specab/sim/profiles/realistic.yml").read_text())
    base = economics.profile_cost(prof, speculative=False, gpus=8, output_len=256, warmup=2)
    spec = economics.profile_cost(prof, speculative=True, gpus=8, output_len=256, warmup=2)
    assert base.load_s > 300 and spec.load_s > base.load_s
    assert base.per_request_s == pytest.approx(0.04 + 0.25 * 128 / 1000 + 256 * 0.01217, rel=0.01)
    fast = economics.profile_cost(prof, speculative=False, gpus=8, output_len=256, warmup=2, time_scale=10)
    assert fast.load_s == pytest.approx(base.load_s / 10)


def test_acceptance_makes_a_speculative_arms_requests_vary():
    # steps 2 at the default profile's acceptance: 1, 2 or 3 tokens per cycle with p 0.3, 0.3, 0.4
    cv2 = economics.acceptance_cv2([0.70, 0.5714], 2, 256)
    mean, var = 2.1, 0.3 + 4 * 0.3 + 9 * 0.4 - 2.1 ** 2
    assert cv2 == pytest.approx(var / mean ** 2 / (256 / mean), rel=1e-3)
    prof = yaml.safe_load((REPO_ROOT / "specab/sim/profiles/default.yml").read_text())
    plain = economics.profile_components(prof, 256)
    spec = economics.profile_components(prof, 256, spec_steps=2)
    assert spec.within > 10 * plain.within and spec.between == plain.between


def _noisy(rng, ms, *, instance=0.0, request=0.05, specs=("spec",), e2e=2.0):
    """Blocks with ms[b] measured requests per run (the design by cost's choice per block), each run a new instance."""
    arms = [Arm("baseline")] + [Arm(s, server_args={"speculative_algorithm": "EAGLE3"}, baseline="baseline")
                                for s in specs]
    runs, seq = [], 0
    for b, m in enumerate(ms, 1):
        for arm in ["baseline", *specs]:
            seq += 1
            mu = 80.0 if arm == "baseline" else 60.0
            off = rng.normal(0, instance)
            reqs = [Request(i=k, decode_tok_s=float(mu * math.exp(off + rng.normal(0, request))), e2e_s=e2e)
                    for k in range(m)]
            runs.append(Run(run_id=f"{seq:03d}-{arm}", arm=arm, seq=seq, block=b, server_args={"tp_size": 8},
                            requests=reqs, gpu_seconds=8 * (100.0 + e2e * m)))
    return Experiment(id="e", arms=arms, runs=runs)


def test_measured_cost_splits_a_run_into_its_restart_and_its_requests_whatever_their_number():
    c = economics.measured_cost(_noisy(np.random.default_rng(3), [4, 40]))
    assert c.restart_s == pytest.approx(100.0) and c.per_request_s == pytest.approx(2.0) and c.gpus == 8
    assert economics.measured_cost(Experiment(id="x", arms=[], runs=[])) is None


def test_decide_block_buys_longer_runs_for_request_noise_and_keeps_them_for_instance_noise():
    rng = np.random.default_rng(4)
    req = economics.decide_block(_noisy(rng, [4]), 0.02, max_blocks=10, keep_requests=4)
    assert req.more and req.requests > 8 and req.design == "cost"
    assert req.plan is not None and req.plan.gpu_s > req.plan.done_gpu_s > 0
    inst = economics.decide_block(_noisy(rng, [4, 4], instance=0.012, request=0.002), 0.02, max_blocks=20,
                                  keep_requests=4)
    assert inst.more and inst.requests == 4
    # under a load of 16 in flight a run measures at least 16 (the experiment has 24), whatever the noise says
    loaded = economics.decide_block(_noisy(rng, [16, 16], instance=0.012, request=0.002), 0.02, max_blocks=20,
                                    keep_requests=24, min_requests=16)
    assert loaded.more and loaded.requests >= 16
    # every compared arm is served: the block runs them all with the most requests any asks for
    two = economics.decide_block(_noisy(rng, [4], specs=("a", "b")), 0.02, max_blocks=10, keep_requests=4)
    assert two.more and set(two.arms) == {"a", "b"} and two.requests >= 8


def test_decide_block_stops_on_the_reports_interval_with_blocks_of_different_requests():
    rng = np.random.default_rng(5)
    exp = _noisy(rng, [4, 40, 40, 40], request=0.01)
    from specab.analysis.measures import stats
    sp = stats.paired_speedup(exp, "spec")
    assert len(sp.ratios) == 4 and sp.ci.half_width_rel < 0.02      # the paired speedup is per block
    d = economics.decide_block(exp, 0.02, max_blocks=10, keep_requests=4)
    assert not d.more and "within" in d.reason
    # the cap: no block beyond --max-repeats whatever the width
    wide = economics.decide_block(_noisy(rng, [4, 4], request=0.3), 0.005, max_blocks=2, keep_requests=4)
    assert not wide.more and "cap" in wide.reason


def test_the_report_states_the_designs_own_stop_and_lists_its_decisions_with_blocks_of_different_requests():
    from specab.analysis.render import report
    exp = _noisy(np.random.default_rng(5), [4, 40, 40, 40], request=0.01)
    exp.target_ci = 0.02
    exp.meta["design_steps"] = [
        {"blocks": 0, "design": "cost", "more": True, "requests": 4, "reason": "first block: the experiment's"},
        {"blocks": 1, "design": "cost", "more": True, "requests": 40, "reason": "spec: requests dominate"},
        {"blocks": 4, "design": "cost", "more": False, "requests": None,
         "reason": "spec: interval +-1.0% within +-2.0% after 4 blocks"}]
    rep = report.build_report(exp, plots=False)
    assert "--target-ci 2.0% (design by cost): spec: interval +-1.0% within +-2.0% after 4 blocks." in rep.summary
    assert any("over 4 paired block(s)" in line for line in rep.summary)
    assert rep.summary[-1].startswith("Verdict cost: ")
    md = report.to_markdown(rep)
    assert "The design's decisions" in md and "| 1 | design by cost | another block | 40 | spec: requests dominate |" in md


def test_first_block_without_a_prior_keeps_the_experiments_requests_and_the_plan_says_so():
    """`run` starts with the experiment's requests where the node has a run cost but no prior noise; the plan's
    design by cost keeps them too (it would otherwise describe a first block the run never runs)."""
    from specab.analysis.cost import design
    cost = design.RunCost(load_s=300.0, per_request_s=6.0, dead_s=7.7, gpus=8, source="history")
    prior = design.Components(between=2 * 0.01 ** 2, within=2 * 0.04 ** 2, between_df=8.0, within_df=100.0,
                              source="history")
    kept = economics.first_block(None, cost, 0.02, arms=2, requests=8, max_blocks=10)
    assert (kept.requests, kept.design) == (8, None) and "the experiment's requests" in kept.why
    default = design.Components(design.DEFAULT_BETWEEN, 0.0, design.DEFAULT_BETWEEN_DF, 0.0, source="default")
    est = economics.plan_estimate(cost, default, 0.02, arms=2, requests=8, max_blocks=10, first=kept)
    assert est.design.requests == 8
    assert "the first block with 8 measured requests per run (the experiment's: no prior noise" in est.lines(0.02)[1]
    # with a prior the first block is the design's, and the plan shows the same block and restarts
    chosen = economics.first_block(prior, cost, 0.02, arms=2, requests=8, max_blocks=10)
    assert chosen.design is not None and chosen.requests == chosen.design.requests
    est = economics.plan_estimate(cost, prior, 0.02, arms=2, requests=8, max_blocks=10, first=chosen)
    assert (est.design.requests, est.design.blocks) == (chosen.requests, chosen.design.blocks)
    assert est.design.gpu_s_low <= est.design.gpu_s <= est.design.gpu_s_high


def test_the_dead_time_prior_is_what_the_h200_known_truth_runs_measured(tmp_path):
    """DEFAULT_DEAD_S is a measurement, not a guess: the median seconds per phase of the 21 runs of the H200
    known-truth stores, for every phase that is neither the engine's load nor the measured benchmark."""
    import sqlite3
    import statistics
    from collections import defaultdict

    load_or_bench = {"loading", "loading weights", "capturing graphs", "benchmarking"}
    per_phase: dict[str, list[float]] = defaultdict(list)
    fixtures = REPO_ROOT / "tests" / "fixtures" / "known-truth" / "h200"
    stores = [copy_store(fixtures / name, tmp_path / name) / "results.sqlite" for name in (
        "known-truth-h200-20261204-055428", "known-truth-h200-causes-20261204-060246",    # the three experiments
        "known-truth-h200-twin-20261204-060855")]                                          # the prior came from
    runs = set()
    for path in stores:
        with sqlite3.connect(path) as c:
            for seq, phase, d in c.execute("SELECT seq, phase, duration_s FROM run_phases"):
                runs.add((path, seq))
                if phase not in load_or_bench:
                    per_phase[phase].append(d)
    assert len(stores) == 3 and len(runs) == 21
    measured = sum(statistics.median(v) for v in per_phase.values())
    assert abs(measured - economics.DEFAULT_DEAD_S) < 0.1, (measured, {k: statistics.median(v)
                                                                        for k, v in per_phase.items()})
