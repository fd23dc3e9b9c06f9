"""The same A/B playbook over real SSH: an sshd in a network namespace made (and removed) by the test,
host key checking on, the simulated node running inside the namespace."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.ansible.conftest import SimNode, experiment
from tests.netns import NetnsHost, netns_host  # noqa: F401  (fixture)

pytestmark = [pytest.mark.ssh, pytest.mark.slow, pytest.mark.timeout(900)]


def test_ab_round_over_ssh(netns_host: NetnsHost, tmp_path: Path) -> None:  # noqa: F811
    node = SimNode(root=tmp_path / "sim-ssh", name="gpu-ns", connection_vars=netns_host.ansible_vars())
    try:
        exp = experiment(node.port)
        exp_file = node.write_experiment(exp)
        node.write_inventory()
        result = node.playbook("ab_test.yml", {"specab_experiment_file": str(exp_file),
                                               "specab_experiment_id": "t-ssh"})
        assert result.rc == 0, str(result)
        assert "gpu-ns" in result.output and "ok=" in result.output
        sshd_log = netns_host.sshd_log.read_text()
        assert "Accepted publickey for root" in sshd_log, "Ansible must have reached the node over SSH"

        table = json.loads((node.runs_dir / "t-ssh" / "ab_table.json").read_text())
        assert [r["arm"] for r in table["rows"]] == ["baseline", "eagle3-s2"]
        assert all(r["ok"] == r["requests"] == 2 for r in table["rows"])
        eagle = table["rows"][1]
        assert eagle["accept_len"] is not None and 1.5 < eagle["accept_len"] < 3.0
        for run in ("001-baseline", "002-eagle3-s2"):
            run_dir = node.runs_dir / "t-ssh" / run
            assert {"server.log", "bench.jsonl", "launch.sh", "nccl.env", "manifest.json"} <= {
                p.name for p in run_dir.iterdir()}
            manifest = json.loads((run_dir / "manifest.json").read_text())
            assert "gpu-ns" in json.dumps(manifest)

        # the engine listened inside the namespace only: testinfra over SSH sees the node free again
        check = node.infra_check()
        assert check.rc == 0, f"testinfra over SSH should pass on free GPUs:\n{check}"
        assert "4 passed" in check.output
    finally:
        node.stop()
