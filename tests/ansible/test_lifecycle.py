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


def test_the_per_run_path_continues_an_instances_server_with_its_cache_reset(sim_node: SimNode) -> None:
    """One server per instance on the per-run path (playbooks/tasks/run_arm.yml, docs/decisions/0011): the first run
    of an instance keeps its server for the next (specab_instance keep), which continues it (no stop, no GPUs-free
    wait, no start) with the engine's cache reset, and stops it. The simulator's own records are the truth: its
    launch counter and its /flush_cache record."""
    exp = experiment(sim_node.port)
    sim_node.write_inventory()
    runs = [("001-baseline", True), ("002-baseline", False)]
    for run_id, keep in runs:
        got = sim_node.playbook("arm.yml", _arm_vars(sim_node, exp, run_id, specab_stop_after=not keep,
                                                     specab_instance={"id": "1", "keep": keep}))
        assert got.rc == 0, str(got)
        if keep:
            kept = sim_node.server_record()
            assert kept is not None and record_alive(kept) and kept["kept"] and kept["instance"] == "1"
    assert (sim_node.state_dir / "instances").read_text() == "1", "one server start for the instance's two runs"
    flushes = [json.loads(line) for line in (sim_node.state_dir / "flushes.jsonl").read_text().splitlines()]
    assert [(f["instance"], f["ok"]) for f in flushes] == [(0, True)]
    first, second = (sim_node.runs_dir / "t-life" / run_id for run_id, _ in runs)
    assert json.loads((second / "cache_reset.json").read_text())["ok"]
    assert json.loads((second / "instance.json").read_text())["started_run_id"] == "001-baseline"
    assert not (first / "stop.json").exists() and not (first / "cache_reset.json").exists()
    assert json.loads((second / "stop.json").read_text())["was_running"]
    assert (first / "server.log").read_text().count("fired up") == 1
    assert (second / "server.log").read_text().count("Cache flushed successfully!") == 1
    manifests = [json.loads((d / "manifest.json").read_text())["extra"] for d in (first, second)]
    assert manifests[0]["stop_s"] in (None, "null") and manifests[1]["time_to_ready_s"] in (None, "null")
    assert sim_node.server_record() is None
