"""One server across a load sweep end to end (docs/decisions/0011): `driver.py --matrix concurrency=1,2,3` with
`design.server: per-instance` on the simulated node, through the run queue, interrupted and resumed.

The truth is the simulator's own record: its launch counter (`<state>/instances`: one per server start) and its
/flush_cache record (`<state>/flushes.jsonl`: every reset it answered, and which start answered it). Two instances
per block: the baseline's loads (its server dies after its 10th request: the first load's warm-up and 8 measured
requests, then the next load's warm-up: that run fails and ends its instance) and EAGLE-3's (the driver is
interrupted while its second load runs; `--resume` runs the missing loads on a server of their own)."""
from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import yaml

from specab.config import instances, matrix
from specab.config.plan import make_plan
from specab.config.spec import load_experiment
from specab.results import store as st
from tests.driver.simnode import SimNode, driver, free_port, reap_driver, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
SEED = 3


@pytest.fixture
def node(tmp_path: Path):
    n = SimNode(root=tmp_path, port=free_port(), profile="instant")
    yield n
    n.cleanup()


def _experiment(node: SimNode) -> Path:
    path = node.write_experiment("sweep", num_requests=8, output_len=32)
    doc = yaml.safe_load(path.read_text())
    exp = doc["specab_experiment"]
    exp["design"] = {"server": "per-instance"}
    exp["server_args"]["tp_size"] = 2
    exp["arms"][0]["env"] = {"SPECAB_SIM_FAULT": "crash_after=10"}      # the baseline's servers
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _planned(path: Path) -> list[str]:
    """The plan the seed draws (config/plan.py): each instance's loads back to back, in the seeded order."""
    exp = load_experiment(path)
    arms = matrix.build_arms(exp, matrix.parse_matrix(["concurrency=1,2,3"])).arms
    groups = instances.load_groups(arms)
    return [r.run_id for r in make_plan([a.name for a in arms], 1, SEED, groups=groups)]


def _flushes(node: SimNode) -> list[dict]:
    path = node.state_dir / "flushes.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_one_server_per_instance_with_a_failure_an_interrupt_and_a_resume(node: SimNode):
    path = _experiment(node)
    planned = _planned(path)
    eagle = [rid for rid in planned if "eagle3" in rid]
    base = [rid for rid in planned if "baseline" in rid]
    assert len(eagle) == len(base) == 3 and planned in (base + eagle, eagle + base), planned
    common = ["-i", str(node.write_inventory()), "--runs-dir", str(node.runs_dir), "--executor", "queue"]
    proc = driver("-e", str(path), "--matrix", "concurrency=1,2,3", "--repeats", "1", "--seed", str(SEED), *common)
    try:
        def second_load_benchmarking() -> bool:
            bench = node.node_dir / "runs" / eagle[1] / "bench.jsonl"
            return bench.exists() and '"warmup":false' in bench.read_text()
        wait_for(second_load_benchmarking, timeout=400, interval=0.05, what=f"{eagle[1]} benchmarking", proc=proc)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=300)
    finally:
        reap_driver(proc, 120)
    assert proc.returncode == 130, out[-4000:]
    assert not node.server_alive() and node.gpus_busy() == [], out[-4000:]
    [exp_dir] = [d for d in node.runs_dir.iterdir() if (d / st.FILENAME).exists()]
    with st.Store.open(exp_dir) as s:
        assert [r["run_id"] for r in s.plan()] == planned, "the plan is the seed's, each instance back to back"
        assert {r["run_id"]: r["status"] for r in s.runs()}[eagle[1]] == st.INTERRUPTED
    launches_before = int((node.state_dir / "instances").read_text())

    resumed = driver("--resume", exp_dir.name, *common)
    out2, _ = resumed.communicate(timeout=600)
    assert resumed.returncode == 1, out2[-4000:]          # the baseline's failed run keeps the status non-zero
    assert not node.server_alive() and node.gpus_busy() == []
    with st.Store.open(exp_dir) as s:
        rows = {r["run_id"]: r for r in s.runs()}
        plan = {r["run_id"]: r for r in s.plan()}
    seq = {rid: plan[rid]["seq"] for rid in planned}
    # the baseline's instance: its second load failed when its server died, which ended the instance; the third load
    # started a server of its own
    assert [rows[r]["status"] for r in base] == ["ok", "failed", "ok"], [rows[r]["failure_reason"] for r in base]
    assert rows[base[1]]["failure_phase"] in ("warming up", "benchmarking")
    assert [rows[r]["server_seq"] for r in base] == [seq[base[0]], seq[base[0]], seq[base[2]]]
    # EAGLE-3's: the interrupted second load and the third ran after the resume, on one server of their own
    assert [rows[r]["status"] for r in eagle] == ["ok", "ok", "ok"]
    assert rows[eagle[1]]["attempt"] == 2
    assert [rows[r]["server_seq"] for r in eagle] == [seq[eagle[0]], seq[eagle[1]], seq[eagle[1]]]
    # the simulator's own count: one start per instance that ran whole, one for the baseline's third load, one after
    # the resume; a reset before each load that continued a server, each answered done by the server it continued
    assert int((node.state_dir / "instances").read_text()) == 4
    assert launches_before == 3 if planned[0] == base[0] else launches_before == 1
    # (the interrupted attempt of EAGLE-3's second load had continued its instance's server: its reset is the third)
    flushes = _flushes(node)
    assert [f["ok"] for f in flushes] == [True, True, True], flushes
    continued = [r for r in planned if rows[r]["server_seq"] != seq[r]]
    assert sorted(continued) == sorted([base[1], eagle[2]]), continued
    for rid in planned:
        reset = exp_dir / rid / "cache_reset.json"
        assert reset.exists() == (rows[rid]["server_seq"] != seq[rid]), rid
        if reset.exists():
            assert json.loads(reset.read_text())["ok"]
