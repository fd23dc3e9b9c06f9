"""The node lease on the plain playbook path: ab_test.yml and a hand-run stop.yml take the
driver's node lease (specab/node/lease.py through the node_lease role) and are refused, naming the holder,
before any server stop or start while a driver experiment holds the node."""
from __future__ import annotations

import json
import os
import socket

import pytest

from specab.config.inventory import load_inventory
from specab.driver.lease import NodeLeases
from tests.ansible.conftest import SimNode, experiment

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_lease_held_by_a_driver_refuses_ab_test_and_stop_before_anything_is_stopped_or_started(sim_node: SimNode):
    exp_file = sim_node.write_experiment(experiment(sim_node.port))
    inv = sim_node.write_inventory()
    lease_file = sim_node.node_dir / "experiment.lease"
    notices: list[str] = []
    with NodeLeases(load_inventory(str(inv)).hosts, "drv-lease-1", notice=notices.append) as driver_lease:
        token = driver_lease.holder["token"]
        result = sim_node.playbook("ab_test.yml", {"specab_experiment_file": str(exp_file),
                                                   "specab_experiment_id": "t-lease"})
        assert result.rc != 0, str(result)
        flat = result.flat
        assert "experiment drv-lease-1" in flat and f"controller {socket.gethostname()} pid {os.getpid()}" in flat \
            and driver_lease.holder["started_at_iso"] in flat, flat[-3000:]
        assert "Nothing was stopped or started" in flat, flat[-3000:]
        # nothing was shipped, stopped or started: no node tools, no server ever recorded, no run directory, no
        # start task reached
        assert not (sim_node.node_dir / "bin").exists(), "ab_test.yml shipped its tools to a node another holds"
        assert sim_node.server_record() is None
        assert not (sim_node.node_dir / "runs").exists() and not (sim_node.runs_dir / "t-lease").exists()
        assert "Start | Start arm" not in flat and "Stop | Stop any server of ours" not in flat
        # the driver's lease is untouched
        assert json.loads(lease_file.read_text())["token"] == token

        # a hand-run stop.yml is refused the same way
        stop = sim_node.playbook("stop.yml", {"specab_experiment_file": str(exp_file)})
        assert stop.rc != 0 and "experiment drv-lease-1" in stop.flat, str(stop)
        assert not (sim_node.node_dir / "bin").exists(), "stop.yml shipped its tools to a node another holds"
        assert "Stop | Stop the server recorded in server.json" not in stop.flat
        assert json.loads(lease_file.read_text())["token"] == token

        # the driver's own stop.yml (its holder passed) runs under its lease and leaves it in place
        own = sim_node.playbook("stop.yml", {"specab_experiment_file": str(exp_file),
                                             "specab_lease_holder": driver_lease.holder})
        assert own.rc == 0, str(own)
        assert json.loads(lease_file.read_text())["token"] == token
    assert notices == [] and not lease_file.exists()

    # the node free again: stop.yml by hand takes the lease for its stop and releases it
    stop = sim_node.playbook("stop.yml", {"specab_experiment_file": str(exp_file)})
    assert stop.rc == 0, str(stop)
    assert not lease_file.exists()


def test_ab_test_releases_its_lease_when_an_arm_fails(sim_node: SimNode):
    exp = experiment(sim_node.port)
    exp["env"]["SPECAB_SIM_FAULT"] = "oom_at_start"       # every server exits at start
    result = sim_node.playbook("ab_test.yml", {"specab_experiment_file": str(sim_node.write_experiment(exp)),
                                               "specab_experiment_id": "t-lease-fail"})
    assert result.rc != 0 and "Lease | Release the node lease" in result.flat, str(result)
    assert not (sim_node.node_dir / "experiment.lease").exists(), "the failed round kept the node lease"
