"""Where the test suite's wall time goes: which modules compute and which wait (how tests/conftest.py's lanes
were chosen).

As a pytest plugin it records every test's start and end (each xdist worker its own file) and, in the
controlling process, the machine's busy CPU (/proc/stat, every second) into SPECAB_TIMELINE_DIR:

    SPECAB_TIMELINE_DIR=/tmp/tl PYTHONPATH=scripts make test PYTEST_ARGS='-p suite_timeline'

Then the report: per module its wall time, its worker's CPU (the worker and the children it reaped: the nodes'
own daemons are not counted), the machine's busy cores while it ran (of all cores), when it started and ended,
and the busy cores minute by minute:

    .venv/bin/python scripts/suite_timeline.py /tmp/tl [--top 40]

A module that keeps the machine ~1 core busy of 2 while its worker's CPU is a fraction of its wall time mostly
waits (simulated time, readiness and stop polling): it belongs in the waiting lane (WAITING_MODULES).
Stdlib only; Linux (/proc/stat).
"""
from __future__ import annotations

import argparse
import json
import os
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pytest

DIR_VAR = "SPECAB_TIMELINE_DIR"
STAT_FILE = "stat.jsonl"
SAMPLE_S = 1.0


def _cpu_s() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _busy_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot: user nice system idle iowait irq softirq steal."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    busy = fields[0] + fields[1] + fields[2] + fields[5] + fields[6] + fields[7]
    return busy, sum(fields)


# --------------------------------------------------------------------------------------------- the plugin
class _Recorder:
    """Registered as a plugin of its own by pytest_configure (one per process: the controller, each worker)."""

    def __init__(self, out: Path, worker: str, *, tests: bool) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self._tests: IO[str] | None = (out / f"tests-{worker}.jsonl").open("a", buffering=1) if tests else None
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None
        if worker == "main":
            self._sampler = threading.Thread(target=self._sample, args=(out / STAT_FILE,), daemon=True)
            self._sampler.start()

    def _sample(self, path: Path) -> None:
        with path.open("a", buffering=1) as f:
            while True:
                busy, total = _busy_jiffies()
                f.write(json.dumps({"t": time.time(), "busy": busy, "total": total, "cores": os.cpu_count()}) + "\n")
                if self._stop.wait(SAMPLE_S):
                    return

    def _event(self, ev: str, nodeid: str) -> None:
        if self._tests is None:
            return
        self._tests.write(json.dumps({"ev": ev, "id": nodeid, "t": time.time(), "cpu": _cpu_s()}) + "\n")

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self._event("start", nodeid)

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        self._event("end", nodeid)

    def pytest_unconfigure(self) -> None:
        self._stop.set()
        if self._sampler is not None:
            self._sampler.join(timeout=5)      # its last sample: the end of the run
        if self._tests is not None:
            self._tests.close()


def pytest_configure(config: pytest.Config) -> None:
    out = os.environ.get(DIR_VAR)
    if not out:
        raise pytest.UsageError(f"-p suite_timeline needs {DIR_VAR}=DIR (where the timeline is written)")
    # an xdist worker is told so by its config (workerinput), not by PYTEST_XDIST_WORKER: a pytest run started by a
    # test inherits that variable from the worker running the test
    workerinput = getattr(config, "workerinput", None)
    worker = workerinput["workerid"] if workerinput else "main"
    # the xdist controller also sees every test's start and end (relayed by the workers): only the workers,
    # where the tests run and their CPU is, record them; the controller samples the machine
    xdist_controller = worker == "main" and getattr(config.option, "dist", "no") != "no"
    config.pluginmanager.register(_Recorder(Path(out), worker, tests=not xdist_controller), "suite_timeline_recorder")


# --------------------------------------------------------------------------------------------- the report
@dataclass
class Module:
    wall: float = 0.0
    cpu: float = 0.0
    tests: int = 0
    start: float = float("inf")
    end: float = 0.0
    workers: set[str] = field(default_factory=set)


@dataclass
class Timeline:
    samples: list[tuple[float, float, float]]     # (t0, t1, busy cores)
    modules: dict[str, Module]

    def busy(self, t0: float, t1: float) -> float:
        num = den = 0.0
        for a, b, cores in self.samples:
            overlap = min(b, t1) - max(a, t0)
            if overlap > 0:
                num += cores * overlap
                den += overlap
        return num / den if den else float("nan")


def load(path: Path) -> Timeline:
    raw = [json.loads(line) for line in (path / STAT_FILE).read_text().splitlines() if line.strip()]
    samples = [(a["t"], b["t"], a["cores"] * (b["busy"] - a["busy"]) / max(1, b["total"] - a["total"]))
               for a, b in zip(raw, raw[1:])]
    tests: dict[str, dict[str, float]] = {}
    workers: dict[str, str] = {}
    for f in sorted(path.glob("tests-*.jsonl")):
        worker = f.stem.removeprefix("tests-")
        for line in f.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                entry = tests.setdefault(rec["id"], {})
                entry[rec["ev"]], entry[rec["ev"] + "_cpu"] = rec["t"], rec["cpu"]
                workers[rec["id"]] = worker
    modules: dict[str, Module] = defaultdict(Module)
    for nodeid, e in tests.items():
        if "start" not in e or "end" not in e:
            continue
        m = modules[nodeid.split("::", 1)[0]]
        m.wall += e["end"] - e["start"]
        m.cpu += e["end_cpu"] - e["start_cpu"]
        m.tests += 1
        m.start, m.end = min(m.start, e["start"]), max(m.end, e["end"])
        m.workers.add(workers[nodeid])
    return Timeline(samples, dict(modules))


def report(tl: Timeline, top: int) -> str:
    if not tl.modules:
        return "no finished test in the timeline"
    t0 = min(m.start for m in tl.modules.values())
    t1 = max(m.end for m in tl.modules.values())
    lines = [f"{t1 - t0:.0f} s from the first test's start to the last one's end; busy cores on average "
             f"{tl.busy(t0, t1):.2f}",
             f"{'module':58} {'tests':>5} {'wall s':>7} {'cpu s':>7} {'busy':>5} {'from':>6} {'to':>6}  worker"]
    for name, m in sorted(tl.modules.items(), key=lambda kv: -kv[1].wall)[:top]:
        lines.append(f"{name:58} {m.tests:5d} {m.wall:7.1f} {m.cpu:7.1f} {tl.busy(m.start, m.end):5.2f} "
                     f"{m.start - t0:6.0f} {m.end - t0:6.0f}  {','.join(sorted(m.workers))}")
    minutes = int((t1 - t0) // 60) + 1
    lines.append("busy cores minute by minute: "
                 + " ".join(f"{tl.busy(t0 + 60 * i, min(t1, t0 + 60 * (i + 1))):.1f}" for i in range(minutes)))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("dir", type=Path, help=f"the {DIR_VAR} of the recorded run")
    ap.add_argument("--top", type=int, default=40, help="modules shown, the longest first (default 40)")
    args = ap.parse_args(argv)
    if not (args.dir / STAT_FILE).exists():
        ap.error(f"{args.dir} holds no {STAT_FILE}: record a run first ({DIR_VAR}=... -p suite_timeline)")
    print(report(load(args.dir), args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
