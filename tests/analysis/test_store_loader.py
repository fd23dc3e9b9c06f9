"""The analysis reads an experiment back from the driver's results store (docs/results.md)."""
import pytest

from specab import analysis, doctor, stats
from tests.analysis import factory as F


def test_store_round_trip_gives_the_same_statistics(tmp_path):
    exp = F.experiment({"baseline": 82.2, "eagle3-s2": 60.5}, blocks=4, accept={"eagle3-s2": 2.1})
    d = F.write_store(exp, tmp_path)
    back = analysis.load_store(d)
    assert back.id == exp.id and back.order == "interleaved" and back.baseline == "baseline"
    assert [a.name for a in back.spec_arms] == ["eagle3-s2"]
    assert back.target_ci == pytest.approx(0.02) and back.max_repeats == 8
    assert len(back.runs) == 8 and all(r.ok for r in back.runs)
    r0 = back.runs[0]
    assert r0.server_args["tp_size"] == 8 and "internal_states" not in r0.server_args
    assert r0.env_check and r0.env_check.ok and all(v.confirmed for v in r0.env_check.variables)
    assert r0.gpu_samples and r0.gpu_samples[0].reasons == 0 and r0.gpu_samples[0].max_sm_mhz == 1980
    assert r0.log and r0.log.decode_lines == 6 and r0.log.cuda_graph_share == 1.0
    assert r0.log.nccl_env.get("NCCL_MAX_NCHANNELS") == "16"
    a, b = stats.paired_speedup(exp, "eagle3-s2"), stats.paired_speedup(back, "eagle3-s2")
    assert b.ratios == pytest.approx(a.ratios)
    s = stats.arm_stats(back, "eagle3-s2")
    assert s.accept_len.mean == pytest.approx(2.1, rel=0.02) and s.log_accept_len == pytest.approx(2.1)
    assert not s.accept_len_disagrees
    assert {f.rule for f in doctor.diagnose(back)} == {"accept-below-break-even"}


def test_store_env_check_mismatch_reaches_the_doctor(tmp_path):
    def lost(run, arm):
        if arm.is_spec:
            run.env_check = F.env_check(run.env, missing_in_workers=("NCCL_ALGO",))
    exp = F.experiment({"baseline": 82.2, "eagle3-s2": 94.0}, blocks=3, tweak=lost)
    back = analysis.load_store(F.write_store(exp, tmp_path))
    f = [x for x in doctor.diagnose(back) if x.rule == "env-not-confirmed"]
    assert len(f) == 1 and "NCCL_ALGO" in f[0].message


def test_missing_store_is_an_actionable_error(tmp_path):
    with pytest.raises(analysis.AnalysisError, match="no results store"):
        analysis.load_store(tmp_path)


def test_simulated_time_scale_is_undone(tmp_path):
    """A simulated node at SPECAB_SIM_TIME_SCALE=20 runs 20x fast: the analysis reports simulated seconds."""
    exp = F.experiment({"baseline": 82.2, "eagle3-s2": 60.5}, blocks=3, accept={"eagle3-s2": 2.1})
    back = analysis.load_store(F.write_store(exp, tmp_path, time_scale=20.0))
    assert back.meta["time_scales"] == [20.0] and all(r.time_scale == 20.0 for r in back.runs)
    for a, b in zip(exp.runs, back.runs):
        assert b.tok_s == pytest.approx(a.tok_s) and b.measured[0].tpot_s == pytest.approx(a.measured[0].tpot_s)
    assert back.runs[0].log.gen_tok_s_median == pytest.approx(exp.runs[0].log.gen_tok_s_median / 20, rel=1e-3)
