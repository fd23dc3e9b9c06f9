"""Benchmark 5: report generation for an experiment of 1,000 runs.

    python bench/report_scale.py [--runs 1000] [--steps 1 2 3] [--requests 8] [--warmup 2]

Synthesises an experiment directory of ``--runs`` runs through ``specab.results.store.Store``'s API, the
calls the driver makes for each run (``start_run``, ``record_phase``, ``add_requests``,
``add_gpu_samples``, ``add_manifest``, ``add_env_check``, ``add_file``, ``finish_run``):

* arms: baseline + EAGLE-3 at ``--steps`` (default 1, 2, 3: 4 arms, 250 blocks of 4 runs),
  interleaved in a seeded random order per block;
* per run: ``--warmup`` + ``--requests`` bench.jsonl records of ``--output-len`` tokens with their
  per-chunk arrays (chunks of 1..steps+1 tokens for EAGLE-3 arms), 1 s GPU samples of 8 GPUs over
  the run's decode time, a node manifest and an env check shaped like the node tools' output, the
  small JSON files the driver keeps, and a ``server.log`` in the run directory (real SGLang 0.5.9
  line formats: one ``Decode batch,`` line every 40 steps), which the report parses;
* speeds: baseline ~82 tok/s, EAGLE-3 ~60/61/58 tok/s with per-request and per-run noise and a
  slow drift, like the seed measurements.

Then ``python driver.py report <dir>`` runs in a fresh process (what a user types: imports, store
load, statistics, doctor, spec model, six plots, Markdown + HTML + JSON) and its wall time is the
measurement. ``--profile`` also runs ``specab.analysis.render.report.write_report`` in-process under cProfile and
lists the top functions. Target: <= 5 s. Prints one JSON object.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from specab.results.store import FILENAME, Store  # noqa: E402

NCCL = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_P2P_LEVEL": "SYS", "NCCL_MAX_NCHANNELS": "16",
        "NCCL_BUFFSIZE": "16777216", "NCCL_NTHREADS": "512"}
COMMON = {"model_path": "/models/Kimi-K2.5-INT4", "tp_size": 8, "mem_fraction_static": 0.88,
          "disable_custom_all_reduce": True, "trust_remote_code": True, "host": "127.0.0.1", "port": 30000}
SPEED = {0: 82.2, 1: 61.0, 2: 60.5, 3: 58.0}          # tok/s by steps (0 = baseline), seed-like
ACCEPT = {1: 1.7, 2: 2.1, 3: 2.3}
GPUS = 8


def arms(steps: list[int]) -> list[dict[str, Any]]:
    out = [{"name": "baseline", "is_baseline": True, "baseline": "baseline", "server_args": dict(COMMON),
            "env": dict(NCCL), "matrix": {}}]
    for k in steps:
        sa = {**COMMON, "speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "/models/eagle3-head",
              "speculative_num_steps": k, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": k + 1}
        out.append({"name": f"eagle3-s{k}", "is_baseline": False, "baseline": "baseline", "server_args": sa,
                    "env": dict(NCCL), "matrix": {"steps": k}})
    return out


def bench_records(rng: random.Random, t0: float, tok_s: float, steps: int, n_warm: int, n_req: int,
                  output_len: int) -> tuple[list[dict[str, Any]], float]:
    recs, t = [], t0
    for i in range(n_warm + n_req):
        v = tok_s * (1 + 0.003 * rng.gauss(0, 1))
        ttft = 0.06 * (1 + 0.05 * rng.random())
        chunk_t, chunk_n, left, ct = [ttft], [1], output_len - 1, ttft
        while left > 0:
            k = min(left, rng.randint(1, steps + 1) if steps else 1)
            ct += k / v
            chunk_t.append(round(ct, 6))
            chunk_n.append(k)
            left -= k
        e2e = ct
        vct = len(chunk_n) - 1 if steps else None
        recs.append({"i": i if i < n_warm else i - n_warm, "warmup": i < n_warm, "ok": True, "error": None,
                     "start_ts": t, "prompt_tokens": 131, "output_tokens": output_len, "ttft_s": round(ttft, 6),
                     "e2e_s": round(e2e, 6), "chunk_t_s": chunk_t, "chunk_tokens": chunk_n,
                     "chunk_tokens_exact": True, "tokens_from": "completion_tokens",
                     "decode_tok_s": (output_len - 1) / (e2e - ttft), "tpot_s": (e2e - ttft) / (output_len - 1),
                     "spec_verify_ct": vct, "accept_len": output_len / vct if vct else None,
                     "finish_reason": "length"})
        t += e2e + 0.005
    return recs, t


def gpu_csv(t0: float, t1: float, uuids: list[str]) -> str:
    lines = ["timestamp,index,uuid,clocks.sm,clocks.mem,clocks.max.sm,power.draw,temperature.gpu,utilization.gpu,"
             "clocks_event_reasons.active,memory.used"]
    t = t0
    while t <= t1:
        for g, u in enumerate(uuids):
            lines.append(f"{t:.3f},{g},{u},1980,3201,1980,455.37,56,97,0x0000000000000000,126518")
        t += 1.0
    return "\n".join(lines) + "\n"


def server_log(arm: dict[str, Any], steps: int, tok_s: float, n_lines: int, t0: float) -> str:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t0))
    sa = arm["server_args"]
    out = [f"[{stamp}] server_args=ServerArgs(model_path='{sa['model_path']}', tp_size=8, "
           f"speculative_algorithm={sa.get('speculative_algorithm')!r}, speculative_num_steps={steps or None})"]
    for r in range(GPUS):
        out.append(f"[{stamp} TP{r}] Load weight begin. avail mem=139.90 GB")
        out.append(f"[{stamp} TP{r}] Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, "
                   f"avail mem=67.90 GB, mem usage=72.00 GB.")
        out.append(f"[{stamp} TP{r}] Capture cuda graph begin. This can take up to several minutes. avail mem=10.12 GB")
        out.append(f"[{stamp} TP{r}] Capture cuda graph end. Time elapsed: 1.00 s. mem usage=2.00 GB. "
                   f"avail mem=8.12 GB.")
    out.append(f"[{stamp}] The server is fired up and ready to roll!")
    for i in range(n_lines):
        spec = (f"accept len: {ACCEPT[steps]:.2f}, accept rate: {ACCEPT[steps] / (steps + 1):.2f}, "
                if steps else "")
        out.append(f"[{stamp} TP0] Decode batch [{40 * (i + 1)}], #running-req: 1, #token: {131 + 40 * i}, "
                   f"token usage: 0.00, {spec}cuda graph: True, gen throughput (token/s): {tok_s:.2f}, #queue-req: 0")
    return "\n".join(out) + "\n"


def synthesise(exp_dir: Path, n_runs: int, steps: list[int], n_req: int, n_warm: int, output_len: int,
               seed: int, t0: float | None = None) -> dict[str, Any]:
    """Write the experiment; t0 (unix s) fixes its clock so two syntheses are identical (tests)."""
    rng = random.Random(seed)
    arm_list = arms(steps)
    names = [a["name"] for a in arm_list]
    blocks = -(-n_runs // len(names))
    plan = []
    for b in range(blocks):
        perm = names[:]
        rng.shuffle(perm)
        for pos, n in enumerate(perm, 1):
            if len(plan) < n_runs:
                seq = len(plan) + 1
                plan.append({"seq": seq, "run_id": f"{seq:03d}-{n}", "block": b, "position": pos, "arm": n})
    uuids = [f"GPU-{rng.getrandbits(32):08x}-daef-237f-dd2d-1f194bd911{g:02x}" for g in range(GPUS)]
    exp_dir.mkdir(parents=True)
    store = Store.create(exp_dir / FILENAME)
    t = time.time() - n_runs * 60.0 if t0 is None else t0
    exp_id = exp_dir.name
    store.write_experiment(id=exp_id, name="scale", seed=seed, repeats=blocks, order_mode="interleaved",
                           experiment_file="experiments/default.yml", inventory_file="inventory/local.yml",
                           config={"name": "scale", "server_args": COMMON, "env": NCCL},
                           matrix=[f"steps={','.join(map(str, steps))}"],
                           argv=["run", "--matrix", f"steps={','.join(map(str, steps))}", "--repeats", str(blocks)],
                           hosts=["node0"], specab_version="0.1.0", git_sha=None)
    store.write_arms(arm_list)
    store.write_plan(plan, repeats=blocks)
    by_name = {a["name"]: a for a in arm_list}
    n_rows = 0
    for p in plan:
        arm = by_name[p["arm"]]
        k = int(arm["server_args"].get("speculative_num_steps") or 0)
        drift = 1.0 - 0.01 * (p["seq"] / n_runs)
        tok_s = SPEED[k] * drift * (1 + 0.004 * rng.gauss(0, 1))
        run_dir = exp_dir / p["run_id"]
        run_dir.mkdir()
        store.start_run(seq=p["seq"], run_id=p["run_id"], arm=p["arm"], block=p["block"], host="node0",
                        run_dir=str(run_dir), runner_ident=f"{p['run_id']}-synthetic")
        t_start = t
        t += 40.0                                     # stop, GPUs free, start, load, ready, env
        recs, t_end = bench_records(rng, t, tok_s, k, n_warm, n_req, output_len)
        for ph, a, b in (("preparing", t_start, t_start + 1), ("stopping", t_start + 1, t_start + 2),
                         ("waiting for GPUs", t_start + 2, t_start + 3), ("starting", t_start + 3, t_start + 4),
                         ("loading", t_start + 4, t - 2), ("verifying env", t - 2, t),
                         ("benchmarking", t, t_end), ("final stop", t_end, t_end + 1),
                         ("collecting", t_end + 1, t_end + 3)):
            store.record_phase(p["seq"], ph, a, b)
        n_rows += store.add_requests(p["seq"], "node0", recs)
        n_rows += store.add_gpu_samples(p["seq"], "node0", gpu_csv(t, t_end, uuids))
        store.add_manifest(p["seq"], "node0", {
            "kind": "specab-node-manifest", "created_at": t_end, "run_id": p["run_id"],
            "host": {"hostname": "node0", "kernel": "6.8.0-45-generic", "machine": "x86_64",
                     "python_of_tools": "3.11.7"},
            "versions": {"python_for_engine": "/usr/bin/python3", "sglang": "0.5.9", "torch": "2.9.1"},
            "gpu": {"driver_version": "580.159.04", "gpus": [
                {"index": g, "uuid": u, "name": "NVIDIA H200", "memory.total": 143771, "clocks.max.sm": 1980,
                 "power.limit": 700.0, "pstate": "P0", "persistence_mode": "Enabled"} for g, u in enumerate(uuids)]},
            "server_args": arm["server_args"], "env_file": {"values": NCCL}, "seed": 1})
        store.add_env_check(p["seq"], "node0", {
            "ok": True, "variables": {v: {"expected": x, "evidence": [f"environ:{1000 + r}" for r in range(10)],
                                          "mismatches": [], "unverified": []} for v, x in NCCL.items()},
            "args": {a: {"expected": x, "actual": x, "ok": True} for a, x in arm["server_args"].items()},
            "server_info_endpoint": "/get_server_info", "nccl_lines": 0})
        summary = {"requests": n_req, "ok": n_req, "failed": 0, "decode_tok_s_median": tok_s,
                   "decode_tok_s_mean": tok_s, "ttft_s_median": 0.06, "tpot_s_median": 1 / tok_s,
                   "e2e_s_median": 0.06 + (output_len - 1) / tok_s, "accept_len_mean": ACCEPT.get(k),
                   "output_tok_s": tok_s * 0.98, "duration_s": t_end - t, "client_cpu_s": 0.05}
        stop = {"was_running": True, "escalated": False, "term_to_gone_s": 0.09, "total_s": 0.26, "ok": True}
        gpu_free = {"ok": True, "time_to_free_s": 0.31}
        info = {**arm["server_args"], "version": "0.5.9"}
        for name, val in (("bench_summary.json", summary), ("stop.json", stop), ("gpu_free.json", gpu_free),
                          ("server_info.json", info)):
            store.add_file(p["seq"], "node0", name, json.dumps(val))
        (run_dir / "server.log").write_text(server_log(arm, k, tok_s, (n_warm + n_req) * output_len // 40, t))
        store.finish_run(p["seq"], status="ok", runner_status="successful", runner_rc=0, summary=summary,
                         server_info=info, stop=stop, gpu_free=gpu_free, gpus=len(uuids))
        t = t_end + 5.0
    store.set_experiment_status("finished")
    store.close()
    return {"runs": len(plan), "arms": names, "blocks": blocks, "rows": n_rows,
            "store_mb": round((exp_dir / FILENAME).stat().st_size / 2**20, 1),
            "server_logs_mb": round(sum(f.stat().st_size for f in exp_dir.glob("*/server.log")) / 2**20, 1)}


def time_report_cli(exp_dir: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, str(REPO / "driver.py"), "report", str(exp_dir)], cwd=str(REPO),
                          capture_output=True, text=True, env=dict(os.environ, MPLBACKEND="Agg"))
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"driver.py report failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    for name in ("report.md", "report.html", "report.json"):
        if not (exp_dir / name).is_file():
            raise RuntimeError(f"driver.py report exited 0 but wrote no {name} in {exp_dir}")
    return {"wall_s": round(wall, 2), "cpu_s": round((after.ru_utime - before.ru_utime)
                                                     + (after.ru_stime - before.ru_stime), 2),
            "peak_rss_mb": round(after.ru_maxrss / 1024, 1), "summary": proc.stdout.strip().splitlines()[:6]}


def stage_times(exp_dir: Path) -> dict[str, float]:
    """CPU seconds of each stage of the report, in this process (after a first, warming report)."""
    import matplotlib
    matplotlib.use("Agg")
    from specab.analysis.evidence import model as analysis
    from specab.analysis.findings import doctor
    from specab.analysis.render import report
    from specab.analysis.measures import stats
    report.write_report(exp_dir)
    out: dict[str, float] = {}

    def timed(name: str, f, repeat: int = 1):
        best = float("inf")
        for _ in range(repeat):
            t = time.process_time()
            v = f()
            best = min(best, time.process_time() - t)
        out[name] = round(best, 3)
        return v
    # "server logs" is a difference of two loads (the store rows alone, then rows + logs): each is the best of three,
    # and a difference below the loads' own noise (a small experiment's logs) reads 0, not a negative time
    timed("load_store: store rows", lambda: analysis.load_store(exp_dir, read_logs=False), repeat=3)
    exp = timed("load_store: store rows + server logs", lambda: analysis.load_store(exp_dir), repeat=3)
    out["server logs"] = round(max(0.0, out.pop("load_store: store rows + server logs")
                                   - out["load_store: store rows"]), 3)
    st = timed("statistics", lambda: stats.analyse(exp))
    timed("doctor", lambda: doctor.diagnose(exp, st))
    model = timed("spec model", lambda: report._model_for(exp, st, exp.baseline))
    timed("plot tok/s", lambda: report.plot_tok_s(exp, st))
    timed("plot speedup, tau, baseline", lambda: (report.plot_speedup_vs_steps(exp, st, model),
                                                  report.plot_tau(exp, st, model),
                                                  report.plot_baseline_over_time(exp, st)))
    timed("plot GPU clocks", lambda: report.plot_gpu_clocks(exp))
    return out


def profile_report(exp_dir: Path, top: int) -> list[str]:
    from specab.analysis.render.report import write_report
    prof = cProfile.Profile()
    prof.enable()
    write_report(exp_dir)
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(top)
    return [line for line in s.getvalue().splitlines() if line.strip()][-top:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--steps", type=int, nargs="+", default=[1, 2, 3], help="EAGLE-3 arms besides the baseline")
    ap.add_argument("--requests", type=int, default=8, help="measured requests per run")
    ap.add_argument("--warmup", type=int, default=2, help="warm-up requests per run")
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3, help="time the report this many times (median reported)")
    ap.add_argument("--profile", action="store_true", help="also profile write_report in-process")
    ap.add_argument("--stages", action="store_true", help="also time each stage of the report in-process (CPU s)")
    ap.add_argument("--workdir", help="keep the experiment here (default: a temporary directory, removed)")
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args(argv)
    if args.runs < 2:
        ap.error("--runs must be >= 2")
    root = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="specab-reportscale-"))
    exp_dir = root / "scale-20261129-000000"
    try:
        t0 = time.perf_counter()
        made = synthesise(exp_dir, args.runs, args.steps, args.requests, args.warmup, args.output_len, seed=1)
        made["synthesis_s"] = round(time.perf_counter() - t0, 1)
        load_before = [round(x, 2) for x in os.getloadavg()]
        timings = [time_report_cli(exp_dir) for _ in range(max(1, args.repeat))]
        walls = sorted(t["wall_s"] for t in timings)
        res: dict[str, Any] = {
            "benchmark": "report generation, experiment of %d runs" % args.runs,
            "loadavg_before": load_before, "loadavg": [round(x, 2) for x in os.getloadavg()],
            "cores": os.cpu_count(), "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "experiment": made, "command": "python driver.py report <experiment dir>",
            "wall_s": walls, "wall_s_median": walls[len(walls) // 2], "cpu_s": [t["cpu_s"] for t in timings],
            "peak_rss_mb": max(t["peak_rss_mb"] for t in timings), "report_summary": timings[-1]["summary"],
            "target_s": 5.0, "met": walls[len(walls) // 2] <= 5.0}
        if args.stages:
            res["stages_cpu_s"] = stage_times(exp_dir)
        if args.profile:
            res["profile_top"] = profile_report(exp_dir, 25)
    finally:
        if not args.workdir:
            shutil.rmtree(root, ignore_errors=True)
    text = json.dumps(res, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
