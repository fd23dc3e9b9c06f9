"""The results table that ab_test.yml prints, rendered by Ansible's own templar from the playbook's task.

What a user relies on: every arm measured alike, a rate that is not there shown as '-', never as 0.0, and —
where an arm's requests all reached the client in bursts (a starved vLLM API server on 2 cores, seen in a fresh
clone's `make demo-vllm`: the baseline's 4/4 requests buffered, its tok/s printed as 0.0) — the engine's own
decode rate for every arm, with a line that says so."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

PLAYBOOK = Path(__file__).resolve().parents[2] / "playbooks" / "ab_test.yml"


def _task(node: Any, name: str) -> dict[str, Any] | None:
    if isinstance(node, dict):
        if node.get("name") == name:
            return node
        node = list(node.values())
    if isinstance(node, list):
        for child in node:
            found = _task(child, name)
            if found:
                return found
    return None


def table(rows: list[dict[str, Any]]) -> list[str]:
    task = _task(yaml.safe_load(PLAYBOOK.read_text()), "Collect | Print the results table")
    assert task, "ab_test.yml has no 'Collect | Print the results table' task"
    variables = {k: trust_as_template(v) if isinstance(v, str) else v for k, v in task["vars"].items()}
    templar = Templar(loader=DataLoader(), variables={**variables, "ab_test_rows": rows, "ab_test_dir": "/runs/x"})
    return list(templar.template(trust_as_template(task["ansible.builtin.debug"]["msg"])))


def row(arm: str, tok_s: float | None, accept: float | None = None, *, buffered: int = 0,
        engine: float | None = None, ok: int = 4) -> dict[str, Any]:
    return {"arm": arm, "speculative": accept is not None, "requests": 4, "ok": ok, "tok_s": tok_s, "ttft_s": 0.033,
            "accept_len": accept, "buffered": buffered, "engine_tok_s": engine}


def test_client_medians_and_speedups_when_every_arm_has_one() -> None:
    lines = table([row("baseline", 41.1), row("eagle3-s2", 60.5, 2.1)])
    assert lines[0].split() == ["arm", "requests", "tok/s", "(median)", "TTFT", "(ms)", "accept", "len", "speedup"]
    assert lines[1].split() == ["baseline", "4/4", "41.1", "33", "-", "1.00x"]
    assert lines[2].split() == ["eagle3-s2", "4/4", "60.5", "33", "2.10", "1.47x"]
    assert lines[3] == "speedup = median tok/s / median tok/s of arm baseline" and lines[4] == "artefacts in /runs/x"


def test_a_baseline_delivered_in_bursts_switches_every_arm_to_the_engines_rate() -> None:
    # the fresh clone's make demo-vllm: 4/4 baseline requests buffered (no client median), every arm with vLLM's rate
    lines = table([row("baseline", None, buffered=4, engine=412.3), row("draft-self-k3", 177.8, 4.0, engine=180.1),
                   row("draft-weak-k3", 68.4, 1.0, engine=70.2)])
    assert "tok/s (engine)" in lines[0]
    assert lines[1].split() == ["baseline", "4/4", "412.3", "33", "-", "1.00x"]
    assert lines[2].split() == ["draft-self-k3", "4/4", "180.1", "33", "4.00", "0.44x"]
    assert lines[3].split() == ["draft-weak-k3", "4/4", "70.2", "33", "1.00", "0.17x"]
    assert lines[4].startswith("tok/s = the engine's own decode rate over the measured requests (vLLM /metrics")
    assert "4 of 12 requests reached the client in bursts" in lines[4]
    assert lines[5] == "speedup = tok/s / tok/s of arm baseline"


def test_a_missing_rate_is_a_dash_never_zero() -> None:
    # no engine rate to fall back on (SGLang, the simulator) and an arm with no measurable rate: '-', not 0.0
    lines = table([row("baseline", 41.1), row("eagle3-s2", None, 2.1, buffered=4, ok=4)])
    assert "tok/s (median)" in lines[0]
    assert lines[2].split() == ["eagle3-s2", "4/4", "-", "33", "2.10", "-"]
    lines = table([row("baseline", None, buffered=4), row("eagle3-s2", 60.5, 2.1)])
    assert lines[1].split() == ["baseline", "4/4", "-", "33", "-", "-"]
    assert lines[2].split() == ["eagle3-s2", "4/4", "60.5", "33", "2.10", "-"]
