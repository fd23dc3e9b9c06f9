"""Env verification fails the run, readably, when the engine does not run with the arm's env or args,
and the failed run leaves no server behind but keeps its artefacts."""
from __future__ import annotations

import json
import re

import pytest

from tests.ansible.conftest import EAGLE3, SimNode, experiment, record_alive, resolved_arm

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _run(node: SimNode, exp: dict, arm_index: int, run_id: str, **extra: object):
    return node.playbook("arm.yml", {"specab_experiment": exp, "specab_arm": resolved_arm(exp, arm_index),
                                     "specab_run_id": run_id, "specab_experiment_id": "t-env",
                                     "specab_run_dir": str(node.runs_dir / "t-env" / run_id), **extra})


def _assert_nothing_left(node: SimNode, run_id: str) -> None:
    last = json.loads((node.node_dir / "last_server.json").read_text())
    assert last["run_id"] == run_id and not record_alive(last), "the failed run's server must be stopped"
    assert node.server_record() is None
    assert (node.runs_dir / "t-env" / run_id / "server.log").exists(), "the failed run's artefacts are kept"


def test_workers_without_the_nccl_env_fail_the_run(sim_node: SimNode) -> None:
    exp = experiment(sim_node.port)
    result = _run(sim_node, exp, 0, "001-baseline", server_start_source_env_file=False)
    assert result.rc != 0, str(result)
    assert "Env verification failed on sim0: " in result.flat
    # names the variable, the process and the expected value
    assert re.search(r"NCCL_PROTO: expected ''?LL''? in every engine process, but sglang::scheduler_TP\d \(pid \d+\) "
                     r"does not have it", result.flat), str(result)
    assert not (sim_node.runs_dir / "t-env" / "001-baseline" / "bench.jsonl").exists(), \
        "no benchmark after a failed env verification"
    _assert_nothing_left(sim_node, "001-baseline")


def test_server_args_that_differ_from_the_arm_fail_the_run(sim_node: SimNode) -> None:
    # SGLang silently adjusts draft tokens to steps + 1 when topk == 1: the server does not run the arm.
    exp = experiment(sim_node.port, arms=[{"name": "eagle3-dt5",
                                           "server_args": {**EAGLE3, "speculative_num_draft_tokens": 5}}])
    result = _run(sim_node, exp, 0, "001-eagle3-dt5")
    assert result.rc != 0, str(result)
    assert "speculative_num_draft_tokens" in result.flat
    assert "Env verification failed on sim0" in result.flat
    check = json.loads((sim_node.runs_dir / "t-env" / "001-eagle3-dt5" / "env_check.json").read_text())
    arg = check["args"]["speculative_num_draft_tokens"]
    assert (arg["expected"], arg["actual"], arg["ok"]) == (5, 3, False)
    _assert_nothing_left(sim_node, "001-eagle3-dt5")
