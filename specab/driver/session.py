"""Run an experiment: validate everything, plan, run each planned run through `playbooks/arm.yml`,
store results as they arrive, survive failures and interruptions, resume.

Nothing here touches a node before `prepare()` has validated the experiment file, the inventory,
the matrix and every arm against SGLang's rules, and checked that the run directory is writable.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable
from typing import Any, Literal, TextIO

from specab.driver import preflight
from specab.results import store as st
from specab.config.spec import (REPO_ROOT, Arm, ConfigError, Experiment, Host, Inventory, is_secret_name,
                           load_experiment, load_inventory, redact_env)
from specab.config.matrix import build_arms, parse_matrix
from specab.config.plan import Order, PlannedRun, make_plan
from specab.driver.progress import Progress
from specab.driver.remote import LogTail, load_phase, open_node, read_tail
from specab.driver.playbook import Failure, PlaybookResult, PlaybookRunner

ARM_PLAYBOOK = "playbooks/arm.yml"
MULTINODE_PLAYBOOK = "playbooks/multinode_arm.yml"   # one server over every host (docs/scale.md)
STOP_PLAYBOOK = "playbooks/stop.yml"
MIN_FREE_MB = 50
EXIT_OK, EXIT_FAILED_RUNS, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


Executor = Literal["auto", "queue", "per-run"]


class ExperimentError(Exception):
    """The experiment cannot start or continue (what, where, what to do)."""


@dataclass
class Options:
    experiment_file: str | None = None
    inventory_file: str | None = None
    matrix: list[str] = field(default_factory=list)
    repeats: int = 3
    seed: int = 1
    order: Order = "interleaved"
    runs_dir: str | None = None
    verbose: bool = False
    skip_invalid: bool = False
    target_ci: float | None = None          # relative half-width, e.g. 0.02
    max_repeats: int | None = None
    retry_failed: bool = False
    run_timeout_s: int | None = None
    argv: list[str] = field(default_factory=list)
    fleet: bool = False                     # independent blocks per host at once (specab/driver/fleet.py)
    executor: Executor = "auto"             # auto: the run queue on one host, per-run otherwise


@dataclass
class Prepared:
    experiment: Experiment
    inventory: Inventory
    arms: list[Arm]
    notices: list[str]
    plan: list[PlannedRun]


def default_runs_dir() -> Path:
    return REPO_ROOT / "runs"


def prepare(opts: Options) -> Prepared:
    """Validate the experiment, inventory and matrix and make the plan. Touches nothing."""
    exp = load_experiment(opts.experiment_file)
    inv = load_inventory(opts.inventory_file)
    armset = build_arms(exp, parse_matrix(opts.matrix), skip_invalid=opts.skip_invalid)
    if opts.repeats < 1:
        raise ConfigError(f"--repeats must be at least 1, got {opts.repeats}.")
    if opts.target_ci is not None and opts.order == "blocked":
        raise ConfigError("--target-ci adds interleaved blocks; it cannot be combined with --order blocked.")
    check_executor(opts.executor, inv, opts.fleet)
    plan = make_plan([a.name for a in armset.arms], opts.repeats, opts.seed, opts.order)
    return Prepared(experiment=exp, inventory=inv, arms=armset.arms,
                    notices=exp.warnings + armset.notices + preflight.bind_warnings(armset.arms), plan=plan)


def check_writable(directory: Path, min_free_mb: int = MIN_FREE_MB) -> None:
    """Refuse an unwritable or full run directory before a run starts (issue 6, item 11)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".write-test-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise ExperimentError(f"{directory}: the run directory is not writable ({exc.strerror}). Fix its "
                              f"permissions or pass --runs-dir to another directory.") from None
    free_mb = shutil.disk_usage(directory).free / 1e6
    if free_mb < min_free_mb:
        raise ExperimentError(f"{directory}: only {free_mb:.0f} MB free on its disk (need at least {min_free_mb} MB "
                              f"for a run's logs and records). Free some space or pass --runs-dir.")


def _git_sha() -> str | None:
    try:
        p = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                           timeout=5)
        return p.stdout.strip() or None if p.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def _new_experiment_dir(runs_dir: Path, name: str) -> tuple[str, Path]:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    exp_id = f"{name}-{stamp}"
    i = 2
    while (runs_dir / exp_id).exists():
        exp_id = f"{name}-{stamp}-{i}"
        i += 1
    path = runs_dir / exp_id
    path.mkdir(parents=True)
    return exp_id, path


def _secrets_of(prepared: Prepared) -> list[str]:
    vals: list[str] = []
    for arm in prepared.arms:
        vals += [str(v) for k, v in arm.env.items() if is_secret_name(k) and v is not None]
        vals += [str(v) for k, v in arm.server_args.items() if is_secret_name(k) and v is not None]
    for h in prepared.inventory.hosts:
        vals += [str(v) for k, v in h.node_env.items() if is_secret_name(k)]
    return vals


def _redacted_config(exp: Experiment) -> dict[str, Any]:
    cfg = exp.as_extravar()
    cfg["env"] = redact_env(cfg.get("env") or {})
    for arm in cfg.get("arms") or []:
        if isinstance(arm.get("env"), dict):
            arm["env"] = redact_env(arm["env"])
    return cfg


class _Interrupt:
    """SIGINT/SIGTERM -> a cancel event (first signal); handlers restored on exit."""

    def __init__(self, progress: Progress):
        self.event = threading.Event()
        self.signum: int | None = None
        self.at: float | None = None        # time of the first signal
        self.progress = progress
        self._old: dict[int, Any] = {}

    def __enter__(self) -> "_Interrupt":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if not self.event.is_set():
            self.signum = signum
            self.at = time.time()
            self.event.set()
            return
        # later signals: keep going, the server must still be stopped (no locks taken in a handler)
        os.write(2, b"\nspecab: still stopping the server of the current run; finished runs are safe.\n")

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def is_multinode(hosts: list[Host]) -> bool:
    """Whether the inventory places ONE server over all its hosts (specab_multinode: true)."""
    return any(bool(h.vars.get("specab_multinode")) for h in hosts)


def choose_executor(asked: str, multinode: bool, n_hosts: int) -> str:
    """`queue` (the node's sequencer runs the runs back to back, docs/architecture.md "Run queue") for one
    host; `per-run` (one arm.yml per run) for a multi-node server or several hosts running each run."""
    if asked == "per-run" or multinode or n_hosts != 1:
        return "per-run"
    return "queue"


def check_executor(asked: str, inventory: Inventory, fleet: bool) -> None:
    """Refuse `--executor queue` where it cannot apply (before anything runs)."""
    if asked != "queue" or (fleet and not is_multinode(inventory.hosts)):
        return
    n = len(inventory.hosts)
    if is_multinode(inventory.hosts) or n != 1:
        what = "places one server over several hosts" if is_multinode(inventory.hosts) else f"runs every run on {n} hosts"
        raise ConfigError(f"{inventory.path}: --executor queue runs the runs of one host, but this inventory {what}. "
                          f"Use --executor per-run (the default here), or --fleet for one queue per host.")


class ExperimentRun:
    """One experiment's execution loop (new or resumed)."""

    def __init__(self, prepared: Prepared, opts: Options, exp_id: str, exp_dir: Path, store: st.Store,
                 out: TextIO, progress: Progress, limit: str | None = None):
        self.p = prepared
        self.limit = limit          # ansible --limit: the fleet runs one host's blocks per ExperimentRun
        multinode = is_multinode(prepared.inventory.hosts)
        if multinode and len(prepared.inventory.hosts) < 2:
            raise ExperimentError(f"{prepared.inventory.path}: specab_multinode is set but group gpu_nodes has "
                                  f"one host; a multi-node server needs at least two (docs/scale.md).")
        self.playbook = MULTINODE_PLAYBOOK if multinode else ARM_PLAYBOOK
        self.executor = choose_executor(opts.executor, multinode, len(prepared.inventory.hosts))
        # hosts whose results the run has: the head alone for a multi-node server (rank 0 serves and is
        # benchmarked; the other ranks' files are kept under <run dir>/node<r>-<host>/)
        self.result_hosts = prepared.inventory.hosts[:1] if multinode else prepared.inventory.hosts
        self.opts = opts
        self.exp_id = exp_id
        self.exp_dir = exp_dir
        self.store = store
        self.out = out
        self.progress = progress
        self.arms = {a.name: a for a in prepared.arms}
        self.runner = PlaybookRunner(REPO_ROOT, prepared.inventory.path, exp_dir / ".runner",
                                     verbose=opts.verbose, stream=lambda s: progress.notice(s))
        self.secrets = _secrets_of(prepared)

    # ------------------------------------------------------------------ one run
    def _node_run_dir(self, host: Host, run_id: str) -> str:
        return host.node_dir.rstrip("/") + f"/runs/{run_id}"

    def run_one(self, pr: PlannedRun, cancel: threading.Event) -> str:
        arm = self.arms[pr.arm]
        run_dir = (self.exp_dir / pr.run_id).resolve()
        check_writable(self.exp_dir)
        if run_dir.exists():       # an earlier, unfinished attempt (resume): start clean
            shutil.rmtree(run_dir)
        ident = f"{pr.run_id}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{int(time.time() * 1000) % 100000}"
        hosts = self.p.inventory.hosts
        self.store.start_run(seq=pr.seq, run_id=pr.run_id, arm=pr.arm, block=pr.block,
                             host=",".join(h.name for h in hosts), run_dir=str(run_dir), runner_ident=ident)
        clock = _PhaseClock(self.progress)
        head = hosts[0]
        tails: list[LogTail] = []

        on_log, on_bench = self.tail_handlers(clock)
        warmups = int(self.p.experiment.bench.get("warmup_requests") or 0)

        def on_phase(phase: str) -> None:
            if phase == "starting" and clock.current in (None, "preparing"):
                phase = "preparing"             # arm.yml checks its variables before the first stop
            if phase == "benchmarking" and warmups > 0 and clock.current not in ("warming up", "benchmarking"):
                phase = "warming up"            # the client sends the warm-up requests first
            if phase == "loading":
                if clock.current in ("loading weights", "capturing graphs", "ready"):
                    return
                phase = "loading"
            if phase in ("starting", "loading") and not tails:
                node_dir = self._node_run_dir(head, pr.run_id)
                tails.append(LogTail(head, node_dir + "/server.log", on_log).start())
                tails.append(LogTail(head, node_dir + "/bench.jsonl", on_bench).start())
            if phase == "benchmarking" and clock.current in ("warming up", "benchmarking"):
                return
            clock.enter(phase)

        extravars = {
            "specab_experiment": self.p.experiment.as_extravar(),
            "specab_arm": arm.to_extravar(),
            "specab_experiment_id": self.exp_id,
            "specab_run_id": pr.run_id,
            "specab_run_dir": str(run_dir),
            "specab_stop_after": True,
        }
        started = time.time()
        try:
            result = self.runner.run(self.playbook, extravars, ident, cancel=cancel, on_phase=on_phase,
                                     secrets=self.secrets, timeout=self.opts.run_timeout_s, limit=self.limit)
        except Exception as exc:        # ansible-runner itself failed: record it, the experiment goes on
            result = PlaybookResult(status="error", rc=None, ident=ident, artifact_dir=self.exp_dir / ".runner",
                                    failures=[Failure(phase=clock.current, task="ansible-runner", host=None,
                                                      message=f"{type(exc).__name__}: {exc}")])
        finally:
            for t in tails:
                t.stop()
        clock.close()
        for phase, t0, t1 in clock.times:
            self.store.record_phase(pr.seq, phase, t0, t1)
        return self._finish(pr, result, run_dir, clock, started, cancel.is_set())

    def tail_handlers(self, clock: "_PhaseClock", enter_phases: bool = True
                      ) -> tuple[Callable[[str], None], Callable[[str], None]]:
        """Callbacks for the live tails of server.log (load phases) and bench.jsonl (request lines).
        `enter_phases=False`: the phases come from elsewhere (the sequencer's phases.jsonl)."""
        bench_state = {"warm": 0, "measured": 0}
        warmups = int(self.p.experiment.bench.get("warmup_requests") or 0)

        load_order = ("loading", "loading weights", "capturing graphs", "ready")

        def on_log(line: str) -> None:
            self.progress.log_line(line)
            ph = load_phase(line)
            if ph not in ("loading weights", "capturing graphs", "ready"):
                return
            if not enter_phases:
                # the node's phases lead; the log only refines a load in progress, forward only (with TP > 1
                # the ranks' lines interleave)
                cur = clock.current
                if cur not in load_order or load_order.index(ph) <= load_order.index(cur):
                    return
            clock.enter(ph)

        def on_bench(line: str) -> None:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                return
            if rec.get("warmup"):
                bench_state["warm"] += 1
                if bench_state["warm"] >= warmups and enter_phases:
                    clock.enter("benchmarking")     # the measured requests start now
            else:
                bench_state["measured"] += 1
                if enter_phases:
                    clock.enter("benchmarking")
                n = self.p.experiment.bench.get("num_requests")
                self.progress.log_line(f"request {bench_state['measured']}" + (f" of {n}" if n else "")
                                       + f": {rec.get('decode_tok_s') or 0:.1f} tok/s")
        return on_log, on_bench

    def _finish(self, pr: PlannedRun, result: PlaybookResult, run_dir: Path, clock: "_PhaseClock",
                started: float, canceled: bool) -> str:
        if canceled:
            outcome = (st.INTERRUPTED, clock.current, "interrupted by the user (SIGINT/SIGTERM)")
        elif result.ok:
            outcome = (st.OK, None, None)
        else:
            f = result.failures[0] if result.failures else None
            reason = (f"{f.task}: {f.message}" if f else f"ansible-runner status {result.status} rc {result.rc}")
            if f and f.host and len(self.result_hosts) > 1:
                reason = f"[{f.host}] {reason}"
            phase = clock.phase_at(f.time) if f else clock.current
            if f and f.phase and f.phase != "loading" and phase not in (f.phase,):
                phase = f.phase
            outcome = (st.FAILED, phase, reason)
        return self.record_finish(pr, result, run_dir, started, outcome=outcome, load_phases=clock.load_phases())

    def record_finish(self, pr: PlannedRun, result: PlaybookResult, run_dir: Path, started: float, *,
                      outcome: tuple[str, str | None, str | None], load_phases: dict[str, float] | None,
                      fetch_missing: bool = True) -> str:
        """Ingest the collected run directory and record the run's outcome (status, failed phase, reason)."""
        hosts = self.result_hosts
        if not result.ok and fetch_missing:
            # keep what the node produced (partial bench records, server log) when collect did not run
            for h in hosts:
                dest = run_dir if len(hosts) == 1 else run_dir / h.name
                _fetch_missing(h, self._node_run_dir(h, pr.run_id), dest)
        ingested = ingest_run_dir(self.store, pr.seq, run_dir, [h.name for h in hosts])
        planned = int(self.p.experiment.bench.get("num_requests") or 0)
        # partial: fewer answered measured requests than planned (a crash cuts the file short, or leaves
        # records of requests that failed after it)
        partial = planned > 0 and ingested["measured_ok"] < planned * len(hosts)
        log_tail = None
        for h in hosts:
            local = (run_dir if len(hosts) == 1 else run_dir / h.name) / "server.log"
            if local.exists():
                tail = _tail_file(local)
            else:
                remote = read_tail(h, self._node_run_dir(h, pr.run_id) + "/server.log", lines=2000)
                tail = log_excerpt(remote) if remote else None
            if tail:
                log_tail = tail if len(hosts) == 1 else (log_tail or "") + f"== {h.name} ==\n{tail}\n"
        status, phase, reason = outcome
        if status == st.FAILED and log_tail is None:
            log_tail = result.stdout_tail
        self.store.finish_run(pr.seq, status=status, runner_status=result.status, runner_rc=result.rc,
                              failure_phase=phase if status != st.OK else None, failure_reason=reason,
                              log_tail=log_tail if status != st.OK else None, partial=partial,
                              summary=ingested.get("summary"), timings=ingested.get("timings"),
                              load_phases=load_phases or ingested.get("ready"),
                              server_info=ingested.get("server_info"), stop=ingested.get("stop"),
                              gpu_free=ingested.get("gpu_free"))
        self.progress.run_finished(status, time.time() - started, reason)
        return status

    # ------------------------------------------------------------------ interruption
    def stop_servers(self) -> str | None:
        """Stop our server on every node through the stop role; returns an error text or None."""
        playbook = STOP_PLAYBOOK if (REPO_ROOT / STOP_PLAYBOOK).exists() else None
        if playbook is None:
            return f"{STOP_PLAYBOOK} is missing: the server could not be stopped through the stop role."
        ident = f"stop-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{int(time.time() * 1000) % 100000}"
        res = self.runner.run(playbook, {"specab_experiment": self.p.experiment.as_extravar()}, ident,
                              secrets=self.secrets, limit=self.limit)
        if not res.ok:
            f = res.failures[0] if res.failures else None
            return f"stopping failed: {f.message if f else res.status}"
        return None

    # ------------------------------------------------------------------ the loop
    def execute(self, todo: list[PlannedRun]) -> int:
        total = len(self.store.plan())
        done_before = total - len(todo)
        self.progress.start(self.exp_id, total, done=done_before)
        interrupted = False
        with _Interrupt(self.progress) as intr:
            try:
                if self.executor == "queue":
                    from specab.driver.queue_executor import QueueExecutor
                    more = self._more_blocks_counted if self.opts.target_ci is not None else None
                    try:
                        interrupted = QueueExecutor(self, signal_time=lambda: intr.at).loop(
                            list(todo), intr.event, done_before, more=more)
                    except BaseException:
                        # the sequencer would go on with the queued runs: stop it and the server first
                        self.progress.notice("stopping the node's sequencer and server (stop role) ...")
                        self.stop_servers()
                        self.store.set_experiment_status("interrupted")
                        raise
                    todo = []
                queue = list(todo)
                index = done_before
                while queue:
                    pr = queue.pop(0)
                    index += 1
                    self.progress.run_started(index, pr.run_id, pr.arm, pr.block)
                    try:
                        status = self.run_one(pr, intr.event)
                    except ExperimentError:
                        self.store.set_experiment_status("interrupted")
                        raise
                    if status == st.INTERRUPTED or intr.event.is_set():
                        interrupted = True
                        break
                    if not queue:
                        queue += self._more_blocks()
                        total = len(self.store.plan())
                        self.progress.state.total = total
            finally:
                if interrupted and self.executor != "queue":   # the queue executor stopped the node itself
                    self.progress.notice("interrupted: stopping the server of the current run (stop role) ...")
                    err = self.stop_servers()
                    if err:
                        self.progress.notice(f"WARNING: {err} Check the node with `python driver.py status`.")
                if interrupted:
                    self.store.set_experiment_status("interrupted")
                self.progress.close()
        if interrupted:
            print(f"\nInterrupted. Finished runs are kept in {self.exp_dir}.\n"
                  f"Resume with: python driver.py --resume {self.exp_id}"
                  + (f" --runs-dir {self.opts.runs_dir}" if self.opts.runs_dir else ""), file=self.out)
            return EXIT_INTERRUPTED
        self.store.set_experiment_status("finished")
        return EXIT_OK

    def _more_blocks_counted(self) -> list[PlannedRun]:
        """`_more_blocks`, keeping the progress display's total up to date."""
        new = self._more_blocks()
        if new:
            self.progress.state.total = len(self.store.plan())
        return new

    def _more_blocks(self) -> list[PlannedRun]:
        """Sequential stopping hook: after the planned blocks, ask specab.analysis.stats whether to add one."""
        if self.opts.target_ci is None:
            return []
        exp_row = self.store.experiment()
        blocks = exp_row["repeats"]
        limit = self.opts.max_repeats or blocks
        if blocks >= limit:
            self.progress.notice(f"--target-ci: stopping at --max-repeats {limit} blocks.")
            return []
        more, reason = decide_more_blocks(self.store, self.opts.target_ci, limit)
        self.progress.notice(f"--target-ci {self.opts.target_ci:.1%}: {reason}")
        if not more:
            return []
        last_seq = max(r["seq"] for r in self.store.plan())
        new = make_plan(list(self.arms), 1, exp_row["seed"], exp_row["order_mode"], first_block=blocks + 1,
                        first_seq=last_seq + 1)
        self.store.write_plan([r.to_json() for r in new], repeats=blocks + 1)
        return new


class _PhaseClock:
    """Phase timings of one run (driver side), fed by Ansible task events and the log tail."""

    def __init__(self, progress: Progress):
        self.progress = progress
        self.times: list[tuple[str, float, float | None]] = []
        self.current: str | None = None
        self._lock = threading.Lock()

    def enter(self, phase: str) -> None:
        with self._lock:
            if phase == self.current:
                return
            now = time.time()
            if self.times and self.times[-1][2] is None:
                self.times[-1] = (self.times[-1][0], self.times[-1][1], now)
            names = [t[0] for t in self.times]
            name = phase
            if phase in names:
                name = "final stop" if phase == "stopping" else ("waiting for GPUs after stop"
                                                                 if phase == "waiting for GPUs" else phase)
                if name in names:
                    name = f"{phase} ({names.count(phase) + 1})"
            self.current = phase
            self.times.append((name, now, None))
        self.progress.phase(phase)

    def close(self) -> None:
        with self._lock:
            if self.times and self.times[-1][2] is None:
                self.times[-1] = (self.times[-1][0], self.times[-1][1], time.time())

    def phase_at(self, t: float) -> str | None:
        """The phase (display name) that was current at time `t`."""
        with self._lock:
            for name, t0, t1 in reversed(self.times):
                if t0 <= t:
                    return re.sub(r" \(\d+\)$", "", name)
        return self.current

    def load_phases(self) -> dict[str, float]:
        """Seconds from the start of `starting` to each load phase reached."""
        start = next((t0 for name, t0, _ in self.times if name == "starting"), None)
        if start is None:
            return {}
        out = {}
        for name, t0, _ in self.times:
            if name in ("loading weights", "capturing graphs", "ready"):
                out[name.replace(" ", "_") + "_s"] = round(t0 - start, 3)
        return out


FATAL = re.compile(r"Traceback \(most recent call last\)|Error:|out of memory|unrecognized arguments|"
                   r"Address already in use|Killed|Segmentation fault", re.IGNORECASE)


def log_excerpt(text: str, lines: int = 40, context: int = 6) -> str:
    """The last `lines` lines, preceded by the first fatal line (and a few after it) when that came
    earlier: with TP>1 the other ranks keep logging after rank 0 failed, burying the cause."""
    all_lines = text.splitlines()
    tail = all_lines[-lines:]
    head_end = len(all_lines) - len(tail)
    for i, line in enumerate(all_lines[:head_end]):
        if FATAL.search(line):
            first = all_lines[i:min(i + context, head_end)]
            gap = "[...]" if i + context < head_end else None
            return "\n".join(first + ([gap] if gap else []) + tail)
    return "\n".join(tail)


def _tail_file(path: Path, lines: int = 40) -> str:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 256 * 1024))
        return log_excerpt(f.read().decode(errors="replace"), lines)


def _fetch_missing(host: Host, node_run_dir: str, dest: Path) -> None:
    """Copy the node's run files that the controller run dir lacks (after a failed run; read-only)."""
    try:
        node = open_node(host)
    except Exception:
        return
    try:
        rc, out, _ = node.sh(f"cd {_q(node_run_dir)} 2>/dev/null && ls -1A")
        if rc != 0:
            return
        dest.mkdir(parents=True, exist_ok=True)
        for name in out.split():
            if "/" in name or (dest / name).exists():
                continue
            data = node.read_from(f"{node_run_dir}/{name}", 0, max_bytes=64 << 20)
            if data is not None:
                (dest / name).write_bytes(data)
                if name.endswith(".env"):
                    os.chmod(dest / name, 0o600)
    except Exception:
        return
    finally:
        node.close()


def _q(path: str) -> str:
    from specab.driver.remote import _shell_path
    return _shell_path(path)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None


RANK_DIR = re.compile(r"node(\d+)-(.+)")


def rank_dirs(run_dir: Path) -> list[tuple[str, Path]]:
    """(host, directory) of a multi-node run's other ranks, by rank: rank r's files are collected into
    <run dir>/node<r>-<host>/ (playbooks/tasks/multinode_run_arm.yml)."""
    found = []
    if run_dir.is_dir():
        for d in run_dir.iterdir():
            m = RANK_DIR.fullmatch(d.name)
            if m and d.is_dir() and int(m.group(1)) > 0:
                found.append((int(m.group(1)), m.group(2), d))
    return [(host, d) for _, host, d in sorted(found)]


def ingest_run_dir(store: st.Store, seq: int, run_dir: Path, hosts: list[str]) -> dict[str, Any]:
    """Read a collected run directory into the store (immediately after the run). A multi-node run's
    other ranks (their manifest, env check, GPU samples and small files) are stored under their hosts."""
    out: dict[str, Any] = {"measured": 0, "measured_ok": 0}
    dirs = [(hosts[0], run_dir), *rank_dirs(run_dir)] if len(hosts) == 1 else [(h, run_dir / h) for h in hosts]
    for host, d in dirs:
        if not d.is_dir():
            continue
        bench = d / "bench.jsonl"
        if bench.exists():
            records = []
            for line in bench.read_text(errors="replace").splitlines():
                line = line.strip()
                if not line:
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue       # a line cut by a crash
                if isinstance(rec, dict):
                    records.append(rec)
            store.add_requests(seq, host, records)
            out["measured"] += sum(1 for r in records if not r.get("warmup"))
            out["measured_ok"] += sum(1 for r in records if not r.get("warmup") and r.get("ok"))
        samples = d / "gpu_samples.csv"
        if samples.exists():
            store.add_gpu_samples(seq, host, samples.read_text(errors="replace"))
        manifest = _read_json(d / "manifest.json")
        if isinstance(manifest, dict):
            store.add_manifest(seq, host, manifest)
        env_check = _read_json(d / "env_check.json")
        if isinstance(env_check, dict):
            store.add_env_check(seq, host, env_check)
        for key, name in (("summary", "bench_summary.json"), ("timings", "timings.json"),
                          ("server_info", "server_info.json"), ("stop", "stop.json"),
                          ("gpu_free", "gpu_free.json"), ("ready", "ready.json")):
            val = _read_json(d / name)
            if val is not None and key not in out:
                out[key] = val
        for f in sorted(d.iterdir()):
            # queue_entry.json (0600) holds the node env the client runs with, which may carry a secret
            if f.is_file() and f.suffix in (".json", ".csv") and f.name not in ("manifest.json", "queue_entry.json") \
                    and f.stat().st_size <= 256 * 1024 and f.name != "gpu_samples.csv":
                store.add_file(seq, host, f.name, f.read_text(errors="replace"))
    return out


def decide_more_blocks(store: st.Store, target_ci: float, max_repeats: int) -> tuple[bool, str]:
    """Ask specab.analysis.stats (analysis helper) whether another block is needed."""
    try:
        from specab.analysis import model as analysis
        from specab.analysis import stats
    except ImportError:
        return False, "specab.analysis.stats is not available; no blocks added."
    loader = getattr(analysis, "load_store", None) or getattr(analysis, "load_experiment_store", None)
    if loader is None or not hasattr(stats, "decide_more_blocks"):
        return False, "specab.analysis.stats cannot read the store yet; no blocks added."
    exp = loader(store.path)
    more, reason = stats.decide_more_blocks(exp, target_ci, max_repeats)
    return bool(more), str(reason)


# --------------------------------------------------------------------------- entry points

def start(opts: Options, out: TextIO, progress: Progress | None = None) -> tuple[int, Path | None]:
    """Run a new experiment. Returns (exit code, experiment dir)."""
    prepared = prepare(opts)
    for n in prepared.notices:
        print(f"notice: {n}", file=out)
    runs_dir = Path(opts.runs_dir) if opts.runs_dir else default_runs_dir()
    check_writable(runs_dir)
    # the node's engine lists its flags (read-only, cached per node and engine version): an unknown flag is
    # refused now rather than after a model load of minutes (issue 6, item 14)
    preflight.check_engine_flags(prepared.arms, prepared.inventory.hosts,
                                 notice=lambda n: print(f"notice: {n}", file=out))
    exp_id, exp_dir = _new_experiment_dir(runs_dir, prepared.experiment.name)
    store = st.Store.create(exp_dir / st.FILENAME)
    try:
        store.write_experiment(id=exp_id, name=prepared.experiment.name, seed=opts.seed, repeats=opts.repeats,
                               order_mode=opts.order, experiment_file=str(prepared.experiment.path),
                               inventory_file=str(prepared.inventory.path),
                               config=_redacted_config(prepared.experiment), matrix=list(opts.matrix),
                               argv=list(opts.argv), hosts=[h.name for h in prepared.inventory.hosts],
                               specab_version=_version(), git_sha=_git_sha())
        store.write_arms([a.to_json() for a in prepared.arms])
        store.write_plan([r.to_json() for r in prepared.plan], repeats=opts.repeats)
        if opts.fleet:     # every host of gpu_nodes runs its own blocks at once (docs/scale.md)
            from specab.driver.fleet import run_fleet
            code = run_fleet(prepared, opts, exp_id, exp_dir, list(prepared.plan), out, progress or Progress(),
                             total=len(prepared.plan))
        else:
            run = ExperimentRun(prepared, opts, exp_id, exp_dir, store, out, progress or Progress())
            code = run.execute(list(prepared.plan))
        return _conclude(code, store, exp_dir, out), exp_dir
    finally:
        store.close()


def resume(exp_ref: str, opts: Options, out: TextIO, progress: Progress | None = None) -> tuple[int, Path]:
    """Run the missing runs of an experiment, in the planned order."""
    exp_dir = locate(exp_ref, opts.runs_dir)
    store = st.Store.open(exp_dir)
    try:
        row = store.experiment()
        ropts = Options(experiment_file=opts.experiment_file or row["experiment_file"],
                        inventory_file=opts.inventory_file or row["inventory_file"], matrix=list(row["matrix"]),
                        repeats=row["repeats"], seed=row["seed"], order=row["order_mode"],
                        runs_dir=opts.runs_dir, verbose=opts.verbose, skip_invalid=True,
                        target_ci=opts.target_ci, max_repeats=opts.max_repeats, retry_failed=opts.retry_failed,
                        run_timeout_s=opts.run_timeout_s, argv=opts.argv,
                        fleet=opts.fleet or "--fleet" in (row.get("argv") or []), executor=opts.executor)
        prepared = prepare(ropts)
        stored = {a["name"]: a for a in store.arms()}
        for arm in prepared.arms:
            s = stored.get(arm.name)
            now = arm.to_json()
            if s is None or s["server_args"] != now["server_args"] or s["env"] != now["env"]:
                raise ExperimentError(f"arm {arm.name}: the experiment file {ropts.experiment_file} no longer "
                                      f"resolves to the arm recorded in {store.path}; resuming would mix two "
                                      f"experiments. Restore the file or start a new experiment.")
        todo_rows = store.missing()
        if opts.retry_failed:
            todo_rows = store._rows("SELECT p.* FROM plan p LEFT JOIN runs r ON r.seq = p.seq"
                                    " WHERE r.status IS NULL OR r.status != ? ORDER BY p.seq", (st.OK,))
        todo = [PlannedRun(seq=r["seq"], block=r["block"], arm=r["arm"], position=r["position"]) for r in todo_rows]
        print(f"resuming {row['id']}: {len(todo)} of {len(store.plan())} runs to do", file=out)
        if not todo:
            return _conclude(EXIT_OK, store, exp_dir, out), exp_dir
        prepared = Prepared(prepared.experiment, prepared.inventory, prepared.arms, prepared.notices,
                            [r for r in prepared.plan])
        with store._tx() as c:
            c.execute("UPDATE experiment SET status='running'")
        if ropts.fleet:
            from specab.driver.fleet import run_fleet
            code = run_fleet(prepared, ropts, row["id"], exp_dir, todo, out, progress or Progress(),
                             total=len(store.plan()))
        else:
            run = ExperimentRun(prepared, ropts, row["id"], exp_dir, store, out, progress or Progress())
            code = run.execute(todo)
        return _conclude(code, store, exp_dir, out), exp_dir
    finally:
        store.close()


def locate(exp_ref: str, runs_dir: str | None) -> Path:
    """An experiment directory from an id (under the runs dir) or a path."""
    p = Path(exp_ref)
    if p.is_file() and p.name == st.FILENAME:
        return p.parent
    if (p / st.FILENAME).exists():
        return p
    base = Path(runs_dir) if runs_dir else default_runs_dir()
    if (base / exp_ref / st.FILENAME).exists():
        return base / exp_ref
    raise ExperimentError(f"experiment {exp_ref!r} not found: no {st.FILENAME} in {p} or {base / exp_ref}. "
                          f"Give the experiment id (a directory under {base}) or its path.")


def _version() -> str | None:
    try:
        from importlib.metadata import version
        return version("specab")
    except Exception:
        return None


def _conclude(code: int, store: st.Store, exp_dir: Path, out: TextIO) -> int:
    from specab.driver.progress import print_summary
    failed = print_summary(store, out)
    print(f"\nexperiment directory: {exp_dir}", file=out)
    if code == EXIT_OK:
        try:
            from specab.analysis import report# analysis helper's module, if present
        except ImportError:
            report = None
        if report is not None and hasattr(report, "write_report"):
            try:
                paths = report.write_report(exp_dir)
                print(f"report: {paths.get('markdown')} and {paths.get('html')}", file=out)
            except Exception as exc:    # a report bug must not lose the experiment's exit status
                print(f"report not written: {type(exc).__name__}: {exc}", file=out)
    if code != EXIT_OK:
        return code
    return EXIT_FAILED_RUNS if failed else EXIT_OK
