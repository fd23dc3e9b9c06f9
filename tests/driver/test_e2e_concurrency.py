"""The verdict per load end to end: `driver.py --matrix steps=1,2 concurrency=1,8,32` on the simulated node (the
run queue), checked against the simulator's own trace (the times it emitted each chunk, the device-timer seconds of
the passes that served each request), not against wall-clock speed.

The node runs the h200-known-truth profile, whose batched speculative cycle grows as the real H200's did (the
known-truth facts, concurrency), so speculation wins at one request in flight and loses from a few on; its start-up
is cut to nothing (the timing model is untouched) to keep the 18 runs cheap."""
from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
import yaml

from specab.analysis.measures import phases
from specab.analysis.evidence.model import load_store
from specab.results import store as st
from tests.driver.simnode import SimNode, driver, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
SCALE = 1           # real time: at a faster scale the baseline's chunks at 8 in flight came every ~80 us of wall time
                    # and the client (one Python thread per request) read them late: 9 % off the trace at scale 4
# how far the per-user speedup at one request in flight may lie from the simulator's own. With several in flight the
# client (one Python thread per request) reads a stream of small chunks later than one of fewer, fuller chunks when
# the box is busy: at 32 in flight ~6 % on an idle 2-core box, at 8 up to 6 % beside another test module. That is the
# client's reading, not the analysis: there the test holds the analysis to the client's own numbers exactly and the
# shape to the facts. (A late read can also make a request look faster: a first chunk read late shortens its decode
# span, so no bound in either direction holds for the client's rate under load.)
TRUTH_TOL_SINGLE_STREAM = 0.05
LOADS = (1, 8, 32)


def _profile(tmp: Path) -> Path:
    from specab.sim.profile import PROFILE_DIR
    p = yaml.safe_load((PROFILE_DIR / "h200-known-truth.yml").read_text())
    p["name"] = "h200-known-truth-instant-start"
    p["load"] = {k: 0.0 for k in p["load"]} | {"sigterm_poll_s": 0.05}
    out = tmp / "profile.yml"
    out.write_text(yaml.safe_dump(p))
    return out


def _experiment(node: SimNode) -> Path:
    exp = {"specab_experiment": {
        "name": "conc", "model_path": "/models/known-truth-target",
        "server_args": {"tp_size": 1, "mem_fraction_static": 0.6, "host": "127.0.0.1", "port": node.port,
                        "max_running_requests": 48},
        "env": {},
        "arms": [{"name": "baseline"},
                 {"name": "eagle3", "server_args": {"speculative_algorithm": "EAGLE3",
                                                    "speculative_draft_model_path": "/models/known-truth-eagle3",
                                                    "speculative_num_steps": 2, "speculative_eagle_topk": 1,
                                                    "speculative_num_draft_tokens": 3}}],
        "bench": {"api": "generate", "num_requests": 32, "warmup_requests": 1, "input_len": 16, "output_len": 48,
                  "concurrency": 1, "seed": 1, "timeout_s": 120},
        "timeouts": {"ready_s": 60, "stop_grace_s": 5, "gpu_free_s": 30}}}
    p = node.root / "conc.yml"
    p.write_text(json.dumps(exp))
    return p


@pytest.fixture
def node(tmp_path: Path):
    n = SimNode(root=tmp_path, port=free_port(), time_scale=str(SCALE), profile=str(_profile(tmp_path)))
    yield n
    n.cleanup()


def _traced(trace: list[dict], run) -> list[dict]:
    """The simulator's trace lines of a run's measured requests: the runs ran one after another, so they are the
    requests that arrived inside the run's measured window (its warm-up request came alone, before it)."""
    w0, w1 = run.window
    out = [t for t in trace if w0 - 1e-3 <= t["arrival_wall"] <= w1]
    assert len(out) == len(run.measured), (run.run_id, len(out), len(run.measured))
    assert sorted(t["spec_verify_ct"] or 0 for t in out) == sorted(q.spec_verify_ct or 0 for q in run.measured)
    return out


def _true_per_user(trace: list[dict], run) -> float:
    """The run's per-user tok/s by the simulator's own emission times: the median request decode rate."""
    return statistics.median((t["completion_tokens"] - 1) / ((t["emit_mono"][-1] - t["emit_mono"][0]) * SCALE)
                             for t in _traced(trace, run))


def _modelled_per_user(trace: list[dict], run) -> float:
    """The run's per-user tok/s by the simulator's timing model: the median request's decode tokens over the modelled
    seconds of the forward passes that served it (the batch each pass actually had), which the box's speed does not
    move."""
    return statistics.median((t["completion_tokens"] - 1) / sum(t["pass_forward_s"].values())
                             for t in _traced(trace, run))


def test_matrix_steps_and_concurrency_to_a_verdict_per_load(node: SimNode):
    trace_file = node.root / "sim-trace.jsonl"
    inv = node.write_inventory({**node.host_vars(),
                                "specab_node_env": {**node.node_env(), "SPECAB_SIM_TRACE": str(trace_file)}})
    proc = driver("-e", str(_experiment(node)), "-i", str(inv), "--runs-dir", str(node.runs_dir),
                  "--matrix", "steps=1,2", "--matrix", "concurrency=1,8,32", "--repeats", "2", "--seed", "2")
    out, _ = proc.communicate(timeout=800)
    assert proc.returncode == 0, out[-4000:]
    exp_dir = next(d for d in node.runs_dir.iterdir() if (d / st.FILENAME).exists())
    exp = load_store(exp_dir)
    trace = [json.loads(x) for x in trace_file.read_text().splitlines()]

    # every run ran at its own arm's load: the client kept that many requests in flight, and the engine batched them
    for r in exp.runs:
        want = exp.arm(r.arm).matrix["concurrency"]
        assert r.status == "ok" and r.arm.endswith(f"-c{want}")
        assert json.loads((r.run_dir / "bench_summary.json").read_text())["concurrency"] == want
        assert json.loads((r.run_dir / "queue_entry.json").read_text())["bench"]["concurrency"] == want
        assert r.latency and r.latency["itl_s"]["p50"] and r.latency["ttft_s"]["p99"] >= r.latency["ttft_s"]["p50"]
        batch = max(t["pass_batch_sum"] / max(1, t["spec_verify_ct"] or len(t["emit_mono"]) - 1)
                    for t in _traced(trace, r))
        assert batch > (0.6 * want if want > 1 else 0) and batch <= want, (r.run_id, batch)

    data = json.loads((exp_dir / "report.json").read_text())["loads"]
    assert data["loads"] == list(LOADS)
    fams = {f["name"]: f for f in data["families"]}
    assert set(fams) == {"eagle3-s1-k1-d2", "eagle3-s2-k1-d3"}
    for name, fam in fams.items():
        pts = fam["points"]
        assert [p["concurrency"] for p in pts] == list(LOADS)
        for p in pts:
            assert p["baseline"] == f"baseline-c{p['concurrency']}"
            for measure in ("per_user", "throughput"):
                ci = p[measure]["ci"]
                assert ci and math.isfinite(ci["lo"]) and ci["lo"] <= p[measure]["estimate"] <= ci["hi"], (name, p)
            # the per-user speedup is the runs' paired ratio of the client's per-user rates, exactly; at one in flight
            # the ratio is the simulator's own
            arm_runs = {r.block: r for r in exp.runs_of(p["arm"])}
            base_runs = {r.block: r for r in exp.runs_of(p["baseline"])}
            got = p["per_user"]["ratios"]
            assert got == pytest.approx([arm_runs[b].tok_s / base_runs[b].tok_s for b in sorted(arm_runs)], rel=1e-9)
            if p["concurrency"] == 1:
                truth = [_true_per_user(trace, arm_runs[b]) / _true_per_user(trace, base_runs[b])
                         for b in sorted(arm_runs)]
                assert got == pytest.approx(truth, rel=TRUTH_TOL_SINGLE_STREAM), (p["arm"], got, truth)
        # the shape of the facts: a win at one in flight, a loss at 8 and 32. The engine ran the losing regime at
        # both loads by its own timing model, in every block; the client measured the win and the loss at 8 per
        # user and in throughput. At 32 the measured verdict is only held below the single-stream one: on a slow
        # 2-core host the simulated server itself falls behind its model at 32 in flight (its own emission times
        # gave 0.98 for a block whose model gives 0.82), so the client reads what the box produced, not the model.
        one, eight, many = pts
        for p in (eight, many):
            arm_runs, base_runs = exp.runs_of(p["arm"]), {r.block: r for r in exp.runs_of(p["baseline"])}
            modelled = [_modelled_per_user(trace, r) / _modelled_per_user(trace, base_runs[r.block]) for r in arm_runs]
            assert max(modelled) < 0.95, (p["arm"], modelled)
        assert one["per_user"]["estimate"] > 1.1 and one["label"] == "1 in flight (single-stream)"
        assert eight["per_user"]["estimate"] < 0.95 and eight["throughput"]["estimate"] < 0.95
        assert many["per_user"]["estimate"] < one["per_user"]["estimate"]
        x = fam["per_user"]
        assert x["direction"] == "stops" and 1 < x["estimate"] < 8, x
        assert (x["lo_open"] or x["lo"] <= x["estimate"]) and (x["hi_open"] or x["estimate"] <= x["hi"])
        # stated per load in the console, with "single-stream" only at 1 in flight
        line = next(li for li in out.splitlines() if li.startswith(f"per load: {name}:"))
        assert "at 1 in flight (single-stream)" in line and "stops paying per user at ~" in line
        assert line.count("single-stream") == 2
    report = (exp_dir / "report.md").read_text()
    assert "## Verdict per load" in report and "### Latency per load" in report
    assert (exp_dir / "report" / "speedup_vs_concurrency.png").stat().st_size > 10_000

    # phase times per request cycle at 8 in flight: within 5 % of the simulator's own per-cycle forwards
    for arm in ("eagle3-s1-k1-d2-c8", "eagle3-s2-k1-d3-c8"):
        for run in exp.runs_of(arm):
            got = phases.run_phases(run)
            assert got is not None and got.batch > 4.0, got
            traced = _traced(trace, run)
            verify = sum(t["spec_verify_ct"] for t in traced)
            truth = {cat: 1000.0 * SCALE * sum(t["pass_forward_s"].get(cat, 0.0) for t in traced) / verify
                     for cat in ("eagle_draft", "eagle_draft_extend", "target_verify")}
            for cat, ms in (("eagle_draft_extend", got.draft_extend_ms), ("target_verify", got.verify_ms)) + (
                    (("eagle_draft", got.draft_ms),) if truth["eagle_draft"] else ()):
                assert ms == pytest.approx(truth[cat], rel=0.05), (run.run_id, cat, ms, truth[cat])
