"""The spec model reproduces the seed's hand arithmetic."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from specab.analysis.measures import specmodel as sm

ROOT = Path(__file__).resolve().parents[2]


def run_model(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specab.analysis.measures.specmodel", "model", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_break_even_from_step_times_is_2_46():
    r = run_model("--verify-ms", "30", "--decode-ms", "12.2", "--format", "json")
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)
    assert round(out["break_even"]["tau_star"], 2) == 2.46


def test_seed_retest_numbers():
    r = run_model("--baseline-tok-s", "82.2", "--spec-tok-s", "60.5", "--accept-len", "2.1", "--steps", "2",
                  "--target-tok-s", "150", "--format", "json")
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)
    arm = out["arms"][0]
    assert arm["cycle_ms"] == pytest.approx(2.1 / 60.5 * 1000)
    assert arm["tau_star"] == pytest.approx(2.85, abs=0.01)
    assert arm["margin"] < 0
    # chain model at k=2: 1 + a + a^2 = 2.1  ->  a = (-1 + sqrt(5.4)) / 2
    assert arm["alpha"] == pytest.approx((-1 + 5.4 ** 0.5) / 2, abs=1e-6)
    assert arm["speedup"] == pytest.approx(60.5 / 82.2)
    # one arm: cycle-vs-steps is an assumption and says so
    assert any("assumed" in a for a in out["assumptions"])
    t = out["targets"][0]
    assert t["tau_needed"] == pytest.approx(150 * arm["cycle_ms"] / 1000)
    assert t["alpha_needed"] is None            # 5.2 tokens/cycle cannot fit a 2-step chain
    assert "impossible" in t["note"]


def test_alpha_limit_for_150_tok_s_at_30ms_cycle_is_0_78():
    r = run_model("--verify-ms", "30", "--decode-ms", "12.2", "--target-tok-s", "150", "--format", "json")
    out = json.loads(r.stdout)
    t = out["targets"][0]
    assert t["tau_needed"] == pytest.approx(4.5)
    assert round(t["alpha_limit"], 2) == 0.78


def test_text_format_states_the_verdict():
    r = run_model("--baseline-tok-s", "82.2", "--spec-tok-s", "60.5", "--accept-len", "2.1", "--steps", "2")
    assert r.returncode == 0
    assert "tau* = 2.85" in r.stdout and "loses" in r.stdout


def test_chain_alpha_inverts_chain_tau():
    for k in (1, 2, 3, 5):
        for a in (0.1, 0.5, 0.74, 0.95):
            assert sm.chain_alpha(sm.chain_tau(a, k), k) == pytest.approx(a, abs=1e-9)
    assert sm.chain_alpha(1 / (1 - 0.6), None) == pytest.approx(0.6)


def test_impossible_inputs_are_refused_with_a_reason():
    with pytest.raises(sm.SpecModelError, match="exceeds steps"):
        sm.chain_alpha(3.5, 2)
    with pytest.raises(sm.SpecModelError, match="below 1"):
        sm.chain_alpha(0.8, 2)
    r = run_model("--baseline-tok-s", "82", "--spec-tok-s", "60", "--steps", "2")
    assert r.returncode == 2 and "once per speculative arm" in r.stdout


def test_cycle_is_fitted_from_two_arms_and_predicts_them_back():
    arms = [sm.SpecArm(steps=2, tok_s=60.5, accept_len=2.1), sm.SpecArm(steps=3, tok_s=60.0, accept_len=2.39)]
    res = sm.build(82.2, arms)
    assert res.cycle_fit and "fitted from 2" in res.cycle_fit.source
    for a in arms:
        assert res.cycle_fit.cycle_ms(a.steps) == pytest.approx(a.cycle_ms)
    p2 = next(p for p in res.predictions if p.steps == 2)
    # alpha is the mean of both arms' alphas, so the prediction is near (not exactly) the measurement
    assert p2.tok_s == pytest.approx(60.5, rel=0.05)
    assert not any("assumed" in a for a in res.assumptions)
