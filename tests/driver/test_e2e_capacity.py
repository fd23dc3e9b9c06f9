"""Capacity at an SLO and the honest load verdict end to end on the simulated node, against the simulator's own timing
model and trace.

The node runs a deterministic profile (no noise, every draft accepted: the speculative arm emits 4 tokens a cycle, 1 +
3 steps; instant start-up) whose step grows linearly with the batch, so what each arm serves at a latency target follows
from specab/sim/timing.py alone:

- in a closed loop of c requests in flight every decode pass serves c requests, so a request's TPOT (its 32 tokens
  after the first over the time they took) is the baseline's step at batch c, ``nominal_decode_step_s(c)``, and the
  speculative arm's 8 cycles (32 / 4 tokens) at batch c over 32 tokens, ``8 * nominal_spec_cycle_s(c) / 32``; the
  highest concurrency meeting ``p50 TPOT <= 22 ms`` is where that line crosses 22 ms (baseline 10 + 5 (c - 1) ms:
  3.4 in flight; EAGLE-3 8 x 13.04 c / 32 ms: 6.75 in flight);
- at an arrival rate above what an arm can serve with at most C = 4 in flight, the batch stays at C and the arm
  completes C requests every D passes: mu = C / (D * pass(C)) requests per second (D = 32 steps, or 8 cycles), so the
  throughput ratio of two saturated arms is mu_spec / mu_base; far below mu both keep up.

The probes' batches are the engine's own (a request that ends leaves one pass at c - 1 before its successor is
prefilled), so the measured TPOT lies a few per cent under the line, and a box that falls behind the simulator's
schedule moves it further (CI saw the EAGLE-3 capacity 8.2 % above the model's): the final bracket must contain the
model's capacity, each capacity is the interpolation over the probes' stored TPOTs (recomputed here), each probe's TPOT
is the one the simulator's own trace gives (from the times it emitted the tokens, `_trace_tpot`), and so is the
per-token ITL (the trace's emission gaps).
"""
from __future__ import annotations

import json
import math
import signal
import statistics
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from scipy.optimize import brentq

from specab.analysis.evidence.chunks import run_chunks
from specab.analysis.evidence.model import load_store
from specab.analysis.measures.latency import per_token_latencies, run_times
from specab.results import store as st
from specab.sim.profile import PROFILE_DIR, profile_from_dict
from specab.sim.timing import TimingModel
from tests.driver.simnode import SimNode, driver, free_port, reap_driver, wait_for
from tests.driver.simtrace import trace_of

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
SCALE = 2
OUTPUT_LEN = 33                 # the first token, then 32: 32 baseline steps, 8 speculative cycles of 4
TPOT_TARGET_MS = 22.0
CAP_TOL = 0.08                  # the probes' TPOT lies a few per cent under the model's line (the module's note)
# A probe's TPOT as the client read it against the simulator's emission times: on the loaded 2-core CI box the client
# read a probe at 8 in flight up to 10.8 % late (measured: 25.76 against 23.25 ms), which a capacity interpolated in
# log load amplified past 3 %; the capacity itself is held exactly to the stored TPOTs and the search to the model.
PROBE_TOL = 0.15
CAP = 4                         # requests in flight at most under an arrival rate
SPEC = {"speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "/models/known-truth-eagle3",
        "speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4}


def _profile() -> dict:
    p = yaml.safe_load((PROFILE_DIR / "h200-known-truth.yml").read_text())
    p["name"] = "capacity-linear"
    p["load"] = {k: 0.0 for k in p["load"]} | {"sigterm_poll_s": 0.05}
    p["decode"].update(step_ms=10.0, bs_slope=0.5)
    p["prefill"] = {"base_ms": 0.1, "per_token_ms": 0.001}
    p["spec"].update(draft_step_ms=1.0, draft_passes_offset=1, verify_base_ms=10.0, verify_per_token_ms=0.01,
                     verify_cuda_graph=False, overhead_ms=1.0, draft_extend_ms=0.5, bs_slope=1.0, bs_log2_slope=0.0,
                     acceptance=[0.999999] * 8)
    p["noise"] = {"step_cv": 0.0, "request_cv": 0.0, "instance_cv": 0.0, "drift_pct_per_hour": 0.0,
                  "drift_max_pct": 0.0}
    return p


def _models() -> tuple[TimingModel, TimingModel]:
    prof = profile_from_dict(_profile())
    args = {"tp_size": 1, "max_running_requests": 48}
    return TimingModel.create(prof, args, {}), TimingModel.create(prof, {**args, **SPEC}, {})


def tpot_s(tm: TimingModel, c: float) -> float:
    """A request's TPOT with c in flight by the timing model: its decode passes at batch c over its 32 tokens."""
    tokens = OUTPUT_LEN - 1
    if not tm.speculative:
        return tm.nominal_decode_step_s(c)                         # type: ignore[arg-type]
    cycles = math.ceil(tokens / round(tm.expected_accept_length()))
    return cycles * tm.nominal_spec_cycle_s(c) / tokens           # type: ignore[arg-type]


def capacity_truth(tm: TimingModel) -> float:
    """The concurrency at which the model's TPOT crosses the target (it grows linearly with the batch)."""
    return brentq(lambda c: tpot_s(tm, c) * 1000.0 - TPOT_TARGET_MS, 1.0, 64.0)


def saturated_rate(tm: TimingModel) -> float:
    """Requests per second an arm completes with CAP in flight at every pass (simulated seconds)."""
    passes = OUTPUT_LEN - 1 if not tm.speculative else math.ceil((OUTPUT_LEN - 1) / round(tm.expected_accept_length()))
    one = tm.nominal_spec_cycle_s(CAP) if tm.speculative else tm.nominal_decode_step_s(CAP)
    return CAP / (passes * one)


@pytest.fixture
def node(tmp_path: Path):
    (tmp_path / "profile.yml").write_text(yaml.safe_dump(_profile()))
    n = SimNode(root=tmp_path, port=free_port(), time_scale=str(SCALE), profile=str(tmp_path / "profile.yml"))
    yield n
    n.cleanup()


def _experiment(node: SimNode, concurrency: int) -> Path:
    exp = {"specab_experiment": {
        "name": "cap", "model_path": "/models/known-truth-target",
        "server_args": {"tp_size": 1, "mem_fraction_static": 0.6, "host": "127.0.0.1", "port": node.port,
                        "max_running_requests": 48},
        "env": {}, "arms": [{"name": "baseline"}, {"name": "eagle3", "server_args": dict(SPEC)}],
        "bench": {"api": "generate", "num_requests": 24, "warmup_requests": 1, "input_len": 16,
                  "output_len": OUTPUT_LEN, "concurrency": concurrency, "seed": 1, "timeout_s": 120},
        "slo": {"tpot_ms": {"p50": TPOT_TARGET_MS}},
        "timeouts": {"ready_s": 60, "stop_grace_s": 5, "gpu_free_s": 30}}}
    p = node.root / f"cap-{concurrency}.yml"
    p.write_text(json.dumps(exp))
    return p


def _inventory(node: SimNode) -> Path:
    trace = node.root / "sim-trace.jsonl"
    return node.write_inventory({**node.host_vars(),
                                 "specab_node_env": {**node.node_env(), "SPECAB_SIM_TRACE": str(trace)}})


def _exp_dir(node: SimNode) -> Path:
    return max((d for d in node.runs_dir.iterdir() if (d / st.FILENAME).exists()), key=lambda d: d.stat().st_mtime)


def _trace_tpot(exp, trace: Path) -> Callable[[str], float]:
    """A run's p50 TPOT from the times the simulator emitted its requests' tokens (simulated seconds)."""
    runs = {r.run_id: r for r in exp.runs}
    return lambda run_id: statistics.median((rec["emit_mono"][-1] - rec["emit_mono"][0]) * rec["time_scale"]
                                            / (rec["completion_tokens"] - 1) for _, rec in trace_of(trace, runs[run_id]))


def _client_tpot(exp) -> Callable[[str], float]:
    """A run's p50 TPOT as the client measured it (the stored requests)."""
    runs = {r.run_id: r for r in exp.runs}
    return lambda run_id: statistics.median(q.tpot_s for q in runs[run_id].measured)


def _capacity(fam: dict, tpot_of: Callable[[str], float]) -> float:
    """A family's capacity from its probes' p50 TPOT: in each block, the margin log(TPOT / target) of its passing and
    failing probes crossing 0 interpolated in log load (docs/analysis.md, SLO and capacity); the geometric mean over
    blocks."""
    logs = []
    for b in fam["blocks"]:
        margin = {}
        for load in (b["passed"], b["failed"]):
            [probe] = [p for p in fam["probes"] if p["block"] == b["block"] and p["load"] == load]
            margin[load] = math.log(tpot_of(probe["run_id"]) * 1000.0 / TPOT_TARGET_MS)
        x0, x1 = b["passed"], b["failed"]
        t = min(1.0, max(0.0, -margin[x0] / (margin[x1] - margin[x0])))
        logs.append(math.log(x0) + t * (math.log(x1) - math.log(x0)))
    return math.exp(statistics.fmean(logs))


def _run(node: SimNode, exp: Path, *args: str) -> tuple[str, Path]:
    proc = driver("-e", str(exp), "-i", str(_inventory(node)), "--runs-dir", str(node.runs_dir), *args)
    out, _ = proc.communicate(timeout=800)
    assert proc.returncode == 0, out[-4000:]
    return out, _exp_dir(node)


def _interrupted_in_block_2(node: SimNode, exp: Path, *args: str) -> tuple[str, Path]:
    """The search interrupted (SIGINT) once block 2 is planned and its second run is up, then resumed: the resume
    reads the stored search and goes on from the stored runs. Returns the resume's output."""
    common = ["-i", str(_inventory(node)), "--runs-dir", str(node.runs_dir)]
    proc = driver("-e", str(exp), *common, *args)
    try:
        def in_block_2() -> bool:
            s = node.server()
            if not (node.runs_dir.exists() and s and node.server_alive()):
                return False
            with st.Store.open(_exp_dir(node)) as store:
                second = [r for r in store.plan() if r["block"] == 2][1:2]
            return bool(second) and s.get("run_id") == second[0]["run_id"]
        wait_for(in_block_2, timeout=600, what="block 2's second run", proc=proc)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=300)
    finally:
        reap_driver(proc, 120)
    assert proc.returncode == 130, out[-4000:]
    exp_dir = _exp_dir(node)
    with st.Store.open(exp_dir) as store:
        assert store.experiment()["status"] == "interrupted" and store.missing()
    proc = driver("--resume", exp_dir.name, *common)
    out, _ = proc.communicate(timeout=800)
    assert proc.returncode == 0, out[-4000:]
    assert "runs to do" in out
    return out, exp_dir


def test_search_finds_each_arms_capacity_at_the_slo(node: SimNode):
    base_tm, spec_tm = _models()
    truth = {"baseline": capacity_truth(base_tm), "eagle3": capacity_truth(spec_tm)}
    assert truth["baseline"] == pytest.approx(3.4) and truth["eagle3"] == pytest.approx(6.75, rel=1e-3)
    out, exp_dir = _interrupted_in_block_2(node, _experiment(node, 1), "--search", "concurrency=2..8",
                                           "--search-tol", "50%", "--repeats", "2")
    data = json.loads((exp_dir / "report.json").read_text())["capacity"]
    fams = data["families"]
    assert set(fams) == {"baseline", "eagle3"} and data["axis"] == "concurrency"
    exp = load_store(exp_dir)
    trace_tpot, client_tpot = _trace_tpot(exp, node.root / "sim-trace.jsonl"), _client_tpot(exp)
    traced = {name: _capacity(fam, trace_tpot) for name, fam in fams.items()}
    measured = {name: _capacity(fam, client_tpot) for name, fam in fams.items()}
    for name, fam in fams.items():
        blocks = fam["blocks"]
        assert blocks[0]["loads"] == [2, 4, 8]                      # block 1: the ladder from 2 doubling to 8
        last = blocks[-1]
        # the search stopped with the model's capacity inside the last block's own bracket, one grid step wide
        assert last["passed"] < truth[name] < last["failed"] and last["failed"] / last["passed"] <= 1.5, (name, last)
        assert all(b["estimate"] is not None for b in blocks) and len(blocks) == 2
        # the report's capacity is the interpolation over the client's stored TPOTs, recomputed here
        assert fam["estimate"] == pytest.approx(measured[name], rel=1e-9), (name, fam["estimate"], measured[name])
        # and each probe's TPOT as the client read it is the simulator's, from the times it emitted the tokens
        for probe in fam["probes"]:
            rid = probe["run_id"]
            assert client_tpot(rid) == pytest.approx(trace_tpot(rid), rel=PROBE_TOL), (rid, client_tpot(rid))
        assert fam["bound"] == "tpot_ms:p50"
    [ratio] = data["ratios"]
    want = traced["eagle3"] / traced["baseline"]
    assert ratio["estimate"] == pytest.approx(measured["eagle3"] / measured["baseline"], rel=1e-9)
    assert len(ratio["ratios"]) == 2 and ratio["ci"]
    line = next(li for li in out.splitlines() if li.startswith("capacity: "))
    assert f"at p50 TPOT <= 22 ms, eagle3 serves {ratio['estimate']:.2f}x the requests in flight of baseline" in line
    # every probe an ordinary stored run: block 2 probed each configuration at two neighbouring grid points
    steps = exp.meta["design_steps"]
    assert [s["more"] for s in steps] == [True, True, False] and "block 1, the ladder" in steps[0]["reason"]
    assert sorted({r.block for r in exp.runs}) == [1, 2] and all(r.ok for r in exp.runs)
    assert [s["blocks"] for s in steps] == [0, 1, 2]          # the resume took the search up where it stopped
    assert (exp_dir / "report" / "throughput_vs_per_user.png").stat().st_size > 10_000
    _per_token_itl_is_the_trace(exp, node.root / "sim-trace.jsonl")
    # a search stopped between blocks (interrupted with no planned run missing): a resume asks the search again,
    # which decides from the stored runs (here: it has its brackets, so it stops again, planning nothing)
    with st.Store.open(exp_dir) as store:
        store.set_experiment_status("interrupted")
        decided = store.design_steps()[-1]["decided"]
    proc = driver("--resume", exp_dir.name, "-i", str(_inventory(node)), "--runs-dir", str(node.runs_dir))
    again, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0 and "between blocks: the search decides whether another block follows" in again, again
    with st.Store.open(exp_dir) as store:
        last = store.design_steps()[-1]
        assert last["blocks"] == 2 and not last["more"] and last["decided"] > decided and not store.missing()
        assert store.experiment()["status"] == "finished"
    # a finished search allowed more blocks than it has (--max-repeats 3 over its 2): the resume asks the search again
    # rather than only concluding (here it has its brackets, so it stops again, planning nothing)
    proc = driver("--resume", exp_dir.name, "--max-repeats", "3", "-i", str(_inventory(node)),
                  "--runs-dir", str(node.runs_dir))
    more, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, more
    assert "was finished with 2 blocks, now allowed 3: the search decides whether another block follows" in more, more
    with st.Store.open(exp_dir) as store:
        again_step = store.design_steps()[-1]
        assert again_step["decided"] > last["decided"] and not again_step["more"] and not store.missing()
    print("capacity in flight (search / trace / model): " + ", ".join(
        f"{n} {f['estimate']:.3f} / {traced[n]:.3f} / {truth[n]:.3f} (blocks {[b['estimate'] for b in f['blocks']]})"
        for n, f in fams.items()) + f"; iso-SLO ratio {ratio['estimate']:.3f} / {want:.3f} (trace); {len(exp.runs)} runs")


def _per_token_itl_is_the_trace(exp, trace_file: Path) -> None:
    """Per-token ITL: each chunk carries the tokens the simulator emitted at once, and its gap spread over them is the
    simulator's own per-token emission gap; the analysis's recomputation from the stored chunk arrays is the client's
    own summary, exactly."""
    trace = [json.loads(x) for x in trace_file.read_text().splitlines()]
    for run in exp.runs:
        summary = json.loads((run.run_dir / "bench_summary.json").read_text())["latency"]["itl_token_s"]
        times = run_times(exp, run)
        for q in ("50", "90", "99"):
            assert times.percentile("itl_token_s", float(q)) == pytest.approx(summary[f"p{q}"] * SCALE, rel=1e-9)
        client, emitted = [], []
        for q, (i, t, n) in zip(run.measured, run_chunks(exp, run)):
            rec = min(trace, key=lambda x: abs(x["arrival_wall"] - q.start_ts))
            assert q.i == i and n == rec["emit_tokens"], run.run_id         # the chunks are the emissions
            client += per_token_latencies(t, n)
            emitted += per_token_latencies([e * SCALE for e in rec["emit_mono"]], rec["emit_tokens"])
        assert len(client) == len(emitted) == len(run.measured) * (OUTPUT_LEN - 1)
        assert statistics.median(client) == pytest.approx(statistics.median(emitted), rel=0.05), run.run_id
        if "eagle3" in run.arm:         # a chunk of 4 tokens: its gap is 4 per-token gaps
            chunk = times.percentile("itl_chunk_s", 50)
            assert chunk == pytest.approx(4 * times.percentile("itl_token_s", 50), rel=0.05)


def test_below_saturation_both_served_the_offered_load(node: SimNode):
    """--matrix request_rate=6,60 (3 and 30 req/s in simulated time at scale 2), at most 4 in flight: at 3 req/s both
    arms keep up (their saturated rates are 5.0 and 9.6 req/s), so no throughput ratio is stated and the latency is
    compared; at 30 both saturate and the throughput ratio is the ratio of their saturated rates."""
    base_tm, spec_tm = _models()
    mu = {"baseline": saturated_rate(base_tm), "eagle3": saturated_rate(spec_tm)}
    assert mu["baseline"] == pytest.approx(5.0) and mu["eagle3"] == pytest.approx(9.59, rel=1e-3)
    out, exp_dir = _run(node, _experiment(node, CAP), "--matrix", "request_rate=6,60", "--repeats", "1")
    [fam] = json.loads((exp_dir / "report.json").read_text())["loads"]["families"]
    low, high = fam["points"]
    assert low["served"] and not low["throughput_stated"] and high["throughput_stated"] and not high["served"]
    for who in ("arm", "baseline"):
        [s] = low["serve"][who]
        assert s["kept_up"] and s["achieved"] == pytest.approx(s["offered"], rel=0.1)
        [s] = high["serve"][who]
        assert not s["kept_up"] and s["achieved"] < 0.9 * s["offered"]
        assert s["achieved"] == pytest.approx(mu["eagle3" if who == "arm" else "baseline"], rel=0.2)
    assert high["throughput"]["estimate"] == pytest.approx(mu["eagle3"] / mu["baseline"], rel=CAP_TOL)
    assert low["latency_ratios"]["TPOT p50"]["estimate"] < 0.5       # 4 tokens a cycle: the arm is faster per token
    line = next(li for li in out.splitlines() if li.startswith("per load: eagle3:"))
    assert "at 6 req/s (at most 4 in flight) both served the offered load" in line and "no throughput ratio" in line
    assert f"{high['throughput']['estimate']:.2f}x at 60 req/s in throughput" in line
    assert "at 6 req/s (at most 4 in flight) in throughput" not in line and "stops paying in throughput" not in line
    md = (exp_dir / "report.md").read_text()
    assert "both served the offered load: no ratio" in md and "### Offered and achieved load" in md
    assert "ITL per chunk p50" in md and "ITL per token p50" in md
    # the stored runs judged again at another target, with a GPU-hour price: the report's own SLO and cost
    proc = driver("report", str(exp_dir), "--slo", "tpot_ms:p50=17", "--gpu-hour-usd", "2")
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    data = json.loads((exp_dir / "report.json").read_text())["capacity"]
    assert data["slo"]["text"] == "p50 TPOT <= 17 ms" and data["gpu_hour_usd"] == 2.0
    met = {p["arm"]: p["met"] for fam in data["families"].values() for p in fam["probes"]}
    assert met == {"baseline-r6": True, "baseline-r60": False, "eagle3-r6": True, "eagle3-r60": True}
