"""The queue executor: runs of one host go through the node's sequencer, not one playbook each.

`playbooks/enqueue.yml` renders each run's files and queues it on the node; the sequencer
(`bin/specab/node sequence`, node side) runs the queued runs back to back with no Ansible task between two runs;
`playbooks/collect_run.yml` waits for one run (`sequence.py wait`) and fetches its directory, with those of the
runs queued after it that the node finished meanwhile (one play for all of them; each is then recorded as if
collected on its own: runs shorter than a collect no longer leave the driver a play behind per run). The driver
keeps runs queued ahead of the one it waits for (LOOKAHEAD at first, up to DEPTH), so its own Ansible
work (collect run k-1, enqueue later runs) overlaps the benchmark of run k and the transition between
two runs contains none.

Contract with the node side: docs/architecture.md "Run queue". The run's outcome is the sequencer's
``done.json``; its phases come from ``phases.jsonl`` (tailed live, stored with the node's times).
"""
from __future__ import annotations

import json
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specab.config import bench, defaults, plan
from specab.config.inventory import Host
from specab.config.plan import PlannedRun
from specab.driver import lease
from specab.driver.context import MoreBlocks, RunContext
from specab.driver.playbook import Failure, PlaybookResult, runner_ident
from specab.driver.record import (INTERRUPTED_REASON, PhaseClock, UnpackError, check_writable, fetch_missing,
                                  phase_at, read_json, unpack_fetched)
from specab.driver.remote import LogTail, read_tail
from specab.results import store as st
from specab.vocab.contract import LOAD_SUBPHASES
from specab.vocab.phases import display_phase, stored_phase_name


ENQUEUE_PLAYBOOK = "playbooks/enqueue.yml"
COLLECT_PLAYBOOK = "playbooks/collect_run.yml"
# The first enqueue of a session queues the run the driver waits for and LOOKAHEAD more, so the node starts
# at once; from then on up to DEPTH runs are queued and not yet collected, topped up (one enqueue.yml for
# many runs) when half of them are collected. The sequencer must never wait for the driver: a run of a
# real model is minutes, but a tiny one is shorter than the driver's collect of the one before.
LOOKAHEAD = 2
DEPTH = 16
CANCELED = "canceled"      # a collect cut short by the interrupt (not a run status: the run is collected again)

def load_marks(ready: Any) -> list[tuple[str, float]]:
    """(display sub-phase, node time first seen) from a run's ready.json."""
    out = []
    phases = ready.get("phases") if isinstance(ready, dict) else None
    for key, name in LOAD_SUBPHASES:
        rec = phases.get(key) if isinstance(phases, dict) else None
        t = rec.get("seen_at") if isinstance(rec, dict) else None
        if isinstance(t, (int, float)):
            out.append((name, float(t)))
    return out


def phase_rows(lines: list[str], sub: list[tuple[str, float]] | None = None
               ) -> list[tuple[str, float, float | None]]:
    """Stored phases of one run from its phases.jsonl: (name, start, end), repeated phases named like the
    per-run path does (`final stop`, `waiting for GPUs after stop`); `sub` (from `load_marks`) splits
    `loading` into `loading weights` and `capturing graphs` where they fall inside it."""
    events: list[tuple[str | None, float]] = []
    for line in lines:
        try:
            rec = json.loads(line)
            events.append((display_phase(str(rec["phase"])), float(rec["t"])))
        except (ValueError, KeyError, TypeError):
            continue                    # a line cut short by a crash of the sequencer
    starts = [i for i, (p, _) in enumerate(events) if p == "loading"]
    if starts and sub:
        i = starts[0]
        end = events[i + 1][1] if i + 1 < len(events) else float("inf")
        inside = sorted((t, name) for name, t in sub if events[i][1] < t < end)
        events[i + 1:i + 1] = [(name, t) for t, name in inside]
    # the node stamps to 0.1 ms: a skipped phase (no leftover to stop) can share its start with the next;
    # keep the order the node wrote them in (the store sorts by start time)
    for i in range(1, len(events)):
        if events[i][1] <= events[i - 1][1]:
            events[i] = (events[i][0], events[i - 1][1] + 1e-6)
    rows: list[tuple[str, float, float | None]] = []
    names: list[str] = []
    for i, (phase, t0) in enumerate(events):
        if phase is None:
            continue
        t1 = events[i + 1][1] if i + 1 < len(events) else None
        names.append(stored_phase_name(phase, names))
        rows.append((names[-1], t0, t1))
    return rows


@dataclass
class Collected:
    """One collect play: the waited-for run's status, whether the queue is still healthy, the play's result and
    runner ident, its window (collect start, end), and the later runs that came finished with it."""

    status: str
    healthy: bool
    result: PlaybookResult
    ident: str
    window: tuple[float, float]
    extras: list[PlannedRun] = field(default_factory=list)


def node_tails(host: Host, node_dir: str, clock: PhaseClock, on_log: Callable[[str], None],
               on_bench: Callable[[str], None]) -> list[LogTail]:
    """The live view of a queued run, started: its node phases (phases.jsonl) entered on `clock`, its server log and
    its benchmark's requests."""
    def on_node_phase(line: str) -> None:
        try:
            phase = display_phase(str(json.loads(line)["phase"]))
        except (ValueError, KeyError, TypeError):
            return
        if phase is not None:
            clock.enter(phase)

    return [LogTail(host, node_dir + "/phases.jsonl", on_node_phase, interval=0.1).start(),
            LogTail(host, node_dir + "/server.log", on_log).start(),
            LogTail(host, node_dir + "/bench.jsonl", on_bench).start()]


def run_outcome(done: dict[str, Any] | None, result: PlaybookResult,
             current: str | None) -> tuple[str, str | None, str | None]:
    """(status, failure phase, failure reason) of a run from done.json and the collect playbook; `current`:
    the phase the driver saw last."""
    if done and done.get("status") == "interrupted":
        return st.INTERRUPTED, display_phase(done.get("phase")) or current, INTERRUPTED_REASON
    if not result.ok:
        f = result.failures[0] if result.failures else None
        reason = f"{f.task}: {f.message}" if f else f"ansible-runner status {result.status} rc {result.rc}"
        phase = (display_phase(done.get("phase")) if done else None) or current
        return st.FAILED, phase, reason
    if not done:
        return st.FAILED, current, ("the sequencer finished the run without a done.json; see "
                                    "sequencer.log in the node directory")
    if done.get("ok"):
        return st.OK, None, None
    error = done.get("error") or f"the run ended with status {done.get('status')!r}"
    # the headline of a failure in its phase and the tool's own error, as the per-run path's module states it
    headline = done.get("headline") or done.get("task") or "sequencer"
    return st.FAILED, display_phase(done.get("phase")) or current, f"{headline}: {error}"


def record_collected(r: RunContext, host: Host, pr: PlannedRun, run_dir: Path, result: PlaybookResult, started: float,
                     window: tuple[float, float] | None, clock: PhaseClock | None, after_stop: float | None,
                     signalled: Callable[[], bool]) -> tuple[str, bool]:
    """Store a collected run: its node phases (and the collect's window), its outcome, its files; `signalled`: whether
    this driver received SIGINT/SIGTERM (only that is an interruption by the user)."""
    current = clock.current if clock else None
    done = read_json(run_dir / "done.json")
    if not isinstance(done, dict) and clock is not None:     # (the play's fact is the waited-for run's)
        fact = (result.facts.get(host.name) or {}).get("specab_done")
        done = fact if isinstance(fact, dict) and fact else None
    rows = phase_rows(_read_lines(run_dir / "phases.jsonl"), load_marks(read_json(run_dir / "ready.json")))
    if window is not None:
        rows.append(("collecting", *window))
    if not rows and clock is not None:    # nothing from the node (it never claimed the run): the live view
        rows = list(clock.times)
    for name, t0, t1 in rows:
        r.store.record_phase(pr.seq, name, t0, t1)
    ended = (done or {}).get("finished_at")
    healthy = True
    if after_stop is not None and not (done and done.get("ok")) and (
            not done or not isinstance(ended, (int, float)) or ended > after_stop):
        # Ctrl-C at time T: what had not ended by T is interrupted (and resumed), however long the stop
        # took to reach the node; its phase is the one it was in at T (the node's phases, or the phase it
        # was stopped in)
        phase = phase_at(rows, after_stop) or display_phase((done or {}).get("phase")) or current
        outcome = (st.INTERRUPTED, phase, INTERRUPTED_REASON)
    else:
        outcome = run_outcome(done, result, current)
        if done and done.get("status") == "interrupted" and not signalled():
            # the node's sequencer was stopped, but this driver received no signal: not an interruption
            # by the user; the run failed, and the queue is started anew for the next runs
            outcome = (st.FAILED, outcome[1], "the node's sequencer was stopped by a signal this driver did "
                       "not send (another controller, stop.py or the system): " + str(done.get("error") or ""))
            healthy = False
    status = r.record_finish(pr, result, run_dir, started, outcome=outcome, load_phases=None,
                             fetch_missing=False)
    return status, healthy


def fail_unqueued(r: RunContext, host: Host, pr: PlannedRun, res: PlaybookResult, index: int) -> None:
    """Record run `pr` as failed because it could not be queued."""
    r.progress.run_started(index, pr.run_id, pr.arm, pr.block)
    f = res.failures[0] if res.failures else None
    reason = (f"{f.task}: {f.message}" if f else f"enqueue.yml: ansible-runner status {res.status} rc {res.rc}")
    run_dir = (r.exp_dir / pr.run_id).resolve()
    r.store.start_run(seq=pr.seq, run_id=pr.run_id, arm=pr.arm, block=pr.block, host=host.name,
                      run_dir=str(run_dir), runner_ident=res.ident)
    r.store.finish_run(pr.seq, status=st.FAILED, runner_status=res.status, runner_rc=res.rc,
                       failure_phase="starting", failure_reason=reason, log_tail=res.stdout_tail or None)
    r.progress.run_finished(st.FAILED, 0.0, reason)


def instance_entry(pr: PlannedRun, keeps: set[int], engine: str) -> dict[str, Any] | None:
    """The queue entry's instance of run `pr` (docs/decisions/0011): its id, whether its server is kept up for the
    instance's next run (`keeps`: the next run to run continues it), the engine whose cache reset it uses."""
    if pr.instance is None:
        return None
    return {"id": str(pr.instance), "keep": pr.seq in keeps, "engine": engine}


def enqueue_vars(r: RunContext, runs: list[PlannedRun], reset: bool, finish: bool,
                 instance_of: Callable[[PlannedRun], dict[str, Any] | None]) -> dict[str, Any]:
    """enqueue.yml's extra vars: the runs to queue, each with its arm, its measured requests (the design by cost
    chooses them per block), its scoring and its instance in its queue entry; whether the queue starts anew, whether
    it ends."""
    return {"specab_experiment": r.experiment_extravar(), "specab_experiment_id": r.exp_id,
            "specab_runs": [{"seq": pr.seq, "run_id": pr.run_id, "arm": r.arms[pr.arm].to_extravar(),
                             "num_requests": r.num_requests(pr), "score": r.score_spec(pr),
                             "instance": instance_of(pr)} for pr in runs],
            "specab_queue_reset": reset, "specab_queue_finish": finish}


class QueueExecutor:
    """The queue loop of one host (a single-node inventory, or one host of a fleet)."""

    stops_node_on_interrupt = True     # loop() stops the sequencer and the server itself (stop.yml)

    def __init__(self, ctx: RunContext, lookahead: int = LOOKAHEAD, depth: int = DEPTH,
                 signal_time: Callable[[], float | None] | None = None):
        if len(ctx.p.inventory.hosts) != 1:
            raise ValueError("the queue executor runs the runs of exactly one host")
        self.ctx = ctx
        self.host = ctx.p.inventory.hosts[0]
        self.lookahead = max(0, lookahead)
        self.depth = max(self.lookahead + 1, depth)
        self.node_path: str | None = None        # the absolute node directory, from enqueue.yml
        self.finish_sent = False
        self.stopped = False                      # interrupt: the node was stopped through stop.yml
        self.signal_time = signal_time            # when the user's SIGINT/SIGTERM came
        self.keeps: set[int] = set()              # runs whose server is kept for their instance's next run

    # ------------------------------------------------------------------ playbooks
    def _enqueue(self, runs: list[PlannedRun], *, reset: bool, finish: bool,
                 cancel: threading.Event) -> PlaybookResult:
        r = self.ctx
        extravars = enqueue_vars(r, runs, reset, finish,
                                 lambda pr: instance_entry(pr, self.keeps, r.p.experiment.engine))
        ident = runner_ident("enqueue-" + ("-".join(pr.run_id.split("-", 1)[0] for pr in runs) or "none"))
        try:
            res = r.runner.run(ENQUEUE_PLAYBOOK, extravars, ident, cancel=cancel, secrets=r.secrets,
                               limit=r.limit)
        except Exception as exc:       # ansible-runner itself failed
            return PlaybookResult(status="error", rc=None, ident=ident, artifact_dir=r.exp_dir / ".runner",
                                  failures=[Failure(phase="starting", task="ansible-runner (enqueue.yml)",
                                                    host=None, message=f"{type(exc).__name__}: {exc}")])
        path = (res.facts.get(self.host.name) or {}).get("specab_node_path")
        if isinstance(path, str) and path:
            self.node_path = path
        if res.ok and finish:
            self.finish_sent = True
        return res

    def node_run_dir(self, run_id: str) -> str:
        base = self.node_path or self.host.node_dir.rstrip("/")
        return f"{base}/runs/{run_id}"

    def _collect_vars(self, pr: PlannedRun, run_dir: Path, also: Sequence[PlannedRun],
                      wait_s: float | None) -> dict[str, Any]:
        """collect_run.yml's extra vars. It waits `wait_s` for the run, else the driver's --run-timeout, else what the
        run's queue entry needs (specab.config.bench.queue_wait_s: its bench settings, the arm's own over the
        experiment's, its measured requests; the timeouts of the experiment over its host's)."""
        r = self.ctx
        if wait_s is None and r.opts.run_timeout_s:
            wait_s = int(r.opts.run_timeout_s)
        elif wait_s is None:
            timeouts = bench.timeouts(bench.given(self.host.vars, defaults.TIMEOUT_DEFAULTS), r.p.experiment.timeouts)
            settings = r.bench_settings(pr)
            # a baseline run that scores (temperature > 0): each scored run's requests, one scoring request each
            scored = len(r.score_spec(pr).get("runs") or []) * int(settings["num_requests"])
            wait_s = bench.queue_wait_s(settings, timeouts, scored)
        return {"specab_experiment": r.experiment_extravar(pr), "specab_experiment_id": r.exp_id,
                "specab_run_id": pr.run_id, "specab_run_dir": str(run_dir), "specab_queue_wait_s": wait_s,
                **({"specab_also_run_ids": [p.run_id for p in also]} if also else {}),
                **({"specab_node_path": self.node_path} if self.node_path else {})}

    # ------------------------------------------------------------------ one run (and those done after it)
    def collect(self, pr: PlannedRun, cancel: threading.Event, *, new_row: bool = True,
                wait_s: float | None = None, after_stop: float | None = None,
                also: Sequence[PlannedRun] = ()) -> Collected:
        """Wait for run `pr` on the node, fetch and ingest it; the leading runs of `also` (queued after it, in
        queue order) that the node has finished by then come in the same play and are returned, fetched but not
        yet recorded (`record_also`). Status CANCELED when `cancel` cut the collect short (nothing recorded:
        collected again after the stop). `after_stop` = the time of the user's interrupt, after which the node
        was stopped: a run without done.json, or that ended after that time, is interrupted (its files are kept)."""
        r = self.ctx
        run_dir = (r.exp_dir / pr.run_id).resolve()
        ident = runner_ident(pr.run_id)
        if new_row:
            check_writable(r.exp_dir)
            r.store.start_run(seq=pr.seq, run_id=pr.run_id, arm=pr.arm, block=pr.block, host=self.host.name,
                              run_dir=str(run_dir), runner_ident=ident)
        for p in [pr, *also] if new_row else also:
            stale = (r.exp_dir / p.run_id).resolve()
            if stale.exists():         # an earlier, unfinished attempt (resume): start clean
                shutil.rmtree(stale)
        clock = PhaseClock(r.progress)
        node_dir = self.node_run_dir(pr.run_id)
        tails = node_tails(self.host, node_dir, clock, *r.tail_handlers(clock, enter_phases=False, pr=pr))
        collect_started: list[float] = []

        def on_phase(phase: str, at: float | None = None) -> None:   # only collecting counts (the node tells the rest)
            if phase == "collecting":
                if not collect_started:
                    collect_started.append(time.time())
                clock.enter(phase)

        started = time.time()
        try:
            result = r.runner.run(COLLECT_PLAYBOOK, self._collect_vars(pr, run_dir, also, wait_s), ident,
                                  cancel=cancel, on_phase=on_phase, secrets=r.secrets, limit=r.limit)
        except Exception as exc:
            result = PlaybookResult(status="error", rc=None, ident=ident, artifact_dir=r.exp_dir / ".runner",
                                    failures=[Failure(phase=clock.current, task="ansible-runner (collect_run.yml)",
                                                      host=None, message=f"{type(exc).__name__}: {exc}")])
        finally:
            for t in tails:
                t.stop()
        held: list[str] = []
        try:        # collect_run.yml leaves the fetched runs packed (collect_unpack: false)
            held = unpack_fetched(run_dir.with_name(run_dir.name + ".tar"), r.exp_dir,
                                  [pr.run_id, *(p.run_id for p in also)])
        except UnpackError as exc:
            result.failures.append(Failure(phase="collecting", task="unpack the fetched run directory",
                                           host=self.host.name, message=str(exc)))
        clock.close()
        if cancel.is_set():
            return Collected(CANCELED, False, result, ident, (started, time.time()))
        if not result.ok:
            fetch_missing(self.host, node_dir, run_dir)
        window = (collect_started[0] if collect_started else started, time.time())
        status, healthy = record_collected(r, self.host, pr, run_dir, result, started,
                                           window if collect_started else None, clock, after_stop, self._signalled)
        extras = []
        if result.ok:                  # the later runs the node had finished, in queue order
            for p in also:
                if p.run_id not in held:
                    break
                extras.append(p)
        return Collected(status, result.ok and healthy, result, ident, window, extras)

    def record_also(self, pr: PlannedRun, c: Collected) -> tuple[str, bool]:
        """Record run `pr`, which came finished in the collect `c` of an earlier run (its files unpacked).
        Returns (status, queue still healthy)."""
        r = self.ctx
        run_dir = (r.exp_dir / pr.run_id).resolve()
        check_writable(r.exp_dir)
        r.store.start_run(seq=pr.seq, run_id=pr.run_id, arm=pr.arm, block=pr.block, host=self.host.name,
                          run_dir=str(run_dir), runner_ident=c.ident)
        rows = phase_rows(_read_lines(run_dir / "phases.jsonl"))
        started = rows[0][1] if rows else c.window[0]     # the node claimed it then: its duration is the node's
        return record_collected(r, self.host, pr, run_dir, c.result, started, c.window, None, None, self._signalled)

    def hold_node(self) -> None:
        """Interrupted: the node's sequencer claims and starts no further run (its node lease on hold, at once,
        before stop.yml's Ansible start-up: the next arm's server never starts)."""
        try:
            lease.hold(self.host)
        except Exception as exc:      # the stop role still stops the sequencer
            self.ctx.progress.notice(f"WARNING: could not hold the queue on {self.host.name}: {exc}")

    def _watch_cancel(self, cancel: threading.Event, over: threading.Event) -> None:
        while not over.is_set():
            if cancel.wait(0.1):
                self.hold_node()
                return

    def _signalled(self) -> bool:
        """Whether this driver received SIGINT/SIGTERM (only that is an interruption by the user)."""
        return bool(self.signal_time and self.signal_time() is not None)

    # ------------------------------------------------------------------ the loop
    def abort(self) -> None:
        """The driver failed: the sequencer would go on with the queued runs; stop it and the server."""
        self.ctx.progress.notice("stopping the node's sequencer and server (stop role) ...")
        self.ctx.stop_servers()

    def loop(self, todo: list[PlannedRun], cancel: threading.Event, index: int, *,
             more: MoreBlocks | None = None, on_status: Callable[[str], None] | None = None) -> bool:
        """Run `todo` (and what `more` adds when it runs out) through the queue. Returns True when
        interrupted (`cancel` set), after stopping the node's sequencer and server."""
        self.keeps = plan.keeps(todo)
        over = threading.Event()
        watcher = threading.Thread(target=self._watch_cancel, args=(cancel, over), name="queue-hold", daemon=True)
        watcher.start()
        try:
            return self._loop(todo, cancel, index, more=more, on_status=on_status)
        finally:
            over.set()
            watcher.join(timeout=30)

    def _loop(self, todo: list[PlannedRun], cancel: threading.Event, index: int, *,
              more: MoreBlocks | None = None, on_status: Callable[[str], None] | None = None) -> bool:
        r = self.ctx
        pending: deque[PlannedRun] = deque(todo)
        queued: deque[PlannedRun] = deque()
        reset = True                      # a new driver session or a resume starts from a clean queue
        final = more is None              # no run can be added after the planned ones
        while pending or queued:
            if reset:       # a small first batch: the node starts at once; the next top-up follows right away
                want = self.lookahead + 1 - len(queued)
            elif len(queued) <= self.depth // 2:
                want = self.depth - len(queued)
            else:
                want = 0
            batch = [pending.popleft() for _ in range(min(max(want, 0), len(pending)))]
            if reset:
                batch = list(queued) + batch
                queued.clear()
            if batch or reset:
                res = self._enqueue(batch, reset=reset, finish=final and not pending, cancel=cancel)
                if cancel.is_set():
                    self.interrupted(None, list(queued) + [pr for pr in batch if pr not in queued])
                    return True
                if not res.ok:
                    # the node cannot take runs (unreachable, foreign GPU process, ...): the first run of the
                    # batch fails with that message; the rest are queued again from a clean queue
                    if not batch:
                        batch = [pending.popleft()] if pending else []
                    if not batch:
                        break
                    first, rest = batch[0], batch[1:]
                    fail_unqueued(r, self.host, first, res, index + 1)
                    index += 1
                    if on_status:
                        on_status(st.FAILED)
                    pending.extendleft(reversed(rest))
                    reset = True
                    continue
                queued.extend(batch)
                if reset and pending and len(queued) <= self.depth // 2:
                    reset = False
                    continue          # top up at once, before waiting for the first run
                reset = False
            if not queued:
                continue
            pr = queued.popleft()
            index += 1
            r.progress.run_started(index, pr.run_id, pr.arm, pr.block)
            # the runs queued after it that the node finished meanwhile come in the same play
            c = self.collect(pr, cancel, also=list(queued))
            status = c.status
            if status == CANCELED or cancel.is_set():
                self.interrupted(pr if status == CANCELED else None, list(queued), on_status)
                return True
            index, healthy = self._record_extras(c, queued, index, on_status)
            if status == st.INTERRUPTED:      # (the driver's own signal: cancel is set, handled above)
                self.interrupted(None, list(queued), on_status)
                return True
            if not healthy:
                reset = True              # the sequencer may be gone, halted or still busy: start it anew
            if not pending and not queued and more is not None:
                added = more()          # the design's next block, its kept servers among the instances' runs
                self.keeps |= plan.keeps(added)
                pending.extend(added)
                if not added:
                    break
        if not self.finish_sent and not cancel.is_set():
            self._enqueue([], reset=False, finish=True, cancel=cancel)
        return cancel.is_set()

    def _record_extras(self, c: Collected, queued: deque[PlannedRun], index: int,
                       on_status: Callable[[str], None] | None) -> tuple[int, bool]:
        """After the collect `c` of the run at `index`: its status reported, then the later runs that came finished in
        the same play recorded one by one, in queue order, as if each had had its own collect (a systematic stop after
        one of them leaves the rest missing). Returns the index of the last run recorded and whether the queue is
        still healthy."""
        r = self.ctx
        status, healthy = c.status, c.healthy
        extras = list(c.extras) if status != st.INTERRUPTED else []
        try:
            if on_status:
                on_status(status)
            while extras and healthy:
                extra = extras.pop(0)
                queued.popleft()          # (== extra: the extras lead the queue, in its order)
                index += 1
                r.progress.run_started(index, extra.run_id, extra.arm, extra.block)
                x_status, x_healthy = self.record_also(extra, c)
                healthy = healthy and x_healthy
                if on_status:
                    on_status(x_status)
        finally:
            for extra in extras:          # fetched but not recorded: the store says missing, so does the disk
                shutil.rmtree(r.exp_dir / extra.run_id, ignore_errors=True)
        return index, healthy

    def interrupted(self, current: PlannedRun | None, queued: list[PlannedRun],
                    on_status: Callable[[str], None] | None = None) -> None:
        """After SIGINT/SIGTERM: stop the node (stop.yml: the sequencer first, which stops its server and
        marks its run interrupted), then keep what the node finished: `current` (whose collect was cut
        short; its store row exists) and every queued run that has a done.json, in order, are fetched and
        recorded (ok, failed, or interrupted for the run the stop cut); the runs after them stay missing."""
        t_signal = (self.signal_time() if self.signal_time else None) or time.time()
        r = self.ctx
        r.progress.notice("interrupted: stopping the node's sequencer and server (stop role) ...")
        err = r.stop_servers()
        if err:
            r.progress.notice(f"WARNING: {err} Check the node with `python driver.py status`.")
        self.stopped = True
        calm = threading.Event()           # never set: these collects do not wait (timeout 0) and are short
        if current is not None:
            status = self.collect(current, calm, new_row=False, wait_s=0, after_stop=t_signal).status
            if on_status:
                on_status(status)
        for pr in queued:
            if read_tail(self.host, self.node_run_dir(pr.run_id) + "/done.json", lines=1) is None:
                break                      # never run, or cut before it wrote done.json: missing, resumed later
            status = self.collect(pr, calm, wait_s=0, after_stop=t_signal).status
            if on_status:
                on_status(status)


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()
    except OSError:
        return []
