#!/usr/bin/env python3
"""Wait until the server answers /health_generate (fallback /health), failing fast.

    ready.py --url http://H:P --pid N --log R/server.log --timeout S
             [--phases-out F] [--progress F] [--interval 0.2]

Fails within about a second (not at the timeout) when the server process exits or a fatal line
appears in its log (out of memory, unrecognized arguments, Address already in use, a failed child;
a Python traceback followed by log silence), quoting the fatal line and the log tail. Reports the
load phases parsed from SGLang's log (weights, CUDA graphs, ready line) with their timestamps; where
the engine logs ``Engine startup timings (s): ...`` (SGLang 0.5.17) the weight-load and graph-capture
durations come from that line (10 ms, not whole-second timestamps) and it is kept as ``startup_timings``.
``--progress F`` is rewritten with the current phase as one JSON line while waiting.
"""
from __future__ import annotations

import contextlib
import json
import re
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from specab.node import cli, osutil, procfs
from specab.node.cli import ToolError
from specab.vocab import contract, engines

# SGLang's log prefix: "[2025-10-22 10:27:57 TP0] message" (the rank part is optional).
LINE_RE = re.compile(r"^\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:\.\d+)?(?P<rank>[^\]]*)\]\s?(?P<msg>.*)$")

# (phase key, message prefix, "first" or "last" occurrence wins across ranks / draft model)
PHASE_MARKERS: Tuple[Tuple[str, str, str], ...] = tuple((ll.key, ll.needle, ll.which) for ll in contract.LOAD_LINES)

# Lines that mean the launch failed, whatever the process does next.
FATAL_RES = contract.FATAL_LINES
FATAL_SETTLE_S = 1.0
TRACEBACK_RE = contract.TRACEBACK_RE
EXC_LINE_RE = re.compile(r"^(?:\[[^\]]*\]\s*)?[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)\b:?.*$")
# vLLM prefixes every line of its processes: "(Worker pid=29030) ERROR 12-01 05:03:35 [multiproc_executor.py:1063] "
VLLM_PREFIX_RE = re.compile(r"^\([\w:.-]+ pid=\d+\) [A-Z]+ \d\d-\d\d [\d:]+ \[[^\]]*\] ")


@dataclass
class ReadySpec:
    """One readiness wait: the server's URL, its main pid and log, the time it has."""
    url: str
    pid: int
    log: str
    timeout: float
    interval: float = 0.2
    traceback_grace: float = cli.arg("a Python traceback followed by this many seconds of log silence (server not "
                                        "ready, no further line) counts as fatal", default=60.0)
    phases_out: Optional[str] = cli.arg("ready.json", default=None)
    progress: Optional[str] = cli.arg("ready_progress.json", default=None)


def parse_args(argv: Optional[Sequence[str]]) -> ReadySpec:
    return cli.parse_spec(ReadySpec, argv, "ready.py", __doc__)


def log_ts_to_epoch(ts: str) -> Optional[float]:
    """SGLang logs local time without a zone; the node tool runs on the same host."""
    try:
        return time.mktime(time.strptime(ts, "%Y-%m-%d %H:%M:%S"))
    except (ValueError, OverflowError):
        return None


class LogWatcher(object):
    """Incrementally reads the server log; tracks phases, fatal lines and the tail."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""
        self.phases: Dict[str, Dict[str, Any]] = {}
        self.fatals: List[Tuple[int, str, str]] = []  # (priority, kind, line)
        self.fatal_at: Optional[float] = None
        self.traceback_at: Optional[float] = None
        self.exception_line: Optional[str] = None
        self.exception_lines: List[str] = []
        self.tail: List[str] = []
        self.startup_timings: Optional[Dict[str, Any]] = None
        self.last_line_at = time.monotonic()
        self.polls = 0

    def poll(self) -> None:
        self.polls += 1
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except OSError:
            return
        if not data:
            return
        self.offset += len(data)
        data = self.partial + data
        parts = data.split(b"\n")
        self.partial = parts.pop()
        for raw in parts:
            self.feed(raw.decode("utf-8", "replace").rstrip("\r"))

    def flush(self) -> None:
        """Treat an unterminated last line as complete (the process has exited)."""
        self.poll()
        if self.partial:
            self.feed(self.partial.decode("utf-8", "replace"))
            self.partial = b""

    def feed(self, line: str) -> None:
        self.last_line_at = time.monotonic()
        self.tail.append(line)
        if len(self.tail) > 40:
            del self.tail[:-40]
        m = LINE_RE.match(line)
        msg = m.group("msg") if m else line
        for key, prefix, which in PHASE_MARKERS:
            if msg.startswith(prefix):
                if which == "first" and key in self.phases:
                    continue
                self.phases[key] = {"log_time": m.group("ts") if m else None,
                                    "t": log_ts_to_epoch(m.group("ts")) if m else None,
                                    "seen_at": round(time.time(), 3), "live": self.polls > 1,
                                    "rank": (m.group("rank").strip() or None) if m else None}
        if self.startup_timings is None:
            self.startup_timings = engines.parse_startup_timings(msg)
        for prio, (kind, rx) in enumerate(FATAL_RES):
            if rx.search(line):
                self.fatals.append((prio, kind, line.strip()))
                if self.fatal_at is None:
                    self.fatal_at = time.monotonic()
                break
        if TRACEBACK_RE.search(line) and self.traceback_at is None:
            self.traceback_at = time.monotonic()
        elif self.traceback_at is not None and EXC_LINE_RE.match(VLLM_PREFIX_RE.sub("", line.strip())):
            self.exception_line = line.strip()
            if len(self.exception_lines) < 50:
                self.exception_lines.append(self.exception_line)

    def root_cause_line(self) -> Optional[str]:
        """The exception line that names the cause: the first one that is not an engine's report of another
        process's death (vLLM's API server logs EngineDeadError; its worker logged the cause, in either order)."""
        return next((line for line in self.exception_lines if not any(c in line for c in engines.CONSEQUENCE_ERRORS)),
                    self.exception_lines[0] if self.exception_lines else None)

    def phase(self) -> str:
        p = self.phases
        if "ready_line" in p:
            return "ready line logged"
        if ("capture_cuda_graph_begin" in p and "capture_cuda_graph_end" not in p) or \
                ("capture_draft_cuda_graph_begin" in p and "capture_draft_cuda_graph_end" not in p):
            return "capturing graphs"
        if "capture_cuda_graph_end" in p:
            return "graphs captured"
        if "load_weight_begin" in p and "load_weight_end" not in p:
            return "loading weights"
        if "load_weight_end" in p:
            return "weights loaded"
        return "starting"

    def durations(self, observed: bool = False) -> Dict[str, Optional[float]]:
        """Phase spans from the log's timestamps (whole seconds: SGLang's datefmt), the weight load and the
        target's graph capture from the engine's startup-timings line where it logged one; or with
        ``observed`` from when this tool read the lines (0.2 s polling; None unless both lines
        arrived while it was watching, i.e. not in its first read of the log)."""
        def span(a: str, b: str) -> Optional[float]:
            pa, pb = self.phases.get(a, {}), self.phases.get(b, {})
            if observed:
                if not (pa.get("live") and pb.get("live")):
                    return None
                ta, tb = pa.get("seen_at"), pb.get("seen_at")
            else:
                ta, tb = pa.get("t"), pb.get("t")
            return None if ta is None or tb is None else round(tb - ta, 3)
        out = {"load_weights_s": span("load_weight_begin", "load_weight_end"),
               "capture_cuda_graph_s": span("capture_cuda_graph_begin", "capture_cuda_graph_end"),
               "weights_to_ready_s": span("load_weight_begin", "ready_line")}
        if not observed and self.startup_timings:
            out.update(engines.startup_durations(self.startup_timings))
        return out

    def durations_source(self) -> Dict[str, str]:
        """Where each of ``durations()`` comes from: ``startup_timings`` (the engine's own line) or ``log_lines``."""
        own = engines.startup_durations(self.startup_timings) if self.startup_timings else {}
        return {k: "startup_timings" if k in own else "log_lines" for k in self.durations()}

    @property
    def fatal(self) -> Optional[Tuple[str, str]]:
        """The most specific fatal line seen: (kind, line); FATAL_RES order is the priority."""
        if not self.fatals:
            return None
        _, kind, line = min(self.fatals, key=lambda f: f[0])
        return kind, line

    def best_fatal_line(self) -> Optional[str]:
        if self.fatal:
            return self.fatal[1]
        if self.exception_line:
            return self.exception_line
        return None


def probe(base: str, path: str, timeout: float) -> Tuple[Optional[int], str]:
    """HTTP status of GET base+path (None when nothing answers) and a short note."""
    try:
        with urllib.request.urlopen(base + path, timeout=timeout) as resp:
            return resp.status, "ok"
    except urllib.error.HTTPError as exc:
        return exc.code, "HTTP %d" % exc.code
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return None, str(reason)


def probe_generation(base: str, timeout: float) -> Tuple[bool, str]:
    """One real generation over the OpenAI completions API: (ok, note). A 20-word prompt and 8 tokens, enough to
    exercise prefill, decode and speculative verification: on the real EAGLE-3 vLLM that could not serve, a 3-word,
    2-token request still succeeded and the next longer one killed the engine (tests/real_engine). The model name
    comes from /v1/models (vLLM refuses an unknown one)."""
    body: Dict[str, Any] = {"prompt": " ".join("w%d" % i for i in range(1, 21)), "max_tokens": 8,
                            "temperature": 0, "ignore_eos": True}
    with contextlib.suppress(urllib.error.URLError, OSError, ValueError):
        with urllib.request.urlopen(base + "/v1/models", timeout=timeout) as resp:
            models = json.loads(resp.read().decode("utf-8")).get("data") or []
        if models:
            body["model"] = models[0].get("id")
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            answer = json.loads(resp.read().decode("utf-8"))
    except urllib.error.HTTPError as exc:
        text = exc.read().decode("utf-8", "replace")[:300]
        return False, "POST /v1/completions answered HTTP %d %s" % (exc.code, text.strip())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return False, "POST /v1/completions failed: %s" % (getattr(exc, "reason", exc),)
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not choices:
        return False, "POST /v1/completions answered no choices: %s" % json.dumps(answer)[:300]
    usage = answer.get("usage") or {}
    return True, "POST /v1/completions generated %s token(s)" % usage.get("completion_tokens", "?")


def write_progress(path: Optional[str], phase: str, t0: float, watcher: LogWatcher) -> None:
    if not path:
        return
    last = contract.redact_text(watcher.tail[-1])[:240] if watcher.tail else ""
    osutil.write_text(path, json.dumps({"phase": phase, "t": round(time.time(), 3),
                                        "elapsed_s": round(time.monotonic() - t0, 3), "last_log_line": last}) + "\n")


def tail_text(watcher: LogWatcher, n: int = 15) -> str:
    return "\n".join(contract.redact_text(l) for l in watcher.tail[-n:])


class _Wait:
    """One wait for readiness: the server's log watched from the start, the result built so far."""

    def __init__(self, a: ReadySpec) -> None:
        self.a = a
        self.watcher = LogWatcher(a.log)
        self.t0 = time.monotonic()
        self.out: Dict[str, Any] = {"url": a.url.rstrip("/"), "pid": a.pid, "log": a.log}

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def fail(self, msg: str) -> ToolError:
        watcher, out = self.watcher, self.out
        watcher.flush()
        out.update(ready=False, phase=watcher.phase(), phases=watcher.phases, durations=watcher.durations(),
                   durations_source=watcher.durations_source(), startup_timings=watcher.startup_timings,
                   elapsed_s=round(self.elapsed(), 3), fatal_line=contract.redact_text(
                       watcher.best_fatal_line() or "") or None, log_tail=watcher.tail[-15:])
        out["log_tail"] = [contract.redact_text(l) for l in out["log_tail"]]
        write_progress(self.a.progress, "failed", self.t0, watcher)
        return ToolError(msg, out)

    def check_alive(self) -> None:
        """Raises when the log says the server failed to start, or its process exited."""
        a, watcher = self.a, self.watcher
        if watcher.fatal is not None and (time.monotonic() - (watcher.fatal_at or 0) >= FATAL_SETTLE_S
                                          or not procfs.is_alive(a.pid)):
            # a short settle: "Scheduler hit an exception" comes before the line naming the cause
            watcher.flush()
            kind, line = watcher.fatal
            raise self.fail("the server failed to start (%s) after %.1fs: %r. Log tail of %s:\n%s"
                            % (kind, self.elapsed(), contract.redact_text(line), a.log, tail_text(watcher)))
        if not procfs.is_alive(a.pid):
            watcher.flush()
            fatal = watcher.best_fatal_line()
            raise self.fail("the server process %d exited before it was ready (after %.1fs, phase %r)%s. "
                            "Log tail of %s:\n%s"
                            % (a.pid, self.elapsed(), watcher.phase(),
                               ": %r" % contract.redact_text(fatal) if fatal else "", a.log, tail_text(watcher)))

    def check_generation(self, left: float) -> None:
        """/health alone is not readiness: a real vLLM answered 200 while its engine could not serve one request
        (the facts of real engines on CPU). Proves one real generation, else raises with the cause the log names."""
        watcher = self.watcher
        ok, why = probe_generation(self.out["url"], max(5.0, min(60.0, left)))
        if not ok:
            settle = time.monotonic() + FATAL_SETTLE_S + 2.0
            while time.monotonic() < settle and watcher.fatal is None:
                watcher.poll()
                time.sleep(0.1)
            watcher.poll()
            # the exception the engine logged names the cause better than a generic fatal line
            fatal = watcher.root_cause_line() or watcher.best_fatal_line()
            error = self.fail("the server answered /health 200 after %.1fs but could not generate: %s%s. "
                              "Log tail of %s:\n%s"
                              % (self.elapsed(), why, "; the log says: %r" % contract.redact_text(fatal) if fatal
                                 else "", self.a.log, tail_text(watcher)))
            if fatal:
                error.result["fatal_line"] = contract.redact_text(fatal)
            raise error
        self.out["generation_check"] = why

    def ready(self, endpoint: str) -> Dict[str, Any]:
        watcher = self.watcher
        watcher.poll()
        self.out.update(ready=True, endpoint=endpoint, elapsed_s=round(self.elapsed(), 3),
                        ready_at=round(time.time(), 3), phase="ready", phases=watcher.phases,
                        durations=watcher.durations(), durations_source=watcher.durations_source(),
                        startup_timings=watcher.startup_timings, durations_observed=watcher.durations(observed=True))
        if watcher.traceback_at is not None:
            self.out["warning"] = "a Traceback appeared in the log before readiness: %r" % (
                watcher.exception_line or "Traceback")
        write_progress(self.a.progress, "ready", self.t0, watcher)
        return self.out


def wait_ready(a: ReadySpec) -> Dict[str, Any]:
    w = _Wait(a)
    base, watcher, t0 = w.out["url"], w.watcher, w.t0
    deadline = t0 + a.timeout
    endpoint = "/health_generate"
    last_phase = None
    last_progress = 0.0
    last_note = ""
    while True:
        watcher.poll()
        phase = watcher.phase()
        if phase != last_phase or time.monotonic() - last_progress > 1.0:
            write_progress(a.progress, phase, t0, watcher)
            if phase != last_phase:
                cli.log("phase: %s (%.1fs)" % (phase, time.monotonic() - t0))
            last_phase, last_progress = phase, time.monotonic()
        w.check_alive()
        left = deadline - time.monotonic()
        status, note = probe(base, endpoint, max(0.5, min(5.0, left)))
        if status == 404 and endpoint == "/health_generate":
            endpoint = "/health"
            status, note = probe(base, endpoint, max(0.5, min(5.0, left)))
        last_note = note
        if status == 200 and endpoint == "/health":
            w.check_generation(left)
        if status == 200:
            return w.ready(endpoint)
        if watcher.traceback_at is not None and time.monotonic() - watcher.last_line_at > a.traceback_grace:
            raise w.fail("the server logged a Python traceback, then nothing for %gs, and is not ready: %r. "
                         "Log tail of %s:\n%s" % (a.traceback_grace, contract.redact_text(
                             watcher.exception_line or "Traceback"), a.log, tail_text(watcher)))
        if time.monotonic() >= deadline:
            raise w.fail("the server was not ready after %gs (phase %r, last health answer: %s; raise "
                         "timeouts.ready_s if loading is just slow). Log tail of %s:\n%s"
                         % (a.timeout, watcher.phase(), last_note, a.log, tail_text(watcher)))
        time.sleep(max(0.0, min(a.interval, deadline - time.monotonic())))


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    a = parse_args(argv)
    return cli.recorded(a.phases_out, lambda: wait_ready(a))


if __name__ == "__main__":
    sys.exit(cli.run_tool(main))
