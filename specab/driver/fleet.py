"""Fleets: independent replicate blocks on every host of gpu_nodes at once (`driver.py --fleet`).

Block b of the plan goes to host ``hosts[(b - 1) % n]`` (inventory order), so each host runs whole
blocks and hosts never mix within a block: every paired comparison (arm vs baseline of the same block)
is made on one host, and the statistics treat the host as a blocking factor (specab.analysis.measures.stats pairs within
(host, block) and reports the speedup per host). The parallelism is Ansible's: one ansible-runner run
per host with ``--limit <host>``, one thread per host, each thread taking its host's runs in plan order:
through that host's run queue (``specab/driver/queue_executor.py``: one sequencer per host) by default, or one
``arm.yml`` per run with ``--executor per-run``. There is no scheduler beyond that fixed assignment.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, TextIO

from specab.config.inventory import Host, Inventory
from specab.config.plan import PlannedRun
from specab.driver.context import RunContext
from specab.driver.options import EXIT_FAILED_RUNS, EXIT_INTERRUPTED, EXIT_OK, Options, Prepared, is_multinode
from specab.driver.progress import Progress
from specab.driver.signals import Interrupt
from specab.driver.systematic import STOPPED, FailFast, SystematicFailure
from specab.results import store as st

# (prepared, opts, exp_id, exp_dir, store, out, progress, limit=host) -> the context of one host's runs
MakeContext = Callable[..., RunContext]
# (context, signal_time) -> an executor with loop()/abort() (session.make_executor)
MakeExecutor = Callable[[RunContext, Callable[[], float | None]], Any]


class FleetError(Exception):
    """The fleet cannot run as asked (what, where, what to do)."""


def assign_blocks(runs: list[PlannedRun], hosts: list[str]) -> dict[str, list[PlannedRun]]:
    """The runs of each host: block b on hosts[(b - 1) % len(hosts)], in plan order."""
    if not hosts:
        raise FleetError("a fleet needs at least one host in group gpu_nodes")
    out: dict[str, list[PlannedRun]] = {h: [] for h in hosts}
    for pr in sorted(runs, key=lambda r: r.seq):
        out[hosts[(pr.block - 1) % len(hosts)]].append(pr)
    return out


class HostProgress:
    """The part of Progress one host's runs report to, each line prefixed with the host."""

    def __init__(self, base: Progress, host: str, counter: "RunCounter"):
        self.base = base
        self.host = host
        self.counter = counter
        self.run_id = ""
        self.started = 0.0
        self.state = base.state

    def run_started(self, index: int, run_id: str, arm: str, block: int) -> None:
        self.run_id, self.started = run_id, time.time()
        self.base.notice(f"[{self.host}] {run_id} (arm {arm}, block {block}) started")

    def phase(self, phase: str) -> None:
        self.base.notice(f"[{self.host}]     {phase}  (+{time.time() - self.started:.1f} s)")

    def log_line(self, line: str) -> None:
        pass

    def run_finished(self, status: str, duration: float, reason: str | None = None, gpus: int | None = None,
                     gpu_seconds: float | None = None) -> None:
        done, total = self.counter.add()
        extra = f": {reason.splitlines()[0][:200]}" if reason else ""
        self.base.notice(f"[{self.host}] {self.run_id} {status} in {duration:.1f} s{extra}  ({done}/{total} runs)")

    def notice(self, text: str) -> None:
        self.base.notice(f"[{self.host}] {text}")


class RunCounter:
    def __init__(self, done: int, total: int):
        self.done, self.total = done, total
        self._lock = threading.Lock()

    def add(self) -> tuple[int, int]:
        with self._lock:
            self.done += 1
            return self.done, self.total


@dataclass
class _Fleet:
    """One fleet experiment: what every host thread shares, and what they report to the main thread."""
    prepared: Prepared
    opts: Options
    exp_id: str
    exp_dir: Path
    out: TextIO
    progress: Progress
    counter: RunCounter
    make_context: MakeContext
    make_executor: MakeExecutor
    errors: list[BaseException] = field(default_factory=list)
    stops: list[SystematicFailure] = field(default_factory=list)
    stopped: set[str] = field(default_factory=set)     # hosts whose executor's own stop after the interrupt succeeded
    lock: threading.Lock = field(default_factory=threading.Lock)
    interrupt: Interrupt | None = None                  # the Interrupt of the main thread, once entered

    def signal_time(self) -> float | None:
        return self.interrupt.at if self.interrupt else None

    def host_loop(self, host: Host, runs: list[PlannedRun], cancel: threading.Event) -> None:
        name = host.name
        store = st.Store.open(self.exp_dir)       # one SQLite connection per thread (WAL)
        try:
            sub = replace(self.prepared, inventory=Inventory(path=self.prepared.inventory.path, hosts=[host]))
            ctx = self.make_context(sub, self.opts, self.exp_id, self.exp_dir, store, self.out,
                                    HostProgress(self.progress, name, self.counter), limit=name)
            fail_fast = FailFast.for_runs({pr.arm for pr in runs}, host=name)
            executor = self.make_executor(ctx, self.signal_time)
            if (executor.loop(runs, cancel, 0, on_status=lambda status: fail_fast.observe(store, status))
                    and not executor.stops_node_on_interrupt):
                # the per-run executor: this host's stop is its interrupted run's teardown, recorded in that run's
                # directory and row as on a single host (session.execute), while the other hosts stop theirs
                ctx.progress.notice("interrupted: stopping the server of the current run (stop role) ...")
                err = ctx.stop_servers(executor.interrupted)
                if err:
                    ctx.progress.notice(f"WARNING: {err} Check the node with `python driver.py status`.")
                else:
                    with self.lock:
                        self.stopped.add(name)
        except SystematicFailure as exc:  # every arm failed at start-up for one cause: every host stops
            with self.lock:
                self.stops.append(exc)
            cancel.set()
        except BaseException as exc:      # reported by the main thread
            with self.lock:
                self.errors.append(exc)
            cancel.set()
        finally:
            store.close()

    def finish(self, interrupted: bool) -> None:
        """The experiment's status; after an interrupt, the servers of every host but those whose own stop
        succeeded (a host thread that failed, the run queue's hosts, whose executor stops them, once more)."""
        hosts = self.prepared.inventory.hosts
        main_store = st.Store.open(self.exp_dir)
        try:
            if not interrupted:
                main_store.set_experiment_status("finished")
                return
            rest = [h.name for h in hosts if h.name not in self.stopped]
            if rest:
                which = "every host" if len(rest) == len(hosts) else ", ".join(rest)
                self.progress.notice(("stopped" if self.stops else "interrupted")
                                     + f": stopping the servers of {which} (stop role) ...")
                full = self.make_context(self.prepared, self.opts, self.exp_id, self.exp_dir, main_store, self.out,
                                         self.progress, limit=None if len(rest) == len(hosts) else ",".join(rest))
                err = full.stop_servers()
                if err:
                    self.progress.notice(f"WARNING: {err} Check the nodes with `python driver.py status`.")
            main_store.set_experiment_status(STOPPED if self.stops and self.signal_time() is None else "interrupted")
        finally:
            main_store.close()

    def exit_code(self, interrupted: bool) -> int:
        if self.errors:
            raise self.errors[0]
        resume = (f"python driver.py --resume {self.exp_id} --fleet"
                  + (f" --runs-dir {self.opts.runs_dir}" if self.opts.runs_dir else ""))
        if self.stops and self.signal_time() is None:
            with st.Store.open(self.exp_dir) as s:
                not_run = len(s.missing())
            print(self.stops[0].message(self.exp_id, not_run, resume), file=self.out)
            return EXIT_FAILED_RUNS
        if interrupted:
            print(f"\nInterrupted. Finished runs are kept in {self.exp_dir}.\nResume with: {resume}", file=self.out)
            return EXIT_INTERRUPTED
        return EXIT_OK


def run_fleet(prepared: Prepared, opts: Options, exp_id: str, exp_dir: Path, todo: list[PlannedRun], out: TextIO,
              progress: Progress, total: int, *, make_context: MakeContext, make_executor: MakeExecutor) -> int:
    """Run ``todo`` with every host taking its own blocks at once, each host through the executor
    ``make_executor`` gives its context. Returns the experiment exit code."""
    hosts: list[Host] = prepared.inventory.hosts
    if is_multinode(hosts):
        raise FleetError(f"{prepared.inventory.path}: --fleet runs independent servers per host, but the inventory "
                         f"sets specab_multinode (one server over all hosts). Use one or the other.")
    if opts.target_ci is not None:
        raise FleetError("--target-ci adds blocks one at a time after looking at the data; it is not supported "
                         "with --fleet. Give the number of blocks with --repeats.")
    assignment = assign_blocks(todo, [h.name for h in hosts])
    for h, runs in assignment.items():
        blocks = sorted({r.block for r in runs})
        progress.notice(f"fleet: {h} runs block(s) {', '.join(map(str, blocks)) or '-'} ({len(runs)} runs)")
    fleet = _Fleet(prepared, opts, exp_id, exp_dir, out, progress, RunCounter(total - len(todo), total),
                   make_context, make_executor)
    with Interrupt() as intr:
        fleet.interrupt = intr         # the host loops read the signal's time through signal_time()
        threads = [threading.Thread(target=fleet.host_loop, args=(h, assignment[h.name], intr.event),
                                    name=f"fleet-{h.name}", daemon=True)
                   for h in hosts if assignment[h.name]]
        for t in threads:
            t.start()
        try:
            for t in threads:
                while t.is_alive():
                    t.join(timeout=0.5)
        finally:
            interrupted = intr.event.is_set()
            fleet.finish(interrupted)
            progress.close()
    return fleet.exit_code(interrupted)
