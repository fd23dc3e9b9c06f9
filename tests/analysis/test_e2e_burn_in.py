"""A freshly started node whose first server starts run slow, through the driver on the simulated node
(`slow_instance=0-1:30`: the node's first two starts decode 30 % slower, the simulator's own truth in each run's
/server_info): without a burn-in the first block measures the warm-up and the doctor's `instance-trend` names
exactly those runs with the burn-in to set; with `design.burn_in: 2` the two slow starts are the burn-in, stored
and shown apart, every measured instance is a normal one, and the rule is silent."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from specab.analysis.evidence import model as analysis
from specab.analysis.measures import stats
from tests.analysis.test_e2e_rules import SPEC, findings, host_vars, write_experiment
from tests.driver.simnode import SimNode, driver, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
FAULT = "slow_instance=0-1:30"
ARMS = [{"name": "baseline"}, {"name": "eagle3", "server_args": SPEC}]


def _node(tmp_path: Path, name: str) -> tuple[SimNode, Path]:
    node = SimNode(root=tmp_path / name, port=free_port(), time_scale="20", host=f"sim-{name}", profile="instant")
    node.root.mkdir(parents=True)
    hv = host_vars(node)
    hv["specab_node_env"] = {**node.node_env(), "SPECAB_SIM_FAULT": FAULT}      # the node's, not an arm's
    return node, node.write_inventory(hv)


def _run(node: SimNode, exp: Path, inv: Path, repeats: int) -> tuple[analysis.Experiment, str]:
    proc = driver("run", "-e", str(exp), "-i", str(inv), "--runs-dir", str(node.runs_dir), "--repeats", str(repeats))
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-4000:]
    [d] = [d for d in node.runs_dir.iterdir() if (d / "results.sqlite").exists()]
    return analysis.load_store(d), out


def _slow(run: analysis.Run) -> bool:
    """The simulator's truth: this server start was one of the node's slow ones."""
    return bool(run.server_args["simulator"]["slow_instance"]["this_instance"])


@pytest.fixture
def made(tmp_path: Path):
    nodes: list[SimNode] = []
    yield tmp_path, nodes
    for n in nodes:
        n.cleanup()


def test_the_first_slow_starts_are_named_without_a_burn_in_and_absorbed_by_one(made):
    tmp_path, nodes = made
    cold, inv = _node(tmp_path, "cold")
    nodes.append(cold)
    e, _ = _run(cold, write_experiment(cold, "cold", ARMS, num_requests=4, output_len=256), inv, 4)
    assert not e.burn_in
    slow = sorted(r.seq for r in e.runs if _slow(r))
    assert slow == [1, 2] and all(r.server_args["simulator"]["instance"] == r.seq - 1 for r in e.runs)
    trend = findings(e).get("instance-trend", [])
    # one finding per arm, naming exactly its run among the node's first two starts, with the burn-in to set
    assert sorted((f.arm, tuple(f.runs)) for f in trend) == sorted((r.arm, (r.run_id,)) for r in e.runs if _slow(r))
    for f in trend:
        [first] = f.runs
        start = int(first[:3])
        assert f"design.burn_in in the experiment file to at least {start} (unmeasured" in f.message, f.message
        assert re.search(r"its first instance on sim-cold ran (2\d|3\d)% slower than its later ones", f.message)
    report = json.loads((cold.runs_dir / e.id / "report.json").read_text())
    assert [a["restarts"] for a in report["instances"]["arms"].values()] == [4, 4]
    assert "## Instance spread" in (cold.runs_dir / e.id / "report.md").read_text()

    warm, inv = _node(tmp_path, "burnin")
    nodes.append(warm)
    exp = write_experiment(warm, "burnin", ARMS, num_requests=4, output_len=256)
    doc = json.loads(exp.read_text())
    doc["specab_experiment"]["design"] = {"burn_in": 2}
    exp.write_text(json.dumps(doc))
    plan = _plan(exp, inv)
    assert [(p["seq"], p["block"], p["burn_in"]) for p in plan["plan"][:3]] == [(1, 1, True), (2, 1, True),
                                                                               (3, 1, False)]
    assert plan["burn_in"]["runs"] == 2 and plan["burn_in"]["gpu_minutes"] > 0, plan["burn_in"]
    e, out = _run(warm, exp, inv, 3)
    assert [r.seq for r in e.burn_in] == [1, 2] and all(_slow(r) for r in e.burn_in)
    assert not any(_slow(r) for r in e.runs) and sorted(r.seq for r in e.runs) == list(range(3, 9))
    assert "instance-trend" not in findings(e)
    assert [stats.analyse(e).arms[a].runs for a in ("baseline", "eagle3")] == [3, 3]
    ids = ", ".join(r.run_id for r in e.burn_in)
    assert f"burn-in (design.burn_in): {ids} start a server and benchmark it before block 1" in out
    assert f"burn-in (unmeasured starts before block 1, not in the table): " \
           f"{', '.join(f'{r.run_id} ok' for r in e.burn_in)}" in out
    report = json.loads((warm.runs_dir / e.id / "report.json").read_text())
    burn = report["instances"]["burn_in"]
    assert [b["run_id"] for b in burn] == [r.run_id for r in e.burn_in]
    assert all(b["change"] < -0.2 for b in burn), burn           # the client saw the two slow starts as slow
    assert report["cost"]["burn_in_runs"] == 2 and report["cost"]["burn_in_gpu_s"] > 0
    assert re.search(r"Verdict cost: .*, burn-in \d+\.\d \(2 unmeasured starts\)", " ".join(report["summary"]))


def _plan(exp: Path, inv: Path) -> dict:
    proc = driver("plan", "-e", str(exp), "-i", str(inv), "--repeats", "3", "--format", "json")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out[-3000:]
    return json.loads(out[out.index("{"):])
