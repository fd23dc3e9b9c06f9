"""One server per instance in the plan (docs/decisions/0011): which arms share a server (config/instances.py), each
block's instances back to back with their loads in a seeded order (config/plan.py), which runs keep their server for
the next, the design.server key, where per-instance is refused before anything runs, and the store's columns."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from specab.config import instances, matrix
from specab.config.inventory import load_inventory
from specab.config.plan import PlannedRun, block_order, keeps, make_plan
from specab.config.spec import load_experiment
from specab.config.yamlfile import ConfigError
from specab.driver.options import Options, prepare
from specab.results import store as st
from tests.driver.conftest import EXPERIMENT

LOADS = ["concurrency=1,2,3"]


def _arms(path: Path, axes: list[str] = LOADS) -> list:
    exp = load_experiment(path)
    return matrix.build_arms(exp, matrix.parse_matrix(axes, exp.engine)).arms


def test_arms_that_differ_only_in_load_share_a_server_and_others_do_not(write):
    exp = write("e.yml", EXPERIMENT)
    groups = instances.load_groups(_arms(exp))
    assert groups == {"baseline-c1": "baseline-c1", "baseline-c2": "baseline-c1", "baseline-c3": "baseline-c1",
                      "eagle3-s2-c1": "eagle3-s2-c1", "eagle3-s2-c2": "eagle3-s2-c1", "eagle3-s2-c3": "eagle3-s2-c1"}
    assert instances.LOAD_KEYS == matrix.BENCH_AXES
    # a server condition (an env value) keeps arms apart even at one load; without a load axis nothing is shared
    split = instances.load_groups(_arms(exp, ["env.NCCL_PROTO=LL,Simple", "concurrency=1,2"]))
    assert split["baseline-NCCL_PROTO-LL-c2"] == "baseline-NCCL_PROTO-LL-c1"
    assert split["baseline-NCCL_PROTO-Simple-c2"] == "baseline-NCCL_PROTO-Simple-c1"
    assert len(set(split.values())) == 4
    assert instances.load_groups(_arms(exp, [])) == {}


def test_each_block_runs_its_instances_back_to_back_with_the_loads_in_a_seeded_order():
    arms = [f"{a}-c{c}" for a in ("baseline", "eagle3") for c in (1, 8, 32)]
    groups = {a: a.rsplit("-", 1)[0] for a in arms}
    plan = make_plan(arms, 40, seed=5, groups=groups)
    assert plan == make_plan(arms, 40, seed=5, groups=groups)
    first_group, load_orders = Counter(), Counter()
    for b in range(1, 41):
        block = [r for r in plan if r.block == b]
        assert sorted(r.arm for r in block) == sorted(arms)
        # two instances, each its group's three loads back to back, numbered from the seq of their first run
        assert [r.instance_pos for r in block] == [1, 2, 3, 1, 2, 3]
        assert [r.instance for r in block] == [block[0].seq] * 3 + [block[3].seq] * 3
        assert len({groups[r.arm] for r in block[:3]}) == 1 and groups[block[0].arm] != groups[block[3].arm]
        # the order is the block's seeded shuffle, each group gathered where its first arm falls
        shuffled = block_order(arms, 5, b)
        assert [r.arm for r in block[:3]] == [a for a in shuffled if groups[a] == groups[shuffled[0]]]
        first_group[groups[block[0].arm]] += 1
        load_orders[tuple(r.arm.rsplit("-c", 1)[1] for r in block[:3])] += 1
    assert set(first_group) == {"baseline", "eagle3"}, "either instance comes first"
    assert len(load_orders) == 6, "every order of the three loads occurs"
    # a later block (--target-ci, --resume) is what it would have been in a longer plan
    assert make_plan(arms, 1, seed=5, first_block=3, first_seq=13, groups=groups) == plan[12:18]
    # burn-in runs (design.burn_in) start servers of their own before block 1, whose instances come after them
    burned = make_plan(arms, 1, seed=5, groups=groups, burn_in=2)
    assert [(r.burn_in, r.instance) for r in burned[:2]] == [(True, None), (True, None)]
    assert [r.instance_pos for r in burned[2:]] == [1, 2, 3, 1, 2, 3] and burned[2].instance == 3


def test_a_run_keeps_its_server_only_for_its_instances_next_run():
    arms = ["a-c1", "a-c2", "b-c1", "b-c2"]
    plan = make_plan(arms, 2, seed=1, groups={a: a[0] for a in arms})
    assert keeps(plan) == {r.seq for r in plan if r.instance_pos == 1}
    # a resume of the runs left: a run whose next run of its instance is done keeps nothing
    todo = [r for r in plan if r.seq != 2]
    assert 1 not in keeps(todo) and keeps(todo) <= {r.seq for r in todo}
    assert keeps([PlannedRun(1, 1, "x", 1)]) == set()


def test_design_server_is_checked_and_chooses_the_plan(write):
    with pytest.raises(ConfigError, match=r"e.yml:\d+.*design.server must be per-run .* or per-instance"):
        load_experiment(write("e.yml", EXPERIMENT + "  design: {server: shared}\n"))
    with pytest.raises(ConfigError, match=r"unknown key 'servers' in design \(did you mean 'server'\?\)"):
        load_experiment(write("e.yml", EXPERIMENT + "  design: {servers: per-run}\n"))
    per_instance = write("i.yml", EXPERIMENT + "  design: {server: per-instance}\n")
    prepared = prepare(Options(experiment_file=str(per_instance), matrix=LOADS, repeats=2))
    assert prepared.server.per_instance and len({r.instance for r in prepared.plan}) == 4
    assert any("4 instances" in n and "8 of 12 runs continue" in n for n in prepared.notices), prepared.notices
    default = prepare(Options(experiment_file=str(write("d.yml", EXPERIMENT)), matrix=LOADS, repeats=2))
    assert instances.DEFAULT_SERVER == "per-instance" and default.server.per_instance
    assert any("per-instance, the default" in n for n in default.notices), default.notices
    per_run = write("r.yml", EXPERIMENT + "  design: {server: per-run}\n")
    prepared = prepare(Options(experiment_file=str(per_run), matrix=LOADS, repeats=2))
    assert not prepared.server.per_instance and {r.instance for r in prepared.plan} == {None}


def test_per_instance_is_refused_before_anything_runs_where_it_cannot_run(write, tmp_path):
    per_instance = write("i.yml", EXPERIMENT + "  design: {server: per-instance}\n")
    with pytest.raises(ConfigError, match="--order blocked runs an arm's blocks one after another"):
        prepare(Options(experiment_file=str(per_instance), matrix=LOADS, order="blocked"))
    vllm = write("v.yml", EXPERIMENT.replace("  model_path:", "  engine: vllm\n  model_path:")
                 .replace("""    - name: eagle3-s2
      server_args:
        speculative_algorithm: EAGLE3
        speculative_draft_model_path: /models/draft
        speculative_num_steps: 2
        speculative_eagle_topk: 1
        speculative_num_draft_tokens: 3
""", "") + "  design: {server: per-instance}\n")
    inventory = str(Path(__file__).resolve().parents[2] / "inventory" / "vllm-cpu.yml")
    with pytest.raises(ConfigError, match=r"only among its development routes, mounted with VLLM_SERVER_DEV_MODE=1.*"
                                          r"the arm's env does not set VLLM_SERVER_DEV_MODE=1"):
        prepare(Options(experiment_file=str(vllm), inventory_file=inventory, matrix=LOADS))
    # the default falls back to a server per run where it cannot run, and says why
    fallback = prepare(Options(experiment_file=str(write("f.yml", vllm.read_text().replace(
        "  design: {server: per-instance}\n", ""))), inventory_file=inventory, matrix=LOADS))
    assert not fallback.server.per_instance and {r.instance for r in fallback.plan} == {None}
    assert any(n.startswith("one server per run (the default per-instance cannot run here: the engine's cache "
                            "cannot be reset between two loads: vLLM serves /reset_prefix_cache only among its "
                            "development routes") for n in fallback.notices), fallback.notices
    dev = write("d.yml", vllm.read_text().replace("    NCCL_PROTO: LL", '    NCCL_PROTO: LL\n    VLLM_SERVER_DEV_MODE: "1"'))
    assert prepare(Options(experiment_file=str(dev), inventory_file=inventory, matrix=LOADS)).server.per_instance
    multinode = Path(__file__).resolve().parents[2] / "inventory" / "example-multinode.yml"
    exp = load_experiment(per_instance)
    arms = _arms(per_instance)
    with pytest.raises(ConfigError, match="a server over several hosts .specab_multinode."):
        instances.choose(exp, arms, load_inventory(str(multinode)), "interleaved")


def test_the_store_keeps_the_plans_instances_and_the_server_each_run_measured_on(tmp_path):
    arms = ["a-c1", "a-c2"]
    plan = make_plan(arms, 1, seed=1, groups={a: "a" for a in arms})
    s = st.Store.create(tmp_path / st.FILENAME)
    s.write_experiment(id="x", name="x", seed=1, repeats=1, order_mode="interleaved", config={}, matrix=[],
                       argv=[], hosts=[], experiment_file="e.yml", inventory_file="i.yml", specab_version=None,
                       git_sha=None)
    s.write_arms([{"name": a, "is_baseline": True, "baseline": a, "server_args": {}, "env": {}} for a in arms])
    s.write_plan([r.to_json() for r in plan])
    assert [PlannedRun.from_row(r) for r in s.plan()] == plan
    for r in plan:
        s.start_run(seq=r.seq, run_id=r.run_id, arm=r.arm, block=1, host="h", run_dir="d", runner_ident="i")
        s.finish_run(r.seq, status=st.OK, gpus=1, server_seq=plan[0].seq)
    assert [r["server_seq"] for r in s.runs()] == [1, 1]


def test_plan_shows_each_runs_instance_and_the_gpu_minutes_saved(write, tmp_path, monkeypatch):
    """`driver.py plan` with one server per instance: the table's instance column (`<first seq>.<position>`) and the
    starts saved at the simulated node's run cost (the profile's load and a stop, per continued run); touches no
    node."""
    import io
    import json

    from specab.analysis.cost import economics
    from specab.driver import design_inputs
    from specab.driver.cli import main
    from tests.driver.test_cli_plan import INVENTORY
    monkeypatch.chdir(tmp_path)
    inv = write("inv.yml", INVENTORY.replace("NODEDIR", str(tmp_path / "node")))
    exp = write("e.yml", EXPERIMENT)
    out = io.StringIO()
    assert main(["plan", "-e", str(exp), "-i", str(inv), "--matrix", LOADS[0], "--repeats", "2", "--runs-dir",
                 str(tmp_path / "runs")], out=out) == 0
    text = out.getvalue()
    prepared = prepare(Options(experiment_file=str(exp), inventory_file=str(inv), matrix=LOADS, repeats=2))
    cost = design_inputs.design_inputs(prepared.experiment, prepared.arms, prepared.inventory.hosts[0],
                                       tmp_path / "runs", "fp").cost
    saved = economics.instance_saving_s(cost, 8) / 60
    assert saved == pytest.approx(8 * (cost.load_s + economics.DEFAULT_STOP_S) * 2 / 60)      # TP 2: two GPUs
    assert (f"one server per instance: 4 instances, 8 of 12 runs continue their instance's server (8 server starts "
            f"saved): {saved:.1f} GPU-minutes saved") in text, text
    rows = [line.split() for line in text.splitlines() if line.strip()[:1].isdigit() and "-c" in line]
    assert [r[2] for r in rows] == [f"{r.instance}.{r.instance_pos}" for r in prepared.plan]
    out = io.StringIO()
    main(["plan", "-e", str(exp), "-i", str(inv), "--matrix", LOADS[0], "--repeats", "2", "--format", "json",
          "--runs-dir", str(tmp_path / "runs")], out=out)
    data = json.loads(out.getvalue())
    assert [(r["instance"], r["instance_pos"]) for r in data["plan"]] == \
        [(r.instance, r.instance_pos) for r in prepared.plan]
    assert data["instances"] and data["instances"][0].startswith("one server per instance: 4 instances")
    assert not (tmp_path / "node").exists() and not (tmp_path / "runs").exists()
