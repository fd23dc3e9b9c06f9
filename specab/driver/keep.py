"""Runs the node finished that the store has not recorded: fetched on every exit path, recorded by `--resume`.

A queued run's outcome on the node is its directory `<node dir>/runs/<run id>/`: `done.json`, written last by the
sequencer, and `queue_entry.json`, naming the experiment. When the driver cannot record a finished run (the store
held by another program past its bounded wait, a driver that died), that directory is the run. `fetch_unrecorded`
brings every such run of the experiment into the experiment directory (its files scrubbed of secrets, not yet
recorded); `adopt` (a resume) records the ones found there, or fetched now, instead of running them again.

A run stopped half-way (done.json status `interrupted`) is no finished run: it runs again.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

from specab.config.plan import PlannedRun
from specab.driver.playbook import PlaybookResult, runner_ident, scrub_tree
from specab.driver.queue_executor import COLLECT_PLAYBOOK, Collected, QueueExecutor
from specab.driver.record import read_json, unpack_fetched
from specab.driver.remote import RemoteError, open_node
from specab.driver.systematic import STOPPED
from specab.results import store as st

FINISHED = ("ok", "failed")          # done.json statuses of a run that ran to its end (recorded as it is)
# what the node says of each asked run: done.json's status where the run's queue entry names the experiment
_PROBE = ("import json, os, sys\n"
          "base, exp, ids = os.path.expanduser(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])\n"
          "out = {}\n"
          "for rid in ids:\n"
          "    d = os.path.join(base, 'runs', rid)\n"
          "    try:\n"
          "        entry = json.load(open(os.path.join(d, 'queue_entry.json')))\n"
          "        done = json.load(open(os.path.join(d, 'done.json')))\n"
          "    except (OSError, ValueError):\n"
          "        continue\n"
          "    if isinstance(entry, dict) and entry.get('experiment_id') == exp and isinstance(done, dict):\n"
          "        out[rid] = done.get('status')\n"
          "print(json.dumps(out))\n")


def finished_on_node(ex: QueueExecutor, runs: list[PlannedRun], statuses: tuple[str, ...] = FINISHED
                     ) -> list[PlannedRun]:
    """The runs of `runs` (in their order) that the node finished for this experiment with one of `statuses` (one
    read-only probe)."""
    if not runs:
        return []
    host = ex.host
    node = open_node(host)
    try:
        rc, out, _ = node.run([str(host.vars.get("specab_python", "python3")), "-c", _PROBE,
                               ex.node_path or host.node_dir, ex.ctx.exp_id, json.dumps([p.run_id for p in runs])],
                              timeout=60)
    except RemoteError:
        return []
    finally:
        node.close()
    try:
        found = json.loads(out.strip().splitlines()[-1]) if rc == 0 else {}
    except (ValueError, IndexError):
        found = {}
    return [p for p in runs if found.get(p.run_id) in statuses]


def finished_here(exp_dir: Path, exp_id: str, pr: PlannedRun, statuses: tuple[str, ...] = FINISHED) -> bool:
    """Whether the experiment directory holds run `pr` as the node finished it with one of `statuses` (fetched, not
    yet recorded)."""
    entry, done = read_json(exp_dir / pr.run_id / "queue_entry.json"), read_json(exp_dir / pr.run_id / "done.json")
    return (isinstance(entry, dict) and entry.get("experiment_id") == exp_id and isinstance(done, dict)
            and done.get("status") in statuses)


def fetch(ex: QueueExecutor, runs: list[PlannedRun]) -> list[str]:
    """Fetch finished runs (collect_run.yml without waiting: the first run, the rest as its `also`) into the
    experiment directory, scrubbed; nothing is recorded. Returns the run ids fetched."""
    r, fetched, left = ex.ctx, [], list(runs)
    while left:
        first, also = left[0], left[1:]
        run_dir = (r.exp_dir / first.run_id).resolve()
        extravars: dict[str, Any] = {"specab_experiment": r.experiment_extravar(first), "specab_experiment_id": r.exp_id,
                                     "specab_run_id": first.run_id, "specab_run_dir": str(run_dir),
                                     "specab_also_run_ids": [p.run_id for p in also], "specab_queue_wait_s": 0}
        if ex.node_path:
            extravars["specab_node_path"] = ex.node_path
        try:
            r.runner.run(COLLECT_PLAYBOOK, extravars, runner_ident("keep-" + first.run_id), secrets=r.secrets,
                         limit=r.limit)
            held = unpack_fetched(run_dir.with_name(run_dir.name + ".tar"), r.exp_dir, [p.run_id for p in left])
        except Exception as exc:        # an exit path: what cannot be fetched stays on the node for the resume
            r.progress.notice(f"{first.run_id}: not fetched ({type(exc).__name__}: {exc}); it stays on the node")
            held = []
        for run_id in held:
            scrub_tree(r.exp_dir / run_id, r.secrets)
        fetched += held
        left = [p for p in also if p.run_id not in held] if first.run_id in held else also
    return fetched


def unrecorded(ex: QueueExecutor, runs: list[PlannedRun]) -> list[PlannedRun]:
    """The runs of `runs` the store holds no outcome of: no row, or a row left `running` (the driver stopped or died
    while the run was on the node). A run recorded interrupted, failed or ok is the store's word: a resume runs the
    interrupted (and, with --retry-failed, the failed) again, whatever the node finished after the signal."""
    rows = {row["seq"]: row["status"] for row in ex.ctx.store.runs()}
    return [p for p in runs if rows.get(p.seq, st.RUNNING) == st.RUNNING]


def fetch_unrecorded(ex: QueueExecutor) -> list[str]:
    """Every run of the plan the store holds no outcome of but the node finished: fetched (an exit path on which
    the store cannot be written). Reads the store only."""
    r = ex.ctx
    todo = unrecorded(ex, [PlannedRun.from_row(row) for row in r.store.plan()])
    on_disk = [p for p in todo if finished_here(r.exp_dir, r.exp_id, p)]
    return [p.run_id for p in on_disk] + fetch(ex, finished_on_node(ex, [p for p in todo if p not in on_disk]))


def adoptable(experiment: dict[str, Any]) -> tuple[str, ...]:
    """The done.json statuses a resume of `experiment` (the store's row) records instead of running again."""
    return ("ok",) if experiment.get("status") == STOPPED else FINISHED


def adopt(ex: QueueExecutor, todo: list[PlannedRun], index: int, statuses: tuple[str, ...] = FINISHED,
          on_status: Callable[[str], None] | None = None) -> list[PlannedRun]:
    """A resume: record each run of `todo` that the store holds no outcome of and the node finished with one of
    `statuses` (found in the experiment directory, else fetched now) as it finished, and return the rest, which run.
    After a systematic stop only ok runs are taken: the queued runs the node went on with before the stop reached it
    failed for the cause the user has fixed since, and run again."""
    r = ex.ctx
    open_runs = unrecorded(ex, todo)
    fetch(ex, finished_on_node(ex, [p for p in open_runs if not finished_here(r.exp_dir, r.exp_id, p, statuses)],
                               statuses))
    rest = []
    for pr in todo:
        if pr not in open_runs or not finished_here(r.exp_dir, r.exp_id, pr, statuses):
            rest.append(pr)
            continue
        index += 1
        r.progress.run_started(index, pr.run_id, pr.arm, pr.block)
        r.progress.notice(f"{pr.run_id}: finished on the node before this resume: recorded, not run again")
        ident = runner_ident("adopt-" + pr.run_id)
        now = time.time()
        ok = PlaybookResult(status="successful", rc=0, ident=ident, artifact_dir=r.exp_dir / ".runner")
        status, _ = ex.record_also(pr, Collected(st.OK, True, ok, ident, (now, now)))
        if on_status:
            on_status(status)
    return rest
