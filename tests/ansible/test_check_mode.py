"""ab_test.yml --check --diff changes nothing and shows the rendered launch script and env file."""
from __future__ import annotations

import pytest

from tests.ansible.conftest import EAGLE3, SimNode, experiment

pytestmark = [pytest.mark.timeout(600)]


def test_check_diff_changes_nothing_and_shows_the_rendered_files(sim_node: SimNode) -> None:
    # one arm (EAGLE-3) keeps the test short; the template is the same for every arm
    exp = experiment(sim_node.port, arms=[{"name": "eagle3-s2", "server_args": dict(EAGLE3)}])
    exp_file = sim_node.write_experiment(exp)
    sim_node.write_inventory()
    result = sim_node.playbook("ab_test.yml", {"specab_experiment_file": str(exp_file)}, "--check", "--diff")
    assert result.rc == 0, str(result)
    out = result.output
    # the rendered launch script
    assert "+exec " in out and "-m specab.sim.launch_server" in out
    assert "+  --tp-size 2" in out and "+  --mem-fraction-static 0.88" in out and "+  --trust-remote-code" in out
    assert "+  --speculative-algorithm EAGLE3" in out and "+  --speculative-num-draft-tokens 3" in out
    assert '+. "${specab_here}/nccl.env"' in out
    # the rendered env file
    for var, value in (("NCCL_PROTO", "LL"), ("NCCL_ALGO", "Ring"), ("NCCL_BUFFSIZE", "16777216")):
        assert f"+{var}={value}" in out
    # nothing changed on the node or the controller, nothing started
    assert not sim_node.node_dir.exists(), "check mode must not create the node directory"
    assert not sim_node.runs_dir.exists(), "check mode must not create run directories"
    assert sim_node.server_record() is None


# --------------------------------------------------------------------------- the driver's checks

def _refused_before_any_start(node: SimNode, result) -> None:
    assert result.rc != 0, str(result)
    assert "Nothing was started." in result.output, str(result)
    assert "TASK [Run |" not in result.output, "the A/B play must not start"
    assert not node.node_dir.exists() and not node.runs_dir.exists() and node.server_record() is None


def test_missing_experiment_file_is_named_and_relative_paths_resolve_from_the_current_directory(
        sim_node: SimNode, tmp_path) -> None:
    sim_node.write_inventory()
    result = sim_node.playbook("ab_test.yml", {"specab_experiment_file": "nowhere/missing.yml"}, "--check",
                               cwd=tmp_path)
    _refused_before_any_start(sim_node, result)
    assert f"{tmp_path}/nowhere/missing.yml does not exist" in result.flat, str(result)
    # the same relative path, once the file exists under the current directory, is accepted (check mode)
    exp = experiment(sim_node.port, arms=[{"name": "eagle3-s2", "server_args": dict(EAGLE3)}])
    (tmp_path / "nowhere").mkdir()
    (tmp_path / "nowhere" / "missing.yml").write_text(sim_node.write_experiment(exp).read_text())
    result = sim_node.playbook("ab_test.yml", {"specab_experiment_file": "nowhere/missing.yml"}, "--check",
                               cwd=tmp_path)
    assert result.rc == 0, str(result)
    assert f"({tmp_path}/nowhere/missing.yml)" in result.flat


def test_misspelt_server_arg_is_refused_by_the_playbook_before_any_start(sim_node: SimNode) -> None:
    exp = experiment(sim_node.port)
    exp["server_args"]["mem_fraction"] = exp["server_args"].pop("mem_fraction_static")
    result = sim_node.playbook("ab_test.yml", {"specab_experiment_file": str(sim_node.write_experiment(exp))})
    _refused_before_any_start(sim_node, result)
    # the node's own --help refused it, as the driver's preflight does (specab/driver/preflight.py)
    assert "server_args.mem_fraction -> --mem-fraction is not a flag of the engine on sim0" in result.flat
    assert "did you mean --mem-fraction-static" in result.flat


def test_a_tp_size_above_the_nodes_gpus_is_refused_by_the_playbook_before_any_start(sim_node: SimNode) -> None:
    """The playbook path checks the arms against the node as the driver does (specab/driver/nodecheck.py)."""
    exp = experiment(sim_node.port)
    exp["server_args"]["tp_size"] = 16
    result = sim_node.playbook("ab_test.yml", {"specab_experiment_file": str(sim_node.write_experiment(exp))})
    _refused_before_any_start(sim_node, result)
    assert "arm baseline on sim0: its server takes 16 GPU(s) (tp_size 16: server_args.tp_size at" in result.flat
    assert "but sim0 has 8 (nvidia-smi)" in result.flat


def test_misspelt_bench_key_is_refused_with_a_suggestion(sim_node: SimNode) -> None:
    exp = experiment(sim_node.port)
    exp["bench"]["num_request"] = exp["bench"].pop("num_requests")
    result = sim_node.playbook("ab_test.yml", {"specab_experiment_file": str(sim_node.write_experiment(exp))},
                               "--check", "--diff")
    _refused_before_any_start(sim_node, result)
    assert "unknown key 'num_request' in bench (did you mean 'num_requests'?)" in result.flat
