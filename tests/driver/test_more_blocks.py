"""The sequential-stopping hook: after the planned blocks, specab.analysis.stats decides whether to add one."""
from __future__ import annotations

import io

import pytest

from specab.driver import context as ex
from specab.driver.options import Options, prepare
from specab.results import store as st
from specab.driver.progress import Progress
from tests.driver.test_cli_plan import INVENTORY


@pytest.fixture
def run(tmp_path, experiment_file, monkeypatch):
    inv = tmp_path / "inv.yml"
    inv.write_text(INVENTORY.replace("NODEDIR", str(tmp_path / "node")))
    opts = Options(experiment_file=str(experiment_file), inventory_file=str(inv), repeats=2, seed=4,
                      target_ci=0.02, max_repeats=4, runs_dir=str(tmp_path / "runs"))
    prepared = prepare(opts)
    s = st.Store.create(tmp_path / "results.sqlite")
    s.write_experiment(id="t-1", name="t", seed=4, repeats=2, order_mode="interleaved", experiment_file="e",
                       inventory_file="i", config={}, matrix=[], argv=[], hosts=["simA"], specab_version=None,
                       git_sha=None)
    s.write_arms([a.to_json() for a in prepared.arms])
    s.write_plan([r.to_json() for r in prepared.plan], repeats=2)
    r = ex.RunContext(prepared, opts, "t-1", tmp_path, s, io.StringIO(), Progress(out=io.StringIO(), live=False))
    yield r
    s.close()


def test_a_block_is_added_while_stats_asks_for_one_up_to_max_repeats(run, monkeypatch):
    calls = []

    def decide(store, target, limit):
        calls.append((target, limit))
        return True, "CI still wide"
    monkeypatch.setattr(ex, "decide_more_blocks", decide)
    new = run.more_blocks()
    assert [r.block for r in new] == [3, 3] and [r.seq for r in new] == [5, 6]
    assert sorted(r.arm for r in new) == ["baseline", "eagle3-s2"]
    assert run.store.experiment()["repeats"] == 3 and len(run.store.plan()) == 6
    assert calls == [(0.02, 4)]
    run.more_blocks()
    assert run.store.experiment()["repeats"] == 4
    assert run.more_blocks() == []                    # --max-repeats reached: stats not even asked
    assert len(calls) == 2


def test_no_block_when_stats_is_satisfied(run, monkeypatch):
    monkeypatch.setattr(ex, "decide_more_blocks", lambda s, t, m: (False, "target met"))
    assert run.more_blocks() == [] and len(run.store.plan()) == 4


def test_real_stats_decision_on_an_empty_experiment(run):
    more, reason = ex.decide_more_blocks(run.store, 0.02, 4)
    assert isinstance(more, bool) and reason
