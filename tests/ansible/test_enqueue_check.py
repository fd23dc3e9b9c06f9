"""enqueue.yml --check --diff (the run queue, docs/architecture.md "Run queue"): shows every queued run's
rendered launch script, env file and queue entry, and changes nothing: no node directory, no queue, no
sequencer."""
from __future__ import annotations

import pytest

from tests.ansible.conftest import EAGLE3, SimNode, experiment, processes_mentioning, resolved_arm

pytestmark = [pytest.mark.timeout(600)]


def test_enqueue_check_diff_shows_files_and_entries_and_changes_nothing(sim_node: SimNode) -> None:
    exp = experiment(sim_node.port, arms=[{"name": "baseline"},
                                          {"name": "eagle3-s2", "server_args": dict(EAGLE3), "env": {}}])
    # public inventory variables (roles/specab), which the entry must carry, not literals or role vars
    sim_node.write_inventory(specab_gpu_free_threshold_mib=512, specab_bench_sample_interval_s=0.25,
                             specab_bench_python="/opt/client/bin/python3")
    # run 1's measured requests chosen by the design by cost (the driver's specab_runs[].num_requests); run 2
    # without: the experiment's
    runs = [{"seq": 1, "run_id": "001-eagle3-s2", "arm": resolved_arm(exp, 1), "num_requests": 7},
            {"seq": 2, "run_id": "002-baseline", "arm": resolved_arm(exp, 0)}]
    result = sim_node.playbook("enqueue.yml", {"specab_experiment": exp, "specab_experiment_id": "t-20261129-000000",
                                               "specab_runs": runs, "specab_queue_reset": True},
                               "--check", "--diff")
    assert result.rc == 0, str(result)
    out = result.output
    # both runs' launch scripts and env files, from the same templates as the per-run path
    assert out.count("+exec ") == 2 and "-m specab.sim.launch_server" in out
    assert "+  --speculative-algorithm EAGLE3" in out and "+  --tp-size 2" in out
    assert out.count("+NCCL_PROTO=LL") == 2
    # the queue entries: named by seq and run id, with the values the sequencer runs with
    flat = result.flat
    assert "queue/.staging/000001-001-eagle3-s2.json" in flat and "queue/.staging/000002-002-baseline.json" in flat
    assert f'"url": "http://127.0.0.1:{sim_node.port}"' in out
    assert out.count('"num_requests": 7') == 1 and out.count('"num_requests": 2') == 1
    assert '"stop_grace_s": 10.0' in out
    assert out.count('"threshold_mib": 512.0') == 2, "the inventory's GPU-free threshold is in every entry"
    assert out.count('"sample_interval_s": 0.25') == 2 and out.count('"python": "/opt/client/bin/python3"') == 2
    # nothing changed, nothing started
    assert not sim_node.node_dir.exists(), "check mode must not create the node directory"
    assert not processes_mentioning(str(sim_node.node_dir)), "check mode must start nothing"
