"""Per-position acceptance through the simulator: the benchmark client's per-request counts (from the 0.5.23
``spec_correct_drafts_histogram`` the simulated SGLang sends) equal the simulator's own trace of every cycle's draw, the
run's pooled counts are their sum, and the conditional rates the analysis computes recover the profile's per-position
chain (the default profile's 0.70, 0.5714, 0.50: no single alpha), which the spec model's per-position chain turns
back into the engine's tokens per cycle."""
from __future__ import annotations

import json
import math

import pytest

from specab.analysis.measures import positions, specmodel
from specab.analysis.evidence.model import load_run_dir
from specab.node import loadgen
from specab.vocab import engines
from specab.sim.profile import load_profile
from tests.node.helpers import client_config
from tests.sim.client import request_json
from tests.sim.conftest import TUNED, wait_for

EAGLE_S3 = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/models/eagle3",
            "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]


def test_the_chain_per_position_on_the_simulators_trace(launch, tmp_path):
    trace = tmp_path / "trace.jsonl"
    srv = launch(EAGLE_S3, env={**TUNED, "SPECAB_SIM_TRACE": str(trace)}, scale=100, tp=1)
    run_dir = tmp_path / "001-eagle3-s3"
    run_dir.mkdir()
    status, info, _ = request_json(srv.port, "GET", "/server_info")
    assert status == 200
    (run_dir / "server_info.json").write_text(json.dumps(info))
    n = 8
    cfg = client_config(f"http://127.0.0.1:{srv.port}", str(run_dir / "bench.jsonl"), str(run_dir / "bench_summary.json"),
                        api="generate", num_requests=n, warmup=0, input_len=16, output_len=256, concurrency=1, seed=5,
                        ignore_eos=True, timeout=120)
    summary = loadgen.run_benchmark(cfg)
    assert summary["ok"] == n
    wait_for(lambda: trace.is_file() and len(trace.read_text().splitlines()) >= n, 10, "trace lines")
    traced = sorted((json.loads(x) for x in trace.read_text().splitlines()), key=lambda r: r["arrival_wall"])
    recs = [json.loads(x) for x in (run_dir / "bench.jsonl").read_text().splitlines()]
    # per request, exactly: the client's counts are the simulator's draws, counted per position
    assert [r["spec_accept_hist"] for r in recs] == [t["accept_hist"] for t in traced]
    assert [r["spec_accepted_per_pos"] for r in recs] == [engines.accepted_per_position(t["accept_hist"]) for t in traced]
    assert all(sum(t["accept_hist"]) == t["spec_verify_ct"] == r["spec_verify_ct"] for r, t in zip(recs, traced))
    # per run: the sum, and what the analysis reads back from the run folder
    cycles = sum(t["spec_verify_ct"] for t in traced)
    per_pos = [sum(engines.accepted_per_position(t["accept_hist"])[i] for t in traced) for i in range(3)]
    assert summary["spec_positions"] == {"cycles": cycles, "accepted_per_pos": per_pos, "requests": n,
                                         "from": "requests"}
    counts = positions.of_run(load_run_dir(run_dir), steps=3)
    assert counts is not None and counts.cycles == cycles and list(counts.accepted) == per_pos
    # the profile's chain, recovered within 4 binomial standard deviations at each position (about 900 cycles)
    want = load_profile("default").spec.acceptance[:3]
    reached = [cycles] + per_pos[:2]
    for got, p, trials in zip(counts.conditional, want, reached):
        assert got is not None and abs(got - p) < 4 * math.sqrt(p * (1 - p) / trials), (counts.conditional, want)
    # the chain with the measured rates is the engine's own tokens per cycle (its correct drafts, every cycle's draw)
    correct = sum(r["spec_correct_drafts"] for r in recs)
    assert counts.tokens_per_cycle == 1 + correct / cycles
    assert specmodel.chain_tau_rates(counts.chain_rates(), 3) == pytest.approx(1 + correct / cycles, rel=1e-12)
