#!/usr/bin/env python3
"""The sequencer process (``sequence.py serve``): claims the lowest-seq queue entry of its experiment and runs it
(runsteps.RunSteps), next at once; keeps what outlives a run (GPUs verified free, version probes, the engines it
started); halts when GPUs cannot be verified free, exits on a signal, the END marker, the hold marker, idleness or
a controller without sign of life. stdlib only, like every node tool; imports its siblings.
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

from specab.node import cli, gpufree, lease, manifest, osutil, ownership, procfs
from specab.node import stop as stop_tool
from specab.node.cli import ToolError
from specab.node.runqueue import (END_PREFIX, ENTRY_RE, POLL_S, SEQUENCER_LOG, SEQUENCER_START, TASKS,
                                  Entry, queue_dir, queued_names)
from specab.node.runsteps import Interrupted, PhaseLog, RunSteps, SignalGate
from specab.vocab.phases import failure_headline

PROBE_TIMEOUT_S = 60.0          # one engine version probe (manifest.py --probe-timeout)

# ---------------------------------------------------------------------------------------------
# The sequencer process
# ---------------------------------------------------------------------------------------------

@dataclass
class ServeSpec:
    """One sequencer of one experiment on one node directory (``sequence.py ensure`` makes sure it runs; ``serve``
    is the process itself): every setting from the controller, none from a literal here."""
    node_dir: str
    experiment_id: str
    idle_timeout: float = cli.arg("exit after this many seconds without work (a dead driver never leaves it "
                                     "forever; specab_queue_idle_timeout_s)")
    lease_s: float = cli.arg(
        "claim no new run when the controller gave no sign of life (its node lease's heartbeat, lease.py) for this "
        "many seconds, or the lease names another experiment: a killed driver never leaves its queued runs burning "
        "GPU time (0: never stale; specab_lease_stale_s)")
    gpus: str
    gpu_free_timeout: float
    gpu_free_threshold_mib: float = cli.arg(
        "startup GPU check: a GPU is free at most this many MiB used (enqueue.yml passes the inventory's "
        "specab_gpu_free_threshold_mib; each run's own checks use its entry's)")
    stop_grace: float
    smi: Optional[List[str]] = cli.arg("nvidia-smi argv (JSON list): at startup, stop leftovers and wait for free "
                                          "GPUs", default=None)


class Sequencer(object):
    def __init__(self, a: ServeSpec) -> None:
        self.a = a
        self.node_dir = a.node_dir
        self.experiment_id = a.experiment_id
        self.gate = SignalGate()
        self.clean = False           # our server stopped and the GPUs verified free by us, just now
        self.versions_cache: Dict[str, Any] = {}
        self.version_probes: Dict[str, threading.Thread] = {}   # engine python → its probe, running or done
        self.engines: List[int] = []     # engine pids start.py launched from this process (to reap)
        self.last_entry: Optional[Entry] = None      # the run claimed last (its settings stop a kept server)
        self.hostname = os.uname().nodename
        st = procfs.proc_stat(os.getpid())
        self.record: Dict[str, Any] = {
            "pid": os.getpid(), "starttime": st.starttime if st else None, "sid": os.getsid(0),
            "experiment_id": self.experiment_id, "started_at": round(time.time(), 4), "state": "running",
            "run_id": None, "error": None, "log": os.path.join(self.node_dir, SEQUENCER_LOG),
            "idle_timeout_s": a.idle_timeout, "startup": None, "runs_done": 0, "updated_at": None}

    def save(self, **changes: Any) -> None:
        self.record.update(changes)
        self.record["updated_at"] = round(time.time(), 4)
        osutil.write_json(os.path.join(self.node_dir, ownership.SEQUENCER_JSON), self.record)

    def prefetch_versions(self, python: str) -> None:
        """Probe the engine's versions in the background, once per engine python (manifest.versions)."""
        if python in self.versions_cache or python in self.version_probes:
            return

        def probe() -> None:
            try:
                self.versions_cache[python] = manifest.versions(python, PROBE_TIMEOUT_S)
            except Exception as exc:   # the manifest probes again itself then
                cli.log("version probe failed: %s: %s" % (type(exc).__name__, exc))

        t = threading.Thread(target=probe, daemon=True)
        self.version_probes[python] = t
        t.start()

    def wait_versions(self, python: str) -> None:
        t = self.version_probes.get(python)
        if t is not None:
            t.join(timeout=PROBE_TIMEOUT_S + 5)

    # -- the node tools, in-process ----------------------------------------------------------

    def stop_server(self, smi: List[str], grace: float, out: Optional[str],
                    on_gone: Optional[Callable[[], None]] = None) -> Dict[str, Any]:
        a = stop_tool.StopSpec(node_dir=self.node_dir, smi=list(smi), grace=grace, out=out)
        # its bench step's helpers are its own, ended by it (RunSteps.drop_helpers)
        res = cli.recorded(a.out, lambda: stop_tool.stop(a, stop_sequencer=False, on_gone=on_gone,
                                                            helpers=False))
        self.reap()
        return res

    def wait_free(self, smi: List[str], gpus: str, timeout: float, threshold_mib: float, out: Optional[str] = None,
                  csv: Optional[str] = None) -> Dict[str, Any]:
        a = gpufree.GpuFreeSpec(smi=list(smi), gpus=gpus, threshold_mib=threshold_mib, timeout=timeout,
                                interval=POLL_S, node_dir=self.node_dir, out=out, csv=csv)
        return cli.recorded(a.out, lambda: gpufree.wait_free(a))

    def reap(self) -> None:
        """Collect the exited engines start.py launched from this process (no zombies left)."""
        for pid in list(self.engines):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done == pid:
                self.engines.remove(pid)

    # -- life cycle -------------------------------------------------------------------------

    def startup(self) -> None:
        """Stop any leftover server of ours and wait for free GPUs (needs --smi)."""
        a = self.a
        res: Dict[str, Any] = {"t": round(time.time(), 4)}
        if a.smi:
            try:
                res["stop"] = self.stop_server(a.smi, a.stop_grace, None)
                res["gpu_free"] = self.wait_free(a.smi, a.gpus, a.gpu_free_timeout, a.gpu_free_threshold_mib)
                self.clean = True
            except ToolError as exc:
                res.update(ok=False, error=exc.message)
                osutil.write_json(os.path.join(self.node_dir, SEQUENCER_START), res)
                raise
        else:
            res["note"] = "no --smi: the first run stops leftovers and waits for free GPUs itself"
        res["ok"] = True
        res["elapsed_s"] = round(time.time() - res["t"], 4)
        osutil.write_json(os.path.join(self.node_dir, SEQUENCER_START), res)
        self.save(startup={"ok": True, "clean": self.clean, "elapsed_s": res["elapsed_s"]})

    def held(self) -> bool:
        """The driver's interrupt reached the node (its node lease on hold): no run is claimed or started."""
        return lease.on_hold(self.node_dir, self.experiment_id)

    def watch_hold(self) -> None:
        """The driver's hold acts as its interrupt, at once: SIGTERM to ourselves (the gate cuts a
        load or a benchmark short as for stop.py's signal, faster than the stop playbook reaches us)."""
        def loop() -> None:
            while not self.gate.requested:
                if self.held():
                    cli.log("the node lease %s is on hold: the driver was interrupted"
                               % lease.lease_path(self.node_dir))
                    os.kill(os.getpid(), signal.SIGTERM)
                    return
                time.sleep(0.1)
        threading.Thread(target=loop, name="hold-watch", daemon=True).start()

    def claim(self) -> Optional[Entry]:
        qdir = queue_dir(self.node_dir)
        for name in queued_names(self.node_dir):
            path = os.path.join(qdir, name)
            try:
                data = osutil.read_json(path)
            except (OSError, ValueError):
                continue        # vanished (another claim, a reset) or a partial write: look again later
            if not isinstance(data, dict) or str(data.get("experiment_id")) != self.experiment_id:
                continue        # another experiment's entry: not ours to run
            try:
                entry = Entry(data, self.node_dir, name)
            except (ValueError, TypeError) as exc:
                self.refuse(path, name, str(exc))
                continue
            try:
                os.replace(path, entry.path("queue_entry.json"))
            except OSError as exc:
                self.refuse(path, name, "cannot move it into its run directory: %s" % exc)
                continue
            return entry
        return None

    def refuse(self, path: str, name: str, why: str) -> None:
        """A malformed entry: done.json in its run directory (when there is one), the entry set aside."""
        cli.log("queue entry %s refused: %s" % (name, why))
        m = ENTRY_RE.match(name)
        run_dir = os.path.join(self.node_dir, "runs", m.group("run_id")) if m else None
        with contextlib.suppress(OSError):
            os.replace(path, path + ".refused")
        if run_dir and os.path.isdir(run_dir):
            t = round(time.time(), 4)
            osutil.write_json(os.path.join(run_dir, "done.json"), {
                "ok": False, "status": "failed", "phase": "claimed", "task": TASKS["claimed"],
                "headline": failure_headline("claimed", self.hostname),
                "error": "the queue entry was refused: %s" % why, "run_id": m.group("run_id") if m else None,
                "started_at": t, "finished_at": t, "time_to_ready_s": None, "stop_s": None, "time_to_free_s": None})

    def run_entry(self, entry: Entry) -> Optional[str]:
        self.last_entry = entry
        for stale in ("done.json",):
            with contextlib.suppress(OSError):
                os.remove(entry.path(stale))
        phases = PhaseLog(entry.path("phases.jsonl"))
        try:
            phases.begin("claimed", seq=entry.seq)
            self.save(state="running", run_id=entry.run_id)
            steps = RunSteps(self, entry, phases)
            result = steps.run()
        finally:
            phases.close()
        self.save(runs_done=self.record["runs_done"] + 1, last_run={"run_id": entry.run_id,
                                                                    "status": result["status"]})
        cli.log("run %s: %s" % (entry.run_id, result["status"]))
        return steps.halt

    def serve(self) -> int:
        try:
            return self._serve()
        finally:
            self.stop_kept()

    def stop_kept(self) -> None:
        """On the way out: a server kept for an instance's next run (instance.py) that will not come to this
        sequencer is stopped (its GPUs verified free), never left running."""
        try:
            rec = ownership.load_record(self.node_dir)
        except ToolError:
            return
        entry = self.last_entry
        smi = self.a.smi or (entry.smi if entry is not None else None)
        if rec is None or not rec.get("kept") or not smi:
            return
        cli.log("stopping instance %s's server (pid %s): its next run will not come to this sequencer"
                % (rec.get("instance"), rec.get("pid")))
        try:
            self.stop_server(smi, self.a.stop_grace, None)
            self.wait_free(smi, self.a.gpus, self.a.gpu_free_timeout,
                           entry.gpu_free_threshold_mib if entry is not None else self.a.gpu_free_threshold_mib)
            self.clean = True
        except ToolError as exc:
            self.save(error="stopping the kept server: " + exc.message)
            cli.log("stopping the kept server failed: " + exc.message)

    def _serve(self) -> int:
        self.save()
        self.watch_hold()
        try:
            self.startup()
        except ToolError as exc:
            self.save(state="halted", error="startup: " + exc.message)
            cli.log("halted at startup: " + exc.message)
            return 1
        except Interrupted:
            self.save(state="exited", error=None, reason="signal during startup")
            return 0
        end_marker = os.path.join(queue_dir(self.node_dir), END_PREFIX + self.experiment_id)
        last_work = time.monotonic()
        self.save(state="idle", run_id=None)
        while True:
            if self.gate.requested:
                self.save(state="exited", run_id=None, reason="signal %s" % self.gate.requested)
                return 0
            if queued_names(self.node_dir):
                gone = lease.controller_gone(self.node_dir, self.experiment_id, self.record["started_at"],
                                             self.a.lease_s)
                if gone is not None:
                    # the driver died or lost the node: do not spend hours of GPU time on runs nobody
                    # collects; the entries stay queued (a resume resets the queue and queues them again)
                    self.save(state="exited", run_id=None,
                              reason="%s (--lease-s %g): queued runs left unclaimed; resume the experiment to run "
                                     "them" % (gone, self.a.lease_s))
                    cli.log(self.record["reason"])
                    return 0
            if self.held():
                self.save(state="exited", run_id=None, reason="the node lease %s is on hold: the driver was "
                                                              "interrupted" % lease.lease_path(self.node_dir))
                return 0
            entry = self.claim()
            if entry is not None:
                halt = self.run_entry(entry)
                if halt is not None:
                    self.save(state="halted", run_id=None, error=halt)
                    cli.log("halted: " + halt)
                    return 1
                if self.gate.requested:
                    self.save(state="exited", run_id=None, reason="signal %s" % self.gate.requested)
                    return 0
                self.save(state="idle", run_id=None)
                last_work = time.monotonic()
                continue
            if os.path.exists(end_marker):
                self.save(state="exited", run_id=None, reason="end marker %s and an empty queue" % end_marker)
                return 0
            if time.monotonic() - last_work > self.a.idle_timeout:
                self.save(state="exited", run_id=None,
                          reason="idle for %gs without work (--idle-timeout)" % self.a.idle_timeout)
                return 0
            with contextlib.suppress(Interrupted):
                with self.gate.armed():
                    time.sleep(POLL_S)

