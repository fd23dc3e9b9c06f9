"""An arm's own bench settings (ArmSpec.bench) reach what the driver derives from a run's settings: the run's
measured requests (its queue entry, the partial-run check, the manifest's bench) and the wait the queue executor
passes to collect_run.yml (specab.config.bench.queue_wait_s of the run's resolved settings)."""
from __future__ import annotations

import dataclasses
import io
import threading

from specab.config import bench
from specab.config.plan import PlannedRun
from specab.driver import context as ex
from specab.driver import session
from specab.driver.options import Options, prepare
from specab.driver.playbook import PlaybookResult
from specab.driver.progress import Progress
from specab.driver.queue_executor import COLLECT_PLAYBOOK, QueueExecutor
from specab.results import store as st
from tests.driver.conftest import EXPERIMENT
from tests.driver.test_cli_plan import INVENTORY

# the experiment of tests/driver/conftest.py: 3 measured requests, 1 warm-up, 60 s each; ready 60, stop 5, free 30
EXPERIMENT_WAIT = 60 + 2 * 5 + 2 * 30 + 60 * (3 + 1) + bench.QUEUE_WAIT_MARGIN_S


def _context(tmp_path, experiment_file, inventory: str = INVENTORY, **opts) -> ex.RunContext:
    inv = tmp_path / "inv.yml"
    inv.write_text(inventory.replace("NODEDIR", str(tmp_path / "node")))
    options = Options(experiment_file=str(experiment_file), inventory_file=str(inv), repeats=1, seed=4,
                      runs_dir=str(tmp_path / "runs"), **opts)  # type: ignore[arg-type]
    prepared = prepare(options)
    exp_dir = tmp_path / "runs" / "t-1"
    s = st.Store.create(exp_dir / st.FILENAME)
    s.write_experiment(id="t-1", name="t", seed=4, repeats=1, order_mode="interleaved", experiment_file="e",
                       inventory_file="i", config={}, matrix=[], argv=[], hosts=["simA"], specab_version=None,
                       git_sha=None)
    s.write_arms([a.to_json() for a in prepared.arms])
    plan, _ = session.first_plan(prepared, options, s, "fp-of-test")
    s.write_plan([r.to_json() for r in plan], repeats=1)
    return ex.RunContext(prepared, options, "t-1", exp_dir, s, io.StringIO(), Progress(out=io.StringIO(), live=False))


def _collect_extravars(run: ex.RunContext, pr: PlannedRun, monkeypatch) -> dict:
    """The extra vars the queue executor gives collect_run.yml for run `pr` (the play itself faked: failed)."""
    seen: list[tuple[str, dict]] = []

    def fake_run(playbook, extravars, ident, **kw):
        seen.append((playbook, extravars))
        return PlaybookResult(status="failed", rc=2, ident=ident, artifact_dir=run.exp_dir)
    monkeypatch.setattr(run.runner, "run", fake_run)
    QueueExecutor(run).collect(pr, threading.Event())
    [(playbook, extravars)] = [s for s in seen if s[0] == COLLECT_PLAYBOOK]
    return extravars


def test_the_queue_executor_passes_a_wait_that_counts_the_arms_own_requests(tmp_path, experiment_file,
                                                                             monkeypatch):
    run = _context(tmp_path, experiment_file, executor="queue")
    try:
        # an arm whose own bench asks for 40 measured requests and 2 warm-ups; the baseline runs the experiment's
        arm = run.arms["eagle3-s2"]
        run.arms["eagle3-s2"] = dataclasses.replace(arm, bench={"num_requests": 40, "warmup_requests": 2})
        [base_pr] = [PlannedRun.from_row(p) for p in run.store.plan() if p["arm"] == "baseline"]
        [arm_pr] = [PlannedRun.from_row(p) for p in run.store.plan() if p["arm"] == "eagle3-s2"]
        assert _collect_extravars(run, base_pr, monkeypatch)["specab_queue_wait_s"] == EXPERIMENT_WAIT
        assert (_collect_extravars(run, arm_pr, monkeypatch)["specab_queue_wait_s"]
                == EXPERIMENT_WAIT + 60 * (40 + 2 - 3 - 1))
        # the run's measured requests everywhere the driver uses them: its queue entry, the partial-run check
        assert (run.num_requests(base_pr), run.num_requests(arm_pr)) == (3, 40)
        assert run.bench_settings(arm_pr)["warmup_requests"] == 2
        # the design's requests for a block win over both (the queue entry's num_requests)
        chosen = dataclasses.replace(arm_pr, num_requests=7)
        assert (run.num_requests(chosen), run.bench_settings(chosen)["warmup_requests"]) == (7, 2)
    finally:
        run.store.close()


def test_the_wait_takes_the_hosts_timeout_under_the_experiments(tmp_path, write, monkeypatch):
    """An inventory's specab_*_timeout values count where the experiment gives none (as the playbooks resolve
    them)."""
    exp = write("exp.yml", EXPERIMENT.replace("    ready_s: 60\n", ""))
    inventory = INVENTORY + "          specab_ready_timeout_s: 900\n          specab_gpu_free_timeout_s: 1\n"
    run = _context(tmp_path, exp, inventory, executor="queue")
    try:
        [pr] = [PlannedRun.from_row(p) for p in run.store.plan() if p["arm"] == "baseline"]
        assert _collect_extravars(run, pr, monkeypatch)["specab_queue_wait_s"] == EXPERIMENT_WAIT - 60 + 900
    finally:
        run.store.close()


def test_run_timeout_replaces_the_computed_wait(tmp_path, experiment_file, monkeypatch):
    run = _context(tmp_path, experiment_file, executor="queue", run_timeout_s=77)
    try:
        [pr] = [PlannedRun.from_row(p) for p in run.store.plan() if p["arm"] == "baseline"]
        assert _collect_extravars(run, pr, monkeypatch)["specab_queue_wait_s"] == 77
    finally:
        run.store.close()
