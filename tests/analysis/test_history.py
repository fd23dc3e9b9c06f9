"""The per-node history (specab.analysis.cost.history): written when an experiment ends, read as the design's prior
for the next experiment with the same fingerprint on the same node."""
from __future__ import annotations

import math

import numpy as np
import pytest

from specab.analysis.cost import design, history
from specab.analysis.evidence.model import Arm, Experiment, Request, Run


def _exp(rng, exp_id="e1", blocks=6, m=8, instance=0.02, request=0.01, host="gpu-node-1"):
    arms = [Arm("baseline"), Arm("spec", server_args={"speculative_algorithm": "EAGLE3"}, baseline="baseline")]
    runs, seq = [], 0
    for b in range(1, blocks + 1):
        for arm, mu in (("baseline", 80.0), ("spec", 60.0)):
            seq += 1
            off = rng.normal(0, instance)
            reqs = [Request(i=k, decode_tok_s=float(mu * math.exp(off + rng.normal(0, request)))) for k in range(m)]
            runs.append(Run(run_id=f"{seq:03d}-{arm}", arm=arm, seq=seq, block=b, host=host, requests=reqs,
                            gpu_seconds=8 * 420.0))
    return Experiment(id=exp_id, arms=arms, runs=runs)


def test_an_ended_experiment_is_the_next_plans_prior_for_the_same_fingerprint_and_node(tmp_path):
    exp = _exp(np.random.default_rng(3), blocks=30)
    [written] = history.record(tmp_path, exp, "fp-a")
    assert written == tmp_path / "history" / "gpu-node-1.jsonl"
    prior = history.prior(tmp_path, "gpu-node-1", "fp-a")
    # 29 blocks' degrees of freedom and the default between-instance variance's one
    assert prior is not None and prior.between_df == 29 + design.DEFAULT_BETWEEN_DF and "gpu-node-1" in prior.source
    # the two instances' offsets (2 % each) and the requests' noise (1 % each), of the paired log ratio
    assert prior.between == pytest.approx(2 * 0.02 ** 2, rel=0.6)
    assert prior.within == pytest.approx(2 * 0.01 ** 2, rel=0.15)
    entry = history.read(tmp_path, "gpu-node-1")[0]
    assert entry["arms"]["spec"]["gpu_s_per_run"] == pytest.approx(8 * 420.0)
    # another fingerprint (a changed engine argument, model or benchmark) or another node: no prior
    assert history.prior(tmp_path, "gpu-node-1", "fp-b") is None
    assert history.prior(tmp_path, "gpu-node-2", "fp-a") is None


def test_the_matching_experiments_pool_by_degrees_of_freedom(tmp_path):
    history.record(tmp_path, _exp(np.random.default_rng(4), "e1", blocks=5), "fp")
    history.record(tmp_path, _exp(np.random.default_rng(5), "e2", blocks=9), "fp")
    history.record(tmp_path, _exp(np.random.default_rng(6), "e3", blocks=9, instance=0.2), "other")
    one, two = (history.entries_of(_exp(np.random.default_rng(s), blocks=n), "fp")["gpu-node-1"]["arms"]["spec"]
                ["components"] for s, n in ((4, 5), (5, 9)))
    prior = history.prior(tmp_path, "gpu-node-1", "fp")
    assert prior.between_df == 4 + 8 + design.DEFAULT_BETWEEN_DF and "2 earlier experiment(s)" in prior.source
    history.record(tmp_path, _exp(np.random.default_rng(5), "e2", blocks=9), "fp")   # concluded again (resume)
    assert history.prior(tmp_path, "gpu-node-1", "fp") == prior
    assert prior.between == pytest.approx((one["between"] * 4 + two["between"] * 8
                                           + design.DEFAULT_BETWEEN * design.DEFAULT_BETWEEN_DF) / (12 + design.DEFAULT_BETWEEN_DF))


def test_an_experiment_of_one_block_leaves_no_line(tmp_path):
    assert history.record(tmp_path, _exp(np.random.default_rng(7), blocks=1), "fp") == []
    assert history.read(tmp_path, "gpu-node-1") == []


def test_a_broken_line_names_the_file_and_line(tmp_path):
    history.record(tmp_path, _exp(np.random.default_rng(8)), "fp")
    p = history.path_for(tmp_path, "gpu-node-1")
    p.write_text(p.read_text() + "{not json\n")
    with pytest.raises(history.HistoryError, match=r"gpu-node-1\.jsonl:2"):
        history.prior(tmp_path, "gpu-node-1", "fp")
