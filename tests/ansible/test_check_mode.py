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
