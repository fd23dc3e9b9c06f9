"""`driver.py plan` and Ansible render the launch script from one context (specab.config.launch): for the same
arm on the same host they write the same bytes, the engine kind included (the experiment's `engine:` wins over
the host's `specab_engine`; on vllm, model_path is passed as --model) and the arm's engine build's command and env.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from specab.config.inventory import Host
from specab.config.spec import ArmSpec
from specab.driver.render import render_arm
from tests.ansible.conftest import REPO, SimNode, experiment

pytestmark = [pytest.mark.timeout(300)]


def _render_playbook(path: Path) -> Path:
    """roles/server_start's render entry point (the per-run path) for every run, into a node directory."""
    play = [{"name": "Render the runs as the per-run path does", "hosts": "gpu_nodes", "gather_facts": False,
             "roles": [{"role": "specab"}],
             "tasks": [{"name": "Start | Render one run",
                        "ansible.builtin.include_role": {"name": "server_start", "tasks_from": "render"},
                        "vars": {"server_start_arm": "{{ item.arm }}", "server_start_run_id": "{{ item.run_id }}",
                                 "server_start_templates_dir": str(REPO / "templates")},
                        "loop": "{{ specab_runs }}"}]}]
    path.write_text(yaml.safe_dump(play, sort_keys=False))
    return path


@pytest.mark.parametrize(("experiment_engine", "host_engine", "flag"), [
    ("vllm", None, "--model"),               # the experiment names the engine; the host does not
    (None, "vllm", "--model"),               # only the host does
    ("sglang", "vllm", "--model-path"),      # both do: the experiment's wins
], ids=["experiment", "host", "both"])
def test_plan_and_ansible_render_the_same_launch_script(sim_node: SimNode, experiment_engine: str | None,
                                                         host_engine: str | None, flag: str) -> None:
    host_vars: dict[str, Any] = {"specab_engines": {"alt": {"python": sys.executable, "env": {"ALT_BUILD": "1"}}}}
    if host_engine:
        host_vars["specab_engine"] = host_engine
    sim_node.write_inventory(**host_vars)
    exp = experiment(sim_node.port)
    if experiment_engine:
        exp["engine"] = experiment_engine
    arms = [ArmSpec(name="baseline", server_args={"model_path": "/m/x", "tp_size": 2, "gone": None},
                    env={"NCCL_PROTO": "LL", "GONE": None}, is_baseline=True, baseline="baseline"),
            ArmSpec(name="alt-build", server_args={"model_path": "/m/x", "tp_size": 2}, env={}, is_baseline=True,
                    baseline="alt-build", engine="alt")]
    runs = [{"run_id": f"00{i}-{a.name}", "arm": a.to_extravar()} for i, a in enumerate(arms, start=1)]
    result = sim_node.playbook(str(_render_playbook(sim_node.root / "render.yml")),
                               {"specab_experiment": exp, "specab_runs": runs}, cwd=sim_node.root)
    assert result.rc == 0, str(result)
    host = Host(name=sim_node.name, vars=yaml.safe_load(sim_node.inventory.read_text())
                ["all"]["children"]["gpu_nodes"]["hosts"][sim_node.name])
    for arm, run in zip(arms, runs):
        plan = render_arm(arm, host, run_id=run["run_id"], experiment_engine=experiment_engine)
        run_dir = sim_node.node_dir / "runs" / run["run_id"]
        assert (run_dir / "launch.sh").read_text() == plan.launch_sh, run["run_id"]
        assert (run_dir / "nccl.env").read_text() == plan.env_file, run["run_id"]
        assert f"\n  {flag} /m/x " in plan.launch_sh and "gone" not in plan.launch_sh.lower(), plan.launch_sh
    assert "ALT_BUILD" in (sim_node.node_dir / "runs" / "002-alt-build" / "launch.sh").read_text()
