#!/usr/bin/env python3
"""The steps of one queued run, in the sequencer's process: start -> ready (polled every 50 ms) -> env verify ->
bench (client and GPU sampler as processes, started ahead and released at once) -> stop -> GPUs free -> manifest ->
done.json. A failure in any phase is recorded and the run is still stopped, its GPUs verified free, its manifest
and done.json written. Phases are appended to ``runs/<run_id>/phases.jsonl`` as they begin. The node tools are
called in-process through their typed specs. stdlib only, like every node tool; imports its siblings.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from typing import Any, Dict, Iterator, List, Optional, Protocol

from specab.node import common, envcheck, gpusample, loadgen, manifest, ready
from specab.node import start as start_tool
from specab.node.common import ToolError
from specab.node.runqueue import POLL_S, Entry, now
from specab.vocab import phases

PHASES = phases.NODE_PHASES

# A client or sampler process started ahead (while the engine loads) and released by one line on its stdin: the
# tool then runs exactly as `python <node package> TOOL ARGV` would, in the same process (its module executed
# afresh as __main__, everything it imports already loaded).
DEFERRED = r"""
import importlib, json, os, runpy, sys
sys.path.insert(0, sys.argv[1])
name = "specab.node." + sys.argv[2]
importlib.import_module(name)
line = sys.stdin.readline()
if not line.strip():
    sys.exit(0)
job = json.loads(line)
os.chdir(job["cwd"])
for fd, key, flags in ((1, "stdout", os.O_TRUNC), (2, "stderr", os.O_APPEND)):
    if job.get(key):
        f = os.open(job[key], os.O_WRONLY | os.O_CREAT | flags, 0o644)
        os.dup2(f, fd)
        os.close(f)
sys.argv = [name] + job["argv"]
del sys.modules[name]
runpy.run_module(name, run_name="__main__", alter_sys=True)
"""


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
            common.log("%s received: stopping after the current run's teardown" % self.requested)
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
# Helper processes: the client and the sampler, started ahead, released by one line
# ---------------------------------------------------------------------------------------------

class Deferred(object):
    """``python -c DEFERRED ROOT TOOL``: imports the tool's module, then waits for its job."""

    def __init__(self, python: str, module: str, env: Dict[str, str]) -> None:
        self.module = module
        self.proc = subprocess.Popen([python, "-c", DEFERRED, common.PACKAGE_ROOT, module],
                                     stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=None, env=env,
                                     close_fds=True, cwd=common.PACKAGE_ROOT)
        self.released = False

    def release(self, argv: List[str], cwd: str, stdout: Optional[str] = None, stderr: Optional[str] = None) -> None:
        job = {"argv": argv, "cwd": cwd, "stdout": stdout, "stderr": stderr}
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps(job) + "\n").encode())
            self.proc.stdin.close()
        except OSError as exc:
            raise ToolError("the %s process (pid %d) died before it was given its job (%s); see sequencer.log"
                            % (self.module, self.proc.pid, exc))
        self.released = True

    def discard(self) -> None:
        """Never released: close its stdin (it exits at once); kill it if it does not."""
        if self.proc.poll() is None and not self.released:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            except OSError:
                pass
        self.finish(term_after=2.0)

    def finish(self, term_after: float) -> Optional[int]:
        """Wait up to ``term_after`` s, then SIGTERM, then SIGKILL; return the exit status."""
        for sig, wait in ((None, term_after), (signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
            if sig is not None and self.proc.poll() is None:
                try:
                    self.proc.send_signal(sig)
                except OSError:
                    pass
            try:
                return self.proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
        return self.proc.poll()


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
        rec = {"phase": phase, "t": round(now(), 4)}
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

    def one_sample(self, e: Entry, name: str) -> None: ...


class RunSteps(object):
    """The steps of one queued run (start, ready, env, bench, stop, GPUs free, manifest, done.json);
    the sequencer owns the state that outlives a run (clean GPUs, caches)."""

    def __init__(self, seq: QueueState, entry: Entry, phases: PhaseLog) -> None:
        self.seq = seq
        self.e = entry
        self.phases = phases
        self.started_server = False
        self.client_grace = 0.0          # seconds the released client may take to exit on its own
        self.client: Optional[Deferred] = None
        self.sampler: Optional[Deferred] = None
        self.parts_thread: Optional[threading.Thread] = None
        self.parts: Dict[str, Any] = {}
        self.before: Optional[threading.Thread] = None
        self.after: Optional[threading.Thread] = None
        self.result: Dict[str, Any] = {"ok": True, "status": "ok", "phase": None, "task": None, "error": None,
                                       "run_id": entry.run_id, "started_at": round(now(), 4),
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
                    common.log("run %s: %s after its last measured request: kept as ok"
                               % (self.e.run_id, exc))
                    self.result["note"] = "signal %s after the benchmark's last measured request" % exc
                    self.client_grace = 10.0      # it only writes its summary now: let it finish
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
                common.log(traceback.format_exc())
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
                           headline=self.headline(phase, status), error=common.redact_text(message))
        common.log("run %s %s in phase %r: %s" % (self.e.run_id, status, phase, message.splitlines()[0]))

    def failure(self) -> str:
        """The failure as one text, ``"<headline>: <error>"`` (the per-run path's message)."""
        return "%s: %s" % (self.result["headline"], self.result["error"])

    def prepare(self) -> None:
        s, e = self.seq, self.e
        dirty = not s.clean or os.path.exists(os.path.join(s.node_dir, common.SERVER_JSON))
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
        rec = start_tool.start(start_tool.StartSpec(
            node_dir=self.seq.node_dir, run_dir=e.run_dir, script=e.path("launch.sh"), host=str(e.data["host"]),
            port=int(e.data["port"]), run_id=e.run_id, arm=e.arm))
        self.started_server = True
        self.seq.clean = False
        self.server_pid = int(rec["pid"])
        self.seq.engines.append(self.server_pid)
        # the client and the sampler start while the engine loads: released, they run at once
        env = dict(os.environ)
        env.update(e.bench_env)
        self.client = Deferred(e.python, "loadgen", env)
        self.sampler = Deferred(e.python, "gpusample", env)
        # the engine's version probes (two interpreter starts that import torch/sglang: ~5 s on the H200)
        # run once per engine python, while the first engine loads: not in the benchmark, not in the
        # transition window (seen on the H200: the first run's manifest waited 5.1 s for them)
        self.seq.prefetch_versions(e.engine_python)

    def wait_ready(self) -> None:
        e = self.e
        self.phases.begin("loading")
        a = ready.ReadySpec(url=e.url, pid=self.server_pid, log=e.path("server.log"), timeout=e.ready_s,
                            interval=POLL_S, phases_out=e.path("ready.json"), progress=e.path("ready_progress.json"))
        try:
            out = common.recorded(a.phases_out, lambda: ready.wait_ready(a))
        except ToolError as exc:
            raise RunFailed("loading", exc.message)
        self.result["time_to_ready_s"] = out.get("elapsed_s")
        self.phases.begin("ready")

    def verify_env(self) -> None:
        e = self.e
        self.phases.begin("env")
        # gpu_before.csv (one nvidia-smi call) while the environment is checked
        self.before = threading.Thread(target=self.seq.one_sample, args=(e, "gpu_before.csv"), daemon=True)
        self.before.start()
        a = envcheck.EnvCheckSpec(
            node_dir=self.seq.node_dir, env_file=e.path("nccl.env"), expected_args=e.path("args.json"),
            url=e.url if e.server_info else None, no_server_info=not e.server_info, log=[e.path("server.log")],
            out=e.path("env_check.json"), server_info_out=e.path("server_info.json") if e.server_info else None)
        try:
            common.recorded(a.out, lambda: envcheck.check(a))
        except ToolError as exc:
            raise RunFailed("env", exc.message)

    def benchmark(self) -> None:
        e, b = self.e, self.e.bench
        self.phases.begin("warming up")
        assert self.client is not None and self.sampler is not None
        if self.before is not None:      # gpu_before.csv is taken before the client starts
            self.before.join(timeout=60)
        client = loadgen.BenchConfig.from_settings(e.url, b, out=e.path("bench.jsonl"),
                                                   summary=e.path("bench_summary.json"),
                                                   phase_metrics=e.path("phase_metrics.json"))
        self.sampler.release(["--smi", json.dumps(e.smi), "--gpus", e.gpus,
                              "--interval", str(e.sample_interval_s), "--out", "gpu_samples.csv"],
                             e.run_dir, stdout=e.path("gpu_samples.json"), stderr=e.path("gpu_samples.log"))
        self.client.release(client.to_argv(), e.run_dir)
        # the manifest's slow parts (versions, nvidia-smi, checksums) while the benchmark runs
        self.parts_thread = threading.Thread(target=self.slow_parts, daemon=True)
        self.parts_thread.start()
        try:
            with self.seq.gate.armed():
                rc = self.wait_client(client.warmup, client.warmup + client.num_requests)
        finally:
            self.signal_sampler()         # it exits on its own; waited for before done.json
        if self.after is None:
            self.take_after()
        self.after.join(timeout=60)
        if rc != 0:
            summary = {}
            try:
                summary = common.read_json(e.path("bench_summary.json"))
            except (OSError, ValueError):
                pass
            errors = summary.get("errors") or []
            raise RunFailed("benchmarking", "The benchmark on %s failed (loadgen exit %s): %s of %s measured "
                            "requests failed; first errors: %s. Client log: sequencer.log"
                            % (self.seq.hostname, rc, summary.get("failed", "?"), summary.get("requests", "?"),
                               errors[0] if errors else ""))

    def bench_complete(self) -> bool:
        """Whether bench.jsonl holds an answered (ok) record for every measured request."""
        want = int(self.e.bench["num_requests"])
        ok = set()
        try:
            with open(self.e.path("bench.jsonl"), "rb") as fh:
                for line in fh:
                    try:
                        rec = json.loads(line)
                    except ValueError:
                        continue            # a line cut short
                    if isinstance(rec, dict) and not rec.get("warmup") and rec.get("ok"):
                        ok.add(rec.get("i"))
        except OSError:
            return False
        return want > 0 and len(ok) >= want

    def take_after(self) -> None:
        """gpu_after.csv: the GPUs after the last request, the server still up (one nvidia-smi call)."""
        self.after = threading.Thread(target=self.seq.one_sample, args=(self.e, "gpu_after.csv"), daemon=True)
        self.after.start()

    def wait_client(self, warmup: int, total: int) -> int:
        """Poll the client every 50 ms; from its bench.jsonl lines: the end of the warm-up (phase
        "benchmarking") and the end of the last request (gpu_after.csv starts while it exits)."""
        assert self.client is not None
        path = self.e.path("bench.jsonl")
        warm_seen = lines = offset = 0
        measuring = warmup <= 0
        if measuring:
            self.phases.begin("benchmarking")
        while True:
            rc = self.client.proc.poll()
            try:
                with open(path, "rb") as fh:
                    fh.seek(offset)
                    data = fh.read()
                cut = data.rfind(b"\n") + 1
                offset += cut
                for line in data[:cut].splitlines():
                    if not line.strip():
                        continue
                    lines += 1
                    if b'"warmup":true' in line.replace(b" ", b""):
                        warm_seen += 1
                    else:
                        warm_seen = warmup
            except OSError:
                pass
            if not measuring and (warm_seen >= warmup or rc is not None):
                measuring = True
                self.phases.begin("benchmarking")
            if lines >= total and self.after is None:
                self.take_after()
            if rc is not None:
                return rc
            time.sleep(POLL_S)

    def signal_sampler(self) -> None:
        if self.sampler is not None and self.sampler.released and self.sampler.proc.poll() is None:
            try:
                self.sampler.proc.send_signal(signal.SIGTERM)
            except OSError:
                pass

    def drop_helpers(self) -> None:
        """After the benchmark (or a failure): the client must be gone before the server stops;
        the sampler is told to stop and waited for in the teardown (before done.json)."""
        if self.client is not None:
            if self.client.released:
                self.client.finish(term_after=self.client_grace)
            else:
                self.client.discard()
        if self.sampler is not None:
            if self.sampler.released:
                self.signal_sampler()
            else:
                self.sampler.discard()

    def wait_sampler(self) -> None:
        if self.sampler is not None and self.sampler.released:
            self.sampler.finish(term_after=10.0)

    def slow_parts(self) -> None:
        try:
            self.seq.wait_versions(self.e.engine_python)
            self.parts = manifest.slow_parts(self.manifest_spec(), self.seq.versions_cache)
        except Exception as exc:  # the manifest is built without the precomputed parts then
            common.log("manifest parts failed: %s: %s" % (type(exc).__name__, exc))

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
        free: Dict[str, Any] = {}

        def wait_free() -> None:
            try:
                free["out"] = s.wait_free(e.smi, e.gpus, e.gpu_free_s, e.gpu_free_threshold_mib, e.path("gpu_free.json"),
                                          e.path("gpu_free.csv"))
            except ToolError as exc:
                free["error"] = exc.message
            except Exception as exc:  # reported as a failed GPU check, never lost in the thread
                free["error"] = "internal error: %s: %s" % (type(exc).__name__, exc)

        def start_free() -> None:
            """The GPU-free wait, in parallel with stop's GPU sweep once our processes are gone: its
            smi polls overlap the sweep's; server.json still names our session, so an orphan the sweep
            kills is ours to wait for, never refused."""
            if "thread" not in free:
                self.phases.begin("gpus free")
                free["thread"] = threading.Thread(target=wait_free, name="gpus-free", daemon=True)
                free["thread"].start()

        if self.started_server or os.path.exists(os.path.join(s.node_dir, common.SERVER_JSON)):
            self.phases.begin("stopping")
            try:
                out = s.stop_server(e.smi, e.stop_grace_s, e.path("stop.json") if self.started_server else None,
                                    on_gone=start_free)
                self.result["stop_s"] = out.get("total_s")
            except ToolError as exc:
                halt = "%s: %s" % (self.headline("stopping"), exc.message)
                self.fail("stopping", exc.message)
        if halt is None:
            start_free()
        if "thread" in free:
            free["thread"].join()
        else:
            self.phases.begin("gpus free")
        if halt is None:
            if "error" in free:
                halt = "%s: %s" % (self.headline("gpus free"), free["error"])
                self.fail("gpus free", free["error"])
            else:
                self.result["time_to_free_s"] = free["out"].get("time_to_free_s")
                s.clean = True
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
            common.write_json(a.out, manifest.build(a, parts))
        except Exception as exc:
            common.log(traceback.format_exc())
            self.fail("manifest", "cannot write the manifest: %s: %s" % (type(exc).__name__, exc))
        self.wait_sampler()
        self.phases.begin("done")
        if halt is not None and self.failure() != halt:
            self.result["teardown_error"] = halt
        self.result["finished_at"] = round(now(), 4)
        common.write_json(e.path("done.json"), self.result)
        self.halt = halt
        return self.result

