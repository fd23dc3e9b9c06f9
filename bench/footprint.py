"""Benchmark 6: memory footprint of the simulated node at TP 8 and of the driver.

    python bench/footprint.py [--what node driver-real driver-1000] [--runs 1000]

* ``node``: ``python -m specab.sim.launch_server --tp-size 8`` started in its own session (as
  ``start.py`` does), sampled every 0.1 s from /proc while it loads, sits ready, and serves a burst
  of the benchmark client (concurrency 8). Every process whose session id is the server's is
  summed: RSS (VmRSS) and PSS (``/proc/PID/smaps_rollup``: shared pages such as the Python binary
  and libraries split between the processes that map them). The client runs outside the session
  and is not counted. Target: <= 500 MB resident (the PSS sum is the honest "together" number,
  the RSS sum counts shared pages once per process).
* ``driver-real``: ``driver.py run`` for two real runs on the simulated node (instant profile): the
  driver process alone (it hosts ansible-runner) and its child tree (``ansible-playbook`` and the
  module processes it forks), sampled every 0.1 s.
* ``driver-1000``: the driver over a 1,000-run experiment. A real one takes ~10 h here (each run is
  a full ``arm.yml`` playbook), so the driver runs in a child process with
  ``specab.driver.context.PlaybookRunner`` replaced by a stand-in for the queue executor's playbooks (the
  default on one node; ``enqueue.yml`` records the queued runs, ``collect_run.yml`` leaves the run's
  directory as the sequencer and the fetch do, with ``phases.jsonl`` and ``done.json``; ``--executor
  per-run``: ``arm.yml``) that writes each run's artefacts
  (bench.jsonl with per-chunk arrays, 8-GPU samples, manifest, env check, stop/gpu-free/ready JSON,
  server.log) into the run directory, as collect leaves them, and reports the phases, then returns
  a successful result. Everything else is the real driver: plan, progress display, log tails,
  store ingestion, per-run summary, and the report it writes at the end. Ansible's own memory is in
  a separate process per run (``driver-real`` measures it) and does not accumulate. Reported: the
  driver's RSS after runs 1, 10, 100, 1,000 (flat = nothing grows per run) and its peak.
  Target: <= 300 MB.

Prints one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
NCCL = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_P2P_LEVEL": "SYS", "NCCL_MAX_NCHANNELS": "16",
        "NCCL_BUFFSIZE": "16777216", "NCCL_NTHREADS": "512"}
MB = 1024 * 1024


class BenchError(RuntimeError):
    """A measurement could not be made; the message says which and why."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------------------------
# /proc sampling


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def pss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def session_pids(sid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            st = _stat(int(d.name))
            if st and int(st[3]) == sid:       # fields after the comm: state ppid pgrp session ...
                out.append(int(d.name))
    return out


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            st = _stat(int(d.name))
            if st:
                children.setdefault(int(st[1]), []).append(int(d.name))
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


class Sampler:
    """Samples a set of processes (given by a function) every `interval` s; keeps the peaks."""

    def __init__(self, pids, interval: float = 0.1):
        self.pids = pids
        self.interval = interval
        self.peak_rss = 0
        self.peak_pss = 0
        self.peak_procs = 0
        self.samples = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> "Sampler":
        self._t.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def sample(self) -> tuple[int, int, int]:
        pids = self.pids()
        rss = sum(rss_kib(p) for p in pids)
        pss = sum(pss_kib(p) or 0 for p in pids)
        self.peak_rss = max(self.peak_rss, rss)
        self.peak_pss = max(self.peak_pss, pss)
        self.peak_procs = max(self.peak_procs, len(pids))
        self.samples += 1
        return rss, pss, len(pids)

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._t.join(timeout=5)
        return {"peak_rss_mb": round(self.peak_rss / 1024, 1), "peak_pss_mb": round(self.peak_pss / 1024, 1),
                "processes": self.peak_procs, "samples": self.samples}


def _wait(pred, timeout: float, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        if proc is not None and proc.poll() is not None:
            raise BenchError(f"{what}: the process exited with {proc.returncode}")
        time.sleep(0.1)
    raise BenchError(f"timed out after {timeout:.0f} s waiting for {what}")


# ----------------------------------------------------------------------------------------------
# simulated node at TP 8


def measure_node(root: Path, tp: int, requests: int, concurrency: int, time_scale: str) -> dict[str, Any]:
    port = free_port()
    node = root / "node"
    node.mkdir(parents=True)
    env = dict(os.environ, SPECAB_SIM_STATE=str(node / "gpus"), SPECAB_SIM_TIME_SCALE=time_scale,
               PYTHONPATH=str(REPO), SPT_NOENV="1", **NCCL)
    log = node / "server.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen([PYTHON, "-m", "specab.sim.launch_server", "--model-path", "/models/Kimi-K2.5-INT4",
                                 "--tp-size", str(tp), "--host", "127.0.0.1", "--port", str(port),
                                 "--trust-remote-code", "--disable-custom-all-reduce"],
                                stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
    sid = proc.pid
    sampler = Sampler(lambda: session_pids(sid)).start()
    phases: dict[str, Any] = {}
    try:
        _wait(lambda: "fired up and ready" in log.read_text(errors="replace"), 300, "the simulated server", proc)
        time.sleep(0.5)          # settle: a few samples of the idle, ready server
        rss, pss, n = sampler.sample()
        phases["ready_idle"] = {"rss_mb": round(rss / 1024, 1), "pss_mb": round(pss / 1024, 1), "processes": n}
        bench = subprocess.run([PYTHON, str(REPO / "specab" / "node"), "loadgen", "--url", f"http://127.0.0.1:{port}",
                                "--num-requests", str(requests), "--warmup", "0", "--input-len", "128",
                                "--output-len", "256", "--ignore-eos", "true", "--concurrency", str(concurrency), "--request-rate", "0", "--client-procs", "auto", "--api", "generate",
                                "--seed", "1", "--timeout", "600",
                                "--out", str(node / "bench.jsonl"), "--summary", str(node / "summary.json")],
                               capture_output=True, text=True, timeout=600)
        if bench.returncode != 0:
            raise BenchError(f"the benchmark client failed: {bench.stderr[-2000:]}")
        # one snapshot for the after-bench totals, the process count and the per-process list, so they
        # agree: the sampler's peak count can include a transient process (the simulated GPU state's
        # watcher is started by a double fork, and the first child sits in the server's session until its
        # setsid(): a momentary copy of the server, gone by the next sample)
        per_proc = []
        for p in sorted(session_pids(sid)):
            try:
                name = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")[:60]
            except OSError:
                continue                   # exited between the listing and this read: not in the snapshot
            r_kib, p_kib = rss_kib(p), pss_kib(p)
            if not name or p_kib is None:  # exited (or a zombie) while being read
                continue
            per_proc.append({"pid": p, "name": name, "rss_kib": r_kib, "pss_kib": p_kib})
        snap_rss = sum(x["rss_kib"] for x in per_proc)
        snap_pss = sum(x["pss_kib"] for x in per_proc)
        for x in per_proc:
            x["rss_mb"] = round(x.pop("rss_kib") / 1024, 1)
            x["pss_mb"] = round(x.pop("pss_kib") / 1024, 1)
        phases["after_bench"] = {"rss_mb": round(snap_rss / 1024, 1), "pss_mb": round(snap_pss / 1024, 1),
                                 "processes": len(per_proc)}
    finally:
        peaks = sampler.stop()
        try:
            os.killpg(sid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)
    peaks["peak_processes"] = peaks.pop("processes")   # may count a transient fork child (see above)
    return {"tp": tp, "bench": {"requests": requests, "concurrency": concurrency, "output_len": 256},
            **peaks, **phases, "processes": len(per_proc), "per_process": per_proc, "target_mb": 500,
            "met": peaks["peak_pss_mb"] <= 500}


# ----------------------------------------------------------------------------------------------
# driver


def _node_files(root: Path, port: int, profile: str = "instant") -> tuple[Path, Path]:
    import yaml
    node_dir = root / "node"
    host = {"ansible_connection": "local", "ansible_python_interpreter": PYTHON, "specab_python": PYTHON,
            "specab_engine_cmd": [PYTHON, "-m", "specab.sim.launch_server"],
            "specab_smi_cmd": [PYTHON, "-m", "specab.sim.smi"], "specab_node_dir": str(node_dir),
            "specab_node_env": {"SPECAB_SIM_STATE": str(node_dir / "gpus"), "SPECAB_SIM_TIME_SCALE": "1",
                                "SPECAB_SIM_PROFILE": profile, "PYTHONPATH": str(REPO)},
            "specab_gpu_indices": "all"}
    inv = root / "inventory.yml"
    inv.write_text(json.dumps({"all": {"children": {"gpu_nodes": {"hosts": {"fpnode": host}}}}}))
    exp = {"name": "footprint", "model_path": "/models/Kimi-K2.5-INT4",
           "server_args": {"tp_size": 8, "mem_fraction_static": 0.88, "disable_custom_all_reduce": True,
                           "trust_remote_code": True, "host": "127.0.0.1", "port": port},
           "env": dict(NCCL),
           "arms": [{"name": "baseline"},
                    {"name": "eagle3-s2", "server_args": {
                        "speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "/models/eagle3-head",
                        "speculative_num_steps": 2, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 3}}],
           "bench": {"api": "generate", "num_requests": 8, "warmup_requests": 2, "input_len": 128,
                     "output_len": 256, "concurrency": 1, "seed": 1, "timeout_s": 600},
           "timeouts": {"ready_s": 300, "stop_grace_s": 15, "gpu_free_s": 60}}
    ef = root / "footprint.yml"
    ef.write_text(yaml.safe_dump({"specab_experiment": exp}, sort_keys=False))
    return inv, ef


def measure_driver_real(root: Path) -> dict[str, Any]:
    root.mkdir(parents=True)
    inv, ef = _node_files(root, free_port())
    cmd = [PYTHON, str(REPO / "driver.py"), "run", "-e", str(ef), "-i", str(inv), "--repeats", "1",
           "--runs-dir", str(root / "runs")]
    proc = subprocess.Popen(cmd, cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"), start_new_session=True)
    own = Sampler(lambda: [proc.pid]).start()
    tree = Sampler(lambda: descendants(proc.pid)).start()
    out, _ = proc.communicate(timeout=900)
    d_own, d_tree = own.stop(), tree.stop()
    # the simulated servers are not part of the driver: they run in their own sessions (start.py)
    if proc.returncode != 0:
        raise BenchError(f"driver.py run failed (exit {proc.returncode}):\n{out[-3000:]}")
    return {"runs": 2, "driver_process": d_own, "children": {k: v for k, v in d_tree.items()},
            "note": "children = ansible-playbook and its per-task processes (the engine is not a child: "
                    "start.py puts it in its own session)"}


FAKE_DRIVER = r'''
import json, os, random, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import specab.driver.context as ctx_module
from specab.driver.playbook import PlaybookResult
rss_log = open(sys.argv[2], "a")
node_dir = Path(sys.argv[3])
rng = random.Random(1)
count = [0]

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])

class StandIn:
    """Plays the driver's playbooks: the queue executor's enqueue.yml (records the runs queued) and
    collect_run.yml (leaves a queued run's directory as the sequencer and the fetch leave it: artefacts,
    phases.jsonl, done.json), or the per-run path's arm.yml; reports phases like ansible-runner."""
    def __init__(self, project_dir, inventory, private_root, verbose=False, stream=None):
        self.private_root = Path(private_root)
        self.queued = {}                                   # run_id -> arm extravar, from enqueue.yml
    def run(self, playbook, extravars, ident, *, cancel=None, on_phase=None, secrets=None, timeout=None, limit=None):
        art = self.private_root / "artifacts" / ident; art.mkdir(parents=True, exist_ok=True)
        name = Path(playbook).name
        if name == "enqueue.yml":
            if extravars.get("specab_queue_reset"):
                self.queued.clear()
            for r in extravars["specab_runs"]:
                self.queued[r["run_id"]] = r["arm"]
            return PlaybookResult(status="successful", rc=0, ident=ident, artifact_dir=art)
        if name == "collect_run.yml":
            run_id = extravars["specab_run_id"]
            if run_id not in self.queued:
                raise RuntimeError(f"collect_run.yml for {run_id}, which no enqueue.yml queued")
            self.write_run(run_id, self.queued.pop(run_id), Path(extravars["specab_run_dir"]), None, queue=True)
            if on_phase: on_phase("collecting")
        elif name == "arm.yml":
            self.write_run(extravars["specab_run_id"], extravars["specab_arm"], Path(extravars["specab_run_dir"]),
                           on_phase, queue=False)
        else:
            raise RuntimeError(f"the stand-in runner has no stand-in for {playbook}")
        count[0] += 1
        if count[0] in (1, 10, 100, 250, 500, 750, 1000) or count[0] % 100 == 0:
            rss_log.write(json.dumps({"runs": count[0], "rss_kib": rss()}) + "\n"); rss_log.flush()
        return PlaybookResult(status="successful", rc=0, ident=ident, artifact_dir=art)

    def write_run(self, run_id, arm, d, on_phase, queue):
        sa = arm["server_args"]
        steps = int(sa.get("speculative_num_steps") or 0)
        d.mkdir(parents=True, exist_ok=True)
        nd = node_dir / "runs" / run_id; nd.mkdir(parents=True, exist_ok=True)
        (nd / "server.log").write_text("[2026-11-29 08:00:00] The server is fired up and ready to roll!\n")
        (nd / "bench.jsonl").write_text("")
        for ph in ("stopping", "waiting for GPUs", "starting", "loading", "verifying env", "benchmarking",
                   "final stop", "collecting"):
            if on_phase: on_phase(ph)
        tok_s = (60.5 if steps else 82.2) * (1 + 0.004 * rng.gauss(0, 1))
        t = time.time(); t_start = t; lines = []
        for i in range(10):
            chunks_t, chunks_n, ct, left = [0.06], [1], 0.06, 255
            while left > 0:
                k = min(left, rng.randint(1, steps + 1) if steps else 1); ct += k / tok_s
                chunks_t.append(round(ct, 6)); chunks_n.append(k); left -= k
            vct = len(chunks_n) - 1 if steps else None
            lines.append(json.dumps({"i": i % 8, "warmup": i < 2, "ok": True, "error": None, "start_ts": t,
                "prompt_tokens": 131, "output_tokens": 256, "ttft_s": 0.06, "e2e_s": ct, "chunk_t_s": chunks_t,
                "chunk_tokens": chunks_n, "decode_tok_s": 255 / (ct - 0.06), "tpot_s": (ct - 0.06) / 255,
                "spec_verify_ct": vct, "accept_len": 256 / vct if vct else None}))
            t += ct
        (d / "bench.jsonl").write_text("\n".join(lines) + "\n")
        hdr = "timestamp,index,uuid,clocks.sm,clocks.mem,clocks.max.sm,power.draw,temperature.gpu,utilization.gpu,clocks_event_reasons.active,memory.used"
        rows = [hdr] + [f"{t + s:.3f},{g},GPU-{g:08d},1980,3201,1980,455.0,56,97,0x0000000000000000,126518"
                        for s in range(30) for g in range(8)]
        (d / "gpu_samples.csv").write_text("\n".join(rows) + "\n")
        (d / "manifest.json").write_text(json.dumps({"kind": "specab-node-manifest", "run_id": run_id,
            "server_args": sa, "env_file": {"values": arm.get("env") or {}},
            "gpu": {"gpus": [{"index": g, "uuid": f"GPU-{g:08d}", "name": "NVIDIA H200"} for g in range(8)]}}))
        (d / "env_check.json").write_text(json.dumps({"ok": True, "variables": {k: {"expected": v,
            "evidence": ["environ:1"], "mismatches": [], "unverified": []} for k, v in (arm.get("env") or {}).items()}}))
        (d / "bench_summary.json").write_text(json.dumps({"requests": 8, "ok": 8, "failed": 0,
            "decode_tok_s_median": tok_s, "accept_len_mean": 2.1 if steps else None, "duration_s": 30.0,
            "client_cpu_s": 0.05}))
        for fname, val in (("stop.json", {"was_running": True, "total_s": 0.26, "ok": True}),
                           ("gpu_free.json", {"ok": True, "time_to_free_s": 0.3}),
                           ("ready.json", {"ready": True, "elapsed_s": 0.5, "ok": True}),
                           ("server_info.json", {**sa, "version": "0.5.9"})):
            (d / fname).write_text(json.dumps(val))
        (d / "server.log").write_text((nd / "server.log").read_text())
        if queue:
            # the sequencer's phases.jsonl (node phases, node clock) and done.json, as fetched with the run
            t0 = t_start - 40.0
            ph = [("claimed", 0.0), ("stopping-leftover", 0.01), ("gpus-free-before", 0.3), ("starting", 0.6),
                  ("loading", 0.7), ("ready", 5.0), ("env", 5.1), ("warming up", 5.3), ("benchmarking", 6.0),
                  ("stopping", 36.0), ("gpus free", 36.3), ("manifest", 36.6), ("done", 37.0)]
            text = "".join(json.dumps({"phase": n, "t": round(t0 + dt, 4)}) + "\n" for n, dt in ph)
            (d / "phases.jsonl").write_text(text); (nd / "phases.jsonl").write_text(text)
            done = {"ok": True, "status": "ok", "phase": None, "task": None, "error": None, "run_id": run_id,
                    "started_at": round(t0, 4), "finished_at": round(t0 + 37.0, 4), "time_to_ready_s": 4.4,
                    "stop_s": 0.3, "time_to_free_s": 0.3}
            (d / "done.json").write_text(json.dumps(done)); (nd / "done.json").write_text(json.dumps(done))

ctx_module.PlaybookRunner = StandIn
from specab.driver.cli import main
rc = main(sys.argv[4:])
rss_log.write(json.dumps({"runs": "end", "rss_kib": rss()}) + "\n")
sys.exit(rc)
'''


def measure_driver_1000(root: Path, runs: int, executor: str = "queue") -> dict[str, Any]:
    root.mkdir(parents=True)
    inv, ef = _node_files(root, free_port())
    script = root / "standin_driver.py"
    script.write_text(FAKE_DRIVER)
    rss_log = root / "rss.jsonl"
    repeats = -(-runs // 2)
    cmd = [PYTHON, str(script), str(REPO), str(rss_log), str(root / "node"), "run", "-e", str(ef), "-i", str(inv),
           "--repeats", str(repeats), "--runs-dir", str(root / "runs"), "--executor", executor]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1", MPLBACKEND="Agg"))
    own = Sampler(lambda: [proc.pid], interval=0.2).start()
    out, _ = proc.communicate(timeout=3600)
    peaks = own.stop()
    if proc.returncode != 0:
        raise BenchError(f"the driver with the stand-in runner failed (exit {proc.returncode}):\n{out[-3000:]}")
    marks = [json.loads(line) for line in rss_log.read_text().splitlines() if line.strip()]
    # the peak is only the whole experiment's if the driver wrote its end-of-experiment report (it exits 0
    # without one, printing "report not written: ...")
    reports = [p for p in (root / "runs").glob("*/report.md") if (p.parent / "report.html").is_file()]
    if not reports:
        tail = "\n".join(line for line in out.splitlines() if "report" in line.lower())[-2000:]
        raise BenchError(f"the driver finished but wrote no report.md/report.html under {root / 'runs'}: the peak "
                         f"would not include the report. Its report lines:\n{tail or out[-2000:]}")
    return {"runs": 2 * repeats, "executor": executor, "wall_s": round(time.perf_counter() - t0, 1), "driver_process": peaks,
            "rss_mb_after_runs": {str(m["runs"]): round(m["rss_kib"] / 1024, 1) for m in marks},
            "report_written": str(reports[0].relative_to(root)),
            "target_mb": 300, "met": peaks["peak_rss_mb"] <= 300}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--what", nargs="+", choices=("node", "driver-real", "driver-1000"),
                    default=["node", "driver-real", "driver-1000"])
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--requests", type=int, default=32, help="node: benchmark requests during the sampling")
    ap.add_argument("--concurrency", type=int, default=8, help="node: client concurrency")
    ap.add_argument("--time-scale", default="20", help="node: SPECAB_SIM_TIME_SCALE (faster load and decode)")
    ap.add_argument("--runs", type=int, default=1000, help="driver-1000: runs of the experiment")
    ap.add_argument("--executor", choices=("queue", "per-run"), default="queue",
                    help="driver-1000: the driver's executor (queue: the default on one node)")
    ap.add_argument("--workdir", help="keep files here (default: a temporary directory, removed)")
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args(argv)
    root = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="specab-footprint-"))
    res: dict[str, Any] = {"benchmark": "footprint", "loadavg_start": [round(x, 2) for x in os.getloadavg()],
                           "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    try:
        if "node" in args.what:
            res["node"] = measure_node(root / "node", args.tp, args.requests, args.concurrency, args.time_scale)
        if "driver-real" in args.what:
            res["driver_real"] = measure_driver_real(root / "driver-real")
        if "driver-1000" in args.what:
            res["driver_1000"] = measure_driver_1000(root / "driver-1000", args.runs, args.executor)
    except BenchError as exc:
        print(f"footprint: {exc}", file=sys.stderr)
        return 1
    finally:
        res["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
        if not args.workdir:
            shutil.rmtree(root, ignore_errors=True)
    text = json.dumps(res, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
