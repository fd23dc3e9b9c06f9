#!/usr/bin/env python3
"""The node-side run queue ("sequencer"): runs queued runs back to back in one process.

    sequence.py --node-dir D ensure --experiment-id X --idle-timeout S --lease-s S [--smi JSON]
                --gpus G --gpu-free-timeout S --gpu-free-threshold-mib M --stop-grace S
    sequence.py --node-dir D reset --experiment-id X --stop-grace S --gpu-free-timeout S
    sequence.py --node-dir D wait --run-id R --timeout S [--pack TAR [--also R2 ...]]
    sequence.py --node-dir D finish --experiment-id X
    sequence.py --node-dir D stage --experiment-id X [--finish] < batch.json   (enqueue.yml: a batch of runs)
    sequence.py --node-dir D serve --experiment-id X ...     (what ensure spawns)

The controller writes each run's directory (launch.sh, nccl.env, args.json), then its queue entry
``queue/<seq:06d>-<run_id>.json`` (``stage``: a whole batch from one JSON document, staging.py); the
sequencer claims the lowest-seq entry of its experiment and runs it with the node tools' logic
called in-process (no interpreter start per step): start → ready (polled every 50 ms) → env verify →
bench (client and GPU sampler as processes, started ahead and released at once) → stop → GPUs free →
manifest → done.json, then the next entry.
A failure in any phase is recorded and the run is still stopped, its GPUs verified free, its
manifest and done.json written; GPUs that cannot be verified free halt the sequencer. Phases are
appended to ``runs/<run_id>/phases.jsonl`` as they begin. Contract: docs/architecture.md and
specab/node/README.md. stdlib only, like every node tool; imports its siblings.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import threading
import time
import traceback
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import contract  # noqa: E402
import envcheck  # noqa: E402
import gpufree  # noqa: E402
import gpusample  # noqa: E402
import loadgen  # noqa: E402
import manifest  # noqa: E402
import ready  # noqa: E402
import staging  # noqa: E402
import start as start_tool  # noqa: E402
import stop as stop_tool  # noqa: E402
from common import ToolError, UsageError  # noqa: E402

BIN_DIR = os.path.dirname(os.path.abspath(__file__))
POLL_S = 0.05
PROBE_TIMEOUT_S = 60.0          # manifest.py --probe-timeout default: one engine version probe
QUEUE_DIR = "queue"
SEQUENCER_LOG = "sequencer.log"
SEQUENCER_START = "sequencer_start.json"
LEASE_FILE = "sequencer.lease"  # touched by the controller's ensure/wait: its sign of life
SERVE_LOCK = "sequencer.lock"
ENSURE_LOCK = "sequencer.ensure.lock"
END_PREFIX = "END-"
HOLD_PREFIX = "HOLD-"        # queue/HOLD-<experiment_id>: the driver was interrupted, claim and start nothing
STAGING_DIR = ".staging"     # queue/.staging: entries being written (`stage`), not yet queued
ENTRY_RE = contract.QUEUE_ENTRY_RE
ID_RE = contract.ID_RE
PHASES = contract.NODE_PHASES
# What failed, in the words of the per-run path's task names (playbooks/tasks/run_arm.yml).
TASKS = contract.TASKS

# A client or sampler process started ahead (while the engine loads) and released by one line on
# its stdin: the tool then runs exactly as `python <tool>.py ARGV` would, in the same process.
DEFERRED = r"""
import importlib, json, os, runpy, sys
sys.path.insert(0, sys.argv[1])
importlib.import_module(sys.argv[2])
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
sys.argv = [job["script"]] + job["argv"]
runpy.run_path(job["script"], run_name="__main__")
"""


class Interrupted(Exception):
    """SIGTERM/SIGINT reached the sequencer while a run was in a phase that can be cut short."""


class RunFailed(Exception):
    """A phase of a run failed: recorded in done.json, the sequencer goes on."""

    def __init__(self, phase: str, message: str) -> None:
        super().__init__(message)
        self.phase = phase
        self.message = message


def now() -> float:
    return time.time()


def atomic_write_text(path: str, text: str, mode: int = 0o644) -> None:
    tmp = "%s.tmp.%d" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def log_tail(path: str, n: int = 12) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 16384))
            lines = fh.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return "(no %s)" % os.path.basename(path)
    return "\n".join(common.redact_text(l) for l in lines[-n:])


# ---------------------------------------------------------------------------------------------
# Queue entries
# ---------------------------------------------------------------------------------------------

class Entry(object):
    """One queued run (the JSON the controller writes; docs/architecture.md "Queue entry")."""

    def __init__(self, data: Dict[str, Any], node_dir: str, name: str) -> None:
        self.data = data
        self.name = name
        m = ENTRY_RE.match(name)
        if m is None:
            raise ValueError("queue entry name %r is not <seq:06d>-<run_id>.json" % name)
        self.run_id = str(data.get("run_id") or "")
        if data.get("version") != 1:
            raise ValueError("queue entry %s has version %r; this sequencer reads version 1"
                             % (name, data.get("version")))
        if self.run_id != m.group("run_id"):
            raise ValueError("queue entry %s names run %r, its file name %r" % (name, self.run_id, m.group("run_id")))
        want = os.path.join(node_dir, "runs", self.run_id)
        self.run_dir = str(data.get("run_dir") or "")
        if not os.path.isabs(self.run_dir) or os.path.realpath(self.run_dir) != os.path.realpath(want):
            raise ValueError("queue entry %s: run_dir %r is not this node's run directory %s"
                             % (name, self.run_dir, want))
        for key in ("experiment_id", "arm", "host", "port", "url", "smi", "gpus", "python", "bench", "timeouts",
                    "gpu_free", "sample_interval_s"):
            if key not in data:
                raise ValueError("queue entry %s lacks %r (see docs/architecture.md, queue entry)" % (name, key))
        if not isinstance(data["smi"], list) or not data["smi"] or not all(isinstance(w, str) for w in data["smi"]):
            raise ValueError("queue entry %s: smi must be a non-empty list of strings" % name)
        self.experiment_id = str(data["experiment_id"])
        self.seq = int(data.get("seq", m.group("seq")))
        self.arm = str(data["arm"])
        self.url = str(data["url"]).rstrip("/")
        self.smi: List[str] = list(data["smi"])
        self.gpus = str(data["gpus"])
        # every setting comes from the entry (enqueue.yml writes them from the inventory and the experiment,
        # defaults in roles/specab): the sequencer has no defaults of its own
        t, g = data["timeouts"], data["gpu_free"]
        try:
            self.stop_grace_s = float(t["stop_grace_s"])
            self.gpu_free_s = float(t["gpu_free_s"])
            self.ready_s = float(t["ready_s"])
            self.gpu_free_threshold_mib = float(g["threshold_mib"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError("queue entry %s: timeouts {stop_grace_s, gpu_free_s, ready_s} and gpu_free "
                             "{threshold_mib} must be numbers (%s: %s)" % (name, type(exc).__name__, exc))
        self.bench: Dict[str, Any] = dict(data.get("bench") or {})
        missing = [k for k in loadgen.BENCH_KEYS if self.bench.get(k) is None]
        if missing:
            raise ValueError("queue entry %s: its bench lacks %s (enqueue.yml resolves every bench setting from "
                             "the experiment and roles/specab)" % (name, ", ".join(missing)))
        self.bench_env = {str(k): str(v) for k, v in (data.get("bench_env") or {}).items() if v is not None}
        self.python = str(data["python"])
        self.engine_python = str(data.get("engine_python") or self.python)
        self.sample_interval_s = float(data["sample_interval_s"])
        self.server_info = bool((data.get("env_verify") or {}).get("server_info", True))
        mf = data.get("manifest") or {}
        self.seed = mf.get("seed", self.bench["seed"])
        self.extra: Dict[str, Any] = dict(mf.get("extra") or {})

    def path(self, name: str) -> str:
        return os.path.join(self.run_dir, name)

    def task(self, phase: str) -> str:
        return TASKS.get(phase, phase).format(arm=self.arm)


def touch_lease(node_dir: str) -> None:
    """The controller is alive: `ensure` and every `wait` (each collect) touch the lease file."""
    path = os.path.join(node_dir, LEASE_FILE)
    try:
        with open(path, "a"):
            pass
        os.utime(path, None)
    except OSError as exc:
        common.log("cannot touch %s: %s" % (path, exc))


def lease_age(node_dir: str, since: float) -> float:
    """Seconds since the controller's last sign of life (or since `since`, when it never gave one)."""
    try:
        last = os.stat(os.path.join(node_dir, LEASE_FILE)).st_mtime
    except OSError:
        last = since
    return now() - last


def queue_dir(node_dir: str) -> str:
    return os.path.join(node_dir, QUEUE_DIR)


def make_queue_dir(node_dir: str) -> str:
    """queue/ (0700: entries carry the node env), created when missing."""
    path = queue_dir(node_dir)
    staging.make_queue_dir(path)
    return path


def queued_names(node_dir: str) -> List[str]:
    try:
        names = os.listdir(queue_dir(node_dir))
    except OSError:
        return []
    return sorted(n for n in names if ENTRY_RE.match(n))


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
    """``python -c DEFERRED BIN MODULE``: imports the tool's module, then waits for its job."""

    def __init__(self, python: str, module: str, env: Dict[str, str]) -> None:
        self.module = module
        self.proc = subprocess.Popen([python, "-c", DEFERRED, BIN_DIR, module], stdin=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, stderr=None, env=env, close_fds=True,
                                     cwd=BIN_DIR)
        self.released = False

    def release(self, script: str, argv: List[str], cwd: str, stdout: Optional[str] = None,
                stderr: Optional[str] = None) -> None:
        job = {"script": os.path.join(BIN_DIR, script), "argv": argv, "cwd": cwd, "stdout": stdout,
               "stderr": stderr}
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


class RunSteps(object):
    """The steps of one queued run (start, ready, env, bench, stop, GPUs free, manifest, done.json);
    the Sequencer owns the state that outlives a run (clean GPUs, caches)."""

    def __init__(self, seq: "Sequencer", entry: Entry, phases: PhaseLog) -> None:
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

    def fail(self, phase: str, message: str, status: str = "failed") -> None:
        if not self.result["ok"]:
            return
        self.result.update(ok=False, status=status, phase=phase, task=self.e.task(phase),
                           error=common.redact_text(message))
        common.log("run %s %s in phase %r: %s" % (self.e.run_id, status, phase, message.splitlines()[0]))

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
            raise RunFailed("loading", "The server on %s did not become ready: %s" % (self.seq.hostname, exc.message))
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
            raise RunFailed("env", "Env verification failed on %s: %s" % (self.seq.hostname, exc.message))

    def benchmark(self) -> None:
        e, b = self.e, self.e.bench
        self.phases.begin("warming up")
        assert self.client is not None and self.sampler is not None
        if self.before is not None:      # gpu_before.csv is taken before the client starts
            self.before.join(timeout=60)
        client = loadgen.BenchConfig.from_settings(e.url, b, out=e.path("bench.jsonl"),
                                                   summary=e.path("bench_summary.json"),
                                                   phase_metrics=e.path("phase_metrics.json"))
        self.sampler.release("gpusample.py", ["--smi", json.dumps(e.smi), "--gpus", e.gpus,
                                              "--interval", str(e.sample_interval_s), "--out", "gpu_samples.csv"],
                             e.run_dir, stdout=e.path("gpu_samples.json"), stderr=e.path("gpu_samples.log"))
        self.client.release("loadgen.py", client.to_argv(), e.run_dir)
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
            extra.update(failed_task=self.result["task"], failure=self.result["error"])
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
                halt = "Stopping the server on %s failed: %s" % (s.hostname, exc.message)
                self.fail("stopping", halt)
        if halt is None:
            start_free()
        if "thread" in free:
            free["thread"].join()
        else:
            self.phases.begin("gpus free")
        if halt is None:
            if "error" in free:
                halt = "The GPUs of %s are not free: %s" % (s.hostname, free["error"])
                self.fail("gpus free", halt)
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
        if halt is not None and self.result["error"] != halt:
            self.result["teardown_error"] = halt
        self.result["finished_at"] = round(now(), 4)
        common.write_json(e.path("done.json"), self.result)
        self.halt = halt
        return self.result


# ---------------------------------------------------------------------------------------------
# The sequencer process
# ---------------------------------------------------------------------------------------------

class Sequencer(object):
    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.node_dir = a.node_dir
        self.experiment_id = a.experiment_id
        self.gate = SignalGate()
        self.clean = False           # our server stopped and the GPUs verified free by us, just now
        self.versions_cache: Dict[str, Any] = {}
        self.version_probes: Dict[str, threading.Thread] = {}   # engine python → its probe, running or done
        self.engines: List[int] = []     # engine pids start.py launched from this process (to reap)
        self.hostname = os.uname().nodename
        st = common.proc_stat(os.getpid())
        self.record: Dict[str, Any] = {
            "pid": os.getpid(), "starttime": st.starttime if st else None, "sid": os.getsid(0),
            "experiment_id": self.experiment_id, "started_at": round(now(), 4), "state": "running",
            "run_id": None, "error": None, "log": os.path.join(self.node_dir, SEQUENCER_LOG),
            "idle_timeout_s": a.idle_timeout, "startup": None, "runs_done": 0, "updated_at": None}

    def save(self, **changes: Any) -> None:
        self.record.update(changes)
        self.record["updated_at"] = round(now(), 4)
        common.write_json(os.path.join(self.node_dir, common.SEQUENCER_JSON), self.record)

    def prefetch_versions(self, python: str) -> None:
        """Probe the engine's versions in the background, once per engine python (manifest.versions)."""
        if python in self.versions_cache or python in self.version_probes:
            return

        def probe() -> None:
            try:
                self.versions_cache[python] = manifest.versions(python, PROBE_TIMEOUT_S)
            except Exception as exc:   # the manifest probes again itself then
                common.log("version probe failed: %s: %s" % (type(exc).__name__, exc))

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
        res = common.recorded(a.out, lambda: stop_tool.stop(a, stop_sequencer=False, on_gone=on_gone))
        self.reap()
        return res

    def wait_free(self, smi: List[str], gpus: str, timeout: float, threshold_mib: float, out: Optional[str] = None,
                  csv: Optional[str] = None) -> Dict[str, Any]:
        a = gpufree.GpuFreeSpec(smi=list(smi), gpus=gpus, threshold_mib=threshold_mib, timeout=timeout,
                                interval=POLL_S, node_dir=self.node_dir, out=out, csv=csv)
        return common.recorded(a.out, lambda: gpufree.wait_free(a))

    def one_sample(self, e: Entry, name: str) -> None:
        """gpusample.py --count 1 (gpu_before.csv / gpu_after.csv); failures go to gpu_samples.log."""
        flag = gpusample.StopFlag(install=False)
        try:
            gpusample.sample(gpusample.SampleSpec(smi=list(e.smi), gpus=e.gpus, count=1, interval=e.sample_interval_s,
                                                  out=e.path(name)), flag)
        except ToolError as exc:
            with open(e.path("gpu_samples.log"), "a") as fh:
                fh.write("error: %s\n" % exc.message)
        finally:
            flag.close()

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
        res: Dict[str, Any] = {"t": round(now(), 4)}
        if a.smi:
            try:
                res["stop"] = self.stop_server(a.smi, a.stop_grace, None)
                res["gpu_free"] = self.wait_free(a.smi, a.gpus, a.gpu_free_timeout, a.gpu_free_threshold_mib)
                self.clean = True
            except ToolError as exc:
                res.update(ok=False, error=exc.message)
                common.write_json(os.path.join(self.node_dir, SEQUENCER_START), res)
                raise
        else:
            res["note"] = "no --smi: the first run stops leftovers and waits for free GPUs itself"
        res["ok"] = True
        res["elapsed_s"] = round(now() - res["t"], 4)
        common.write_json(os.path.join(self.node_dir, SEQUENCER_START), res)
        self.save(startup={"ok": True, "clean": self.clean, "elapsed_s": res["elapsed_s"]})

    def hold_marker(self) -> str:
        return os.path.join(queue_dir(self.node_dir), HOLD_PREFIX + self.experiment_id)

    def held(self) -> bool:
        """The driver's interrupt reached the node (its hold marker): no run is claimed or started."""
        return os.path.exists(self.hold_marker())

    def watch_hold(self) -> None:
        """The driver's hold marker acts as its interrupt, at once: SIGTERM to ourselves (the gate cuts a
        load or a benchmark short as for stop.py's signal, faster than the stop playbook reaches us)."""
        def loop() -> None:
            while not self.gate.requested:
                if self.held():
                    common.log("hold marker %s: the driver was interrupted" % self.hold_marker())
                    os.kill(os.getpid(), signal.SIGTERM)
                    return
                time.sleep(0.1)
        threading.Thread(target=loop, name="hold-watch", daemon=True).start()

    def claim(self) -> Optional[Entry]:
        qdir = queue_dir(self.node_dir)
        for name in queued_names(self.node_dir):
            path = os.path.join(qdir, name)
            try:
                data = common.read_json(path)
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
        common.log("queue entry %s refused: %s" % (name, why))
        m = ENTRY_RE.match(name)
        run_dir = os.path.join(self.node_dir, "runs", m.group("run_id")) if m else None
        try:
            os.replace(path, path + ".refused")
        except OSError:
            pass
        if run_dir and os.path.isdir(run_dir):
            t = round(now(), 4)
            common.write_json(os.path.join(run_dir, "done.json"), {
                "ok": False, "status": "failed", "phase": "claimed", "task": TASKS["claimed"],
                "error": "the queue entry was refused: %s" % why, "run_id": m.group("run_id") if m else None,
                "started_at": t, "finished_at": t, "time_to_ready_s": None, "stop_s": None, "time_to_free_s": None})

    def run_entry(self, entry: Entry) -> Optional[str]:
        for stale in ("done.json",):
            try:
                os.remove(entry.path(stale))
            except OSError:
                pass
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
        common.log("run %s: %s" % (entry.run_id, result["status"]))
        return steps.halt

    def serve(self) -> int:
        self.save()
        self.watch_hold()
        try:
            self.startup()
        except ToolError as exc:
            self.save(state="halted", error="startup: " + exc.message)
            common.log("halted at startup: " + exc.message)
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
            if self.a.lease_s > 0 and queued_names(self.node_dir):
                age = lease_age(self.node_dir, self.record["started_at"])
                if age > self.a.lease_s:
                    # the driver died or lost the node: do not spend hours of GPU time on runs nobody
                    # collects; the entries stay queued (a resume resets the queue and queues them again)
                    self.save(state="exited", run_id=None,
                              reason="no sign of the controller for %.0fs (--lease-s %g): queued runs left "
                                     "unclaimed; resume the experiment to run them" % (age, self.a.lease_s))
                    common.log(self.record["reason"])
                    return 0
            if self.held():
                self.save(state="exited", run_id=None, reason="hold marker %s: the driver was interrupted"
                          % self.hold_marker())
                return 0
            entry = self.claim()
            if entry is not None:
                halt = self.run_entry(entry)
                if halt is not None:
                    self.save(state="halted", run_id=None, error=halt)
                    common.log("halted: " + halt)
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
            try:
                with self.gate.armed():
                    time.sleep(POLL_S)
            except Interrupted:
                pass


# ---------------------------------------------------------------------------------------------
# The controller's commands
# ---------------------------------------------------------------------------------------------

@contextlib.contextmanager
def ensure_lock(node_dir: str) -> Iterator[None]:
    """ensure/reset of one node directory, one at a time."""
    fd = os.open(os.path.join(node_dir, ENSURE_LOCK), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def live_record(node_dir: str) -> Optional[Dict[str, Any]]:
    rec = common.load_sequencer(node_dir)
    return rec if common.sequencer_alive(rec) else None


def stop_live(node_dir: str, grace: float) -> Optional[Dict[str, Any]]:
    return common.stop_sequencer(node_dir, grace)


def spawn(a: argparse.Namespace) -> Dict[str, Any]:
    argv = [sys.executable, os.path.abspath(__file__), "--node-dir", a.node_dir, "serve",
            "--experiment-id", a.experiment_id, "--idle-timeout", str(a.idle_timeout),
            "--lease-s", str(a.lease_s),
            "--gpus", a.gpus, "--gpu-free-timeout", str(a.gpu_free_timeout),
            "--gpu-free-threshold-mib", str(a.gpu_free_threshold_mib), "--stop-grace", str(a.stop_grace)]
    if a.smi:
        argv += ["--smi", json.dumps(a.smi)]
    log_path = os.path.join(a.node_dir, SEQUENCER_LOG)
    with open(log_path, "ab") as logf:
        proc = subprocess.Popen(argv, cwd=a.node_dir, stdin=subprocess.DEVNULL, stdout=logf,
                                stderr=subprocess.STDOUT, close_fds=True, start_new_session=True)
    deadline = time.monotonic() + a.stop_grace + a.gpu_free_timeout + 60
    while True:
        rec = None
        try:
            rec = common.load_sequencer(a.node_dir)
        except ToolError:
            pass            # being written
        if rec and rec.get("pid") == proc.pid:
            if rec.get("state") in ("halted", "exited"):
                raise ToolError("the sequencer for %s stopped at startup (%s): %s. Log tail of %s:\n%s"
                                % (a.experiment_id, rec.get("state"), rec.get("error") or rec.get("reason"),
                                   log_path, log_tail(log_path)), {"sequencer": rec})
            if rec.get("startup"):
                return rec
        if proc.poll() is not None:
            raise ToolError("the sequencer exited at once (status %s) without a record. Log tail of %s:\n%s"
                            % (proc.returncode, log_path, log_tail(log_path)))
        if time.monotonic() > deadline:
            raise ToolError("the sequencer (pid %d) did not finish its startup (stop leftovers, GPUs free) "
                            "within %.0fs. Log tail of %s:\n%s" % (proc.pid, a.stop_grace + a.gpu_free_timeout + 60,
                                                                  log_path, log_tail(log_path)))
        time.sleep(POLL_S / 2)


def cmd_ensure(a: argparse.Namespace) -> Dict[str, Any]:
    make_queue_dir(a.node_dir)
    touch_lease(a.node_dir)
    with ensure_lock(a.node_dir):
        # runs will come: an END marker of an earlier session of this experiment no longer holds
        for prefix in (END_PREFIX, HOLD_PREFIX):
            try:
                os.remove(os.path.join(queue_dir(a.node_dir), prefix + a.experiment_id))
            except OSError:
                pass
        rec = live_record(a.node_dir)
        replaced = None
        if rec is not None and rec.get("experiment_id") == a.experiment_id and rec.get("state") in ("running", "idle"):
            return dict(rec, ensured="running")
        if rec is not None:
            # ours (recorded in sequencer.json) but for another experiment, or on its way out
            replaced = stop_live(a.node_dir, a.stop_grace + a.gpu_free_timeout + 30)
        rec = spawn(a)
        out = dict(rec, ensured="started")
        if replaced is not None:
            out["replaced"] = replaced
        return out


def cmd_reset(a: argparse.Namespace) -> Dict[str, Any]:
    make_queue_dir(a.node_dir)
    with ensure_lock(a.node_dir):
        stopped = stop_live(a.node_dir, a.stop_grace + a.gpu_free_timeout + 30)
        removed = []
        qdir = queue_dir(a.node_dir)
        staged = os.path.join(qdir, STAGING_DIR)      # `stage` writes entries here, then renames them in
        for d, prefix in ((qdir, ""), (staged, STAGING_DIR + "/")):
            try:
                names = sorted(os.listdir(d))
            except OSError:
                continue
            for name in names:
                if ENTRY_RE.match(name) or name.startswith((END_PREFIX, HOLD_PREFIX)) or name.endswith(".refused"):
                    try:
                        os.remove(os.path.join(d, name))
                        removed.append(prefix + name)
                    except OSError:
                        pass
        return {"experiment_id": a.experiment_id, "sequencer": stopped, "removed": removed}


def write_end_marker(node_dir: str, experiment_id: str) -> str:
    path = os.path.join(make_queue_dir(node_dir), END_PREFIX + experiment_id)
    atomic_write_text(path, "%s\n" % common.now_iso(), 0o644)
    return path


def cmd_finish(a: argparse.Namespace) -> Dict[str, Any]:
    path = write_end_marker(a.node_dir, a.experiment_id)
    rec = common.load_sequencer(a.node_dir)
    return {"end_marker": path, "sequencer": rec if common.sequencer_alive(rec) else None}


def cmd_stage(a: argparse.Namespace) -> Dict[str, Any]:
    """A batch of runs from one JSON document on stdin (staging.py): their run directories, then their
    entries renamed into queue/ in run order."""
    runs = staging.parse(sys.stdin.read(), a.node_dir, a.experiment_id,
                         lambda data, name: Entry(data, a.node_dir, name))
    qdir = make_queue_dir(a.node_dir)    # (no lease touch: ensure, just before, and every wait give that sign)
    out = dict(staging.stage(runs, qdir, os.path.join(qdir, STAGING_DIR)), experiment_id=a.experiment_id)
    if a.finish:                         # the last runs: no more will come (what `finish` does, after them)
        out["end_marker"] = write_end_marker(a.node_dir, a.experiment_id)
    return out


def pack_runs(node_dir: str, run_ids: Sequence[str], dest: str) -> None:
    """Pack finished runs' directories into the tar `dest`, each under its run id (``<run id>/...``; mode 0600:
    it holds the runs' env files), written aside and renamed into place, for the controller to fetch
    (collect_run.yml: one node call fewer per run, one fetch for every run that was done)."""
    tmp = "%s.%d.tmp" % (dest, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh, tarfile.open(fileobj=fh, mode="w") as tar:
            for run_id in run_ids:
                tar.add(os.path.join(node_dir, "runs", run_id), arcname=run_id)
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def finished_after(node_dir: str, run_ids: Sequence[str]) -> List[str]:
    """The leading runs of `run_ids` (queue order) that have their done.json now: the sequencer wrote nothing
    more into their directories (done.json is a run's last file); stops at the first one without it."""
    out = []
    for run_id in run_ids:
        if not os.path.isfile(os.path.join(node_dir, "runs", run_id, "done.json")):
            break
        out.append(run_id)
    return out


def cmd_wait(a: argparse.Namespace) -> Dict[str, Any]:
    for run_id in a.also:
        if not ENTRY_RE.match("000000-%s.json" % run_id):
            raise UsageError("--also %r is not a run id (<seq>-<arm>)" % run_id)
    result = wait_done(a)
    if a.pack:
        ids = [a.run_id] + finished_after(a.node_dir, [r for r in a.also if r != a.run_id])
        try:
            pack_runs(a.node_dir, ids, a.pack)
        except OSError as exc:
            raise ToolError("run %s is done but its directory could not be packed into %s: %s"
                            % (a.run_id, a.pack, exc), {"run_id": a.run_id})
    return result


def wait_done(a: argparse.Namespace) -> Dict[str, Any]:
    """Until run a.run_id has its done.json (returned verbatim); a ToolError naming the cause when the sequencer
    is gone or halted without it, the entry was refused or never queued, or a.timeout passes."""
    if not ENTRY_RE.match("000000-%s.json" % a.run_id):
        raise UsageError("--run-id %r is not a run id (<seq>-<arm>)" % a.run_id)
    run_dir = os.path.join(a.node_dir, "runs", a.run_id)
    done = os.path.join(run_dir, "done.json")
    touch_lease(a.node_dir)              # the controller is alive, even when the run is long done
    log_path = os.path.join(a.node_dir, SEQUENCER_LOG)
    deadline = time.monotonic() + a.timeout
    missing_entry = 0
    next_check = 0.0

    def read_done() -> Optional[Dict[str, Any]]:
        try:
            return common.read_json(done)
        except (OSError, ValueError):
            return None

    def phase() -> str:
        try:
            with open(os.path.join(run_dir, "phases.jsonl")) as fh:
                lines = [l for l in fh.read().splitlines() if l.strip()]
            return json.loads(lines[-1]).get("phase", "?") if lines else "not claimed yet"
        except (OSError, ValueError):
            return "not claimed yet"

    while True:
        res = read_done()
        if res is not None:
            return common.Verbatim(res)
        if time.monotonic() >= next_check:
            next_check = time.monotonic() + 0.5
            touch_lease(a.node_dir)
            rec = None
            try:
                rec = common.load_sequencer(a.node_dir)
            except ToolError as exc:
                raise ToolError("run %s: %s" % (a.run_id, exc.message))
            alive = common.sequencer_alive(rec)
            if not alive or (rec or {}).get("state") in ("halted", "exited"):
                time.sleep(POLL_S)
                res = read_done()
                if res is not None:
                    return common.Verbatim(res)
                if rec is None:
                    why = "no sequencer was started on this node (no %s)" % common.SEQUENCER_JSON
                else:
                    why = "the sequencer (pid %s, experiment %s) is %s%s" % (
                        rec.get("pid"), rec.get("experiment_id"),
                        rec.get("state") if alive or rec.get("state") in ("halted", "exited")
                        else "gone (it died without recording why: killed?)",
                        ": %s" % (rec.get("error") or rec.get("reason")) if (rec.get("error") or rec.get("reason"))
                        else "")
                raise ToolError("run %s has no done.json (last phase: %s): %s. Last lines of %s:\n%s\n"
                                "Stop what is left with stop.py (it stops the server of ours), then reset the queue "
                                "and enqueue the run again (driver resume)"
                                % (a.run_id, phase(), why, log_path, log_tail(log_path)),
                                {"run_id": a.run_id, "sequencer": rec})
            queued = any(ENTRY_RE.match(n) and n.endswith("-%s.json" % a.run_id) for n in queued_names(a.node_dir))
            claimed = os.path.exists(os.path.join(run_dir, "queue_entry.json"))
            missing_entry = 0 if (queued or claimed) else missing_entry + 1
            refused = [n for n in os.listdir(queue_dir(a.node_dir)) if n.endswith("-%s.json.refused" % a.run_id)] \
                if os.path.isdir(queue_dir(a.node_dir)) else []
            if missing_entry >= 2 and refused:
                raise ToolError("run %s: the sequencer refused its queue entry %s (malformed, or its run directory "
                                "is missing); the reason is in %s:\n%s" % (a.run_id, refused[0], log_path,
                                                                           log_tail(log_path)),
                                {"run_id": a.run_id, "sequencer": rec})
            if missing_entry >= 2:
                raise ToolError("run %s is neither queued (%s) nor claimed (%s): it was never enqueued, or a reset "
                                "removed it; enqueue it again" % (a.run_id, queue_dir(a.node_dir), run_dir),
                                {"run_id": a.run_id, "sequencer": rec})
        if time.monotonic() >= deadline:
            raise ToolError("run %s is not done after %gs (phase %s); raise the wait timeout if the run is just "
                            "long, or look at %s and %s" % (a.run_id, a.timeout, phase(),
                                                            os.path.join(run_dir, "server.log"), log_path),
                            {"run_id": a.run_id})
        time.sleep(POLL_S)


def cmd_serve(a: argparse.Namespace) -> Dict[str, Any]:
    make_queue_dir(a.node_dir)
    fd = os.open(os.path.join(a.node_dir, SERVE_LOCK), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        rec = None
        try:
            rec = common.load_sequencer(a.node_dir)
        except ToolError:
            pass
        raise ToolError("another sequencer holds %s (recorded: pid %s, experiment %s); use `sequence.py ensure` "
                        "(it replaces it) or `stop.py` to stop it" % (os.path.join(a.node_dir, SERVE_LOCK),
                                                                      (rec or {}).get("pid"),
                                                                      (rec or {}).get("experiment_id")))
    common.log("sequencer %d for %s started in %s" % (os.getpid(), a.experiment_id, a.node_dir))
    seq = Sequencer(a)
    try:
        rc = seq.serve()
    except Exception as exc:   # a bug: say so in sequencer.json, so that `wait` can tell the driver
        common.log(traceback.format_exc())
        seq.save(state="halted", error="internal error of the sequencer: %s: %s (traceback in %s)"
                 % (type(exc).__name__, exc, os.path.join(a.node_dir, SEQUENCER_LOG)))
        rc = 1
    common.log("sequencer %d: %s" % (os.getpid(), seq.record.get("state")))
    out = dict(seq.record)
    if rc != 0:
        raise ToolError(str(seq.record.get("error")), out)
    return out


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------

def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="sequence.py", description=__doc__.split("\n")[0])
    p.add_argument("--node-dir", required=True)
    sub = p.add_subparsers(dest="command", required=True)

    def exp(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--experiment-id", required=True)

    def runner_opts(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--idle-timeout", type=float, required=True,
                        help="exit after this many seconds without work (a dead driver never leaves it forever; "
                             "specab_queue_idle_timeout_s)")
        sp.add_argument("--lease-s", type=float, required=True,
                        help="claim no new run when the controller (ensure, wait) gave no sign of life for this "
                             "many seconds: a killed driver never leaves its queued runs burning GPU time "
                             "(0: never; specab_lease_stale_s)")
        sp.add_argument("--smi", default=None, type=lambda s: common.json_list_arg(s, "--smi"),
                        help="nvidia-smi argv (JSON list): at startup, stop leftovers and wait for free GPUs")
        sp.add_argument("--gpus", required=True)
        sp.add_argument("--gpu-free-timeout", type=float, required=True)
        sp.add_argument("--gpu-free-threshold-mib", type=float, required=True,
                        help="startup GPU check: a GPU is free at most this many MiB used (enqueue.yml passes the "
                             "inventory's specab_gpu_free_threshold_mib; each run's own checks use its entry's)")
        sp.add_argument("--stop-grace", type=float, required=True)

    for name in ("ensure", "serve"):
        sp = sub.add_parser(name)
        exp(sp)
        runner_opts(sp)
    sp = sub.add_parser("reset")
    exp(sp)
    sp.add_argument("--stop-grace", type=float, required=True)
    sp.add_argument("--gpu-free-timeout", type=float, required=True)
    sp = sub.add_parser("wait")
    sp.add_argument("--run-id", required=True)
    sp.add_argument("--timeout", type=float, required=True)
    sp.add_argument("--pack", metavar="TAR",
                    help="once the run is done, pack its directory into this tar (mode 0600, members <run id>/...) "
                         "for the controller")
    sp.add_argument("--also", action="append", default=[], metavar="RUN_ID",
                    help="with --pack: also pack these later runs (queue order) that are done by then, up to the "
                         "first one that is not (one fetch for every finished run)")
    sp = sub.add_parser("finish")
    exp(sp)
    sp = sub.add_parser("stage", help="read a batch of runs (JSON, specab/node/README.md) on stdin: write their run "
                                      "directories, then queue their entries in run order")
    exp(sp)
    sp.add_argument("--finish", action="store_true",
                    help="then write the END marker, as `finish` does: these are the experiment's last runs")
    a = p.parse_args(argv)
    a.node_dir = os.path.abspath(os.path.expanduser(a.node_dir))
    if getattr(a, "experiment_id", None) is not None and not ID_RE.match(a.experiment_id):
        p.error("--experiment-id must match [A-Za-z0-9][A-Za-z0-9._-]*, got %r" % a.experiment_id)
    return a


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    a = parse_args(argv)
    os.makedirs(a.node_dir, exist_ok=True)
    commands: Dict[str, Callable[[argparse.Namespace], Dict[str, Any]]] = {
        "ensure": cmd_ensure, "reset": cmd_reset, "wait": cmd_wait, "finish": cmd_finish, "serve": cmd_serve,
        "stage": cmd_stage}
    return commands[a.command](a)


if __name__ == "__main__":
    sys.exit(common.run_tool(main))
