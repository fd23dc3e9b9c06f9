"""The --target-ci hook: after the planned blocks, the design decides whether to add one. By cost (the default) it
also chooses the new block's measured requests per run, which reach the node through the run's playbook
variables and are stored per run; the sequential rule (`--design sequential`) asks specab.analysis.measures.stats."""
from __future__ import annotations

import io
import json

import pytest

from specab.analysis.cost import economics
from specab.config.plan import PlannedRun
from specab.driver import context as ex
from specab.driver import session
from specab.driver.options import Options, prepare
from specab.driver.per_run import PerRunExecutor
from specab.driver.playbook import PlaybookResult
from specab.driver.progress import Progress
from specab.driver.queue_executor import QueueExecutor
from specab.results import store as st
from tests.driver.test_cli_plan import INVENTORY


def _context(tmp_path, experiment_file, design: str, repeats: int) -> ex.RunContext:
    inv = tmp_path / "inv.yml"
    inv.write_text(INVENTORY.replace("NODEDIR", str(tmp_path / "node")))
    opts = Options(experiment_file=str(experiment_file), inventory_file=str(inv), repeats=repeats, seed=4,
                   target_ci=0.02, max_repeats=4, runs_dir=str(tmp_path / "runs"), design=design)  # type: ignore[arg-type]
    prepared = prepare(opts)
    exp_dir = tmp_path / "runs" / "t-1"
    s = st.Store.create(exp_dir / st.FILENAME)
    s.write_experiment(id="t-1", name="t", seed=4, repeats=repeats, order_mode="interleaved", experiment_file="e",
                       inventory_file="i", config={}, matrix=[], argv=[], hosts=["simA"], specab_version=None,
                       git_sha=None)
    s.write_arms([a.to_json() for a in prepared.arms])
    plan, _ = session.first_plan(prepared, opts, s, "fp-of-test")
    s.write_plan([r.to_json() for r in plan], repeats=max(r.block for r in plan))
    return ex.RunContext(prepared, opts, "t-1", exp_dir, s, io.StringIO(), Progress(out=io.StringIO(), live=False))


@pytest.fixture
def sequential(tmp_path, experiment_file):
    r = _context(tmp_path, experiment_file, "sequential", 2)
    yield r
    r.store.close()


@pytest.fixture
def by_cost(tmp_path, experiment_file):
    r = _context(tmp_path, experiment_file, "cost", 3)
    yield r
    r.store.close()


def test_a_block_is_added_while_stats_asks_for_one_up_to_max_repeats(sequential, monkeypatch):
    run = sequential
    # --repeats blocks at the experiment's requests: none chosen by a design (NULL), the experiment's 3 when they run
    assert [p["num_requests"] for p in run.store.plan()] == [None] * 4
    assert {run.num_requests(PlannedRun.from_row(p)) for p in run.store.plan()} == {3}
    calls = []

    def decide(store, target, limit):
        calls.append((target, limit))
        return True, "CI still wide"
    monkeypatch.setattr(ex, "decide_more_blocks", decide)
    new = run.more_blocks()
    assert [r.block for r in new] == [3, 3] and [r.seq for r in new] == [5, 6]
    assert [r.num_requests for r in new] == [None, None]       # the sequential design keeps the experiment's
    assert sorted(r.arm for r in new) == ["baseline", "eagle3-s2"]
    assert run.store.experiment()["repeats"] == 3 and len(run.store.plan()) == 6
    assert calls == [(0.02, 4)]
    run.more_blocks()
    assert run.store.experiment()["repeats"] == 4
    assert run.more_blocks() == []                    # --max-repeats reached: no block, whatever stats says
    assert len(calls) == 3                            # (asked only for the widths the stop reports)
    steps = run.store.design_steps()
    assert [(d["blocks"], d["more"], d["design"]) for d in steps] == [(2, True, "sequential"), (3, True, "sequential"),
                                                                     (4, False, "sequential")]


def test_no_block_when_stats_is_satisfied(sequential, monkeypatch):
    monkeypatch.setattr(ex, "decide_more_blocks", lambda s, t, m: (False, "target met"))
    assert sequential.more_blocks() == [] and len(sequential.store.plan()) == 4


def test_real_stats_decision_on_an_empty_experiment(sequential):
    """Nothing measured yet: the real statistics ask for a block, and say why."""
    more, reason = ex.decide_more_blocks(sequential.store, 0.02, 4)
    assert more is True and reason == "0 complete block(s); at least 3 are needed before judging the CI width"
    # the cap wins over the wish for more: with --max-repeats 0 blocks allowed, no block
    more, reason = ex.decide_more_blocks(sequential.store, 0.02, 0)
    assert more is False and reason == "stopped at --max-repeats 0 (target +-2.0% not met): speedup CI half-widths " \
                                       "eagle3-s2 n/a"


def test_by_cost_the_experiment_starts_with_one_block_its_requests_chosen_from_the_profile(by_cost):
    """The simulated node's profile is the prior: the first block is designed, stored per run, and said."""
    plan = by_cost.store.plan()
    assert [p["block"] for p in plan] == [1, 1]
    [first] = by_cost.store.design_steps()
    assert first["blocks"] == 0 and first["more"] and first["requests"] == plan[0]["num_requests"] == \
        plan[1]["num_requests"] >= 1
    assert "simulator profile default" in first["reason"] and first["plan"]["blocks"] >= 3


def test_by_cost_the_design_chooses_the_next_blocks_requests_and_they_reach_the_node(by_cost, monkeypatch):
    run = by_cost
    decisions = iter([economics.Decision(True, 40, "requests dominate"),
                      economics.Decision(False, 3, "interval +-1.9% within +-2.0% after 3 blocks")])
    asked = []

    def decide(limit):
        asked.append(limit)
        return next(decisions)
    monkeypatch.setattr(run, "decide_block", decide)
    new = run.more_blocks()
    assert [r.num_requests for r in new] == [40, 40] and {r.block for r in new} == {2}
    assert [p["num_requests"] for p in run.store.plan()][-2:] == [40, 40]
    assert asked == [4]                                 # --max-repeats bounds the design
    assert run.more_blocks() == []                      # the design stops
    steps = run.store.design_steps()
    assert [(d["blocks"], d["more"], d["requests"]) for d in steps][1:] == [(1, True, 40), (2, False, None)]
    # the run's measured requests, wherever the run's settings go: the playbook's experiment, the queue entry,
    # the manifest; the experiment's fingerprint stays the file's
    pr = new[0]
    assert run.experiment_extravar(pr)["bench"]["num_requests"] == 40
    assert run.experiment_extravar()["bench"]["num_requests"] == 3
    seen: list[tuple[str, dict]] = []

    def fake_run(playbook, extravars, ident, **kw):
        seen.append((playbook, extravars))
        return PlaybookResult(status="failed", rc=2, ident=ident, artifact_dir=run.exp_dir)
    monkeypatch.setattr(run.runner, "run", fake_run)
    QueueExecutor(run)._enqueue(new, reset=False, finish=False, cancel=None)     # type: ignore[arg-type]
    assert [e["num_requests"] for e in seen[-1][1]["specab_runs"]] == [40, 40]
    PerRunExecutor(run).run_one(pr, cancel=__import__("threading").Event())
    assert seen[-1][1]["specab_experiment"]["bench"]["num_requests"] == 40
    run_dir = run.exp_dir / "m"
    run_dir.mkdir()
    (run_dir / "manifest.json").write_text(json.dumps({"kind": "manifest"}))
    run.stamp_manifests(run_dir, pr)
    stamped = json.loads((run_dir / "manifest.json").read_text())
    assert stamped["bench"]["num_requests"] == 40 and stamped["fingerprint"] == run.fingerprint


def test_resume_keeps_each_runs_planned_requests(by_cost):
    row = {"seq": 5, "block": 3, "arm": "baseline", "position": 1, "run_id": "005-baseline", "num_requests": 40}
    assert PlannedRun.from_row(row).num_requests == 40
    del row["num_requests"]                              # a store before the column: the experiment's
    assert PlannedRun.from_row(row).num_requests is None and by_cost.num_requests(PlannedRun.from_row(row)) == 3
