"""enqueue.yml for real (the run queue, docs/architecture.md "Run queue"): the batch rendered on the controller
(roles/server_start render_batch) and written by one `sequence.py stage` call deploys, for every run, the
bytes the per-run path (roles/server_start render.yml: arm.yml, ab_test.yml) writes for the same arm —
launch.sh, nccl.env, args.json, engine.json, in the same modes — with values that need quoting, an arm with a
secret server arg and a secret env var, and an arm on another engine build; the runs then pass env
verification on the simulated engine, and no secret appears in the playbook's output."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.ansible.conftest import EAGLE3, REPO, SimNode, experiment, resolved_arm

pytestmark = [pytest.mark.timeout(600)]

API_KEY = "STAGESECRETKEY314"
TOKEN = "STAGESECRETTOKEN271"
# values that reach the engine only when quoted right (no double quote: the served name is a metrics label)
QUOTED_NAME = "it's a $(model) & <name> `x` ; y"
QUOTED_ENV = "INIT,ENV x'y $HOME \\ z"
FILES = ("launch.sh", "nccl.env", "args.json", "engine.json")
EXPERIMENT_ID = "t-20261201-000000"


def _per_run_playbook(path: Path) -> Path:
    """The per-run path's render (roles/server_start render.yml) for every run, into another node directory."""
    play = [{"name": "Render the runs as the per-run path does",
             "hosts": "gpu_nodes", "gather_facts": False,
             "roles": [{"role": "specab"}],
             "tasks": [{"name": "Start | Render one run",
                        "ansible.builtin.include_role": {"name": "server_start", "tasks_from": "render"},
                        "vars": {"server_start_arm": "{{ item.arm }}", "server_start_run_id": "{{ item.run_id }}",
                                 "server_start_node_dir": "{{ per_run_node_dir }}",
                                 "server_start_templates_dir": str(REPO / "templates")},
                        "loop": "{{ specab_runs }}"}]}]
    path.write_text(yaml.safe_dump(play, sort_keys=False))
    return path


def test_enqueue_stages_the_per_run_paths_bytes_in_one_call(sim_node: SimNode) -> None:
    exp = experiment(sim_node.port, arms=[
        {"name": "baseline", "server_args": {"served_model_name": QUOTED_NAME}, "env": {"NCCL_DEBUG_SUBSYS": QUOTED_ENV}},
        {"name": "eagle3-s2", "server_args": {**EAGLE3, "api_key": API_KEY}, "env": {"TOKEN": TOKEN}},
        {"name": "alt-build"}])
    sim_node.write_inventory(specab_engines={"alt": {"python": sys.executable,
                                                     "env": {"SPECAB_SIM_SGLANG_VERSION": "0.5.9"}}})
    alt = dict(resolved_arm(exp, 2, sglang_version="0.5.9"), engine="alt", engine_flags_fingerprint="f00d")
    runs = [{"seq": 1, "run_id": "001-baseline", "arm": resolved_arm(exp, 0)},
            {"seq": 2, "run_id": "002-eagle3-s2", "arm": resolved_arm(exp, 1)},
            {"seq": 3, "run_id": "003-alt-build", "arm": alt}]
    result = sim_node.playbook("enqueue.yml", {"specab_experiment": exp, "specab_experiment_id": EXPERIMENT_ID,
                                               "specab_runs": runs, "specab_queue_reset": True,
                                               "specab_queue_finish": True}, "-vvv")
    assert result.rc == 0, str(result)
    # -vvv prints every task's arguments and result unless no_log hides them (the rendered files, the batch)
    assert API_KEY not in result.output and TOKEN not in result.output, "a secret in enqueue.yml's -vvv output"
    assert "Start | Write the run directories and queue the entries in run order (one call)" in result.output

    # while the sequencer runs the queued runs: the per-run path renders the same arms elsewhere
    per_run_dir = sim_node.root / "per-run"
    per_run = sim_node.playbook(str(_per_run_playbook(sim_node.root / "per_run.yml")),
                                {"specab_experiment": exp, "specab_runs": runs, "per_run_node_dir": str(per_run_dir)},
                                cwd=sim_node.root)
    assert per_run.rc == 0, str(per_run)

    node_dir = sim_node.node_dir
    for run in runs:
        done = subprocess.run([sys.executable, str(node_dir / "bin" / "specab" / "node"), "sequence",
                               "--node-dir", str(node_dir), "wait", "--run-id", run["run_id"], "--timeout", "240"],
                              capture_output=True, text=True, timeout=300)
        record = json.loads(done.stdout.strip().splitlines()[-1])
        # ok: the engine started from the staged launch.sh and env verification found every arg and variable
        assert record["status"] == "ok", (record, done.stderr[-2000:])
        for name in FILES:
            staged, rendered = node_dir / "runs" / run["run_id"] / name, per_run_dir / "runs" / run["run_id"] / name
            assert staged.read_bytes() == rendered.read_bytes(), f"{run['run_id']}/{name} differs from the per-run path"
            assert staged.stat().st_mode & 0o777 == rendered.stat().st_mode & 0o777, f"{run['run_id']}/{name} mode"
    spec_run, alt_run = node_dir / "runs" / "002-eagle3-s2", node_dir / "runs" / "003-alt-build"
    assert API_KEY in (spec_run / "launch.sh").read_text() and TOKEN in (spec_run / "nccl.env").read_text()
    assert "SPECAB_SIM_SGLANG_VERSION=0.5.9" in (alt_run / "launch.sh").read_text()
    assert json.loads((alt_run / "engine.json").read_text())["build"] == "alt"
    assert QUOTED_NAME in json.loads((node_dir / "runs" / "001-baseline" / "args.json").read_text()).values()


def _per_run_bench_playbook(path: Path, out: Path) -> Path:
    """The bench settings the per-run path's bench role gets (playbooks/tasks/run_arm.yml: its bench task's
    bench_settings are the run's block's run_arm_bench, the expression read from the file), written as JSON."""
    def walk(tasks: list[dict]) -> list[dict]:
        return [t for task in tasks for t in [task, *walk(task.get("block", []) + task.get("rescue", [])
                                                          + task.get("always", []))]]
    tasks = walk(yaml.safe_load((REPO / "playbooks" / "tasks" / "run_arm.yml").read_text()))
    found = [t for t in tasks if "bench_settings" in (t.get("vars") or {})]
    assert len(found) == 1, "run_arm.yml hands the bench role its settings in one task"
    assert found[0]["vars"]["bench_settings"] == "{{ run_arm_bench }}"
    [resolved] = [t["vars"]["run_arm_bench"] for t in tasks if "run_arm_bench" in (t.get("vars") or {})]
    play = [{"name": "The per-run path's bench settings", "hosts": "gpu_nodes", "gather_facts": False,
             "roles": [{"role": "specab"}],
             "tasks": [{"name": "Bench | Write them", "vars": {"bench_settings": resolved},
                        "ansible.builtin.copy": {"content": "{{ bench_settings | to_json }}", "dest": str(out),
                                                 "mode": "0644"}}]}]
    path.write_text(yaml.safe_dump(play, sort_keys=False))
    return path


def test_the_queue_entrys_bench_is_what_the_per_run_path_bench_role_gets(sim_node: SimNode, tmp_path: Path) -> None:
    """A matrix arm with its own bench condition (concurrency) and a dataset, an inventory specab_bench_* value
    (ab_test.yml honours it): the queued run's bench settings equal the per-run path's, value for value, type for
    type, and carry no experiment key that is not a bench setting (phase_timing)."""
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Say {i} words."}) + "\n" for i in range(4)))
    exp = experiment(sim_node.port, arms=[{"name": "baseline"}])
    exp["bench"] = {**exp["bench"], "dataset": str(data), "phase_timing": False}
    sim_node.write_inventory(specab_bench_request_rate=50)
    arm = dict(resolved_arm(exp, 0), bench={"concurrency": 2})
    runs = [{"seq": 1, "run_id": "001-baseline", "arm": arm}]
    result = sim_node.playbook("enqueue.yml", {"specab_experiment": exp, "specab_experiment_id": EXPERIMENT_ID,
                                               "specab_runs": runs, "specab_queue_reset": True,
                                               "specab_queue_finish": True})
    assert result.rc == 0, str(result)
    node_dir = sim_node.node_dir
    subprocess.run([sys.executable, str(node_dir / "bin" / "specab" / "node"), "sequence", "--node-dir",
                    str(node_dir), "wait", "--run-id", "001-baseline", "--timeout", "240"],
                   capture_output=True, text=True, timeout=300)
    entry = json.loads((node_dir / "runs" / "001-baseline" / "queue_entry.json").read_text())

    out = tmp_path / "per_run_bench.json"
    node_path = entry["run_dir"].rsplit("/runs/", 1)[0]
    per_run = sim_node.playbook(str(_per_run_bench_playbook(tmp_path / "per_run_bench.yml", out)),
                                {"specab_experiment": exp, "specab_arm": arm, "node_prepare_node_path": node_path},
                                cwd=sim_node.root)
    assert per_run.rc == 0, str(per_run)
    expected = json.loads(out.read_text())
    assert entry["bench"] == expected
    assert {k: type(v) for k, v in entry["bench"].items()} == {k: type(v) for k, v in expected.items()}
    assert (entry["bench"]["concurrency"], entry["bench"]["request_rate"]) == (2, 50.0)
    assert entry["bench"]["dataset"] == f"{node_path}/datasets/prompts.jsonl"
    assert "phase_timing" not in entry["bench"]
