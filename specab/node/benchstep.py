#!/usr/bin/env python3
"""The bench step of one run, the same on both paths (the bench role's one tool call, and the run queue's
RunSteps): the GPUs sampled once (gpu_before.csv) -> the GPU sampler running (gpu_samples.csv/.json/.log) -> the
load generator (bench.jsonl, bench_summary.json, phase_metrics.json) -> the sampler told to stop -> the GPUs
sampled once more (gpu_after.csv) -> with a ``score`` spec (a baseline run at temperature > 0), its server scores
the outputs of the runs the spec names (scoring.py: scores.jsonl) -> the summary.

    python3 <root>/specab/node bench --spec-json -      (the spec, a BenchSpec, as JSON on stdin)

The client and the sampler are processes started ahead (``Deferred``: their modules imported, waiting for one line
on stdin), so the run queue starts them while the engine loads and releases them when the server is ready; the
tool starts and releases them at once. A measured request that failed is a ToolError (exit 1) whose message
gives the failed and measured requests, the first error and the client's last log line; the sampler is stopped
in every case. stdlib only, like every node tool; imports its siblings.
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
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Dict, List, Mapping, Optional, Sequence

from specab.node import cli, gpusample, loadgen, osutil, ownership, scoring
from specab.node.cli import ToolError, UsageError
from specab.vocab import contract

# How often the client's bench.jsonl and exit are polled (a phase change or the last request is seen this late).
CLIENT_POLL_S = 0.05
# The client starts once the sampler has written its CSV header (its signal handlers are in place by then): a short
# benchmark could otherwise end, and TERM the sampler, while the sampler is still importing. Polled this often, for
# at most this long (a sampler that never writes one is reported in gpu_samples.log, the benchmark still runs).
SAMPLER_HEADER_POLL_S = 0.005
SAMPLER_HEADER_WAIT_S = 10.0

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


@dataclass
class BenchSpec:
    """One run's bench step. ``bench``: the resolved bench settings (every key of ``loadgen.BENCH_KEYS``, and
    ``model`` and ``dataset`` (a node path) when given), as the controller resolves them
    (``specab.config.defaults.bench``: the experiment's and the arm's ``bench:`` over roles/specab's defaults)."""
    run_dir: str
    url: str
    python: str                     # the interpreter of the client and the sampler
    smi: List[str]                  # nvidia-smi argv
    gpus: Any                       # "all", "0,1" or a list of indices: the GPUs sampled
    sample_interval_s: float
    bench: Dict[str, Any]
    # a baseline run at temperature > 0: the runs whose outputs its server scores after the measured window
    # (scoring.check_spec: engine, experiment_id, runs); None: no scoring
    score: Optional[Dict[str, Any]] = None

    def __post_init__(self) -> None:
        if isinstance(self.gpus, (list, tuple)):
            self.gpus = ",".join(str(g) for g in self.gpus)
        self.gpus = str(self.gpus)
        if not isinstance(self.smi, list) or not self.smi or not all(isinstance(w, str) for w in self.smi):
            raise UsageError("smi must be a non-empty list of strings, got %r" % (self.smi,))
        if not isinstance(self.bench, dict):
            raise UsageError("bench must be a mapping of the resolved bench settings, got %r" % (self.bench,))
        self.sample_interval_s = float(self.sample_interval_s)
        if self.sample_interval_s <= 0:
            raise UsageError("sample_interval_s must be > 0, got %r" % self.sample_interval_s)
        self.score = self.score or None             # {}: none (as a playbook passes it)
        if self.score is not None:
            try:
                scoring.check_spec(self.score)
            except ValueError as exc:
                raise UsageError(str(exc))

    def path(self, name: str) -> str:
        return os.path.join(self.run_dir, name)

    def client_config(self) -> loadgen.BenchConfig:
        """The client's settings; settings it would refuse are a usage error here, before anything runs."""
        try:
            return loadgen.BenchConfig.from_settings(self.url, self.bench, out=self.path("bench.jsonl"),
                                                     summary=self.path("bench_summary.json"),
                                                     phase_metrics=self.path("phase_metrics.json"))
        except loadgen.UsageError as exc:
            raise UsageError(str(exc))


# ---------------------------------------------------------------------------------------------
# Helper processes: the client and the sampler, started ahead, released by one line
# ---------------------------------------------------------------------------------------------

class Deferred(object):
    """``python -c DEFERRED ROOT TOOL``: imports the tool's module, then waits for its job. ``stderr``: None
    (the caller's stderr) or subprocess.PIPE (read by the caller)."""

    def __init__(self, python: str, module: str, env: Mapping[str, str], stderr: Optional[int] = None) -> None:
        self.module = module
        self.proc = subprocess.Popen([python, "-c", DEFERRED, cli.PACKAGE_ROOT, module],
                                     stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=stderr, env=dict(env),
                                     close_fds=True, cwd=cli.PACKAGE_ROOT)
        self.released = False

    def release(self, argv: List[str], cwd: str, stdout: Optional[str] = None, stderr: Optional[str] = None) -> None:
        job = {"argv": argv, "cwd": cwd, "stdout": stdout, "stderr": stderr}
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps(job) + "\n").encode())
            self.proc.stdin.close()
        except OSError as exc:
            raise ToolError("the %s process (pid %d) died before it was given its job (%s); see its log"
                            % (self.module, self.proc.pid, exc))
        self.released = True

    def discard(self) -> None:
        """Never released: close its stdin (it exits at once); kill it if it does not."""
        if self.proc.poll() is None and not self.released:
            with contextlib.suppress(OSError):
                assert self.proc.stdin is not None
                self.proc.stdin.close()
        self.finish(term_after=2.0)

    def signal(self, sig: int) -> None:
        if self.released and self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.send_signal(sig)

    def finish(self, term_after: float) -> Optional[int]:
        """Wait up to ``term_after`` s, then SIGTERM, then SIGKILL; return the exit status."""
        for sig, wait in ((None, term_after), (signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
            if sig is not None and self.proc.poll() is None:
                with contextlib.suppress(OSError):
                    self.proc.send_signal(sig)
            try:
                return self.proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
        return self.proc.poll()


class LastLine(object):
    """Copies a pipe to our stderr line by line, keeping its last non-empty line (the client's log line that a
    failure quotes)."""

    def __init__(self, pipe: Any) -> None:
        self.last = ""
        self.thread = threading.Thread(target=self._copy, args=(pipe,), daemon=True)
        self.thread.start()

    def _copy(self, pipe: Any) -> None:
        for raw in iter(pipe.readline, b""):
            sys.stderr.write(raw.decode("utf-8", "replace"))
            sys.stderr.flush()
            if raw.strip():
                self.last = raw.decode("utf-8", "replace").strip()
        pipe.close()

    def text(self) -> str:
        self.thread.join(timeout=5)
        return contract.redact_text(self.last)


def one_sample(spec: BenchSpec, name: str) -> None:
    """One GPU sample into ``name`` (gpu_before.csv / gpu_after.csv), in this process; a failure is noted in
    gpu_samples.log (the benchmark does not depend on it)."""
    flag = gpusample.StopFlag(install=False)
    try:
        gpusample.sample(gpusample.SampleSpec(smi=list(spec.smi), gpus=spec.gpus, count=1,
                                              interval=spec.sample_interval_s, out=spec.path(name)), flag)
    except ToolError as exc:
        with open(spec.path("gpu_samples.log"), "a") as fh:
            fh.write("error: %s\n" % exc.message)
    finally:
        flag.close()


# ---------------------------------------------------------------------------------------------
# The step
# ---------------------------------------------------------------------------------------------

class BenchStep(object):
    """The bench step of one run, in parts for the run queue (``start_ahead`` while the engine loads,
    ``sample_before`` while the environment is checked, ``run`` once the server is ready, ``drop`` and
    ``wait_sampler`` in the teardown) and whole for the tool (``bench``).

    ``client_log``: where the client's stderr goes, as a failure names it (e.g. "sequencer.log"); None: the
    client's stderr is copied to ours and a failure quotes its last line.

    The client and the sampler are recorded in the run directory's helpers.json (``ownership.record_helpers``) while
    they may run, and ``own_process`` records this process too (the tool, whose owner, a playbook, may be cut off
    by the driver's Ctrl-C: the stop then ends them, ``stop.end_helpers``); the record goes once they are gone."""

    def __init__(self, spec: BenchSpec, env: Mapping[str, str], client_log: Optional[str] = None,
                 own_process: bool = False) -> None:
        self.spec = spec
        self.env = dict(env)
        self.client_log = client_log
        self.own_process = own_process
        self.config = spec.client_config()
        self.client: Optional[Deferred] = None
        self.sampler: Optional[Deferred] = None
        self.client_stderr: Optional[LastLine] = None
        self.before: Optional[threading.Thread] = None
        self.after: Optional[threading.Thread] = None
        self.client_grace = 0.0          # seconds the released client may take to exit on its own

    # -- parts ----------------------------------------------------------------------------

    def start_ahead(self) -> None:
        """The client and the sampler as processes that import their modules and wait for their job."""
        self.client = Deferred(self.spec.python, "loadgen", self.env,
                               stderr=subprocess.PIPE if self.client_log is None else None)
        if self.client_log is None:
            self.client_stderr = LastLine(self.client.proc.stderr)
        self.sampler = Deferred(self.spec.python, "gpusample", self.env)
        ownership.record_helpers(self.spec.run_dir, ([("bench", os.getpid())] if self.own_process else [])
                              + [("loadgen", self.client.proc.pid), ("gpusample", self.sampler.proc.pid)])

    def sample_before(self) -> None:
        """gpu_before.csv (one nvidia-smi call), in a thread: joined before the client starts."""
        self.before = threading.Thread(target=one_sample, args=(self.spec, "gpu_before.csv"), daemon=True)
        self.before.start()

    def run(self, on_phase: Callable[[str], None] = lambda phase: None,
            guard: Callable[[], ContextManager[Any]] = contextlib.nullcontext,
            on_released: Callable[[], None] = lambda: None) -> Dict[str, Any]:
        """Release the sampler, then the client; wait for the client; tell the sampler to stop; gpu_after.csv.
        ``on_phase``: "warming up" at once, "benchmarking" once the warm-up requests are answered; ``guard``: the
        context of the wait for the client (the queue's signal gate); ``on_released``: called once both run.
        Returns the summary; raises ToolError when the client failed."""
        s, cfg = self.spec, self.config
        on_phase("warming up")
        if self.client is None or self.sampler is None:
            self.start_ahead()
        assert self.client is not None and self.sampler is not None
        if self.before is None:
            self.sample_before()
        assert self.before is not None
        self.before.join(timeout=60)     # gpu_before.csv is taken before the client starts
        self.sampler.release(["--smi", json.dumps(s.smi), "--gpus", s.gpus, "--interval", str(s.sample_interval_s),
                              "--out", "gpu_samples.csv"],
                             s.run_dir, stdout=s.path("gpu_samples.json"), stderr=s.path("gpu_samples.log"))
        self.wait_sampler_header()
        self.client.release(cfg.to_argv(), s.run_dir)
        on_released()
        try:
            with guard():
                rc = self.wait_client(cfg.warmup, cfg.warmup + cfg.num_requests, on_phase)
        finally:
            self.signal_sampler()         # it exits on its own; waited for in wait_sampler
        if self.after is None:
            self.take_after()
        assert self.after is not None
        self.after.join(timeout=60)
        summary: Dict[str, Any] = osutil.json_or_none(s.path("bench_summary.json")) or {}
        if rc != 0:
            errors = summary.get("errors") or []
            log = self.client_log if self.client_log is not None else (
                self.client_stderr.text() if self.client_stderr is not None else "")
            raise ToolError("loadgen exit %s: %s of %s measured requests failed; first errors: %s. Client log: %s"
                            % (rc, summary.get("failed", "?"), summary.get("requests", "?"),
                               errors[0] if errors else "", log), {"summary": summary})
        if s.score is not None and cfg.temperature > 0:
            with guard():           # after the measured window and the samples: cut short by an interrupt
                scoring.score(s.score, s.run_dir, cfg.url, summary.get("model") or cfg.model, cfg.timeout,
                              cli.log)
        return summary

    def wait_sampler_header(self) -> None:
        assert self.sampler is not None
        path = self.spec.path("gpu_samples.csv")
        deadline = time.monotonic() + SAMPLER_HEADER_WAIT_S
        while time.monotonic() < deadline and self.sampler.proc.poll() is None:
            with contextlib.suppress(OSError):
                if os.path.getsize(path) > 0:
                    return
            time.sleep(SAMPLER_HEADER_POLL_S)

    def wait_client(self, warmup: int, total: int, on_phase: Callable[[str], None]) -> int:
        """Poll the client; from its bench.jsonl lines: the end of the warm-up (phase "benchmarking") and the end
        of the last request (gpu_after.csv starts while it exits)."""
        assert self.client is not None
        path = self.spec.path("bench.jsonl")
        warm_seen = lines = offset = 0
        measuring = warmup <= 0
        if measuring:
            on_phase("benchmarking")
        while True:
            rc = self.client.proc.poll()
            with contextlib.suppress(OSError):
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
            if not measuring and (warm_seen >= warmup or rc is not None):
                measuring = True
                on_phase("benchmarking")
            if lines >= total and self.after is None:
                self.take_after()
            if rc is not None:
                return rc
            time.sleep(CLIENT_POLL_S)

    def take_after(self) -> None:
        """gpu_after.csv: the GPUs after the last request, the server still up (one nvidia-smi call)."""
        self.after = threading.Thread(target=one_sample, args=(self.spec, "gpu_after.csv"), daemon=True)
        self.after.start()

    def complete(self) -> bool:
        """Whether bench.jsonl holds an answered (ok) record for every measured request."""
        want = int(self.config.num_requests)
        try:
            ok = {rec.get("i") for rec in scoring.measured_records(self.spec.run_dir)}
        except OSError:
            return False
        return want > 0 and len(ok) >= want

    def signal_sampler(self) -> None:
        if self.sampler is not None:
            self.sampler.signal(signal.SIGTERM)

    def drop(self) -> None:
        """After the benchmark (or a failure): the client must be gone before the server stops; the sampler is
        told to stop (waited for in ``wait_sampler``)."""
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
        """The sampler's exit waited for; once the client has exited too, their record goes."""
        if self.sampler is not None and self.sampler.released:
            self.sampler.finish(term_after=10.0)
        helpers = [d.proc for d in (self.client, self.sampler) if d is not None]
        if helpers and all(p.poll() is not None for p in helpers):
            ownership.forget_helpers(self.spec.run_dir)

    # -- whole ----------------------------------------------------------------------------

    def bench(self) -> Dict[str, Any]:
        """Every part in one call (the tool): the summary, or a ToolError; the helpers are gone either way."""
        try:
            summary = self.run()
        finally:
            self.drop()
            self.wait_sampler()
        return summary


def bench(spec: BenchSpec, env: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
    """The bench step as the role runs it: ``{"summary": bench_summary.json, "run_dir": ...}``."""
    step = BenchStep(spec, os.environ if env is None else env, own_process=True)
    return {"summary": step.bench(), "run_dir": spec.run_dir}


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    spec = cli.spec_from_argv(BenchSpec, argv)
    if spec is None:
        raise UsageError("bench takes its spec as JSON: bench --spec-json TEXT|- (the keys of BenchSpec)")
    try:
        spec.client_config().validate()
    except loadgen.UsageError as exc:
        raise UsageError(str(exc))
    return bench(spec)


if __name__ == "__main__":
    sys.exit(cli.run_tool(main))
