#!/usr/bin/env python3
"""The steps of one queued run, in the sequencer's process: start -> ready (polled every 50 ms) -> env verify ->
bench (benchstep.py: client and GPU sampler as processes, started ahead and released at once) -> stop -> GPUs free
-> manifest -> done.json. A failure in any phase is recorded and the run is still stopped, its GPUs verified free,
its manifest and done.json written. Phases are appended to ``runs/<run_id>/phases.jsonl`` as they begin. The node
tools are called in-process through their typed specs. stdlib only, like every node tool; imports its siblings.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
import traceback
from typing import Any, Dict, Iterator, List, Optional, Protocol

from specab.node import benchstep, cli, envcheck, instance, manifest, osutil, ownership, ready, teardown
from specab.node import start as start_tool
from specab.node.cli import ToolError
from specab.node.runqueue import POLL_S, Entry
from specab.vocab import contract, phases

PHASES = phases.NODE_PHASES

class Interrupted(Exception):
    """SIGTERM/SIGINT reached the sequencer while a run was in a phase that can be cut short."""


class RunFailed(Exception):
    """A phase of a run failed: recorded in done.json, the sequencer goes on."""

    def __init__(self, phase: str, message: str) -> None:
        super().__init__(message)
        self.phase = phase
        self.message = message


# ---------------------------------------------------------------------------------------------
# Signals: a flag always, an exception only where a run may be cut short
# ---------------------------------------------------------------------------------------------

class SignalGate(object):
    def __init__(self) -> None:
        self.requested: Optional[str] = None
        self._armed = 0
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handler)

    def _handler(self, signum: int, frame: Any) -> None:
        first = self.requested is None
        self.requested = signal.Signals(signum).name
        if first:
            cli.log("%s received: stopping after the current run's teardown" % self.requested)
        if self._armed and first:
            raise Interrupted(self.requested)

    def check(self) -> None:
        if self.requested:
            raise Interrupted(self.requested)

    @contextlib.contextmanager
    def armed(self) -> Iterator[None]:
        """Inside: a signal raises Interrupted at once (waits that may last minutes)."""
        self.check()
        self._armed += 1
        try:
            yield
        finally:
            self._armed -= 1


# ---------------------------------------------------------------------------------------------
# One run
# ---------------------------------------------------------------------------------------------

class PhaseLog(object):
    def __init__(self, path: str) -> None:
        self.fh = open(path, "w")
        self.current: Optional[str] = None

    def begin(self, phase: str, **extra: Any) -> None:
        assert phase in PHASES, phase
        self.current = phase
        rec = {"phase": phase, "t": round(time.time(), 4)}
        rec.update(extra)
        self.fh.write(json.dumps(rec) + "\n")
        self.fh.flush()

    def close(self) -> None:
        self.fh.close()


class QueueState(Protocol):
    """What outlives one run, kept by the sequencer (sequencer.py ``Sequencer``): what a run reads and updates."""

    node_dir: str
    hostname: str
    gate: SignalGate
    clean: bool                      # our server stopped and the GPUs verified free by us, just now
    engines: List[int]               # engine pids started from this process (to reap)
    versions_cache: Dict[str, Any]

    def held(self) -> bool: ...

    def prefetch_versions(self, python: str) -> None: ...

    def wait_versions(self, python: str) -> None: ...


class RunSteps(object):
    """The steps of one queued run (start, ready, env, bench, stop, GPUs free, manifest, done.json);
    the sequencer owns the state that outlives a run (clean GPUs, caches)."""

    def __init__(self, seq: QueueState, entry: Entry, phases: PhaseLog) -> None:
        self.seq = seq
        self.e = entry
        self.phases = phases
        self.started_server = False     # this run holds a server: its own start, or its instance's taken over
        self.continues = False          # the run continues its instance's server (instance.py): no stop, no start
        self.kept = False               # its instance's next run continues its server: no stop after it
        self.bench: Optional[benchstep.BenchStep] = None
        self.parts_thread: Optional[threading.Thread] = None
        self.parts: Dict[str, Any] = {}
        self.result: Dict[str, Any] = {"ok": True, "status": "ok", "phase": None, "task": None, "error": None,
                                       "run_id": entry.run_id, "started_at": round(time.time(), 4),
                                       "finished_at": None, "time_to_ready_s": None, "stop_s": None,
                                       "time_to_free_s": None}

    # -- phases ---------------------------------------------------------------------------

    def run(self) -> Dict[str, Any]:
        gate = self.seq.gate
        try:
            try:
                self.prepare()
                self.start_engine()
                with gate.armed():
                    self.wait_ready()
                self.verify_env()
                self.benchmark()
            except Interrupted as exc:
                if self.phases.current in ("warming up", "benchmarking") and self.bench_complete():
                    # every measured request was answered before the signal: the measurement is whole
                    cli.log("run %s: %s after its last measured request: kept as ok"
                               % (self.e.run_id, exc))
                    self.result["note"] = "signal %s after the benchmark's last measured request" % exc
                    self.bench_grace(10.0)        # it only writes its summary now: let it finish
                else:
                    self.fail(self.phases.current or "claimed",
                              "interrupted by %s (stop.py or the driver's interrupt) during phase %r; the server was "
                              "stopped and the run is not measured: rerun it" % (exc, self.phases.current),
                              status="interrupted")
            except RunFailed as exc:
                self.fail(exc.phase, exc.message)
            except ToolError as exc:
                self.fail(self.phases.current or "claimed", exc.message)
            except Exception as exc:  # a bug must still stop the server and record the run
                cli.log(traceback.format_exc())
                self.fail(self.phases.current or "claimed", "internal error of the sequencer: %s: %s (see "
                          "sequencer.log)" % (type(exc).__name__, exc))
        finally:
            self.drop_helpers()
        return self.teardown()

    def headline(self, phase: str, status: str = "failed") -> str:
        """The headline of a failure in ``phase`` (specab.vocab.phases, as the per-run roles word it)."""
        if status == "interrupted":
            return phases.INTERRUPTED.format(host=self.e.extra.get("inventory_hostname") or self.seq.hostname)
        return self.e.headline(phase, self.seq.hostname)

    def fail(self, phase: str, message: str, status: str = "failed") -> None:
        """Record the run's first failure: its phase, the headline of a failure there and ``message``, the node
        tool's own error (done.json's ``phase``, ``headline``, ``error``)."""
        if not self.result["ok"]:
            return
        self.result.update(ok=False, status=status, phase=phase, task=self.e.task(phase),
                           headline=self.headline(phase, status), error=contract.redact_text(message))
        cli.log("run %s %s in phase %r: %s" % (self.e.run_id, status, phase, message.splitlines()[0]))

    def failure(self) -> str:
        """The failure as one text, ``"<headline>: <error>"`` (the per-run path's message)."""
        return "%s: %s" % (self.result["headline"], self.result["error"])

    def prepare(self) -> None:
        s, e = self.seq, self.e
        if e.instance is not None:
            self.continues, why = instance.continues(s.node_dir, e.instance)
            if self.continues:          # the per-run path skips the GPUs-free role alike
                self.phases.begin("stopping-leftover", skipped=why)
                return
        dirty = not s.clean or os.path.exists(os.path.join(s.node_dir, ownership.SERVER_JSON))
        if dirty:
            self.phases.begin("stopping-leftover")
            with s.gate.armed():
                s.stop_server(e.smi, e.stop_grace_s, None)
            self.phases.begin("gpus-free-before")
            with s.gate.armed():
                s.wait_free(e.smi, e.gpus, e.gpu_free_s, e.gpu_free_threshold_mib)
            s.clean = True
        else:
            note = "the previous teardown stopped our server and verified the GPUs free"
            self.phases.begin("stopping-leftover", skipped=note)
            self.phases.begin("gpus-free-before", skipped=note)

    def start_engine(self) -> None:
        e = self.e
        self.seq.gate.check()         # a signal already received: no engine is started for this run
        if self.seq.held():
            raise Interrupted("the driver's hold marker")
        self.phases.begin("starting")
        if self.continues:
            try:
                rec = instance.take_over(self.seq.node_dir, e.run_dir, e.run_id, e.arm, str(e.instance))
            except ToolError as exc:
                raise RunFailed("starting", exc.message)
        else:
            rec = start_tool.start(start_tool.StartSpec(
                node_dir=self.seq.node_dir, run_dir=e.run_dir, script=e.path("launch.sh"), host=str(e.data["host"]),
                port=int(e.data["port"]), run_id=e.run_id, arm=e.arm, instance=e.instance))
            self.seq.engines.append(int(rec["pid"]))
        self.started_server = True
        self.seq.clean = False
        self.server_pid = int(rec["pid"])
        # the client and the sampler start while the engine loads: released, they run at once
        env = dict(os.environ)
        env.update(e.bench_env)
        self.bench = benchstep.BenchStep(benchstep.BenchSpec(
            run_dir=e.run_dir, url=e.url, python=e.python, smi=list(e.smi), gpus=e.gpus,
            sample_interval_s=e.sample_interval_s, bench=e.bench, score=e.score), env, client_log="sequencer.log")
        self.bench.start_ahead()
        # the engine's version probes (two interpreter starts that import torch/sglang: ~5 s on the H200)
        # run once per engine python, while the first engine loads: not in the benchmark, not in the
        # transition window (seen on the H200: the first run's manifest waited 5.1 s for them)
        self.seq.prefetch_versions(e.engine_python)

    def wait_ready(self) -> None:
        e = self.e
        self.phases.begin("loading")
        if self.continues:              # the server is up: its cache reset before this load is the ready step
            try:
                cli.recorded(e.path(instance.RESET_RECORD), lambda: instance.reset_cache(e.url, e.engine,
                                                                                        instance.RESET_TIMEOUT_S))
            except ToolError as exc:
                raise RunFailed("loading", exc.message)
            return
        a = ready.ReadySpec(url=e.url, pid=self.server_pid, log=e.path("server.log"), timeout=e.ready_s,
                            interval=POLL_S, phases_out=e.path("ready.json"), progress=e.path("ready_progress.json"))
        try:
            out = cli.recorded(a.phases_out, lambda: ready.wait_ready(a))
        except ToolError as exc:
            raise RunFailed("loading", exc.message)
        self.result["time_to_ready_s"] = out.get("elapsed_s")
        self.phases.begin("ready")

    def verify_env(self) -> None:
        e = self.e
        self.phases.begin("env")
        # gpu_before.csv (one nvidia-smi call) while the environment is checked
        assert self.bench is not None
        self.bench.sample_before()
        a = envcheck.EnvCheckSpec(
            node_dir=self.seq.node_dir, env_file=e.path("nccl.env"), expected_args=e.path("args.json"),
            url=e.url if e.server_info else None, no_server_info=not e.server_info, log=[e.path("server.log")],
            out=e.path("env_check.json"), server_info_out=e.path("server_info.json") if e.server_info else None)
        try:
            cli.recorded(a.out, lambda: envcheck.check(a))
        except ToolError as exc:
            raise RunFailed("env", exc.message)

    def benchmark(self) -> None:
        assert self.bench is not None

        def parts() -> None:
            # the manifest's slow parts (versions, nvidia-smi, checksums) while the benchmark runs
            self.parts_thread = threading.Thread(target=self.slow_parts, daemon=True)
            self.parts_thread.start()

        try:
            self.bench.run(on_phase=self.phases.begin, guard=self.seq.gate.armed, on_released=parts)
        except ToolError as exc:
            raise RunFailed("benchmarking", exc.message)

    def bench_grace(self, seconds: float) -> None:
        if self.bench is not None:
            self.bench.client_grace = seconds

    def bench_complete(self) -> bool:
        """Whether bench.jsonl holds an answered (ok) record for every measured request."""
        return self.bench is not None and self.bench.complete()

    def drop_helpers(self) -> None:
        """After the benchmark (or a failure): the client must be gone before the server stops;
        the sampler is told to stop and waited for in the teardown (before done.json)."""
        if self.bench is not None:
            self.bench.drop()

    def wait_sampler(self) -> None:
        if self.bench is not None:
            self.bench.wait_sampler()

    def slow_parts(self) -> None:
        try:
            self.seq.wait_versions(self.e.engine_python)
            self.parts = manifest.slow_parts(self.manifest_spec(), self.seq.versions_cache)
        except Exception as exc:  # the manifest is built without the precomputed parts then
            cli.log("manifest parts failed: %s: %s" % (type(exc).__name__, exc))

    def manifest_spec(self) -> manifest.ManifestSpec:
        e = self.e
        extra = dict(e.extra)
        extra.update(time_to_ready_s=self.result["time_to_ready_s"], time_to_free_s=self.result["time_to_free_s"],
                     stop_s=self.result["stop_s"])
        if not self.result["ok"]:
            extra.update(failed_task=self.result["task"], failure=self.failure())
        # as the collect role passes them: KEY=VALUE, a value as JSON text, a string as it is
        pairs = ["%s=%s" % (k, v if isinstance(v, str) else json.dumps(v)) for k, v in extra.items()]
        return manifest.ManifestSpec(run_dir=e.run_dir, node_dir=self.seq.node_dir, smi=list(e.smi),
                                     python=e.engine_python, seed=str(e.seed), extra=pairs,
                                     out=e.path("manifest.json"))

    # -- teardown: never interrupted, always recorded --------------------------------------

    def teardown(self) -> Dict[str, Any]:
        s, e = self.seq, self.e
        halt: Optional[str] = None
        if self.keep_server():
            return self.finish(None)

        def begin(phase: str) -> None:      # ("stopping" may be begun already, by a hand-over that failed)
            if phase != self.phases.current:
                self.phases.begin(phase)
        stopped, freed, failed = teardown.stop_and_free(
            lambda on_gone: s.stop_server(e.smi, e.stop_grace_s, e.path("stop.json") if self.started_server else None,
                                          on_gone=on_gone),
            lambda: s.wait_free(e.smi, e.gpus, e.gpu_free_s, e.gpu_free_threshold_mib, e.path("gpu_free.json"),
                                e.path("gpu_free.csv")),
            begin, self.started_server or os.path.exists(os.path.join(s.node_dir, ownership.SERVER_JSON)))
        if stopped is not None:
            self.result["stop_s"] = stopped.get("total_s")
        if failed is not None:
            halt = "%s: %s" % (self.headline(failed[0]), failed[1])
            self.fail(*failed)
        else:
            self.result["time_to_free_s"] = (freed or {}).get("time_to_free_s")
            s.clean = True
        return self.finish(halt)

    def keep_server(self) -> bool:
        """The run is over and its instance's next run continues its server (the entry's ``keep``): the stop step
        hands the server over (instance.keep) instead of stopping it. Not after a failure or a signal, and not when
        the hand-over fails (the server is then stopped as after any run)."""
        s, e = self.seq, self.e
        if not (e.keep and e.instance is not None and self.started_server and self.result["ok"]
                and not s.gate.requested):
            return False
        self.phases.begin("stopping", kept=True)
        try:
            instance.keep(s.node_dir, e.run_dir, e.instance)
        except ToolError as exc:
            cli.log("run %s: its server cannot be kept for its instance's next run: %s" % (e.run_id, exc.message))
            return False
        self.kept = True
        return True

    def finish(self, halt: Optional[str]) -> Dict[str, Any]:
        """The end of the teardown: the manifest, the sampler's end, done.json."""
        s, e = self.seq, self.e
        self.phases.begin("manifest")
        try:
            if self.parts_thread is not None:
                self.parts_thread.join(timeout=5 if s.gate.requested else 120)
            a = self.manifest_spec()
            parts = self.parts or None
            if parts is None and s.gate.requested:   # interrupted: no slow version probes now
                parts = {"versions": s.versions_cache.get(e.engine_python, {"note": "not probed (interrupted)"}),
                         "gpu": {"error": "not queried (interrupted)"}, "host": manifest.host_info(),
                         "models": {"target": None, "draft": None}}
            osutil.write_json(a.out, manifest.build(a, parts))
        except Exception as exc:
            cli.log(traceback.format_exc())
            self.fail("manifest", "cannot write the manifest: %s: %s" % (type(exc).__name__, exc))
        self.wait_sampler()
        self.phases.begin("done")
        if halt is not None and self.failure() != halt:
            self.result["teardown_error"] = halt
        self.result["finished_at"] = round(time.time(), 4)
        osutil.write_json(e.path("done.json"), self.result)
        self.halt = halt
        return self.result

