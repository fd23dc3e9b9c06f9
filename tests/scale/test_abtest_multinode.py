"""`ansible-playbook playbooks/ab_test.yml` (the README's demo) on a multi-node inventory: each arm runs as
ONE server spanning two namespace hosts (TP 16 as 2 x 8 simulated GPUs) over real SSH, with the task list
the driver uses (playbooks/tasks/run_arm.yml, multi-node), and the round ends with one results table.

What a user relies on: the same command as the single-node demo works on a multi-node inventory; both
ranks of each arm get their own --node-rank and the head's dist-init address and really meet; the
benchmark runs on the head; the table shows both arms (accept length only for EAGLE-3); every host is
verified clean before each arm and left clean after the round.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.netns import unavailable_reason
from tests.scale.cluster import (NCCL_TUNED, REPO, VENV_BIN, Node, ansible_env, experiment, namespace_nodes,
                                 pid_alive, run_playbook, write_experiment, write_inventory)

pytestmark = [pytest.mark.slow, pytest.mark.ssh, pytest.mark.timeout(600)]
DIST_PORT = 26000
EXPERIMENT_ID = "mn-abtest"
ENGINE_MARKS = ("sglang", "specab.sim", "specab-sim")     # simulated engine and its helpers (titles, argv)
ROW = re.compile(r"(baseline|eagle3-s2) (\d+/\d+) ([\d.]+) ([\d.]+) ([\d.]+|-) ([\d.]+x|-)")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[Node], Path]]:
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("mn-abtest")
    with namespace_nodes(root, 2) as nodes:
        inv = write_inventory(root / "inventory.yml", {"gpu_nodes": nodes},
                              {"gpu_nodes": {"specab_multinode": True, "specab_dist_init_port": DIST_PORT}})
        yield root, nodes, inv


@pytest.fixture(scope="module")
def round_(cluster: tuple[Path, list[Node], Path]) -> dict[str, Any]:
    root, nodes, inv = cluster
    # 96 tokens (56 ms of wall time at scale 20 for the baseline): a scheduling stall on a loaded box must not deliver
    # both measured baseline requests in bursts, which leaves that arm without a decode pace and the table without
    # a speedup
    exp = write_experiment(root, experiment("mn-abtest", port=30000, tp=16, num_requests=2, output_len=96))
    runs_dir = root / "runs"
    t0 = time.monotonic()
    res = run_playbook(root, inv, "playbooks/ab_test.yml",
                       {"specab_experiment_file": str(exp), "specab_runs_dir": str(runs_dir),
                        "specab_experiment_id": EXPERIMENT_ID}, timeout=480)
    print(f"multi-node ab_test.yml round: {time.monotonic() - t0:.1f} s")
    return {"res": res, "out": res.stdout + res.stderr, "flat": " ".join((res.stdout + res.stderr).split()),
            "nodes": nodes, "exp_dir": runs_dir / EXPERIMENT_ID}


def _ok(r: dict[str, Any]) -> None:
    assert r["res"].returncode == 0, r["out"][-6000:]


def test_the_round_prints_one_table_with_both_arms(round_: dict[str, Any]) -> None:
    _ok(round_)
    flat = round_["flat"]
    assert "as one server over gpu0, gpu1 (the first is the head)" in flat
    header = "arm requests tok/s (median) TTFT (ms) accept len speedup"
    assert flat.count(header) == 1, "one server per arm: one table for the round, printed by the head"
    rows = {m.group(1): m.groups()[1:] for m in ROW.finditer(flat)}
    assert set(rows) == {"baseline", "eagle3-s2"}, flat[-3000:]
    base, eagle = rows["baseline"], rows["eagle3-s2"]
    assert base[0] == eagle[0] == "2/2"
    assert float(base[1]) > 0 and float(eagle[1]) > 0
    assert base[3] == "-" and base[4] == "1.00x"
    assert 1.5 < float(eagle[3]) < 3.0, f"EAGLE-3 2-step accept length should be ~2.1, got {eagle[3]}"
    table = json.loads((round_["exp_dir"] / "ab_table.json").read_text())
    assert table["host"] == "gpu0,gpu1"
    by_arm = {r["arm"]: r for r in table["rows"]}
    assert eagle[4] == f"{by_arm['eagle3-s2']['tok_s'] / by_arm['baseline']['tok_s']:.2f}x"
    assert sorted(p.name for p in round_["exp_dir"].glob("ab_table*.json")) == ["ab_table.json"]


def test_each_arm_is_one_server_over_both_hosts(round_: dict[str, Any]) -> None:
    _ok(round_)
    head, rank1 = round_["nodes"]
    exp_dir: Path = round_["exp_dir"]
    assert sorted(p.name for p in exp_dir.iterdir() if p.is_dir()) == ["001-baseline", "002-eagle3-s2"]
    addr = f"{head.ns.address}:{DIST_PORT}"
    for run, spec in (("001-baseline", False), ("002-eagle3-s2", True)):
        run_dir = exp_dir / run
        rank_dir = run_dir / f"node1-{rank1.name}"
        head_args = json.loads((run_dir / "args.json").read_text())
        rank_args = json.loads((rank_dir / "args.json").read_text())
        assert (head_args["nnodes"], head_args["node_rank"], head_args["dist_init_addr"]) == (2, 0, addr)
        assert (rank_args["nnodes"], rank_args["node_rank"], rank_args["dist_init_addr"]) == (2, 1, addr)
        assert head_args["tp_size"] == rank_args["tp_size"] == 16
        assert ("speculative_algorithm" in head_args) is spec and ("speculative_algorithm" in rank_args) is spec
        # the ranks were started together and met over the network: TP0-7 on the head, TP8-15 on rank 1
        head_log, rank_log = (run_dir / "server.log").read_text(), (rank_dir / "server.log").read_text()
        assert f"Node 1 joined from {rank1.ns.address}" in head_log
        assert f"Joined the head node at {addr}" in rank_log
        assert " TP7]" in head_log and " TP8]" not in head_log
        assert " TP8]" in rank_log and " TP15]" in rank_log and " TP7]" not in rank_log
        # benchmarked on the head only; the arm's env verified on every rank
        bench = [json.loads(x) for x in (run_dir / "bench.jsonl").read_text().splitlines()]
        assert sum(1 for b in bench if not b["warmup"] and b["ok"]) == 2
        assert not (rank_dir / "bench.jsonl").exists()
        for d in (run_dir, rank_dir):
            check = json.loads((d / "env_check.json").read_text())
            assert check["ok"] is True and set(NCCL_TUNED) <= set(check["variables"]), check
            # every host verified clean before the arm and freed after it
            assert json.loads((d / "gpu_free_before.json").read_text())["ok"] is True
            assert json.loads((d / "gpu_free.json").read_text())["ok"] is True
            assert json.loads((d / "stop.json").read_text())["ok"] is True
        # the arm's stop found the server running on at least one host (both hosts stop at once; a rank whose
        # peer went first has already followed it down, as SGLang's ranks do)
        assert any(json.loads((d / "stop.json").read_text())["was_running"] for d in (run_dir, rank_dir))


def test_both_hosts_are_clean_after_the_round(round_: dict[str, Any]) -> None:
    _ok(round_)
    node: Node
    for node in round_["nodes"]:
        assert node.server_record() is None, f"{node.name}: server.json left behind"
        last = node.server_record("last_server.json")
        assert last and last["run_id"] == "002-eagle3-s2", last
        assert not pid_alive(int(last["pid"])), f"{node.name}: server {last['pid']} still running"
        assert node.compute_apps() == "", f"{node.name} still has GPU processes: {node.compute_apps()}"
        cmdlines = {p: b" ".join(argv).decode(errors="replace") for p, argv in node.ns.argvs().items()}
        engines = [c for c in cmdlines.values() if any(m in c for m in ENGINE_MARKS)]
        assert engines == [], f"{node.name}: engine processes left: {engines}"


def _measured(bench: Path) -> int:
    """Measured (non-warm-up) requests in a bench.jsonl, ignoring a line being written."""
    n = 0
    for line in bench.read_text().splitlines():
        try:
            n += not json.loads(line)["warmup"]
        except (ValueError, KeyError):
            pass
    return n


def test_killing_rank1_fails_the_round_and_leaves_both_hosts_clean(
        cluster: tuple[Path, list[Node], Path], round_: dict[str, Any]) -> None:
    root, nodes, inv = cluster
    head, rank1 = nodes
    exp = write_experiment(root, experiment("mn-abkill", port=30001, tp=16, num_requests=40, output_len=64))
    xv = root / "xv-kill.json"
    xv.write_text(json.dumps({"specab_experiment_file": str(exp), "specab_runs_dir": str(root / "runs"),
                              "specab_experiment_id": "mn-abkill"}))
    out_file = root / "kill.out"
    with out_file.open("w") as out:
        proc = subprocess.Popen([str(VENV_BIN / "ansible-playbook"), "-i", str(inv), "playbooks/ab_test.yml",
                                 "-e", f"@{xv}"], cwd=REPO, env=ansible_env(root), stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        # wait until the first arm is benchmarking (the node's runs/001-baseline/ of the earlier round is
        # emptied before this round's server starts, and server.json appears only after that)
        bench = head.node_dir / "runs" / "001-baseline" / "bench.jsonl"
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            if head.server_record() and rank1.server_record() and bench.exists() and _measured(bench) >= 2:
                break
            time.sleep(0.05)
        else:
            pytest.fail(f"the first arm never reached its benchmark: {out_file.read_text()[-3000:]}")
        rec = rank1.server_record()
        assert rec and rec["run_id"] == "001-baseline", rec
        os.kill(int(rec["pid"]), signal.SIGKILL)          # rank 1's server process, mid-benchmark
        rc = proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
    out = out_file.read_text()
    flat = " ".join(out.split())
    assert rc != 0, out[-4000:]
    assert "arm requests tok/s (median)" not in flat, "a failed round prints no results table"
    assert "failed:" in flat and "[rank 0]" in flat and "[rank 1]" in flat, out[-4000:]
    exp_dir = root / "runs" / "mn-abkill"
    assert not (exp_dir / "002-eagle3-s2").exists(), "the round stops at the failed arm"
    assert not (exp_dir / "ab_table.json").exists()
    # the failed arm's artefacts were kept on the controller, for both ranks
    assert "Lost the connection to node 1" in (exp_dir / "001-baseline" / "server.log").read_text()
    assert (exp_dir / "001-baseline" / f"node1-{rank1.name}" / "server.log").exists()
    for node in nodes:
        assert node.server_record() is None, f"{node.name}: server.json left behind"
        last = node.server_record("last_server.json")
        assert last and last["run_id"] == "001-baseline" and not pid_alive(int(last["pid"])), last
        assert node.compute_apps() == "", f"{node.name} still has GPU processes: {node.compute_apps()}"


@pytest.mark.parametrize("layout", [{"a": True, "b": False}, {"a": True}], ids=["mixed", "one-host"])
def test_the_preflight_refuses_an_inconsistent_multinode_layout(tmp_path: Path, layout: dict[str, bool]) -> None:
    """Before any host is contacted: specab_multinode differing between hosts, or set on a single host."""
    hosts = {h: {"ansible_connection": "local", "specab_multinode": v} for h, v in layout.items()}
    inv = tmp_path / "inventory.yml"
    inv.write_text(json.dumps({"all": {"children": {"gpu_nodes": {"hosts": hosts}}}}))
    exp = write_experiment(tmp_path, experiment("mn-layout", port=30000))
    res = run_playbook(tmp_path, inv, "playbooks/ab_test.yml",
                       {"specab_experiment_file": str(exp), "specab_runs_dir": str(tmp_path / "runs")}, timeout=120)
    flat = " ".join((res.stdout + res.stderr).split())
    assert res.returncode != 0, flat[-3000:]
    assert "specab_multinode must be the same on every host of gpu_nodes" in flat, flat[-3000:]
    assert "PLAY [A/B round]" not in flat, "refused in the preflight, before any host is contacted"
    assert not (tmp_path / "runs").exists()
