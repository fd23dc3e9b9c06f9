"""Fleets: two namespace hosts each run their own whole replicate blocks at the same time
(`driver.py --fleet`), against the same blocks run one after another on one host.

What a user relies on: every block runs on exactly one host (pairs never mix hosts), the hosts really
work at the same time, and the report shows the result of each host next to the pooled one.

The wall-time ratio (fleet / one after another) is measured and printed, with the ratio of the nodes'
run spans (first run claimed .. last run done, from the runs' phases.jsonl). Each run is mostly the
node's time (`default` profile at time scale 0.5, 3 requests of 96 tokens), as on a GPU node where model
load and benchmark take minutes: the run queue overlaps the controller's Ansible work for a run with the
node's, so two hosts' runs really run side by side even though the "hosts" share the test machine's two
cores with the controller. Asserted: the run spans' ratio < 0.75 (what --fleet parallelises), both hosts
busy together for most of the fleet's time, blocks never split. The whole wall-time ratio is printed, not
asserted: it also holds the experiment's one-off start (preflight and first enqueue, on each host) and end
(the report), which a fleet does not shorten and which, with one block per host, move with the box's load
(a CI run: 0.87 for a span ratio of 0.54; a quiet run 0.76), so a bound on it would guard the load, not the fleet.
"""
from __future__ import annotations

import sqlite3
import contextlib
import time
from pathlib import Path
from typing import Iterator

import pytest

from tests.netns import unavailable_reason
from tests.scale.cluster import (Node, experiment, experiment_dirs, namespace_nodes, run_driver, runs_of,
                                 write_experiment, write_inventory)

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
    one = write_inventory(root / "inventory-one.yml", {"gpu_nodes": nodes[:1]})

    fleet_wall, fleet_dir = _timed_driver(root, "-e", str(exp), "-i", str(both), "--repeats", str(blocks), "--fleet")
    seq_wall, _ = _timed_driver(root, "-e", str(exp), "-i", str(one), "--repeats", str(blocks))
    ratio = fleet_wall / seq_wall
    seq_dir = experiment_dirs(root / "runs-1")[0]
    node_ratio = node_span(fleet_dir) / node_span(seq_dir)
    print(f"\nfleet of {len(nodes)} hosts x {BLOCKS_PER_HOST} blocks: {fleet_wall:.1f} s; the same {blocks} blocks "
          f"one after another: {seq_wall:.1f} s; measured ratio {ratio:.2f} (ideal 0.50); the nodes' run "
          f"spans (first run claimed .. last run done): {node_span(fleet_dir):.1f} s vs {node_span(seq_dir):.1f} s, "
          f"ratio {node_ratio:.2f}")
    # the runs themselves overlap (what --fleet parallelises); the whole wall time also holds the
    # experiment's one-off start (preflight, first enqueue) and end (report), which do not: printed above
    assert node_ratio < 0.75, (node_ratio, ratio)

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
