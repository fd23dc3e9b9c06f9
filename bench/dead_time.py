"""Benchmark 1: dead time per arm transition, harness vs a naive peer-style sequence.

    python bench/dead_time.py [--transitions 11] [--where local ssh] [--naive-sleeps 5 10]

Dead time of one transition = from "stop requested" (the previous run's benchmark ended) to "the
next benchmark starts" (its first request is sent), minus the engine's own load time (engine
process spawned -> the engine logs "The server is fired up and ready to roll!"). The simulated
node runs the ``instant`` profile (every load phase 0 s), so the engine's load time is process
spawn + imports only, and it is subtracted per transition.

Harness: ``driver.py run`` with two arms (baseline, EAGLE-3) and ``--repeats R`` so that R*2 runs
give ``--transitions`` transitions, exactly as a user runs it: with ``--executor queue`` (the default
on one node) the node's sequencer runs the queued runs back to back and the driver's Ansible work
overlaps the benchmarks; with ``--executor per-run`` every run is one ``playbooks/arm.yml`` through
ansible-runner. Times come from the run directories (bench.jsonl ``start_ts`` and ``e2e_s``) and a
watcher thread in this process that polls (every 20 ms) the node's ``server.json`` (spawn time,
written by ``start.py``'s logic) and each run's ``server.log`` (ready line). Where the time goes:
queue executor: the sequencer's ``phases.jsonl`` (each slice charged to the node phase it is in);
per-run: ansible-runner's job events (``.runner/artifacts/*/job_events``): the window of a
transition is cut at every task start and each slice is charged to the task's role (or to the
play's own task); the time between two playbooks is "driver + ansible-playbook start".
CPU: the driver's own children (driver, ansible-playbook and its module processes; with per-run
also the node tools and the client) and, for the queue, the sequencer (read from /proc: it runs
detached, in its own session, with the node tools in-process and the client as its child).

Naive: what the peers do (vLLM auto_tune: ``pkill`` then ``sleep 10``; SGLang's speculative sweep:
``sleep 5`` after killing): one bash script per transition on the node: ``pkill -f <model path>``
(a unique path, so nothing that is not ours matches), ``sleep S``, start the engine in the
background, poll ``/health`` with curl every ``--naive-poll`` s, run the same benchmark client.

``--where ssh`` does the same against a network-namespace host with its own sshd
(``tests/netns.py``; needs root): the driver's inventory reaches it over SSH with host key
checking; the naive script is run there with one ``ssh`` command per transition (its best case).

Prints one JSON object (and writes it to ``--out``): per mode the dead time of every transition,
median/min/max, and the median seconds of each bucket of the breakdown.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
READY_LINE = "The server is fired up and ready to roll!"
NCCL_TUNED = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_P2P_LEVEL": "SYS", "NCCL_MAX_NCHANNELS": "16",
              "NCCL_BUFFSIZE": "16777216", "NCCL_NTHREADS": "512"}
TARGETS_S = {"local": 1.0, "ssh": 2.5}


class BenchError(RuntimeError):
    """The benchmark could not run; the message says which step failed and what to do."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------------------------
# watcher: engine spawn and ready times, seen from the shared file system


@dataclass
class Watcher:
    """Polls server.json files and server.log files; records when each engine spawned and was ready."""

    server_jsons: list[Path]
    log_globs: list[tuple[Path, str]]
    interval: float = 0.02
    sequencer_json: Path | None = None
    sequencer_cpu: dict[int, float] = field(default_factory=dict)  # sequencer pid -> last CPU seconds seen
    spawned: dict[str, float] = field(default_factory=dict)       # run id -> started_at (start.py)
    ready: dict[str, float] = field(default_factory=dict)         # log path -> first time the ready line was seen
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> "Watcher":
        self._thread = threading.Thread(target=self._loop, name="dead-time-watcher", daemon=True)
        self._thread.start()
        return self

    def _sample_sequencer(self) -> None:
        try:
            rec = json.loads(self.sequencer_json.read_text())   # type: ignore[union-attr]
            pid = int(rec["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            return
        cpu = _proc_cpu_s(pid)
        if cpu is not None:
            self.sequencer_cpu[pid] = cpu

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        mtimes: dict[Path, float] = {}
        offsets: dict[Path, int] = {}
        while not self._stop.is_set():
            for sj in self.server_jsons:
                try:
                    m = sj.stat().st_mtime
                    if mtimes.get(sj) != m:
                        rec = json.loads(sj.read_text())
                        mtimes[sj] = m
                        if isinstance(rec, dict) and rec.get("run_id") and rec.get("started_at"):
                            self.spawned.setdefault(str(rec["run_id"]), float(rec["started_at"]))
                except (OSError, ValueError):
                    pass
            if self.sequencer_json is not None:
                self._sample_sequencer()
            for base, pattern in self.log_globs:
                for log in base.glob(pattern):
                    key = str(log)
                    if key in self.ready:
                        continue
                    try:
                        with open(log, "rb") as f:
                            f.seek(max(0, offsets.get(log, 0) - len(READY_LINE)))
                            data = f.read()
                            offsets[log] = f.tell()
                    except OSError:
                        continue
                    if READY_LINE.encode() in data:
                        self.ready[key] = time.time()
            self._stop.wait(self.interval)


# ----------------------------------------------------------------------------------------------
# node description (local or over SSH)


@dataclass
class Node:
    root: Path
    port: int
    host_vars_extra: dict[str, Any] = field(default_factory=dict)
    ssh_argv: list[str] | None = None          # for the naive script over SSH

    @property
    def node_dir(self) -> Path:
        return self.root / "node"

    def node_env(self) -> dict[str, str]:
        return {"SPECAB_SIM_STATE": str(self.node_dir / "gpus"), "SPECAB_SIM_TIME_SCALE": "1",
                "SPECAB_SIM_PROFILE": "instant", "PYTHONPATH": str(REPO)}

    def inventory(self) -> Path:
        host = {"ansible_connection": "local", "ansible_python_interpreter": PYTHON, "specab_python": PYTHON,
                "specab_engine_cmd": [PYTHON, "-m", "specab.sim.launch_server"],
                "specab_smi_cmd": [PYTHON, "-m", "specab.sim.smi"], "specab_node_dir": str(self.node_dir),
                "specab_node_env": self.node_env(), "specab_gpu_indices": "all", **self.host_vars_extra}
        inv = {"all": {"children": {"gpu_nodes": {"hosts": {"benchnode": host}}}}}
        p = self.root / "inventory.yml"
        p.write_text(json.dumps(inv, indent=1))        # JSON is YAML
        return p


def _proc_cpu_s(pid: int) -> float | None:
    """utime + stime + cutime + cstime of a live process, in seconds (None when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def experiment_file(node: Node, output_len: int) -> Path:
    import yaml
    exp = {
        "name": "deadtime", "model_path": "/models/Kimi-K2.5-INT4",
        "server_args": {"tp_size": 8, "mem_fraction_static": 0.88, "disable_custom_all_reduce": True,
                        "trust_remote_code": True, "host": "127.0.0.1", "port": node.port},
        "env": dict(NCCL_TUNED),
        "arms": [{"name": "baseline"},
                 {"name": "eagle3-s2", "server_args": {
                     "speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "/models/Kimi-K2.5-EAGLE3",
                     "speculative_num_steps": 2, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 3}}],
        "bench": {"api": "generate", "num_requests": 1, "warmup_requests": 1, "input_len": 16,
                  "output_len": output_len, "concurrency": 1, "seed": 1, "timeout_s": 120},
        "timeouts": {"ready_s": 300, "stop_grace_s": 15, "gpu_free_s": 60},
    }
    p = node.root / "deadtime.yml"
    p.write_text(yaml.safe_dump({"specab_experiment": exp}, sort_keys=False))
    return p


# ----------------------------------------------------------------------------------------------
# job events -> breakdown


def _ts(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def playbook_slices(events: list[dict[str, Any]], detail: bool = False
                    ) -> tuple[float, float, list[tuple[float, str]]]:
    """(playbook start, playbook end, [(task start, bucket)]) from one playbook's job events.

    The bucket is the task's role (``role server_stop``) or, for a task of the play itself, the task
    name; with ``detail`` every task is its own bucket (``server_stop : Stop | Send SIGTERM``)."""
    evs = sorted(events, key=lambda e: e.get("counter", 0))
    start = end = None
    marks: list[tuple[float, str]] = []
    for e in evs:
        created = e.get("created")
        if not created:
            continue
        t = _ts(created)
        kind = e.get("event")
        data = e.get("event_data") or {}
        if kind == "playbook_on_start":
            start = t
            marks.append((t, "ansible-playbook: parse, inventory, play start"))
        elif kind == "playbook_on_task_start":
            role = data.get("role")
            task = str(data.get("task") or data.get("name") or "?")
            task = re.sub(r"\b(arm|run) [A-Za-z0-9][A-Za-z0-9._-]*", r"\1 <name>", task)     # one bucket per task
            if detail:
                task = re.sub(r"(, arm <name>|, run <name>|,? ?(into )?(/|http)\S*)", "", task)    # run-specific
                marks.append((t, f"{role} : {task}"[:100] if role else f"play : {task.split(',')[0]}"[:100]))
            else:
                marks.append((t, f"role {role}" if role else f"play task: {task.split(',')[0][:60]}"))
        elif kind == "playbook_on_include":
            marks.append((t, "include_role/include_tasks (loading role files)"))
        end = t if end is None or t > end else end
    if start is None and evs:
        start = _ts(evs[0]["created"])
    if start is None or end is None:
        raise BenchError("an ansible-runner artifact has no job events with times; was the run interrupted?")
    return start, end, sorted(marks)


def load_playbooks(exp_dir: Path, detail: bool = False) -> dict[str, tuple[float, float, list[tuple[float, str]]]]:
    """run id -> its playbook's slices, from <exp dir>/.runner/artifacts/<run id>-<stamp>/job_events."""
    out = {}
    art = exp_dir / ".runner" / "artifacts"
    for d in sorted(art.iterdir()) if art.is_dir() else []:
        m = re.match(r"(\d{3}-.+?)-\d{8}T\d{6}-", d.name)
        if not m or not (d / "job_events").is_dir():
            continue
        events = []
        for f in (d / "job_events").glob("*.json"):
            try:
                events.append(json.loads(f.read_text()))
            except (OSError, ValueError):
                continue
        if events:
            out[m.group(1)] = playbook_slices(events, detail)
    return out


def _add(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: a.get(k, 0.0) + b.get(k, 0.0) for k in {*a, *b}}


def breakdown(t0: float, t1: float, playbooks: list[tuple[float, float, list[tuple[float, str]]]],
              between_label: str = "between playbooks: driver bookkeeping + ansible-playbook start-up"
              ) -> dict[str, float]:
    """Seconds of [t0, t1] charged to buckets: each slice from one task start to the next (or to the
    playbook's end) goes to that task's bucket; time outside every playbook to `between_label`."""
    segs: list[tuple[float, float, str]] = []
    for start, end, marks in playbooks:
        pts = [m for m in marks if start <= m[0] <= end]
        for i, (t, label) in enumerate(pts):
            nxt = pts[i + 1][0] if i + 1 < len(pts) else end
            segs.append((t, nxt, label))
        if not pts:
            segs.append((start, end, "ansible-playbook"))
    out: dict[str, float] = {}
    covered = 0.0
    for a, b, label in segs:
        lo, hi = max(a, t0), min(b, t1)
        if hi > lo:
            out[label] = out.get(label, 0.0) + (hi - lo)
            covered += hi - lo
    rest = (t1 - t0) - covered
    if rest > 1e-6:
        out[between_label] = out.get(between_label, 0.0) + rest
    return out


# ----------------------------------------------------------------------------------------------
# bench.jsonl helpers


def bench_window(path: Path) -> tuple[float, float]:
    """(first request sent, last request finished) of one bench.jsonl, in unix seconds."""
    starts, ends = [], []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        if rec.get("start_ts") is None:
            continue
        starts.append(float(rec["start_ts"]))
        ends.append(float(rec["start_ts"]) + float(rec.get("e2e_s") or 0.0))
    if not starts:
        raise BenchError(f"{path} has no request with a start_ts: the benchmark client did not run")
    return min(starts), max(ends)


def summarize(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    return {"n": len(values), "median_s": round(statistics.median(values), 3), "min_s": round(min(values), 3),
            "max_s": round(max(values), 3)}


def median_buckets(parts: list[dict[str, float]]) -> dict[str, float]:
    keys = sorted({k for p in parts for k in p})
    med = {k: round(statistics.median([p.get(k, 0.0) for p in parts]), 3) for k in keys}
    return dict(sorted(med.items(), key=lambda kv: -kv[1]))


# ----------------------------------------------------------------------------------------------
# harness


def phase_marks(run_dir: Path) -> tuple[float, float, list[tuple[float, str]]] | None:
    """A run's node phases (the sequencer's phases.jsonl) as slices for `breakdown`."""
    marks = []
    try:
        lines = (run_dir / "phases.jsonl").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        try:
            rec = json.loads(line)
            marks.append((float(rec["t"]), f"node: {rec['phase']}"))
        except (ValueError, KeyError, TypeError):
            continue
    if not marks:
        return None
    return marks[0][0], marks[-1][0], sorted(marks)


def run_harness(node: Node, transitions: int, output_len: int, log, executor: str = "queue") -> dict[str, Any]:
    repeats = (transitions + 2) // 2            # 2 arms x repeats runs -> 2*repeats - 1 transitions
    exp = experiment_file(node, output_len)
    inv = node.inventory()
    runs_dir = node.root / "runs"
    watcher = Watcher([node.node_dir / "server.json"], [(node.node_dir / "runs", "*/server.log")],
                      sequencer_json=node.node_dir / "sequencer.json").start()
    t_start = time.time()
    try:
        cmd = [PYTHON, str(REPO / "driver.py"), "run", "-e", str(exp), "-i", str(inv), "--repeats", str(repeats),
               "--seed", "1", "--runs-dir", str(runs_dir), "--executor", executor]
        log(f"harness: {' '.join(cmd[1:])}")
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = subprocess.run(cmd, cwd=str(REPO), capture_output=True, text=True,
                              env=dict(os.environ, PYTHONUNBUFFERED="1"))
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    finally:
        watcher.stop()
    # CPU of the driver, ansible-playbook, its module processes, the node tools and the client (the
    # engine is not counted: start.py puts it in its own session and nobody waits for it)
    cpu_s = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    if proc.returncode != 0:
        raise BenchError(f"driver.py exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-4000:]}")
    [exp_dir] = [d for d in runs_dir.iterdir() if d.is_dir()]
    runs = sorted(d for d in exp_dir.iterdir() if d.is_dir() and re.match(r"\d{3}-", d.name))
    if executor == "queue":     # no Ansible inside a transition: where the time goes is the node's phases
        playbooks = {r.name: m for r in runs if (m := phase_marks(r)) is not None}
        tasks = playbooks
    else:
        playbooks = load_playbooks(exp_dir)
        tasks = load_playbooks(exp_dir, detail=True)
    rows, parts, task_parts = [], [], []
    for prev, nxt in zip(runs, runs[1:]):
        _, t_stop = bench_window(prev / "bench.jsonl")
        t_bench, _ = bench_window(nxt / "bench.jsonl")
        spawn = watcher.spawned.get(nxt.name)
        ready = watcher.ready.get(str(node.node_dir / "runs" / nxt.name / "server.log"))
        if spawn is None or ready is None:
            raise BenchError(f"run {nxt.name}: the watcher saw no spawn/ready time (server.json or the "
                             f"ready line in server.log missed); rerun with a less loaded machine")
        load = ready - spawn
        wall = t_bench - t_stop
        # the engine's own load time [spawn, ready] is cut out of the window: what is left is charged
        pbs = [playbooks[r.name] for r in (prev, nxt) if r.name in playbooks]
        part = _add(breakdown(t_stop, spawn, pbs), breakdown(ready, t_bench, pbs))
        rows.append({"from": prev.name, "to": nxt.name, "wall_s": round(wall, 3), "engine_load_s": round(load, 3),
                     "dead_s": round(wall - load, 3)})
        parts.append(part)
        tps = [tasks[r.name] for r in (prev, nxt) if r.name in tasks]
        task_parts.append(_add(breakdown(t_stop, spawn, tps), breakdown(ready, t_bench, tps)))
    run_wall = [playbooks[r.name][1] - playbooks[r.name][0] for r in runs if r.name in playbooks]
    sequencer_cpu = sum(watcher.sequencer_cpu.values())
    return {"executor": executor, "driver_wall_s": round(time.time() - t_start, 1), "runs": len(runs),
            "transitions": rows,
            "cpu_s_per_run": round((cpu_s + sequencer_cpu) / max(1, len(runs)), 2),
            "controller_cpu_s_per_run": round(cpu_s / max(1, len(runs)), 2),
            "sequencer_cpu_s_per_run": round(sequencer_cpu / max(1, len(runs)), 2),
            "dead": summarize([r["dead_s"] for r in rows]), "engine_load": summarize([r["engine_load_s"] for r in rows]),
            "breakdown_median_s": median_buckets(parts),
            "tasks_median_s": dict(list(median_buckets(task_parts).items())[:30]), "playbook_wall_median_s": round(statistics.median(run_wall), 2)
            if run_wall else None, "experiment_dir": str(exp_dir)}


# ----------------------------------------------------------------------------------------------
# naive peer-style sequence

NAIVE_SCRIPT = r"""#!/bin/bash
# one naive transition: kill by name, fixed sleep, start, poll /health, benchmark
set -u
OUT="$1"; MARKER="$(cat "$2")"; SLEEP="$3"; POLL="$4"; PORT="$5"; PREV="$6"; PY="$7"; REPO="$8"; OUTLEN="$9"
mkdir -p "$OUT"
t_stop=$(date +%s.%N)
pkill -f -- "$MARKER" || true
sleep "$SLEEP"
# not part of the peers' sequence: make sure nothing of the previous server (ours, by its group) survived
if [ -s "$PREV" ]; then kill -9 -- "-$(cat "$PREV")" 2>/dev/null || true; fi
t_spawn=$(date +%s.%N)
setsid "$PY" -m specab.sim.launch_server --model-path "$MARKER" --tp-size 8 --mem-fraction-static 0.88 \
    --disable-custom-all-reduce --trust-remote-code --host 127.0.0.1 --port "$PORT" \
    > "$OUT/server.log" 2>&1 < /dev/null &
echo $! > "$OUT/pid"
n=0
until curl -sf -o /dev/null "http://127.0.0.1:$PORT/health"; do
  n=$((n+1)); if [ "$n" -gt 600 ]; then echo "server did not come up" >&2; exit 1; fi
  sleep "$POLL"
done
"$PY" "$REPO/specab/node" loadgen --url "http://127.0.0.1:$PORT" --api generate --num-requests 1 --warmup 1 \
    --input-len 16 --output-len "$OUTLEN" --ignore-eos true --concurrency 1 --request-rate 0 --client-procs auto --seed 1 --timeout 600 --out "$OUT/bench.jsonl" \
    --summary "$OUT/bench_summary.json" >/dev/null 2>"$OUT/loadgen.err" || exit 1
echo "{\"t_stop\": $t_stop, \"t_spawn\": $t_spawn}" > "$OUT/times.json"
"""


def run_naive(node: Node, transitions: int, sleep_s: float, poll_s: float, output_len: int, log) -> dict[str, Any]:
    base = node.root / f"naive-sleep{sleep_s:g}"
    base.mkdir(parents=True)
    script = base / "transition.sh"
    script.write_text(NAIVE_SCRIPT)
    script.chmod(0o755)
    marker = f"/models/naive-{os.getpid()}-{int(time.time() * 1000) % 10**8}"
    marker_file = base / "marker"        # read by the script: in its argv pkill -f would match the script itself
    marker_file.write_text(marker)
    env = dict(os.environ, **node.node_env(), SPT_NOENV="1", NCCL_PROTO="LL")
    env.update(NCCL_TUNED)
    watcher = Watcher([], [(base, "*/server.log")]).start()
    rows = []
    prev_pid = base / "none"
    try:
        for i in range(transitions + 1):            # the first iteration only starts the first server
            out = base / f"{i:03d}"
            argv = [str(script), str(out), str(marker_file), f"{sleep_s:g}" if i else "0", f"{poll_s:g}", str(node.port),
                    str(prev_pid), PYTHON, str(REPO), str(output_len)]
            if node.ssh_argv:
                exports = " ".join(f"{k}={_q(v)}" for k, v in env.items()
                                   if k.startswith(("SPECAB_SIM_", "NCCL_", "SPT_")) or k == "PYTHONPATH")
                argv = [*node.ssh_argv, f"env {exports} {' '.join(_q(a) for a in argv)}"]
            proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
            if proc.returncode != 0:
                raise BenchError(f"naive transition {i} failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
            prev_pid = out / "pid"
            if i == 0:
                continue
            times = json.loads((out / "times.json").read_text())
            t_bench, _ = bench_window(out / "bench.jsonl")
            _, t_prev_end = bench_window(base / f"{i - 1:03d}" / "bench.jsonl")
            ready = _wait_key(watcher.ready, str(out / "server.log"))
            load = ready - float(times["t_spawn"])
            wall = t_bench - float(times["t_stop"])
            rows.append({"wall_s": round(wall, 3), "engine_load_s": round(load, 3), "dead_s": round(wall - load, 3),
                         "gap_after_bench_s": round(float(times["t_stop"]) - t_prev_end, 3)})
            log(f"naive sleep {sleep_s:g}: transition {i}: dead {wall - load:.2f} s")
    finally:
        watcher.stop()
        _kill_group_file(prev_pid)
    return {"sleep_s": sleep_s, "poll_s": poll_s, "transitions": rows, "dead": summarize([r["dead_s"] for r in rows]),
            "engine_load": summarize([r["engine_load_s"] for r in rows])}


TOOLS_SCRIPT = r"""#!/bin/bash
# one transition with the harness's node tools chained directly (no Ansible): stop -> GPUs free ->
# start -> ready -> benchmark. The lower bound of a transition done as one node-side command.
set -eu
OUT="$1"; NODE="$2"; PORT="$3"; PY="$4"; REPO="$5"; OUTLEN="$6"; SMI="$7"
T="$REPO/specab/node"
mkdir -p "$OUT"
t_stop=$(date +%s.%N)
"$PY" "$T" stop --node-dir "$NODE" --smi "$SMI" --grace 15 --out "$OUT/stop.json" >/dev/null 2>>"$OUT/tools.err"
"$PY" "$T" gpufree --smi "$SMI" --gpus all --threshold-mib 64 --timeout 60 --node-dir "$NODE" \
    --out "$OUT/gpu_free.json" >/dev/null 2>>"$OUT/tools.err"
printf 'NCCL_PROTO=LL\nNCCL_ALGO=Ring\nNCCL_P2P_LEVEL=SYS\nNCCL_MAX_NCHANNELS=16\nNCCL_BUFFSIZE=16777216\nNCCL_NTHREADS=512\n' \
    > "$OUT/nccl.env"
chmod 600 "$OUT/nccl.env"
cat > "$OUT/launch.sh" <<EOS
#!/usr/bin/env bash
set -euo pipefail
set -a; . "$OUT/nccl.env"; set +a
export SPT_NOENV=1
exec "$PY" -m specab.sim.launch_server --tp-size 8 --mem-fraction-static 0.88 --disable-custom-all-reduce \
    --trust-remote-code --host 127.0.0.1 --port "$PORT" --model-path /models/Kimi-K2.5-INT4
EOS
chmod 755 "$OUT/launch.sh"
"$PY" "$T" start --node-dir "$NODE" --run-dir "$OUT" --script "$OUT/launch.sh" --host 127.0.0.1 \
    --port "$PORT" > "$OUT/start.json" 2>>"$OUT/tools.err"
pid=$(sed -n 's/^{"pid": \([0-9]*\),.*/\1/p' "$OUT/start.json")
"$PY" "$T" ready --url "http://127.0.0.1:$PORT" --pid "$pid" --log "$OUT/server.log" --timeout 300 \
    > "$OUT/ready.json" 2>>"$OUT/tools.err"
"$PY" "$REPO/specab/node" loadgen --url "http://127.0.0.1:$PORT" --api generate --num-requests 1 --warmup 1 \
    --input-len 16 --output-len "$OUTLEN" --ignore-eos true --concurrency 1 --request-rate 0 --client-procs auto --seed 1 --timeout 600 --out "$OUT/bench.jsonl" \
    --summary "$OUT/bench_summary.json" >/dev/null 2>"$OUT/loadgen.err"
echo "{\"t_stop\": $t_stop}" > "$OUT/times.json"
"""


def run_tools(node: Node, transitions: int, output_len: int, log) -> dict[str, Any]:
    """The node tools chained by one script per transition (one ssh command over SSH), no Ansible."""
    base = node.root / "tools"
    base.mkdir(parents=True)
    script = base / "transition.sh"
    script.write_text(TOOLS_SCRIPT)
    script.chmod(0o755)
    node_dir = node.node_dir
    node_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, **node.node_env())
    smi = json.dumps([PYTHON, "-m", "specab.sim.smi"])
    watcher = Watcher([node_dir / "server.json"], [(base, "*/server.log")]).start()
    rows = []
    try:
        for i in range(transitions + 1):
            out = base / f"{i:03d}"
            argv = [str(script), str(out), str(node_dir), str(node.port), PYTHON, str(REPO), str(output_len), smi]
            if node.ssh_argv:
                exports = " ".join(f"{k}={_q(v)}" for k, v in node.node_env().items())
                argv = [*node.ssh_argv, f"env {exports} {' '.join(_q(a) for a in argv)}"]
            proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
            if proc.returncode != 0:
                err = (out / "tools.err").read_text()[-2000:] if (out / "tools.err").exists() else ""
                raise BenchError(f"tools transition {i} failed (exit {proc.returncode}): {proc.stderr[-1000:]}{err}")
            if i == 0:
                continue
            times = json.loads((out / "times.json").read_text())
            t_bench, _ = bench_window(out / "bench.jsonl")
            _, t_prev_end = bench_window(base / f"{i - 1:03d}" / "bench.jsonl")
            spawn = json.loads((out / "start.json").read_text())["started_at"]
            ready = _wait_key(watcher.ready, str(out / "server.log"))
            load = ready - float(spawn)
            wall = t_bench - float(times["t_stop"])
            stop = json.loads((out / "stop.json").read_text())
            free = json.loads((out / "gpu_free.json").read_text())
            rows.append({"wall_s": round(wall, 3), "engine_load_s": round(load, 3), "dead_s": round(wall - load, 3),
                         "stop_tool_total_s": stop.get("total_s"), "time_to_free_s": free.get("time_to_free_s"),
                         "stop_to_spawn_s": round(float(spawn) - float(times["t_stop"]), 3),
                         "ready_to_bench_s": round(t_bench - ready, 3)})
            log(f"tools: transition {i}: dead {wall - load:.2f} s")
    finally:
        watcher.stop()
        _kill_harness_server(node)
    return {"transitions": rows, "dead": summarize([r["dead_s"] for r in rows]),
            "engine_load": summarize([r["engine_load_s"] for r in rows]),
            "stop_to_spawn": summarize([r["stop_to_spawn_s"] for r in rows]),
            "ready_to_bench": summarize([r["ready_to_bench_s"] for r in rows])}


def _q(s: str) -> str:
    import shlex
    return shlex.quote(str(s))


def _wait_key(d: dict[str, float], key: str, timeout: float = 5.0) -> float:
    deadline = time.monotonic() + timeout
    while key not in d:
        if time.monotonic() > deadline:
            raise BenchError(f"the watcher never saw the ready line in {key}")
        time.sleep(0.02)
    return d[key]


def _kill_group_file(pid_file: Path) -> None:
    """SIGKILL the process group of the naive server recorded in pid_file (started by us with setsid)."""
    try:
        pgid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return
    try:
        os.killpg(pgid, 9)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_harness_server(node: Node) -> None:
    """The driver stops its servers; if it failed half-way, kill the group recorded in server.json (ours)
    and the sequencer recorded in sequencer.json (ours, when its pid still has the recorded start time)."""
    try:
        rec = json.loads((node.node_dir / "sequencer.json").read_text())
        pid = int(rec["pid"])
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        if int(stat[19]) == int(rec["starttime"]):
            os.killpg(pid, 9)
    except (OSError, ValueError, KeyError, TypeError, IndexError, ProcessLookupError, PermissionError):
        pass
    try:
        rec = json.loads((node.node_dir / "server.json").read_text())
        os.killpg(int(rec["pgid"]), 9)
    except (OSError, ValueError, KeyError, TypeError, ProcessLookupError, PermissionError):
        pass


# ----------------------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "loadavg_start": [round(x, 2) for x in os.getloadavg()],
            "date_utc": datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC")}


def _ssh_node(root: Path) -> Iterator[tuple[Node, Any]]:
    sys.path.insert(0, str(REPO))
    from tests.netns import NetnsHost, unavailable_reason
    reason = unavailable_reason()
    if reason:
        raise BenchError(f"--where ssh {reason}")
    with NetnsHost.create(root / "netns") as host:
        yield host


def run_mode(where: str, root: Path, args: argparse.Namespace, log) -> dict[str, Any]:
    root.mkdir(parents=True)
    result: dict[str, Any] = {"where": where, "target_s": TARGETS_S[where]}
    host_ctx = _ssh_node(root) if where == "ssh" else None
    host = next(host_ctx) if host_ctx else None
    try:
        extra = host.ansible_vars() if host else {}
        ssh_argv = (["ssh", "-i", str(host.key_file), "-p", str(host.port), *host.ssh_options(),
                     f"{host.user}@{host.address}"] if host else None)
        if "harness" in args.what:
            node = Node(root / "harness", free_port(), extra)
            node.root.mkdir()
            try:
                result["harness"] = run_harness(node, args.transitions, args.output_len, log, args.executor)
            finally:
                _kill_harness_server(node)
            result["harness"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
            log(f"{where} harness: {result['harness']['dead']}")
        if "tools" in args.what:
            node = Node(root / "tools", free_port(), extra, ssh_argv)
            node.root.mkdir()
            result["tools"] = run_tools(node, args.transitions, args.output_len, log)
            log(f"{where} tools: {result['tools']['dead']}")
        if "naive" in args.what:
            result["naive"] = []
            for s in args.naive_sleeps:
                node = Node(root / "naive", free_port(), extra, ssh_argv)
                node.root.mkdir(exist_ok=True)
                result["naive"].append(run_naive(node, args.naive_transitions, s, args.naive_poll,
                                                 args.output_len, log))
                log(f"{where} naive sleep {s:g}: {result['naive'][-1]['dead']}")
    finally:
        if host_ctx:
            host_ctx.close()
    h = result.get("harness", {}).get("dead", {})
    if h.get("n"):
        result["met"] = h["median_s"] <= TARGETS_S[where]
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--where", nargs="+", choices=("local", "ssh"), default=["local", "ssh"])
    ap.add_argument("--what", nargs="+", choices=("harness", "tools", "naive"),
                    default=["harness", "tools", "naive"])
    ap.add_argument("--transitions", type=int, default=11, help="harness transitions (>= 10 for the target)")
    ap.add_argument("--executor", choices=("queue", "per-run"), default="queue",
                    help="the driver's executor for the harness sequence (queue: the default on one node)")
    ap.add_argument("--naive-transitions", type=int, default=10)
    ap.add_argument("--naive-sleeps", type=float, nargs="+", default=[5.0, 10.0],
                    help="fixed sleeps after the kill (SGLang sweep: 5 s, vLLM auto_tune: 10 s)")
    ap.add_argument("--naive-poll", type=float, default=1.0, help="health poll interval of the naive sequence")
    ap.add_argument("--output-len", type=int, default=8, help="tokens per benchmark request (tiny: bench is not measured)")
    ap.add_argument("--workdir", help="keep the run here (default: a temporary directory, removed)")
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args(argv)
    if args.transitions < 1 or args.naive_transitions < 1:
        ap.error("--transitions and --naive-transitions must be >= 1")

    def log(msg: str) -> None:
        print(f"[dead_time {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    root = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="specab-deadtime-"))
    result: dict[str, Any] = {"benchmark": "dead time per arm transition", "machine": machine(), "modes": []}
    try:
        for where in args.where:
            result["modes"].append(run_mode(where, root / where, args, log))
    except BenchError as exc:
        print(f"dead_time: {exc}", file=sys.stderr)
        return 1
    finally:
        result["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
        if not args.workdir:
            shutil.rmtree(root, ignore_errors=True)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
