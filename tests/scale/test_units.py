"""Fast checks of the scale-out pieces that need no namespace host."""
from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml

from specab.config.inventory import load_inventory
from specab.driver.options import is_multinode
from specab.driver.fleet import FleetError, HostProgress, RunCounter, assign_blocks
from specab.config.plan import make_plan
from specab.driver.progress import Progress
from tests.scale.cluster import REPO, experiment, resolved_arm, run_playbook


@pytest.mark.parametrize("blocks,hosts", [(4, 2), (6, 3), (5, 2), (1, 3)])
def test_each_block_on_one_host_whole_and_in_order(blocks: int, hosts: int) -> None:
    plan = make_plan(["baseline", "eagle3-s2"], blocks, seed=7)
    names = [f"h{i}" for i in range(hosts)]
    got = assign_blocks(plan, names)
    assert sorted(r.seq for rs in got.values() for r in rs) == [r.seq for r in plan]    # every run once
    for h, rs in got.items():
        assert [r.seq for r in rs] == sorted(r.seq for r in rs)                          # plan order
        for b in {r.block for r in rs}:                                                  # whole blocks
            assert sorted(r.arm for r in rs if r.block == b) == ["baseline", "eagle3-s2"]
    per_host = [len({r.block for r in rs}) for rs in got.values()]
    assert max(per_host) - min(per_host) <= 1                                            # balanced
    with pytest.raises(FleetError):
        assign_blocks(plan, [])


def test_host_progress_prefixes_every_line_with_the_host() -> None:
    out = io.StringIO()
    base = Progress(out=out, live=False)
    p = HostProgress(base, "gpu-node-2", RunCounter(0, 4))
    p.run_started(1, "003-baseline", "baseline", 2)
    p.phase("starting")
    p.run_finished("ok", 12.0)
    p.notice("hello")
    lines = [x for x in out.getvalue().splitlines() if x.strip()]
    assert len(lines) == 4 and all(x.startswith("[gpu-node-2]") for x in lines), lines
    assert "(1/4 runs)" in lines[2]


def test_example_inventories_load_with_their_layout() -> None:
    multi = load_inventory(REPO / "inventory" / "example-multinode.yml")
    fleet = load_inventory(REPO / "inventory" / "example-fleet.yml")
    assert is_multinode(multi.hosts) and len(multi.hosts) == 2
    assert not is_multinode(fleet.hosts) and len(fleet.hosts) == 3


def test_multinode_refuses_a_tp_size_the_nodes_cannot_split(tmp_path: Path) -> None:
    """Checked before anything touches a node: TP 3 over 2 hosts, and a file that sets nnodes itself."""
    hv = {"ansible_connection": "local", "specab_node_dir": str(tmp_path / "never")}
    inv = tmp_path / "inv.yml"
    inv.write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {
        "vars": {"specab_multinode": True}, "hosts": {"a": hv, "b": hv}}}}}))
    for args in ({"tp_size": 3}, {"tp_size": 16, "nnodes": 2}):
        exp = experiment("bad", port=30000)
        exp["server_args"].update(args)
        res = run_playbook(tmp_path, inv, "playbooks/multinode_arm.yml",
                           {"specab_experiment": exp, "specab_arm": resolved_arm(exp, 0), "specab_run_id": "001-baseline",
                            "specab_run_dir": str(tmp_path / "run"), "specab_experiment_id": "bad-1"}, timeout=120)
        text = " ".join((res.stdout + res.stderr).split())
        assert res.returncode != 0 and "divisible by their number" in text, text[-2000:]
    assert not (tmp_path / "never").exists()
