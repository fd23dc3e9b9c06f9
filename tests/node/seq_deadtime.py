"""Dead time per arm transition of the node-side sequencer (benchmark 1, node half).

    .venv/bin/python -m tests.node.seq_deadtime [--runs 11] [--tp 8] [--workdir DIR]

Queues ``--runs`` runs (alternating baseline / EAGLE-3 2-step) on a simulated node with the
``instant`` profile (every load phase 0 s) at time scale 1, lets ``sequence.py`` run them back to
back, and reports per transition, as bench/dead_time.py defines it:

    dead = first request start_ts of run k+1 − end of the last request of run k (start_ts + e2e_s)
           − engine load of run k+1 (server.json started_at → "The server is fired up and ready to
             roll!" seen in its server.log by a 20 ms watcher)

plus where the rest goes, from the run's phases.jsonl. The controller side is not in it (the
queue is filled up front, as the driver's lookahead keeps it filled). Prints one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List

from tests.node.seqnode import SeqNode

READY_LINE = b"The server is fired up and ready to roll!"


class ReadyWatcher(threading.Thread):
    """When each run's server.log first holds the ready line (polled every 20 ms)."""

    def __init__(self, runs_dir: Path) -> None:
        super().__init__(daemon=True)
        self.runs_dir = runs_dir
        self.seen: Dict[str, float] = {}
        self.offsets: Dict[str, int] = {}
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            for log in self.runs_dir.glob("*/server.log"):
                rid = log.parent.name
                if rid in self.seen:
                    continue
                try:
                    with open(log, "rb") as fh:
                        fh.seek(max(0, self.offsets.get(rid, 0) - len(READY_LINE)))
                        data = fh.read()
                        self.offsets[rid] = fh.tell()
                except OSError:
                    continue
                if READY_LINE in data:
                    self.seen[rid] = time.time()
            self.halt.wait(0.02)


def bench_window(path: Path) -> tuple[float, float]:
    recs = [json.loads(l) for l in path.read_text().splitlines() if l.strip()]
    return min(r["start_ts"] for r in recs), max(r["start_ts"] + r["e2e_s"] for r in recs)


def summarize(values: List[float]) -> Dict[str, Any]:
    return {"n": len(values), "median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3)}


def measure(root: Path, runs: int, tp: int, gpu: bool = False) -> Dict[str, Any]:
    node = SeqNode(root, tp=tp, scale=1.0, profile="instant", gpu=gpu)
    bench = {"api": "generate", "num_requests": 1, "warmup_requests": 1, "input_len": 8, "output_len": 8,
             "concurrency": 1, "seed": 1, "timeout_s": 60, "ignore_eos": True,
             "request_rate": 0, "client_procs": "auto"}
    spec = {"speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "/models/eagle3-head",
            "speculative_num_steps": 2, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 3}
    ids = [node.enqueue(i + 1, node.arm("baseline") if i % 2 == 0 else node.arm("eagle3-s2", **spec), bench=bench)
           for i in range(runs)]
    watcher = ReadyWatcher(node.node_dir / "runs")
    watcher.start()
    load0 = os.getloadavg()
    t0 = time.time()
    try:
        r = node.ensure()
        if r.rc != 0:
            raise SystemExit("ensure failed: %s" % r.error)
        node.seq("finish", "--experiment-id", node.experiment_id)
        for rid in ids:
            w = node.wait(rid, timeout=300)
            if w.rc != 0 or not w.data.get("ok"):
                raise SystemExit("run %s failed: %s" % (rid, json.dumps(w.data)[:2000]))
        deadline = time.monotonic() + 5
        while len(watcher.seen) < runs and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        watcher.halt.set()
        node.cleanup()
    load1 = os.getloadavg()
    rows = []
    for prev, cur in zip(ids, ids[1:]):
        _, prev_end = bench_window(node.run_file(prev, "bench.jsonl"))
        first, _ = bench_window(node.run_file(cur, "bench.jsonl"))
        started = json.loads(node.run_file(cur, "manifest.json").read_text())["server"]["record"]["started_at"]
        load = watcher.seen[cur] - float(started)
        ph_prev = {p["phase"]: p["t"] for p in node.phases(prev)}
        ph = {p["phase"]: p["t"] for p in node.phases(cur)}
        rows.append({
            "run": cur, "wall_s": round(first - prev_end, 3), "engine_load_s": round(load, 3),
            "dead_s": round(first - prev_end - load, 3),
            # where the rest goes (phase boundaries of phases.jsonl)
            "last_request_to_stopping_s": round(ph_prev["stopping"] - prev_end, 3),
            "stopping_s": round(ph_prev["gpus free"] - ph_prev["stopping"], 3),
            "gpus_free_s": round(ph_prev["manifest"] - ph_prev["gpus free"], 3),
            "manifest_s": round(ph_prev["done"] - ph_prev["manifest"], 3),
            "done_to_starting_s": round(ph["starting"] - ph_prev["done"], 3),
            "spawn_s": round(float(started) - ph["starting"], 3),
            "ready_seen_to_ready_s": round(ph["ready"] - watcher.seen[cur], 3),
            "env_s": round(ph["warming up"] - ph["env"], 3),
            "warming_up_to_first_request_s": round(first - ph["warming up"], 3),
        })
    keys = [k for k in rows[0] if k.endswith("_s")]
    return {"runs": runs, "transitions": len(rows), "tp": tp, "profile": "instant", "time_scale": 1,
            "loadavg_before": [round(x, 2) for x in load0], "loadavg_after": [round(x, 2) for x in load1],
            "elapsed_s": round(time.time() - t0, 1),
            "median": {k: round(statistics.median(r[k] for r in rows), 3) for k in keys},
            "dead": summarize([r["dead_s"] for r in rows]), "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=11)
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--workdir", default=None, help="keep every run here (default: a temporary directory)")
    ap.add_argument("--gpu", action="store_true",
                    help="GPU mode on a real GPU machine: the schedulers allocate real CUDA memory and the "
                         "sequencer reads the real nvidia-smi (use --tp <= the GPU count)")
    a = ap.parse_args()
    if a.workdir:
        root = Path(a.workdir)
        root.mkdir(parents=True, exist_ok=True)
        print(json.dumps(measure(root, a.runs, a.tp, a.gpu), indent=1))
    else:
        with tempfile.TemporaryDirectory(prefix="specab-seq-dead-") as d:
            print(json.dumps(measure(Path(d), a.runs, a.tp, a.gpu), indent=1))


if __name__ == "__main__":
    main()
