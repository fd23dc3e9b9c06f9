"""arm.yml run after run: a leftover server of ours is stopped first, and the testinfra check
fails readably while a server holds the GPUs and passes once they are free."""
from __future__ import annotations

import json

import pytest

from tests.ansible.conftest import SimNode, experiment, record_alive, resolved_arm

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _arm_vars(node: SimNode, exp: dict, run_id: str, **extra: object) -> dict:
    return {"specab_experiment": exp, "specab_arm": resolved_arm(exp, 0), "specab_run_id": run_id,
            "specab_experiment_id": "t-life", "specab_run_dir": str(node.runs_dir / "t-life" / run_id), **extra}


def test_leftover_server_is_stopped_and_testinfra_sees_it(sim_node: SimNode) -> None:
    exp = experiment(sim_node.port)
    sim_node.write_inventory()

    first = sim_node.playbook("arm.yml", _arm_vars(sim_node, exp, "001-baseline", specab_stop_after=False))
    assert first.rc == 0, str(first)
    left = sim_node.server_record()
    assert left is not None and record_alive(left), "specab_stop_after=false leaves the server running"

    held = sim_node.infra_check()
    assert held.rc != 0, f"testinfra must fail while a server holds the GPUs:\n{held}"
    assert "4 failed" in held.output
    assert "GPU compute processes still running: GPU 0: pid" in held.output
    assert "GPU memory not released (threshold 64 MiB): GPU 0" in held.output
    assert f"server.json names pid {left['pid']} (arm baseline, run 001-baseline, port {sim_node.port})" in held.output
    assert f"server port still open: 127.0.0.1:{sim_node.port}" in held.output

    second = sim_node.playbook("arm.yml", _arm_vars(sim_node, exp, "002-baseline"))
    assert second.rc == 0, str(second)
    assert not record_alive(left), "the leftover server must have been stopped by the next run"
    assert sim_node.server_record() is None
    stopped = json.loads((sim_node.node_dir / "last_server.json").read_text())
    assert stopped["run_id"] == "002-baseline"
    assert (sim_node.runs_dir / "t-life" / "002-baseline" / "bench_summary.json").exists()
    assert json.loads((sim_node.runs_dir / "t-life" / "002-baseline" / "stop.json").read_text())["was_running"]

    free = sim_node.infra_check()
    assert free.rc == 0, f"testinfra must pass once the GPUs are free:\n{free}"
