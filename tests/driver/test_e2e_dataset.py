"""A dataset experiment through the driver on the simulated node (the run queue): the controller's file reaches the
node (node_prepare's copy), the client draws from it on the chat API with ignore_eos false, and every run's
requests carry their categories while its manifest names the file and its sha256."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml

from specab.results import store as st
from tests.driver.simnode import SimNode, driver, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture
def node(tmp_path: Path):
    n = SimNode(root=tmp_path, port=free_port())
    yield n
    n.cleanup()


def test_a_chat_dataset_runs_through_the_queue(node: SimNode) -> None:
    node.profile = "instant"
    exp_file = node.write_experiment("ds", output_len=24)
    doc = yaml.safe_load(exp_file.read_text())
    data = exp_file.parent / "prompts.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "def add(a, b):"}], "category": "code"}\n'
                    '{"prompt": "Tell me about the sea.", "category": "chat"}\n')
    doc["specab_experiment"]["bench"].update(api="chat", dataset="prompts.jsonl", ignore_eos=False)
    exp_file.write_text(yaml.safe_dump(doc, sort_keys=False))
    inv = node.write_inventory()
    proc = driver("-e", str(exp_file), "-i", str(inv), "--runs-dir", str(node.runs_dir), "--repeats", "1")
    out, _ = proc.communicate(timeout=800)
    assert proc.returncode == 0, out[-4000:]
    exp_dir = next(d for d in node.runs_dir.iterdir() if (d / st.FILENAME).exists())
    sha = "sha256:" + hashlib.sha256(data.read_bytes()).hexdigest()
    assert (node.node_dir / "datasets" / "prompts.jsonl").read_bytes() == data.read_bytes()
    runs = sorted(p for p in exp_dir.iterdir() if p.is_dir() and (p / "bench.jsonl").exists())
    assert len(runs) == 2
    for run in runs:
        recs = [json.loads(x) for x in (run / "bench.jsonl").read_text().splitlines()]
        assert {r["category"] for r in recs} == {"code", "chat"} and all(r["ok"] for r in recs)
        assert any(r["finish_reason"] == "stop" for r in recs)
        m = json.loads((run / "manifest.json").read_text())
        assert m["dataset"]["sha256"] == sha and m["dataset"]["kind"] == "file" and m["dataset"]["ignore_eos"] is False
