"""The per-run executor: one ``playbooks/arm.yml`` (or ``multinode_arm.yml``) per run, phases from the
Ansible task events, the server log and bench.jsonl tailed live over the node connection."""
from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

from specab.config import plan
from specab.config.plan import PlannedRun
from specab.driver.context import InterruptedRun, MoreBlocks, RunContext
from specab.driver.playbook import Failure, PlaybookResult, runner_ident
from specab.driver.record import INTERRUPTED_REASON, PhaseClock, check_writable, node_run_dir
from specab.driver.remote import LogTail
from specab.results import store as st


class PerRunExecutor:
    """Runs each planned run through one playbook run; the node is stopped by the caller on interruption."""

    stops_node_on_interrupt = False

    def __init__(self, ctx: RunContext, signal_time: Callable[[], float | None] | None = None):
        self.ctx = ctx
        self.signal_time = signal_time            # when the user's SIGINT/SIGTERM came
        # the run the user interrupted after its server started: the caller's stop is its teardown
        self.interrupted: InterruptedRun | None = None
        self.keeps: set[int] = set()              # runs whose server is kept for their instance's next run

    def loop(self, todo: list[PlannedRun], cancel: threading.Event, index: int, *,
             more: MoreBlocks | None = None, on_status=None) -> bool:
        """Run ``todo`` in order (then what ``more`` adds). Returns True when interrupted."""
        queue = list(todo)
        self.keeps = plan.keeps(queue)
        while queue:
            if cancel.is_set():
                return True
            pr = queue.pop(0)
            index += 1
            self.ctx.progress.run_started(index, pr.run_id, pr.arm, pr.block)
            status = self.run_one(pr, cancel)
            if on_status is not None:
                on_status(status)
            if status == st.INTERRUPTED or cancel.is_set():
                return True
            if not queue and more is not None:
                queue += more()
                self.keeps |= plan.keeps(queue)
        return False

    def abort(self) -> None:
        """Nothing runs on the node between two playbooks: nothing to stop on an error."""

    def run_one(self, pr: PlannedRun, cancel: threading.Event) -> str:
        arm = self.ctx.arms[pr.arm]
        run_dir = (self.ctx.exp_dir / pr.run_id).resolve()
        check_writable(self.ctx.exp_dir)
        if run_dir.exists():       # an earlier, unfinished attempt (resume): start clean
            shutil.rmtree(run_dir)
        ident = runner_ident(pr.run_id)
        hosts = self.ctx.p.inventory.hosts
        self.ctx.store.start_run(seq=pr.seq, run_id=pr.run_id, arm=pr.arm, block=pr.block,
                             host=",".join(h.name for h in hosts), run_dir=str(run_dir), runner_ident=ident)
        clock = PhaseClock(self.ctx.progress)
        head = hosts[0]
        tails: list[LogTail] = []

        on_log, on_bench = self.ctx.tail_handlers(clock, pr=pr)
        warmups = int(self.ctx.bench_settings(pr)["warmup_requests"])

        def on_phase(phase: str, at: float | None = None) -> None:
            if phase == "benchmarking" and warmups > 0 and clock.current not in ("warming up", "benchmarking"):
                phase = "warming up"            # the client sends the warm-up requests first
            if phase == "loading" and clock.current in ("loading weights", "capturing graphs", "ready"):
                return
            # from the load on: the server_start role empties the run directory of an earlier attempt first
            if phase == "loading" and not tails:
                node_dir = node_run_dir(head, pr.run_id)
                tails.append(LogTail(head, node_dir + "/server.log", on_log).start())
                tails.append(LogTail(head, node_dir + "/bench.jsonl", on_bench).start())
            if phase == "benchmarking" and clock.current in ("warming up", "benchmarking"):
                return
            clock.enter(phase, at)

        extravars = {
            "specab_experiment": self.ctx.experiment_extravar(pr),     # its bench: the run's measured requests
            "specab_arm": arm.to_extravar(),
            "specab_experiment_id": self.ctx.exp_id,
            "specab_run_id": pr.run_id,
            "specab_run_dir": str(run_dir),
            "specab_stop_after": pr.seq not in self.keeps,
            "specab_score": self.ctx.score_spec(pr),       # a baseline run at temperature > 0: what it scores
        }
        if pr.instance is not None:         # one server per instance (docs/decisions/0011)
            extravars["specab_instance"] = {"id": str(pr.instance), "keep": pr.seq in self.keeps}
        started = time.time()
        try:
            result = self.ctx.runner.run(self.ctx.playbook, extravars, ident, cancel=cancel, on_phase=on_phase,
                                     secrets=self.ctx.secrets, timeout=self.ctx.opts.run_timeout_s, limit=self.ctx.limit)
        except Exception as exc:        # ansible-runner itself failed: record it, the experiment goes on
            result = PlaybookResult(status="error", rc=None, ident=ident, artifact_dir=self.ctx.exp_dir / ".runner",
                                    failures=[Failure(phase=clock.current, task="ansible-runner", host=None,
                                                      message=f"{type(exc).__name__}: {exc}")])
        finally:
            for t in tails:
                t.stop()
        clock.close()
        for phase, t0, t1 in clock.times:
            self.ctx.store.record_phase(pr.seq, phase, t0, t1)
        return self._finish(pr, result, run_dir, clock, started, cancel.is_set())

    def _finish(self, pr: PlannedRun, result: PlaybookResult, run_dir: Path, clock: PhaseClock,
                started: float, canceled: bool) -> str:
        if canceled:
            # the phase the run was in when the user interrupted it (the playbook is stopped after that)
            t_signal = self.signal_time() if self.signal_time else None
            phase = clock.phase_at(t_signal) if t_signal is not None else clock.current
            outcome = (st.INTERRUPTED, phase, INTERRUPTED_REASON)
        elif result.ok:
            outcome = (st.OK, None, None)
        else:
            f = result.failures[0] if result.failures else None
            reason = f.reason if f else f"ansible-runner status {result.status} rc {result.rc}"
            if f and f.host and len(self.ctx.result_hosts) > 1:
                reason = f"[{f.host}] {reason}"
            # the phase of the failed task's role (a run step's, as the run queue records it)
            phase = (f.phase or clock.phase_at(f.time)) if f else clock.current
            outcome = (st.FAILED, phase, reason)
        status = self.ctx.record_finish(pr, result, run_dir, started, outcome=outcome, load_phases=clock.load_phases())
        # an interrupted run whose playbook was stopped after its server's start (the load follows the start: its
        # node run directory is this attempt's) is torn down by the caller's stop; one kept ok (its benchmark had
        # finished) has no failure
        if canceled and not result.ok and any(name == "loading" for name, _, _ in clock.times):
            self.interrupted = InterruptedRun(pr=pr, run_dir=run_dir,
                                              phase=outcome[1] if status == st.INTERRUPTED else None)
        return status
