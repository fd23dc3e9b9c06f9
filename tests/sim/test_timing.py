"""The pure timing model: the default profile's true speeds are the seed's numbers."""
from __future__ import annotations

import random
import statistics

import pytest

from specab.sim.profile import ProfileError, load_profile, profile_from_dict, shipped_profiles
from specab.sim.timing import TimingModel, drift_factor, instance_factor, nccl_factor, true_decode_tok_s
from tests.sim.conftest import TUNED

BASE = {"tp_size": 8, "mem_fraction_static": 0.88}


def spec(steps: int, topk: int = 1, draft: int | None = None) -> dict:
    return {**BASE, "speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "/d",
            "speculative_num_steps": steps, "speculative_eagle_topk": topk,
            "speculative_num_draft_tokens": draft if draft is not None else steps + 1}


@pytest.fixture(scope="module")
def quiet():
    return load_profile("default").without_noise()


def test_default_profile_true_speeds_match_the_seed(quiet):
    assert true_decode_tok_s(quiet, BASE, TUNED) == pytest.approx(82.2, rel=0.005)
    assert true_decode_tok_s(quiet, BASE, {}) == pytest.approx(63.0, rel=0.01)
    m = TimingModel.create(quiet, spec(2), TUNED)
    assert m.expected_accept_length() == pytest.approx(2.10, abs=0.01)
    assert m.true_decode_tok_s() == pytest.approx(60.5, rel=0.005)
    assert m.nominal_spec_cycle_s() * 1000 - 2 * quiet.spec.draft_step_ms - quiet.spec.overhead_ms == \
        pytest.approx(29.0, abs=0.01), "verify is 29 ms in extend mode"
    assert m.graph_used(1) is False, "the seed's verify ran without CUDA graph"
    base = TimingModel.create(quiet, BASE, TUNED)
    assert base.graph_used(1) is True
    assert 1.0 / (base.nominal_decode_step_s() * 1000) == pytest.approx(1 / 12.17, rel=1e-6)


def test_other_step_counts_follow_the_same_per_position_acceptance(quiet):
    s1, s2, s3 = (TimingModel.create(quiet, spec(k), TUNED) for k in (1, 2, 3))
    assert s1.expected_accept_length() < s2.expected_accept_length() < s3.expected_accept_length()
    assert 50 < s1.true_decode_tok_s() < 60.5 and 58 < s3.true_decode_tok_s() < 63, "seed: 3-step ~60 tok/s"
    # break-even of the seed: a spec arm only wins when tau > cycle / baseline step
    base_step = TimingModel.create(quiet, BASE, TUNED).nominal_decode_step_s()
    assert s2.nominal_spec_cycle_s() / base_step == pytest.approx(2.85, abs=0.05)
    wide = TimingModel.create(quiet, spec(2, topk=4, draft=6), TUNED)
    assert wide.expected_accept_length() > s2.expected_accept_length()


def test_sampled_acceptance_matches_its_expectation(quiet):
    m = TimingModel.create(quiet, spec(2), TUNED)
    rng = random.Random(7)
    draws = [m.tokens_per_verify(rng) for _ in range(20000)]
    assert set(draws) == {1, 2, 3}
    assert statistics.fmean(draws) == pytest.approx(m.expected_accept_length(), abs=0.03)


def test_sglang_simulate_acc_len_forces_the_accept_length(quiet):
    m = TimingModel.create(quiet, spec(3), {**TUNED, "SGLANG_SIMULATE_ACC_LEN": "3.0"})
    rng = random.Random(1)
    mean = statistics.fmean(m.tokens_per_verify(rng) for _ in range(20000))
    assert mean == pytest.approx(m.expected_accept_length(), abs=0.03)
    assert 2.7 < mean < 3.1
    with pytest.raises(ValueError, match="SGLANG_SIMULATE_ACC_LEN"):
        TimingModel.create(quiet, spec(3), {"SGLANG_SIMULATE_ACC_LEN": "x"})


def test_nccl_effect_needs_tp_and_counts_missing_variables(quiet):
    assert nccl_factor(quiet, {}, 1) == 1.0, "no all-reduce at TP 1"
    assert nccl_factor(quiet, TUNED, 8) == 1.0
    half = dict(list(TUNED.items())[:3])
    assert 1.0 < nccl_factor(quiet, half, 8) < nccl_factor(quiet, {}, 8)
    assert nccl_factor(quiet, {**TUNED, "NCCL_PROTO": "Simple"}, 8) > 1.0


def test_graph_limits_and_batch_size(quiet):
    capped = TimingModel.create(quiet, {**BASE, "cuda_graph_max_bs": 4}, TUNED)
    assert capped.graph_used(4) and not capped.graph_used(5)
    assert capped.nominal_decode_step_s(5) > capped.nominal_decode_step_s(4) * quiet.decode.no_graph_factor * 0.99
    nograph = TimingModel.create(quiet, {**BASE, "disable_cuda_graph": True}, TUNED)
    assert nograph.true_decode_tok_s() == pytest.approx(82.2 / quiet.decode.no_graph_factor, rel=0.01)
    m = TimingModel.create(quiet, BASE, TUNED)
    assert m.nominal_decode_step_s(8) > m.nominal_decode_step_s(1)
    assert m.true_decode_tok_s(bs=8) < m.true_decode_tok_s(bs=1)


def test_noise_is_seeded_and_can_be_zero():
    prof = load_profile("default")
    a = [instance_factor(prof, 1, i) for i in range(50)]
    assert a == [instance_factor(prof, 1, i) for i in range(50)], "reproducible"
    assert a != [instance_factor(prof, 2, i) for i in range(50)], "depends on the seed"
    assert 0.0 < statistics.pstdev(a) < 0.01
    assert drift_factor(prof, 0) == 1.0
    assert drift_factor(prof, 3600) == pytest.approx(1 + prof.noise.drift_pct_per_hour / 100)
    assert drift_factor(prof, 1e9) == pytest.approx(1 - prof.noise.drift_max_pct / 100)
    seedlike = load_profile("realistic")
    assert drift_factor(seedlike, 1e9) == pytest.approx(0.92), "the seed's 89 -> 82 slow-down"
    quiet = prof.without_noise()
    assert instance_factor(quiet, 1, 3) == 1.0 and drift_factor(quiet, 1e6) == 1.0
    noisy = true_decode_tok_s(prof, BASE, TUNED, t_sim_s=7200, seed=3, instance=4)
    assert noisy == pytest.approx(82.2 * instance_factor(prof, 3, 4) * drift_factor(prof, 7200), rel=0.005)


def test_profiles_load_by_name_or_path_and_refuse_bad_keys(tmp_path):
    assert {"default", "realistic", "instant"} <= set(shipped_profiles())
    assert load_profile("instant").load.weights_s == 0.0
    assert load_profile("realistic").load.weights_s > 60
    with pytest.raises(ProfileError, match="neither a shipped profile"):
        load_profile("no-such-profile")
    import yaml
    data = yaml.safe_load(open(load_profile("default").source).read())
    data["decode"]["step_ms"] = 10.0
    path = tmp_path / "p.yml"
    path.write_text(yaml.safe_dump(data))
    assert load_profile(str(path)).decode.step_ms == 10.0
    data["decode"]["typo_ms"] = 1
    with pytest.raises(ProfileError, match=r"decode: unknown key\(s\) \['typo_ms'\]"):
        profile_from_dict(data)


def test_simulated_requests_measure_the_true_speed(quiet):
    from specab.sim.timing import request_rng
    prof = load_profile("default")
    for arm, target in ((BASE, 82.2), (spec(2), 60.5)):
        m = TimingModel.create(prof, arm, TUNED, seed=5, instance=2)
        reqs = [m.simulate_request(256, t_sim_s=0.0, rng=request_rng(5, 2, i)) for i in range(1, 201)]
        mean = statistics.fmean(r.decode_tok_s for r in reqs)
        assert mean == pytest.approx(m.true_decode_tok_s(), rel=0.01)
        assert mean == pytest.approx(target, rel=0.02)
        assert all(r.output_tokens == 256 for r in reqs)
    again = TimingModel.create(prof, spec(2), TUNED, seed=5, instance=2).simulate_request(256, rng=request_rng(5, 2, 1))
    first = TimingModel.create(prof, spec(2), TUNED, seed=5, instance=2).simulate_request(256, rng=request_rng(5, 2, 1))
    assert again == first, "seeded: the same request twice is the same"
