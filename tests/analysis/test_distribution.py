"""The output-distribution check (specab/analysis/distribution.py) on constructed experiments whose truth is known:
the law each arm's requests were drawn from. A same-law arm passes, a shifted log-prob, a looping arm or one that
ends early fails on that metric, too few scored requests is no verdict, a greedy experiment has no check; the stated
power is what a simulation of the test at that shift finds."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from specab.analysis.measures import distribution
from specab.analysis.evidence.model import Arm, Experiment, Request, Run
from tests.analysis.factory import BASE_ARGS, spec_args

N = 12          # measured requests per run


def _run(tmp: Path, seq: int, arm: str, block: int, temperature: float, stop: list[bool],
         outputs: list[list[int]]) -> Run:
    d = tmp / f"{seq:03d}-{arm}"
    d.mkdir(parents=True)
    recs = [{"i": i, "warmup": False, "ok": True, "output_tokens": len(o), "output_ids": o,
             "finish_reason": "stop" if s else "length"} for i, (o, s) in enumerate(zip(outputs, stop))]
    (d / "bench.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return Run(run_id=d.name, arm=arm, seq=seq, block=block, run_dir=d, started=0.0, finished=100.0,
               requests=[Request(i=r["i"], output_tokens=r["output_tokens"], finish_reason=r["finish_reason"])
                         for r in recs],
               workload={"kind": "synthetic", "ignore_eos": False, "temperature": temperature, "top_p": 1.0})


def _scores(scorer: Run, scored: dict[str, list[float]], seconds: float = 2.0) -> None:
    """The scorer run's scores.jsonl: each scored run's requests with ``tokens`` 10 and the given mean log-prob."""
    lines = [{"run": rid, "i": i, "tokens": 10, "logprob_sum": 10 * m} for rid, means in scored.items()
             for i, m in enumerate(means)]
    lines.append({"summary": {"scorer": scorer.run_id, "engine": "sglang", "seconds": seconds,
                              "requests": len(lines), "tokens": 10 * len(lines),
                              "runs": {rid: {"scored": len(m), "unscored": 0, "tokens": 10 * len(m), "reason": None}
                                       for rid, m in scored.items()}}})
    assert scorer.run_dir is not None
    (scorer.run_dir / "scores.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def experiment(tmp: Path, arm_logprob: np.ndarray, *, temperature: float = 0.8, arm_stop: float = 0.5,
               arm_loop: bool = False, scored_arm: int = N) -> Experiment:
    """Block 1: eagle3-s2, then baseline (which scores both); the baseline's means drawn from N(-0.8, 0.1)."""
    rng = np.random.default_rng(7)
    base_lp = rng.normal(-0.8, 0.1, N)
    plain = [[int(t) for t in rng.integers(1000, 9000, 10)] for _ in range(N)]
    loops = [([5, 6, 7, 8] * 3)[:10] for _ in range(N)]      # as long as the others: 3 of its 7 4-grams repeat
    spec = _run(tmp, 1, "eagle3-s2", 1, temperature, [i < N * arm_stop for i in range(N)],
                loops if arm_loop else plain)
    base = _run(tmp, 2, "baseline", 1, temperature, [i < N // 2 for i in range(N)], plain)
    _scores(base, {spec.run_id: list(arm_logprob[:scored_arm]), base.run_id: list(base_lp)})
    return Experiment(id="x", arms=[Arm("baseline", dict(BASE_ARGS)), Arm("eagle3-s2", spec_args(2))],
                      runs=[spec, base])


def test_same_law_passes_and_a_shifted_log_prob_fails_naming_it(tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    same = distribution.check(experiment(tmp_path / "a", rng.normal(-0.8, 0.1, N)))["eagle3-s2"]
    assert same.same is True and same.reason.startswith("same distribution as baseline's at alpha 0.05 over 12 vs 12")
    assert (same.scored, same.unscored, same.baseline_scored, same.temperature) == (12, 0, 12, 0.8)
    shifted = distribution.check(experiment(tmp_path / "b", rng.normal(-1.1, 0.1, N)))["eagle3-s2"]
    assert shifted.same is False and shifted.reason.startswith("differs from baseline's: mean target log-prob per "
                                                               "token -1.1"), shifted.reason
    # the lengths and the 4-grams are equal on both sides (not tested), the EOS shares equal (tested, p 1)
    assert shifted.p_values["logprob"] < 0.05 and shifted.p_values["eos"] == 1.0 and len(shifted.p_values) == 2


def test_a_looping_arm_fails_on_repetition_and_an_early_ending_one_on_eos(tmp_path: Path) -> None:
    lp = np.random.default_rng(3).normal(-0.8, 0.1, N)
    loop = distribution.check(experiment(tmp_path / "a", lp, arm_loop=True))["eagle3-s2"]
    assert loop.same is False and loop.reason == ("differs from baseline's: repeated 4-grams 0.429 vs 0 (p "
                                                  f"{loop.p_values['repetition']:.2g})"), loop.reason
    eos = distribution.check(experiment(tmp_path / "b", lp, arm_stop=0.0))["eagle3-s2"]
    assert eos.same is False and "EOS rate 0% vs 50%" in eos.reason and eos.values["eos"] == [0.0, 0.5], eos.reason
    # Holm over the two metrics tested: the smaller p-value doubled
    assert eos.p_values["eos"] == pytest.approx(sps.fisher_exact([[0, N], [N // 2, N // 2]]).pvalue * 2)


def test_too_few_scored_requests_is_no_verdict_and_a_greedy_experiment_has_no_check(tmp_path: Path) -> None:
    lp = np.random.default_rng(3).normal(-0.8, 0.1, N)
    few = distribution.check(experiment(tmp_path / "a", lp, scored_arm=4))["eagle3-s2"]
    assert few.same is None and few.reason == ("not checked: 4 of the arm's and 12 of baseline's requests were "
                                               "scored under the target (at least 5 each needed)")
    assert (few.scored, few.unscored) == (4, 8)
    assert distribution.check(experiment(tmp_path / "b", lp, temperature=0.0)) == {}
    assert distribution.section(experiment(tmp_path / "c", lp, temperature=0.0)) is None


def test_the_stated_power_is_what_the_test_has_at_that_shift(tmp_path: Path) -> None:
    """The power note's shift (in standard deviations of a request's mean), simulated: Mann-Whitney at the note's
    level rejects in about 80 % of draws of normal samples that far apart."""
    lp = np.random.default_rng(3).normal(-0.8, 0.1, N)
    c = distribution.check(experiment(tmp_path / "a", lp))["eagle3-s2"]
    assert "80% power at 12 vs 12 scored requests (two-sided, alpha 0.05/2)" in c.power_note, c.power_note
    effect = float(c.power_note.split(" SD of a request's mean")[0].rsplit("(", 1)[1])
    rng = np.random.default_rng(5)
    hits = sum(sps.mannwhitneyu(rng.normal(0, 1, N), rng.normal(effect, 1, N)).pvalue < distribution.ALPHA / 2
               for _ in range(2000))
    assert 0.72 <= hits / 2000 <= 0.88, (hits, c.power_note)


def test_seq_rep_and_holm() -> None:
    assert distribution.seq_rep([1, 2, 3, 4, 1, 2, 3, 4]) == pytest.approx(0.2)
    assert distribution.seq_rep([1, 2, 3]) is None
    assert distribution._holm({"a": 0.01, "b": 0.04, "c": 0.03}) == pytest.approx({"a": 0.03, "b": 0.06, "c": 0.06})
