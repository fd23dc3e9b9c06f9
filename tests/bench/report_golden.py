"""Golden reports: three small experiments built from code, and the report each must get.

What they are: `tests/bench/data/report_golden/<fixture>.md` and `.json` are the `report.md` and `report.json`
that `build_report` writes for the experiments `build` makes here. Nothing in them was measured: every experiment
is synthesised with fixed seeds and a fixed clock (`T0`), so the same code writes the same files, byte for byte, on
any machine. `test_report_golden.py` rebuilds the experiments and compares: report.md byte for byte (sections,
tables, doctor text), every number of report.json to 1e-12 relative (stats, spec model, findings, summary), and the
plots' file names. A change to the report that nobody meant (a faster loader that drops a line shape, a
refactor that moves a number) fails there with the first differences named.

How they are made: by this module, from the report code of the commit that writes them:
    .venv/bin/python -m tests.bench.report_golden --write tests/bench/data/report_golden
(a few seconds). The files are reviewed as a diff like any code change.

When they may be regenerated: only in a commit that changes what the report says on purpose (a new section, a
reworded finding, a new key), and that commit's message says so and why; never to make a failing test pass after a
change that was meant to keep the report as it was (a speed-up, a refactor, a dependency update): there the
difference is the defect. `git log tests/bench/data/report_golden` lists every regeneration and its reason.

The fixtures cover what the report's fast paths (loader, log reader, plots) must keep:
* ``throttled``: three arms, a throttled baseline run (GPU samples with clock-event reasons), and
  server logs of every line shape the log reader sees (0.5.2 ``Decode batch.`` with a trailing
  comma, 0.5.9 ``Decode batch [iter],``, ``cuda graph: False`` and ``cpu graph``, idle lines with
  ``#running-req: 0``, DP/TP prefixes, CRLF line ends, a non-UTF-8 byte, NCCL INFO lines with the
  integer ``16.`` form and a repeated variable), and the speculative arms' ``phase_metrics.json`` made by
  the client's own parser from SGLang 0.5.23 ``/metrics`` text (a no-graph and a graphed verify: the report's
  per-phase section and stacked bar, the dominant-phase and phase-accounting findings);
* ``fleet``: two hosts (per-host speedups), blocked order with a drift, one failed run, a simulated
  node at SPECAB_SIM_TIME_SCALE 20, no server logs for some runs;
* ``scale``: bench/report_scale.py's synthetic experiment at 24 runs (4 arms, 8-GPU samples with
  UUIDs, manifests, env checks, SGLang 0.5.9 logs).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
FIXTURES = ("throttled", "fleet", "scale")
T0 = 1.79e9          # the scale fixture's clock (unix s)


def _report_scale():
    spec = importlib.util.spec_from_file_location("bench_report_scale_golden", REPO / "bench" / "report_scale.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _rich_log(run, graph_false: bool) -> str:
    """Every decode/NCCL line shape the report's log reader meets, in one server log."""
    acc = run.log.accept_len_mean if run.log and run.log.accept_len_mean else None
    spec = f"accept len: {acc + 0.3:.2f}, accept rate: 0.61, " if acc else ""
    gen = run.log.gen_tok_s_median if run.log else 80.0
    g = "False" if graph_false else "True"
    lines = [
        "[2025-10-22 10:27:40 TP0] Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, "
        "avail mem=60.12 GB, mem usage=72.00 GB.",
        "host:4242:4242 [0] NCCL INFO NCCL_MAX_NCHANNELS set by environment to 16.",
        "host:4242:4243 [1] NCCL INFO NCCL_MAX_NCHANNELS set by environment to 32.",    # first one wins
        "host:4242:4242 [0] NCCL INFO NCCL_P2P_LEVEL set by environment to SYS",
        "NCCL_BUFFSIZE set by environment to 16777216.",                                 # no NCCL INFO: not read
        "host:4242:4242 [0] NCCL INFO NCCL version 2.28.9+cuda13.0",
        "[2025-10-22 10:27:50] The server is fired up and ready to roll!",
        "[2025-10-22 10:27:56 TP0] Prefill batch. #new-seq: 1, #new-token: 28, #cached-token: 0, "
        "token usage: 0.00, #running-req: 0, #queue-req: 0,",
    ]
    for j in range(9):
        lines.append(f"[2025-10-22 10:27:{57 + j % 3:02d} TP0] Decode batch. #running-req: 1, #token: {186 + j}, "
                     f"token usage: 0.00, {spec}cuda graph: {g if j % 3 else 'True'}, "
                     f"gen throughput (token/s): {gen + j * 0.37:.2f}, #queue-req: 0,")
        lines.append(f"[2025-10-22 10:28:0{j % 10} DP0 TP0] Decode batch [{40 * (j + 1)}], #running-req: {j % 2}, "
                     f"#token: {131 + j}, token usage: 0.00, {spec}cuda graph: {g}, "
                     f"gen throughput (token/s): {gen - j * 0.21:.2f}, #queue-req: 0")
    lines.append(f"[2025-10-22 10:29:00 TP0] Decode batch, #running-req: 2, #token: 300, token usage: 0.01, "
                 f"cpu graph: True, gen throughput (token/s): {gen * 1.9:.2f}, #queue-req: 1\r")   # CRLF line end
    lines.append("[2025-10-22 10:29:01 TP0] Decode batch, #running-req: 1, #token: 301, token usage: 0.01, "
                 "cuda graph: True, gen throughput (token/s): 81.00, #queue-req: 0, note: caf\udcff")
    return "\n".join(lines) + "\n"


# SGLang 0.5.23 /metrics labels (shared/reference/engines-2026.md A5; the label set of the real 0.5.17 H200 probe,
# tests/unit/test_phasemetrics.py): per-phase forward seconds only with SGLANG_ENABLE_METRICS_DEVICE_TIMER=1
_LABELS = 'engine_type="unified",model_name="/models/Kimi-K2.5-INT4",moe_ep_rank="0",pp_rank="0",tp_rank="{r}"'
# ms per cycle per category of the throttled fixture's speculative arms, graph mode as their server logs say:
# eagle3-s3 the seed's no-graph verify at steps 3 (3 x 2.0 ms draft, 30.5 ms verify: verify dominates); eagle3-s2 a
# graphed verify (29.0 x 0.45 ms) in a cycle that is no shorter, so half of it lies outside the forward passes
# (phase-accounting)
_PHASE_MS = {"eagle3-s2": (4.0, 0.8, 13.05, "decode_cuda_graph"), "eagle3-s3": (6.0, 0.8, 30.5, "decode_none")}


def _metrics_text(forward_s: dict[str, float], passes: dict[str, float], verify_calls: float, tokens: float) -> str:
    """One /metrics scrape in SGLang 0.5.23's exposition format (two TP ranks; only rank 0 is read)."""
    lines = ["# HELP sglang:forward_execution_seconds_total Total time that GPU is busy executing model forward "
             "passes. Refer to ForwardMode for category labels.",
             "# TYPE sglang:forward_execution_seconds_total counter"]
    for r in (0, 1):
        lines += [f'sglang:forward_execution_seconds_total{{category="{c}",{_LABELS.format(r=r)}}} {v!r}'
                  for c, v in forward_s.items()]
    lines += ["# TYPE sglang:cuda_graph_passes_total counter"]
    lines += [f'sglang:cuda_graph_passes_total{{{_LABELS.format(r=0)},mode="{m}"}} {v!r}' for m, v in passes.items()]
    lines += [f'sglang:spec_verify_calls_total{{engine_type="unified",model_name="/models/Kimi-K2.5-INT4"}} '
              f'{verify_calls!r}',
              f'sglang:generation_tokens_total{{engine_type="unified",is_streaming="true",'
              f'model_name="/models/Kimi-K2.5-INT4"}} {tokens!r}',
              f'sglang:spec_accept_length{{{_LABELS.format(r=0)}}} 2.1']
    return "\n".join(lines) + "\n"


def _phase_metrics(run) -> dict[str, Any]:
    """The run's phase_metrics.json as the benchmark client writes it (specab/node/phasemetrics.py on two scrapes
    around the measured requests): cycles = the requests' verify steps, phase seconds = cycles x ms per cycle
    (slower in proportion when the run is slower)."""
    from specab.node import phasemetrics
    draft, extend, verify, mode = _PHASE_MS[run.arm]
    reqs = run.measured
    cycles = float(sum(q.spec_verify_ct for q in reqs))
    slow = 60.5 / statistics.fmean(q.decode_tok_s for q in reqs)
    before = {"eagle_draft": 812.25, "eagle_draft_extend": 162.5, "target_verify": 5890.125, "extend": 40.5}
    after = {"eagle_draft": before["eagle_draft"] + cycles * draft * slow / 1000.0,
             "eagle_draft_extend": before["eagle_draft_extend"] + cycles * extend * slow / 1000.0,
             "target_verify": before["target_verify"] + cycles * verify * slow / 1000.0,
             "extend": before["extend"] + 0.06 * len(reqs)}
    t0, t1 = reqs[0].start_ts, reqs[-1].start_ts + reqs[-1].e2e_s
    return phasemetrics.result(_metrics_text(before, {mode: 203100.0}, 203100.0, 430000.0),
                               _metrics_text(after, {mode: 203100.0 + cycles}, 203100.0 + cycles,
                                             430000.0 + sum(q.output_tokens for q in reqs)),
                               t1 - t0, t0, t1)


def build(root: Path) -> dict[str, Path]:
    """The three experiment directories under root (deterministic: seeded, fixed clocks)."""
    from tests.analysis import factory as F

    root.mkdir(parents=True, exist_ok=True)
    out = {}

    def hot(run, arm):
        if run.block == 1 and not arm.is_spec:
            w = run.window
            run.gpu_samples = F.gpu_samples(w[0], w[1], sm=1600, reasons=0x20)
    exp = F.experiment({"baseline": 82.2, "eagle3-s2": 60.5, "eagle3-s3": 60.0}, blocks=4,
                       accept={"eagle3-s2": 2.1, "eagle3-s3": 2.3}, tweak=hot)
    d = F.write_store(exp, root / "throttled")
    for r in exp.runs:
        if r.arm != "eagle3-s2" or r.block % 2 == 0:
            text = _rich_log(r, graph_false=r.arm == "eagle3-s3")
            (d / r.run_id / "server.log").write_bytes(text.encode("utf-8", "surrogateescape"))
    from specab.results.store import Store
    with Store.open(d) as s:             # bench.phase_timing auto: the speculative arms' per-phase counters
        for r in exp.runs:
            if r.arm in _PHASE_MS:
                s.add_file(r.seq, r.host, "phase_metrics.json", json.dumps(_phase_metrics(r)))
    out["throttled"] = d

    def fail_one(run, arm):
        if run.seq == 5:
            run.status, run.requests = "failed", []
    exp = F.experiment({"baseline": 82.2, "eagle3-s2": 60.5}, blocks=4, accept={"eagle3-s2": 2.1},
                       order="blocked", drift_per_run=-0.004, hosts=("node-a", "node-b"), seed=7, tweak=fail_one)
    d = F.write_store(exp, root / "fleet", time_scale=20.0)
    for r in exp.runs:
        if r.seq % 3 == 0:
            (d / r.run_id / "server.log").unlink()
    out["fleet"] = d

    rs = _report_scale()
    d = root / "scale" / "scale-20261129-000000"
    rs.synthesise(d, 24, [1, 2, 3], 8, 2, 256, seed=1, t0=T0)
    out["scale"] = d
    return out


def outputs(exp_dir: Path) -> dict[str, Any]:
    """What the golden files hold for one experiment: report.json, report.md and the plots' names."""
    from specab.analysis.findings import doctor
    from specab.analysis.render import report

    paths = report.write_report(exp_dir, config=doctor.DoctorConfig(usual_baseline_tok_s=90.0), target_tok_s=150.0)
    md = Path(paths["markdown"]).read_text(encoding="utf-8")
    data = json.loads(Path(paths["json"]).read_text(encoding="utf-8"))
    data["plots"] = sorted(p.name for p in (exp_dir / "report").glob("*.png"))
    return {"json": data, "md": md}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="write the golden report files")
    ap.add_argument("--write", required=True, help="directory for <fixture>.json and <fixture>.md")
    args = ap.parse_args(argv)
    dest = Path(args.write)
    dest.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="specab-golden-"))
    try:
        for name, d in build(tmp).items():
            o = outputs(d)
            (dest / f"{name}.json").write_text(json.dumps(o["json"], indent=1, sort_keys=True, default=str) + "\n")
            (dest / f"{name}.md").write_text(o["md"])
            print(f"{name}: {dest / name}.json, .md")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
