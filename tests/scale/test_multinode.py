"""Multi-node tensor parallelism end to end: one server spanning two namespace hosts (TP 16 as 2 x 8
simulated GPUs), driven by `python driver.py` over real SSH, with a third host that must stay untouched.

What a user relies on: every rank is started with its own --node-rank and the head's dist-init address,
the A/B round completes with results from the head, a rank that dies mid-run fails that run on every
host (nothing left running anywhere), and the next run starts only after both hosts were verified clean.
"""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Iterator

import pytest

from specab.analysis.evidence import model as analysis
from specab.analysis.findings import doctor
from tests.netns import unavailable_reason
from tests.scale.cluster import (NCCL_TUNED, Node, experiment, experiment_dirs, namespace_nodes, pid_alive, reap_driver,
                                 run_driver, runs_of, start_driver, wait_while_driving, write_experiment,
                                 write_inventory)

pytestmark = [pytest.mark.slow, pytest.mark.ssh, pytest.mark.timeout(900)]
DIST_PORT = 25000 + os.getpid() % 5000   # namespaces have their own ports; varied only for readability


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[Node], Path]]:
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("multinode")
    with namespace_nodes(root, 3, time_scale="10") as nodes:
        inv = write_inventory(root / "inventory.yml",
                              {"gpu_nodes": nodes[:2], "standby": nodes[2:]},
                              {"gpu_nodes": {"specab_multinode": True, "specab_dist_init_port": DIST_PORT}})
        yield root, nodes, inv


def _measured(bench: Path) -> int:
    """Measured (non-warm-up) requests in a bench.jsonl, ignoring a line being written."""
    n = 0
    for line in bench.read_text().splitlines():
        try:
            n += not json.loads(line)["warmup"]
        except (ValueError, KeyError):
            pass
    return n


def _samplers(node: Node) -> list[int]:
    """GPU samplers (`<bin>/specab/node gpusample`) alive in the node's namespace."""
    return [pid for pid, argv in node.ns.argvs().items() if b"gpusample" in argv]


def _clean(nodes: list[Node]) -> None:
    for n in nodes:
        assert _samplers(n) == [], f"{n.name}: GPU sampler left running"
        rec = n.server_record() or n.server_record("last_server.json")
        if rec:
            assert not pid_alive(int(rec["pid"])), f"{n.name}: server {rec['pid']} still running"
        assert n.compute_apps() == "", f"{n.name} still has GPU processes: {n.compute_apps()}"


def test_ab_round_with_one_server_over_two_hosts(cluster) -> None:
    root, nodes, inv = cluster
    head, rank1, spare = nodes
    runs_dir = root / "runs-ab"
    exp = write_experiment(root, experiment("mn-ab", port=30000, tp=16, num_requests=2, output_len=24))
    t0 = time.monotonic()
    res = run_driver(root, "-e", str(exp), "-i", str(inv), "--repeats", "1", "--runs-dir", str(runs_dir))
    print(f"multi-node A/B round: {time.monotonic() - t0:.1f} s")
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    (exp_dir,) = experiment_dirs(runs_dir)
    runs = runs_of(exp_dir)
    assert [r["status"] for r in runs] == ["ok", "ok"], runs
    for r in runs:
        run_dir = Path(r["run_dir"])
        # the head serves and is benchmarked
        bench = [json.loads(x) for x in (run_dir / "bench.jsonl").read_text().splitlines()]
        assert sum(1 for b in bench if not b["warmup"] and b["ok"]) == 2
        head_args = json.loads((run_dir / "args.json").read_text())
        rank_dir = run_dir / f"node1-{rank1.name}"
        rank_args = json.loads((rank_dir / "args.json").read_text())
        addr = f"{head.ns.address}:{DIST_PORT}"
        assert (head_args["nnodes"], head_args["node_rank"], head_args["dist_init_addr"]) == (2, 0, addr)
        assert (rank_args["nnodes"], rank_args["node_rank"], rank_args["dist_init_addr"]) == (2, 1, addr)
        assert head_args["tp_size"] == rank_args["tp_size"] == 16
        # rendered into both launch scripts, and the ranks really met over the network
        assert f"--node-rank 1" in (rank_dir / "launch.sh").read_text()
        head_log, rank_log = (run_dir / "server.log").read_text(), (rank_dir / "server.log").read_text()
        assert f"Node 1 joined from {rank1.ns.address}" in head_log
        assert f"Joined the head node at {head.ns.address}:{DIST_PORT}" in rank_log
        # 8 local ranks per host: TP0-7 on the head, TP8-15 on rank 1
        assert " TP7]" in head_log and " TP8]" not in head_log
        assert " TP8]" in rank_log and " TP15]" in rank_log and " TP7]" not in rank_log
        # the arm's env reached every rank's processes on both hosts; server args are read back from the head
        for d in (run_dir, rank_dir):
            check = json.loads((d / "env_check.json").read_text())
            assert check["ok"] is True and set(NCCL_TUNED) <= set(check["variables"]), check
            assert len([p for p in check["processes"] if not p["skipped"]]) >= 9    # main + 8 schedulers
        assert json.loads((run_dir / "env_check.json").read_text())["args"]["nnodes"]["ok"] is True
        assert json.loads((rank_dir / "env_check.json").read_text())["server_info_endpoint"] is None
        # both hosts verified clean before the start and freed after the stop
        for d in (run_dir, rank_dir):
            assert json.loads((d / "gpu_free_before.json").read_text())["ok"] is True
            assert json.loads((d / "gpu_free.json").read_text())["ok"] is True
        # rank 1 sampled its own GPUs during the head's benchmark (a slow GPU there slows the whole server)
        window = [b["start_ts"] for b in bench if not b["warmup"]]
        rows = (rank_dir / "gpu_samples.csv").read_text().splitlines()
        stamps = [float(x.split(",")[0]) for x in rows[1:]]
        assert rows[0].startswith("timestamp,index,") and stamps and len({x.split(",")[1] for x in rows[1:]}) == 8
        assert min(stamps) <= min(window) + 2 and not (rank_dir / "helpers.json").exists(), (stamps[:3], window)
    assert "eagle3-s2" in {r["arm"] for r in runs}
    # the results store holds rank 1's env check, manifest and GPU samples under its host; the analysis
    # keeps the head's as the run's own and lists rank 1
    e = analysis.load_store(exp_dir)
    for r in e.runs:
        assert r.manifest["extra"]["inventory_hostname"] == head.name, r.manifest.get("extra")
        assert [(k.host, k.rank) for k in r.ranks] == [(rank1.name, 1)], r.ranks
        for check in (r.ranks[0].env_check, r.env_check):
            assert check and check.variables and not check.unconfirmed()
        assert {s.host for s in r.gpu_samples} == {head.name, rank1.name}
    assert not {f.rule for f in doctor.diagnose(e)} & {"env-not-confirmed", "gpu-throttled"}
    _clean(nodes[:2])
    assert not spare.node_dir.exists(), "the standby host was touched by a run it is not part of"


def test_killing_rank1_fails_the_run_and_the_next_starts_clean(cluster) -> None:
    root, nodes, inv = cluster
    head, rank1, _ = nodes
    runs_dir = root / "runs-kill"
    exp = write_experiment(root, experiment("mn-kill", port=30001, tp=16, num_requests=40, output_len=64,
                                            arms=[{"name": "baseline"}]))
    drv = start_driver(root, "-e", str(exp), "-i", str(inv), "--repeats", "2", "--runs-dir", str(runs_dir))
    try:
        # wait until the first run is benchmarking (measured requests arriving on the head)
        bench = head.node_dir / "runs" / "001-baseline" / "bench.jsonl"
        wait_while_driving(drv, root, lambda: bench.exists() and _measured(bench) >= 2)
        rec = rank1.server_record()
        assert rec and rec["run_id"] == "001-baseline"
        os.kill(int(rec["pid"]), signal.SIGKILL)          # the rank-1 server process, mid-benchmark
        killed_at = time.monotonic()
        rc = drv.wait(timeout=600)
    finally:
        reap_driver(drv)
    out = (root / "driver.out").read_text()
    print(f"run failed and next run finished {time.monotonic() - killed_at:.1f} s after the kill")
    assert rc == 1, out[-4000:]                          # finished, with a failed run
    (exp_dir,) = experiment_dirs(runs_dir)
    first, second = runs_of(exp_dir)
    assert first["status"] == "failed", first
    assert second["status"] == "ok", second
    # the head noticed its peer's death and went down, as SGLang does
    d1 = Path(first["run_dir"])
    assert "Lost the connection to node 1" in (d1 / "server.log").read_text()
    # the failed run stopped every rank: no process of it is left on either host
    for n in (head, rank1):
        last = n.server_record("last_server.json")
        assert last and not pid_alive(int(last["pid"]))
    # the next run started only from verified clean nodes on both hosts
    d2 = Path(second["run_dir"])
    for d in (d2, d2 / f"node1-{rank1.name}"):
        before = json.loads((d / "gpu_free_before.json").read_text())
        assert before["ok"] is True and len(before["final"]) == 8 and all(g["memory_used_mib"] <= 64 and not g["compute_processes"] for g in before["final"]), before
    assert _measured(d2 / "bench.jsonl") == 40
    _clean([head, rank1])


def test_ctrl_c_mid_benchmark_stops_every_rank_and_records_its_teardown(cluster) -> None:
    """SIGINT to the driver while the head benchmarks a server over two hosts (the per-run path's
    multinode_arm.yml): every rank is stopped, no bench helper is left on either host (the head's client and
    sampler, rank 1's sampler), the GPUs are free on both, and the run is stored interrupted with its teardown
    (stop.json, gpu_free.json/.csv, manifest.json) in the head's run directory and in rank 1's, and on its row."""
    root, nodes, inv = cluster
    head, rank1, spare = nodes
    runs_dir = root / "runs-ctrl-c"
    # a benchmark long enough to be still running when the driver's stop comes (seconds after the signal): a run
    # whose every measured request was answered by then is kept ok
    exp = write_experiment(root, experiment("mn-ctrl-c", port=30002, tp=16, num_requests=400, output_len=64,
                                            arms=[{"name": "baseline"}]))
    drv = start_driver(root, "-e", str(exp), "-i", str(inv), "--repeats", "1", "--runs-dir", str(runs_dir))
    try:
        bench = head.node_dir / "runs" / "001-baseline" / "bench.jsonl"
        # the driver's own phase too: it follows the head's bench.jsonl over SSH, a moment behind the node
        wait_while_driving(drv, root, lambda: bench.exists() and _measured(bench) >= 2 and bool(_samplers(rank1))
                           and "    benchmarking  (" in (root / "driver.out").read_text())
        drv.send_signal(signal.SIGINT)
        rc = drv.wait(timeout=600)
    finally:
        reap_driver(drv)
    out = (root / "driver.out").read_text()
    assert rc == 130, out[-4000:]
    (exp_dir,) = experiment_dirs(runs_dir)
    [run] = runs_of(exp_dir)
    assert (run["status"], run["failure_phase"]) == ("interrupted", "benchmarking"), run
    run_dir = Path(run["run_dir"])
    for rank, (n, d) in enumerate(((head, run_dir), (rank1, run_dir / f"node1-{rank1.name}"))):
        files = {p.name for p in d.iterdir()} if d.is_dir() else set()
        assert {"stop.json", "gpu_free.json", "gpu_free.csv", "manifest.json"} <= files, (n.name, sorted(files))
        # (the ranks are stopped at once: one may find its server gone already, down with its peer)
        stop = json.loads((d / "stop.json").read_text())
        assert stop["run_id"] == "001-baseline" and stop["total_s"] is not None, (n.name, stop)
        assert json.loads((d / "gpu_free.json").read_text())["ok"] is True
        extra = json.loads((d / "manifest.json").read_text())["extra"]
        assert (extra["node_rank"], extra["nnodes"]) == (str(rank), "2"), extra
        assert extra["failure"].startswith(f"The run on {n.name} was interrupted"), extra
        helpers = [a for a in n.ns.argvs().values() if {b"loadgen", b"gpusample", b"bench"} & set(a)]
        assert helpers == [], (n.name, helpers)
    assert json.loads(run["stop_json"])["total_s"] is not None and json.loads(run["gpu_free_json"])["ok"] is True
    _clean([head, rank1])
    assert not spare.node_dir.exists() or not (spare.node_dir / "runs" / "001-baseline").exists()
