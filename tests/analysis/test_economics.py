"""GPU-seconds spent per run/arm/experiment and the profile's cost model (specab.analysis.economics)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import yaml

from specab.analysis import economics
from specab.analysis.model import Arm, Experiment, Request, Run
from specab.config.yamlfile import REPO_ROOT


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
