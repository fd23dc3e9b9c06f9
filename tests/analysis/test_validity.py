"""Output validity on real engine output and on its own terms.

The real stores: SGLang 0.5.17 on an H100 and on an H200 with a known-truth pair (tests/fixtures/validity/h100/ and
h200/, docs/validation/validity.md), where greedy parity is exact by construction: EAGLE-3 at steps 1-3 must be
identical to the baseline on every request, and the same steps-3 arm under SGLANG_SIMULATE_ACC_LEN must not be (its
outputs departed at the first decoded token on both cards, measured). The rules' arithmetic is checked on outputs built here, and bad `validity:` input is refused
when the experiment is loaded.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from specab.analysis.evidence import outputs
from specab.analysis.evidence.model import Arm, Experiment, Request, Run, load_store
from specab.analysis.findings import doctor
from specab.analysis.measures import stats, validity
from specab.analysis.render import report
from specab.config.spec import load_experiment
from specab.config.yamlfile import ConfigError
from tests.stores import copy_store

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "validity"
STEPS = {"h100": REAL / "h100" / "validity-h200-20261206-054331",
         "h200": REAL / "h200" / "validity-h200-20261206-221559"}
SPREAD = {"h100": REAL / "h100" / "spread-h200-20261206-054911",
          "h200": REAL / "h200" / "spread-h200-20261206-222136"}
CARDS = pytest.mark.parametrize("card", ["h100", "h200"])


def _load(src: Path, tmp: Path) -> Experiment:
    return load_store(copy_store(src, tmp / src.name), read_logs=False)


@CARDS
def test_real_eagle3_at_steps_1_to_3_is_identical_and_forced_acceptance_is_not(card: str, tmp_path: Path) -> None:
    e = _load(STEPS[card], tmp_path)
    v = validity.check(e)
    for arm in ("eagle3-s1", "eagle3-s2", "eagle3-s3"):
        a = v.arms[arm]
        assert (a.status, a.identical, a.compared, a.failing) == (validity.VALID, 12, 12, 0), a.line
        assert a.line == "outputs identical to the baseline on 12/12 requests"
    forced = v.arms["eagle3-s3-forced"]
    assert forced.status == validity.NOT_VALID and forced.identical == 0 and forced.compared == 12
    # the known-truth target's greedy output is f(t) = t+1 from the prompt's last token: every forced request kept
    # the prefill's token only, and then repeated one token to the end
    assert [q.agreed for q in forced.requests] == [1] * 12
    assert forced.loops == list(range(12))
    assert forced.line.startswith("NOT VALID: outputs differ from the baseline on 12/12 requests, after 1 agreeing "
                                  "token (median)")
    # an independent recount from the raw store: every output id list against the baseline run's
    import sqlite3
    conn = sqlite3.connect(tmp_path / STEPS[card].name / "results.sqlite")
    arms = dict(conn.execute("SELECT seq, arm FROM runs"))
    ids: dict[str, dict[int, list[int]]] = {}
    for seq, i, extra in conn.execute("SELECT seq, i, extra_json FROM requests WHERE warmup=0"):
        ids.setdefault(arms[seq], {})[i] = json.loads(extra)["output_ids"]
    for arm, a in v.arms.items():
        assert a.identical == sum(ids[arm][i] == ids["baseline"][i] for i in ids["baseline"]), arm


@pytest.mark.parametrize("card, speedup", [("h100", "1.640"), ("h200", "1.627")])
def test_the_report_doctor_and_verdicts_on_the_real_store(card: str, speedup: str, tmp_path: Path) -> None:
    e = _load(STEPS[card], tmp_path)
    rep = report.build_report(e, plots=False)
    verdicts = rep.data["verdicts"]
    assert verdicts["eagle3-s3"] == (f"eagle3-s3 vs baseline: x{speedup} from one block, not enough blocks for an "
                                     "interval over 1 paired block(s), outputs identical to the baseline on 12/12 "
                                     "requests.")
    assert " -- NOT VALID: outputs differ from the baseline on 12/12 requests" in verdicts["eagle3-s3-forced"]
    found = {f.rule: f for f in doctor.diagnose(e, stats.analyse(e)) if f.arm == "eagle3-s3-forced"}
    # the cause is named from the arm's env; the known-truth check's mismatch is this arm's forcing, not a broken
    # measurement chain
    assert found["outputs-not-valid"].severity == "error"
    assert "SGLANG_SIMULATE_ACC_LEN=2.6" in found["outputs-not-valid"].message
    assert "known-truth-mismatch" not in found
    md = report.to_markdown(rep)
    assert "## Output validity" in md and "| eagle3-s3-forced | baseline | 0/12 | 0%-24% | 1/1/1 |" in md
    # the known-truth check holds the three real arms to the exact truth (every cycle of every request), and leaves
    # the forced arm out, saying why; so does the spec model's fit of alpha
    truth = rep.data["known_truth"]
    assert {r["arm"] for r in truth["runs"]} == {"baseline", "eagle3-s1", "eagle3-s2", "eagle3-s3"}
    assert all(r["exact"] for r in truth["runs"]) and set(truth["skipped"]) == {"eagle3-s3-forced"}
    assert "Cycle counts equal to the truth on 36 of 36 speculative requests" in md
    assert [a["name"] for a in rep.data["model"]["arms"]] == ["eagle3-s1", "eagle3-s2", "eagle3-s3"]
    assert "Left out of the model: eagle3-s3-forced" in md


@CARDS
def test_the_restart_spread_store_is_identical_across_every_instance(card: str, tmp_path: Path) -> None:
    v = validity.check(_load(SPREAD[card], tmp_path))
    s3 = v.arms["eagle3-s3"]
    assert (s3.identical, s3.compared) == (48, 48) and s3.identical_ci[0] > 0.92
    assert v.baseline_self == {"baseline": (36, 36)}        # the baseline's three later restarts against its first


# --------------------------------------------------------------------------- the rules, on built outputs

def _exp(arm_outputs: dict[str, list[list[int]]], config: dict | None = None) -> tuple[Experiment, dict]:
    """An experiment of one block whose runs' outputs are given (arm -> one output per request index)."""
    spec = {"speculative_algorithm": "EAGLE3", "speculative_num_steps": 2}
    arms = [Arm("baseline")] + [Arm(a, server_args=spec, baseline="baseline") for a in arm_outputs if a != "baseline"]
    runs = [Run(run_id=f"{i + 1:03d}-{a}", arm=a, seq=i + 1, block=1, status="ok",
                requests=[Request(i=k) for k in range(len(outs))]) for i, (a, outs) in enumerate(arm_outputs.items())]
    got = {i + 1: {k: outputs.Output(i=k, tokens=tuple(o), unit="tokens", finish_reason="length")
                   for k, o in enumerate(outs)} for i, outs in enumerate(arm_outputs.values())}
    return Experiment(id="t", arms=arms, runs=runs, order="interleaved", baseline="baseline",
                      meta={"config": config or {}}), got


def _check(arm_outputs: dict[str, list[list[int]]], config: dict | None = None) -> dict[str, validity.ArmValidity]:
    e, got = _exp(arm_outputs, config)
    rules = validity.Rules.of(e.meta["config"])
    return {a.name: validity.check_arm(e, a.name, "baseline", got, rules) for a in e.spec_arms}


BASE = [list(range(100 * k, 100 * k + 40)) for k in range(4)]


def test_a_late_divergence_passes_the_rule_and_an_early_one_does_not() -> None:
    late = [o[:30] + [7] * 10 for o in BASE]              # departs after 30 of 40 tokens (75 %)
    early = [o[:10] + [7 + j for j in range(30)] for o in BASE]         # after 10 of 40 (25 %)
    got = _check({"baseline": BASE, "late": late, "early": early})
    assert got["late"].status == validity.VALID and got["late"].line == (
        "outputs identical to the baseline on 0/4 requests; the other 4 diverge late (after 75% or more of their tokens)")
    assert got["early"].status == validity.NOT_VALID and got["early"].failing == 4
    # the rule is the experiment's: at greedy_min_match 0.8 the late arm fails too, at 0.2 the early one passes
    assert _check({"baseline": BASE, "late": late}, {"validity": {"greedy_min_match": 0.8}})["late"].failing == 4
    assert _check({"baseline": BASE, "early": early},
                  {"validity": {"greedy_min_match": 0.2}})["early"].status == validity.VALID


def test_lengths_outside_the_window_and_loops_are_named() -> None:
    short = [o[:34] for o in BASE]                          # 15 % shorter, identical as far as they go
    loop = [o[:5] + [1, 2, 3] * 20 for o in BASE]           # longer and looping
    got = _check({"baseline": BASE, "short": short, "loop": loop})
    assert got["short"].status == validity.NOT_VALID
    assert "mean output length 34 tokens is 0.85x the baseline's 40 (window +-10%)" in got["short"].line
    assert got["loop"].loops == [0, 1, 2, 3] and "4/4 outputs loop" in got["loop"].line
    assert _check({"baseline": BASE, "short": short}, {"validity": {"length_window": 0.2}})["short"].status == \
        validity.VALID


def test_the_wilson_interval_and_the_repeated_share() -> None:
    assert validity.wilson(12, 12) == pytest.approx((0.7575, 1.0), abs=1e-4)
    assert validity.wilson(0, 12) == pytest.approx((0.0, 0.2425), abs=1e-4)
    assert validity.repeated_share(tuple(range(20)), 4) == 0.0
    assert validity.repeated_share((1, 2, 3) * 10, 4) == pytest.approx(1 - 3 / 27)
    assert validity.agreed_prefix((1, 2, 3), (1, 2, 4)) == 2 and validity.agreed_prefix("abc", "abc") == 3


@pytest.mark.parametrize("section,msg", [
    ({"greedy_min_match": 1.5}, "validity.greedy_min_match must be a share in [0, 1]"),
    ({"greedy_min_match": -0.1}, "validity.greedy_min_match must be a share in [0, 1]"),
    ({"length_window": 0}, "validity.length_window must be a share in (0, 1]"),
    ({"loop_ngram": 1}, "validity.loop_ngram must be an integer of at least 2"),
    ({"greedy_min_macth": 0.5}, "unknown key 'greedy_min_macth' in validity (did you mean 'greedy_min_match'?)"),
])
def test_a_bad_validity_rule_is_refused_when_the_experiment_is_loaded(tmp_path: Path, section: dict, msg: str) -> None:
    p = tmp_path / "e.yml"
    p.write_text(json.dumps({"specab_experiment": {"name": "v", "model_path": "/m", "arms": [{"name": "baseline"}],
                                                   "validity": section}}))
    with pytest.raises(ConfigError, match=str(p)) as exc:
        load_experiment(p)
    assert msg in str(exc.value)


def test_cost_only_is_for_a_speculative_arm(tmp_path: Path) -> None:
    p = tmp_path / "e.yml"
    p.write_text(json.dumps({"specab_experiment": {"name": "v", "model_path": "/m", "arms": [
        {"name": "baseline", "cost_only": True}]}}))
    with pytest.raises(ConfigError, match="cost_only is for a speculative arm"):
        load_experiment(p)


VLLM = Path(__file__).resolve().parents[1] / "fixtures" / "validity" / "vllm-cpu" / "vllm-cpu-parity-20261206-060154"


def test_a_real_vllm_decoding_under_another_rule_is_not_valid_and_faster(tmp_path: Path) -> None:
    """A real vllm-cpu 0.32.0 store (the tiny random Llama, 16 x 128 greedy tokens): the self-draft and the weak draft
    are identical to the baseline on every request, the self-draft arm under a repetition penalty departs at the
    second token of every one, and is the only arm that reads faster: the speedup the check exists to refuse."""
    e = _load(VLLM, tmp_path)
    v = validity.check(e)
    assert [(a, v.arms[a].identical, v.arms[a].compared) for a in ("draft-self-k3", "draft-weak-k3")] == \
        [("draft-self-k3", 16, 16), ("draft-weak-k3", 16, 16)]
    bad = v.arms["draft-self-k3-penalty"]
    assert bad.status == validity.NOT_VALID and [q.agreed for q in bad.requests] == [1] * 16
    sp = stats.analyse(e).speedups
    assert sp["draft-self-k3-penalty"].estimate > 1 > sp["draft-self-k3"].estimate
    f = next(f for f in doctor.diagnose(e, validity=v) if f.rule == "outputs-not-valid")
    assert f.arm == "draft-self-k3-penalty" and "override_generation_config {'repetition_penalty': 1.3}" in f.message
