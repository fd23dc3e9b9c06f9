"""The baseline server scores outputs under the target after its measured window (specab/node/scoring.py, run by the
bench step when its spec carries ``score``), checked against the simulator's own truth: each sampled request's sum
of target log-probabilities is in its trace, and the scored sums must equal it exactly."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

from specab.node import loadgen
from specab.sim.engine import count_prompt_tokens
from specab.sim.outputs import prompt_digest
from tests.node.helpers import ServerSetup, SimNode, free_port
from tests.node.test_benchstep import bench_tool, spec

EAGLE = {"speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "/models/eagle3",
         "speculative_num_steps": 2, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 3}
SAMPLED = {"temperature": 0.8, "top_p": 1.0, "num_requests": 6, "output_len": 24, "ignore_eos": False}


def run_sim(setup: ServerSetup, sim: SimNode, trace: Path, score: Dict[str, Any] | None = None,
            fault: str = "", args: Dict[str, Any] | None = None) -> Dict[str, Any]:
    """One run: the simulated server started in ``setup.run_dir`` with a trace, benchmarked (and scoring with
    ``score``), stopped."""
    setup.write_sim_launch(scale=20, tp=1, fault=fault, args=args)
    sim.env["SPECAB_SIM_TRACE"] = str(trace)
    try:
        assert setup.start().rc == 0 and setup.ready(120).rc == 0
        obj = dict(spec(setup.run_dir, setup.url, sim.smi, **SAMPLED), score=score)
        r = bench_tool(obj, sim.env)
        assert r.rc == 0, (r.data, r.stderr)
        return r.data
    finally:
        setup.stop()
        del sim.env["SPECAB_SIM_TRACE"]


def truth_by_request(trace: Path, summary: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The trace line of each measured request i (matched by its prompt's digest)."""
    lines = [json.loads(x) for x in trace.read_text().splitlines()]
    by_digest = {x["prompt_digest"]: x for x in lines}
    prompts = loadgen.make_prompts(int(summary["seed"]), "measure", int(summary["requests"]),
                                   int(summary["input_len"]))
    return [by_digest[prompt_digest(count_prompt_tokens(p))] for p in prompts]


def test_the_baseline_scores_its_own_and_a_speculative_runs_outputs_exactly(server: ServerSetup, sim: SimNode,
                                                                             tmp_path: Path) -> None:
    """A lossy speculative run (lossy=0.3: its tokens leave the target's law) and then a baseline run that scores both
    after its measured window: every request scored, each sum the trace's truth to the last bit, the lossy outputs
    scored lower, and the summary states what was scored and what it cost."""
    spec_run = ServerSetup(node_dir=server.node_dir, run_dir=server.node_dir / "runs" / "001-eagle3",
                           port=free_port(), sim=sim, config=server.config)
    spec_run.run_dir.mkdir(parents=True)
    (spec_run.run_dir / "manifest.json").write_text(json.dumps({"extra": {"experiment_id": "exp-1"}}))
    spec_summary = run_sim(spec_run, sim, tmp_path / "spec.trace", fault="lossy=0.3", args=EAGLE)
    base = ServerSetup(node_dir=server.node_dir, run_dir=server.node_dir / "runs" / "002-baseline",
                       port=free_port(), sim=sim, config=server.config)
    base.run_dir.mkdir(parents=True)
    score = {"engine": "sglang", "experiment_id": "exp-1", "runs": ["001-eagle3", "002-baseline", "000-gone"]}
    base_summary = run_sim(base, sim, tmp_path / "base.trace", score=score)

    lines = [json.loads(x) for x in (base.run_dir / "scores.jsonl").read_text().splitlines()]
    summary = lines[-1]["summary"]
    scores = {(x["run"], x["i"]): x for x in lines[:-1]}
    for run_id, trace, bench in (("001-eagle3", tmp_path / "spec.trace", spec_summary),
                                 ("002-baseline", tmp_path / "base.trace", base_summary)):
        truth = truth_by_request(trace, bench["summary"])
        assert summary["runs"][run_id] == {"scored": 6, "unscored": 0, "reason": None,
                                           "tokens": sum(t["sampled"]["tokens"] for t in truth)}
        for i, t in enumerate(truth):
            assert scores[(run_id, i)]["logprob_sum"] == t["sampled"]["target_logprob"], (run_id, i)
            assert scores[(run_id, i)]["tokens"] == t["completion_tokens"]
    spec_truth = truth_by_request(tmp_path / "spec.trace", spec_summary["summary"])
    base_truth = truth_by_request(tmp_path / "base.trace", base_summary["summary"])
    assert sum(t["sampled"]["off_law"] for t in spec_truth) > 0 == sum(t["sampled"]["off_law"] for t in base_truth)
    mean = lambda run: sum(scores[(run, i)]["logprob_sum"] for i in range(6)) / sum(   # noqa: E731
        scores[(run, i)]["tokens"] for i in range(6))
    assert mean("001-eagle3") < mean("002-baseline")
    assert summary["runs"]["000-gone"]["scored"] == 0 and "no run of experiment exp-1" in \
        summary["runs"]["000-gone"]["reason"]
    assert summary["requests"] == 12 and summary["seconds"] > 0 and summary["scorer"] == "002-baseline"


def test_no_scoring_at_temperature_0_nor_without_a_score_spec(server: ServerSetup, sim: SimNode,
                                                             tmp_path: Path) -> None:
    """Greedy runs are compared token for token (the validity check), never scored: a score spec at temperature 0
    writes no scores.jsonl."""
    server.write_sim_launch(scale=20, tp=1)
    try:
        assert server.start().rc == 0 and server.ready(120).rc == 0
        obj = dict(spec(server.run_dir, server.url, sim.smi, num_requests=2),
                   score={"engine": "sglang", "experiment_id": "e", "runs": ["001-baseline"]})
        r = bench_tool(obj, sim.env)
        assert r.rc == 0, (r.data, r.stderr)
    finally:
        server.stop()
    assert not (server.run_dir / "scores.jsonl").exists()
