"""Fleets: two namespace hosts each run their own whole replicate blocks at the same time (`driver.py --fleet`).

What a user relies on: every block runs on exactly one host (pairs never mix hosts), the hosts really work at the
same time, and the report shows the result of each host next to the pooled one.

Each run is mostly the node's time (`default` profile at time scale 0.5, 3 requests of 96 tokens), as on a GPU node
where model load and benchmark take minutes: the run queue overlaps the controller's Ansible work for a run with the
node's, so two hosts' runs really run side by side even though the "hosts" share the test machine's two cores with
the controller. "At the same time" is read from the runs' own start and finish times on the nodes: both hosts busy
together for most of the fleet's span, and every run overlapping a run of the other host (hosts taking turns fail
both). The wall time against the same blocks on one host is not asserted: it also holds the experiment's one-off
start and end, which a fleet does not shorten and which move with the box's load.
"""
from __future__ import annotations

import sqlite3
import contextlib
import json
import signal
import time
from pathlib import Path
from typing import Iterator

import pytest

from tests.netns import unavailable_reason
from tests.scale.cluster import (Node, experiment, experiment_dirs, namespace_nodes, pid_alive, reap_driver, run_driver,
                                 runs_of, start_driver, wait_while_driving, write_experiment, write_inventory)

pytestmark = [pytest.mark.slow, pytest.mark.ssh, pytest.mark.timeout(2400)]
BLOCKS_PER_HOST = 1
# ~2.5-3 s per request at time scale 0.5: a run is mostly the node's time, as on a GPU node (model load and
# a benchmark of minutes), so the controller's work for a run overlaps the node's (run queue)
FLEET_OUTPUT_LEN = 96


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[Node]]]:
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("fleet")
    with namespace_nodes(root, 2, time_scale="0.5", profile="default") as nodes:
        yield root, nodes


TEARDOWN = {"stop.json", "gpu_free.json", "gpu_free.csv", "manifest.json"}


def _benchmarking(node: Node, since: float) -> bool:
    """A run of the node has answered a measured request since ``since`` (its bench.jsonl on the node; the module's
    earlier experiments left theirs under the same run ids)."""
    for bench in (node.node_dir / "runs").glob("*/bench.jsonl"):
        if bench.stat().st_mtime > since and any(line.strip() and not json.loads(line)["warmup"] for line in bench.read_text().splitlines()
               if line.endswith("}")):
            return True
    return False


def _timed_driver(root: Path, *args: str) -> tuple[float, Path]:
    runs_dir = root / f"runs-{len(list(root.glob('runs-*')))}"
    t0 = time.monotonic()
    res = run_driver(root, *args, "--runs-dir", str(runs_dir), timeout=1500)
    wall = time.monotonic() - t0
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    (exp_dir,) = experiment_dirs(runs_dir)
    return wall, exp_dir


def node_span(exp_dir: Path) -> float:
    """First run claimed .. last run done, from the nodes' own clocks (each run's phases.jsonl)."""
    import json
    first, last = [], []
    for f in exp_dir.glob("*/phases.jsonl"):
        ts = [json.loads(line)["t"] for line in f.read_text().splitlines() if line.strip()]
        first.append(min(ts))
        last.append(max(ts))
    assert first, f"no phases.jsonl under {exp_dir}"
    return max(last) - min(first)


def test_fleet_runs_whole_blocks_per_host_in_parallel(fleet) -> None:
    root, nodes = fleet
    hosts = [n.name for n in nodes]
    exp = write_experiment(root, experiment("fleet", port=30002, tp=1, num_requests=3, output_len=FLEET_OUTPUT_LEN))
    blocks = BLOCKS_PER_HOST * len(nodes)
    both = write_inventory(root / "inventory-fleet.yml", {"gpu_nodes": nodes})

    fleet_wall, fleet_dir = _timed_driver(root, "-e", str(exp), "-i", str(both), "--repeats", str(blocks), "--fleet")
    print(f"\nfleet of {len(nodes)} hosts x {BLOCKS_PER_HOST} blocks: {fleet_wall:.1f} s; the nodes' run span (first "
          f"run claimed .. last run done): {node_span(fleet_dir):.1f} s")

    runs = runs_of(fleet_dir)
    assert len(runs) == blocks * 2 and all(r["status"] == "ok" for r in runs), runs
    # every block on exactly one host, each host BLOCKS_PER_HOST whole blocks
    per_block: dict[int, set[str]] = {}
    for r in runs:
        per_block.setdefault(r["block"], set()).add(r["host"])
    assert all(len(h) == 1 for h in per_block.values()), per_block
    per_host = {h: sorted(b for b, hs in per_block.items() if h in hs) for h in hosts}
    assert all(len(b) == BLOCKS_PER_HOST for b in per_host.values()), per_host
    # the hosts ran at the same time: each host's runs span most of the fleet's time, and the spans overlap
    spans = {h: (min(r["started"] for r in runs if r["host"] == h), max(r["finished"] for r in runs if r["host"] == h))
             for h in hosts}
    (a0, a1), (b0, b1) = spans.values()
    overlap = min(a1, b1) - max(a0, b0)
    print(f"hosts busy together {overlap:.1f} s of {max(a1, b1) - min(a0, b0):.1f} s")
    assert overlap > 0.8 * (max(a1, b1) - min(a0, b0)), spans
    # while one host ran a block, the other host was running one of its own (no turn-taking)
    for r in runs:
        others = [o for o in runs if o["host"] != r["host"]]
        assert any(o["started"] < r["finished"] and o["finished"] > r["started"] for o in others), r
    # requests are stored under the host that served them
    with contextlib.closing(sqlite3.connect(fleet_dir / "results.sqlite")) as c:
        req_hosts = {h for (h,) in c.execute("SELECT DISTINCT host FROM requests")}
    assert req_hosts == set(hosts)
    # the report shows each host's result and the host-to-host spread
    report = (fleet_dir / "report.md").read_text()
    assert "per host" in report.lower(), report[:3000]
    for h in hosts:
        assert h in report


@pytest.mark.parametrize("executor", ["per-run", "queue"])
def test_ctrl_c_leaves_each_hosts_interrupted_run_torn_down(fleet, executor: str) -> None:
    """Ctrl-C while every host of a fleet benchmarks: on each host its interrupted run is torn down as on a single
    host, whichever the executor: no server, no bench helper left, the GPUs free, the run stored interrupted with
    its stop, GPUs free and manifest in its directory and its stop and GPUs-free records on its row."""
    root, nodes = fleet
    runs_dir = root / f"runs-ctrl-c-{executor}"
    exp = write_experiment(root, experiment(f"fleet-ctrl-c-{executor}", port=30003, tp=1, num_requests=20,
                                            output_len=FLEET_OUTPUT_LEN))
    inv = write_inventory(root / "inventory-fleet.yml", {"gpu_nodes": nodes})
    started = time.time()
    drv = start_driver(root, "-e", str(exp), "-i", str(inv), "--repeats", str(len(nodes)), "--fleet",
                       "--executor", executor, "--runs-dir", str(runs_dir))
    try:
        wait_while_driving(drv, root, lambda: all(_benchmarking(n, started) for n in nodes), interval=0.1)
        drv.send_signal(signal.SIGINT)
        rc = drv.wait(timeout=600)
    finally:
        reap_driver(drv)
    out = (root / "driver.out").read_text()
    assert rc == 130, out[-4000:]
    (exp_dir,) = experiment_dirs(runs_dir)
    interrupted = {r["host"]: r for r in runs_of(exp_dir) if r["status"] == "interrupted"}
    assert sorted(interrupted) == sorted(n.name for n in nodes), (runs_of(exp_dir), out[-4000:])
    for n in nodes:
        row = interrupted[n.name]
        run_dir = Path(row["run_dir"])
        assert TEARDOWN <= {p.name for p in run_dir.iterdir()}, (n.name, sorted(p.name for p in run_dir.iterdir()))
        assert json.loads((run_dir / "gpu_free.json").read_text())["ok"] is True
        extra = json.loads((run_dir / "manifest.json").read_text())["extra"]
        assert extra["run_id"] == row["run_id"] and extra["failure"].startswith(f"The run on {n.name} was interrupted")
        assert json.loads(row["stop_json"])["total_s"] is not None and row["gpu_free_json"], row
        # nothing of ours left on the node
        for name in ("server.json", "last_server.json"):
            rec = n.server_record(name)
            assert not (rec and pid_alive(int(rec["pid"]))), (n.name, rec)
        helpers = [a for a in n.ns.argvs().values() if {b"loadgen", b"gpusample", b"bench"} & set(a)]
        assert helpers == [] and n.compute_apps() == "", (n.name, helpers, n.compute_apps())
