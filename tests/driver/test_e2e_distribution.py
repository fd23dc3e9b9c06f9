"""At temperature > 0, end to end on the simulated node: the driver gives each baseline run its runs to score, the
baseline server scores them after its measured window, and the analysis tells the lossless arm (same law, other
draws) from a lossy one (lossy=0.2: a fifth of its decode tokens drawn off the target's law), against the
simulator's own truth (each request's tokens off the law and its sum of target log-probabilities, in its trace)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from specab.analysis.measures import distribution
from specab.analysis.evidence.model import load_store
from specab.results import store as st
from tests.driver.simnode import SimNode, driver
from tests.driver.simtrace import trace_of

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ARMS = """\
arms:
  - name: baseline
  - name: eagle3-s2
    server_args: &eagle
      speculative_algorithm: EAGLE3
      speculative_draft_model_path: /models/Kimi-K2.5-EAGLE3
      speculative_num_steps: 2
      speculative_eagle_topk: 1
      speculative_num_draft_tokens: 3
  - name: eagle3-lossy
    server_args: *eagle
    env:
      SPECAB_SIM_FAULT: lossy=0.2
"""


def test_lossless_arm_same_distribution_lossy_arm_differs_scored_by_the_next_baseline(node: SimNode) -> None:
    """--seed 0 orders block 1 baseline, eagle3-s2, eagle3-lossy and block 2 baseline, eagle3-lossy, eagle3-s2:
    block 1's speculative runs are scored by block 2's baseline run, block 2's come after the last baseline run and
    stay unscored (said, with why). The scores are the trace's truth to the last bit; the lossless arm passes, the
    lossy arm fails on the log-probability; the report states the power and what the scoring cost."""
    node.profile = "instant"
    exp_file = node.write_experiment("dist", arms=ARMS, num_requests=8, output_len=32)
    doc = yaml.safe_load(exp_file.read_text())
    doc["specab_experiment"]["bench"].update(temperature=0.8, top_p=0.95, ignore_eos=False)
    exp_file.write_text(yaml.safe_dump(doc, sort_keys=False))
    trace = node.root / "sim-trace.jsonl"
    inv = node.write_inventory({**node.host_vars(),
                                "specab_node_env": {**node.node_env(), "SPECAB_SIM_TRACE": str(trace)}})
    proc = driver("-e", str(exp_file), "-i", str(inv), "--runs-dir", str(node.runs_dir), "--repeats", "2",
                  "--seed", "0")
    out, _ = proc.communicate(timeout=800)
    assert proc.returncode == 0, out[-4000:]
    (exp_dir,) = [d for d in node.runs_dir.iterdir() if (d / st.FILENAME).exists()]
    exp = load_store(exp_dir)
    assert [r.run_id for r in exp.runs] == ["001-baseline", "002-eagle3-s2", "003-eagle3-lossy", "004-baseline",
                                             "005-eagle3-lossy", "006-eagle3-s2"]
    entry = json.loads((exp_dir / "004-baseline" / "queue_entry.json").read_text())
    assert entry["score"]["runs"] == ["002-eagle3-s2", "003-eagle3-lossy", "004-baseline"]
    assert json.loads((exp_dir / "002-eagle3-s2" / "queue_entry.json").read_text())["score"] == {}

    # every scored request's sum is the simulator's truth, exactly; the off-law tokens are the lossy arm's alone
    scores = {}
    for run in ("001-baseline", "004-baseline"):
        for line in (exp_dir / run / "scores.jsonl").read_text().splitlines()[:-1]:
            rec = json.loads(line)
            scores[(rec["run"], rec["i"])] = rec["logprob_sum"]
    assert len(scores) == 4 * 8
    off = {}
    for r in exp.runs:
        for q, truth in trace_of(trace, r):
            off[(r.arm, r.run_id, q.i)] = truth["sampled"]["off_law"]
            if (r.run_id, q.i) in scores:
                assert scores[(r.run_id, q.i)] == truth["sampled"]["target_logprob"], (r.run_id, q.i)
    assert all(v == 0 for (arm, _, _), v in off.items() if arm != "eagle3-lossy")
    assert sum(v for (arm, _, _), v in off.items() if arm == "eagle3-lossy") > 0

    checks = distribution.check(exp)
    good, bad = checks["eagle3-s2"], checks["eagle3-lossy"]
    assert (good.scored, good.unscored, good.baseline_scored) == (8, 8, 16)
    assert (bad.scored, bad.unscored) == (8, 8)
    assert good.same is True, good.reason
    assert bad.same is False and bad.reason.startswith("differs from baseline's: mean target log-prob"), bad.reason
    assert bad.p_values["logprob"] < distribution.ALPHA <= min(good.p_values.values())
    assert good.values["logprob"][0] > bad.values["logprob"][0]
    assert good.unscored_why == ["006-eagle3-s2: no baseline run came after it on simT to score it"]
    assert "80% power at 8 vs 16 scored requests" in good.power_note and good.temperature == 0.8
    report = (exp_dir / "report.md").read_text()
    assert "## Output distribution" in report and "DIFFERS" in report and "scoring cost: " in report
    data = json.loads((exp_dir / "report.json").read_text())
    assert data["distribution"]["arms"]["eagle3-lossy"]["same"] is False
    # one verdict with both parts: the sampled arms' validity is their distribution check
    assert "sampled at temperature 0.8: same distribution as the baseline's" in data["verdicts"]["eagle3-s2"]
    assert " -- NOT VALID: outputs not drawn from the target's distribution: differs from baseline's: mean target " \
           "log-prob" in data["verdicts"]["eagle3-lossy"], data["verdicts"]["eagle3-lossy"]
    assert f"verdict: {data['verdicts']['eagle3-lossy']}" in out
    assert "temperature 0.8, top_p 0.95" in report
