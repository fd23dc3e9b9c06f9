"""An arm whose own bench settings set the seed: its runs' manifest.json records the seed its client ran with, not
the experiment's, on the per-run path (arm.yml: a run that succeeds and one whose benchmark fails, collected by the
rescue) and on the run queue (enqueue.yml, then collect_run.yml with its default wait)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from specab.driver.record import unpack_fetched
from tests.ansible.conftest import SimNode, experiment, resolved_arm

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

EXPERIMENT_ID = "t-seed"


def _seeds(run_dir: Path) -> tuple[str, int]:
    """(the manifest's seed, the seed the benchmark client recorded in bench_summary.json)."""
    manifest = json.loads((run_dir / "manifest.json").read_text())
    summary = json.loads((run_dir / "bench_summary.json").read_text())
    return manifest["seed"], summary["seed"]


def test_per_run_manifest_records_the_arms_own_seed_on_success_and_in_the_rescue(sim_node: SimNode) -> None:
    exp = experiment(sim_node.port)                       # bench.seed 1
    sim_node.write_inventory()
    ok_dir = sim_node.runs_dir / EXPERIMENT_ID / "001-baseline"
    ok = sim_node.playbook("arm.yml", {
        "specab_experiment": exp, "specab_arm": dict(resolved_arm(exp, 0), bench={"seed": 7}),
        "specab_experiment_id": EXPERIMENT_ID, "specab_run_id": "001-baseline", "specab_run_dir": str(ok_dir)})
    assert ok.rc == 0, str(ok)
    assert _seeds(ok_dir) == ("7", 7)

    # every request past its timeout: the bench step fails, the rescue stops the server and collects the run
    failed_dir = sim_node.runs_dir / EXPERIMENT_ID / "002-baseline"
    failed = sim_node.playbook("arm.yml", {
        "specab_experiment": exp, "specab_arm": dict(resolved_arm(exp, 0), bench={"seed": 9, "timeout_s": 0.001}),
        "specab_experiment_id": EXPERIMENT_ID, "specab_run_id": "002-baseline", "specab_run_dir": str(failed_dir)})
    assert failed.rc != 0, str(failed)
    assert "measured requests failed" in failed.flat or "timeout" in failed.flat, str(failed)
    manifest = json.loads((failed_dir / "manifest.json").read_text())
    assert manifest["seed"] == "9" and manifest["extra"]["failed_task"], manifest


def test_queued_runs_manifest_records_the_arms_own_seed(sim_node: SimNode, tmp_path: Path) -> None:
    exp = experiment(sim_node.port, arms=[{"name": "baseline"}])
    sim_node.write_inventory()
    runs = [{"seq": 1, "run_id": "001-baseline", "arm": dict(resolved_arm(exp, 0), bench={"seed": 7})}]
    queued = sim_node.playbook("enqueue.yml", {"specab_experiment": exp, "specab_experiment_id": EXPERIMENT_ID,
                                               "specab_runs": runs, "specab_queue_reset": True,
                                               "specab_queue_finish": True})
    assert queued.rc == 0, str(queued)
    run_dir = tmp_path / "runs" / "001-baseline"
    collected = sim_node.playbook("collect_run.yml", {"specab_experiment": exp, "specab_run_id": "001-baseline",
                                                      "specab_run_dir": str(run_dir)})
    assert collected.rc == 0, str(collected)
    # the driver's unpacking of what collect_run.yml fetched
    assert unpack_fetched(run_dir.with_name(run_dir.name + ".tar"), run_dir.parent, ["001-baseline"]) == ["001-baseline"]
    assert _seeds(run_dir) == ("7", 7)
