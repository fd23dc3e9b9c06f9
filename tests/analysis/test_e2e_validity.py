"""Output validity end to end: the driver on the simulated node, every arm's outputs against the simulator's truth.

One experiment, one block: the baseline; a lossless EAGLE-3 arm; the same arm with each way a speculative server's
outputs depart from its target (specab/sim/outputs.py), selected through the arm's env as a real engine's would be:
``lossy=0.05`` (each decoded token wrong with probability 0.05), ``late_divergence=0.6:1`` (every request departs
once, after 60 % of its tokens: numerics), ``loop=3`` (a 3-token cycle), and SGLang's forced acceptance
(``SGLANG_SIMULATE_ACC_LEN``, declared ``cost_only``). The simulator's trace records each request's first departure
(``diverged_at``): the parity the analysis reports must be exactly that, request by request.

With ``--correctness`` the same experiment ends with its deterministic pass: every arm but the declared cost
measurement, once more with ``--enable-deterministic-inference`` (4 requests each), where the simulator switches the
late divergence (numerics) off and keeps the lossy commits and the loop (the engine's own doing): the late arm's pass
is identical, the lossy and looping arms' passes are bugs from exactly the simulator's first departure.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from specab.analysis.evidence import model as analysis
from specab.analysis.findings import doctor
from specab.analysis.measures import stats, validity
from tests.driver.simnode import NCCL_TUNED, SimNode, driver, free_port
from tests.driver.simtrace import trace_of

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
SPEC = {"speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "/models/Kimi-K2.5-EAGLE3",
        "speculative_num_steps": 2, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 3}
ARMS = [
    {"name": "baseline"},
    {"name": "eagle3", "server_args": SPEC},
    {"name": "eagle3-lossy", "server_args": SPEC, "env": {"SPECAB_SIM_FAULT": "lossy=0.05"}},
    {"name": "eagle3-late", "server_args": SPEC, "env": {"SPECAB_SIM_FAULT": "late_divergence=0.6:1"}},
    {"name": "eagle3-loop", "server_args": SPEC, "env": {"SPECAB_SIM_FAULT": "loop=3"}},
    {"name": "eagle3-forced", "server_args": SPEC, "env": {"SGLANG_SIMULATE_ACC_LEN": "2.5"}, "cost_only": True},
]


@pytest.fixture
def node(tmp_path: Path):
    n = SimNode(root=tmp_path, port=free_port(), time_scale="20")
    yield n
    n.cleanup()


def test_each_departure_is_reported_as_the_simulator_made_it(node: SimNode, tmp_path: Path):
    trace = tmp_path / "sim-trace.jsonl"
    exp = {"specab_experiment": {
        "name": "e2e-validity", "model_path": "/models/Kimi-K2.5-INT4",
        "server_args": {"tp_size": 8, "host": "127.0.0.1", "port": node.port, "max_running_requests": 48},
        "env": {**NCCL_TUNED, "SPECAB_SIM_TRACE": str(trace)}, "arms": ARMS,
        "bench": {"api": "generate", "num_requests": 8, "warmup_requests": 1, "input_len": 16, "output_len": 64,
                  "concurrency": 1, "seed": 1, "timeout_s": 300, "correctness_requests": 4},
        "timeouts": {"ready_s": 300, "stop_grace_s": 5, "gpu_free_s": 60}}}
    path = node.root / "e2e-validity.yml"
    path.write_text(json.dumps(exp))
    proc = driver("-e", str(path), "-i", str(node.write_inventory()), "--runs-dir", str(node.runs_dir),
                  "--repeats", "1", "--require-valid", "--correctness")
    out, _ = proc.communicate(timeout=900)
    # every run ended ok, and --require-valid exits 3 for the two arms that are not valid and not declared cost only
    assert proc.returncode == 3, out[-4000:]
    assert "--require-valid: eagle3-lossy: NOT VALID" in out and "--require-valid: eagle3-loop: NOT VALID" in out
    assert "--require-valid: eagle3-forced" not in out and "--require-valid: eagle3-late" not in out
    d = next(x for x in node.runs_dir.iterdir() if (x / "results.sqlite").exists())
    e = analysis.load_store(d)
    assert all(r.ok for r in e.runs)
    v = validity.check(e)

    # the truth: per measured request, the simulator's first departure from the target
    truth = {}
    for run in e.runs:
        truth[run.arm] = {q.i: rec["diverged_at"] for q, rec in trace_of(trace, run)}
    assert all(x is None for x in truth["eagle3"].values()) and all(x is None for x in truth["baseline"].values())
    for arm in ("eagle3-lossy", "eagle3-late", "eagle3-loop", "eagle3-forced"):
        got = {q.i: (None if q.identical else q.agreed) for q in v.arms[arm].requests}
        assert got == truth[arm], arm
    assert truth["eagle3-forced"] == {i: 1 for i in truth["eagle3-forced"]}     # only the prefill's token
    late = [x for x in truth["eagle3-late"].values() if x is not None]
    assert len(late) == 8 and all(x >= 0.6 * 64 for x in late)

    assert v.arms["eagle3"].status == validity.VALID and v.arms["eagle3"].identical == 8
    assert v.arms["eagle3"].line == "outputs identical to the baseline on 8/8 requests"
    lossy = v.arms["eagle3-lossy"]
    identical = sum(x is None for x in truth["eagle3-lossy"].values())
    assert lossy.status == validity.NOT_VALID and lossy.identical == identical
    assert v.arms["eagle3-late"].status == validity.VALID            # late divergences pass greedy_min_match 0.5
    assert f"the other {len(late)} diverge late" in v.arms["eagle3-late"].line
    loop = v.arms["eagle3-loop"]
    assert loop.status == validity.NOT_VALID and loop.loops == sorted(truth["eagle3-loop"])
    forced = v.arms["eagle3-forced"]
    assert forced.cost_only and forced.status == validity.NOT_VALID
    assert v.baseline_self == {}            # one block: no restart of the baseline to compare

    # the doctor: an error for each arm not valid and not declared, naming what the settings show; the declared
    # cost measurement is an info naming its forcing variable; the lossless and late arms: nothing
    found = [f for f in doctor.diagnose(e, stats.analyse(e), validity=v) if f.rule == "outputs-not-valid"]
    by_arm = {f.arm: f for f in found}
    assert set(by_arm) == {"eagle3-lossy", "eagle3-loop", "eagle3-forced"}
    assert by_arm["eagle3-lossy"].severity == "error" and "no setting of the arm explains it" in \
        by_arm["eagle3-lossy"].message
    assert by_arm["eagle3-forced"].severity == "info" and "SGLANG_SIMULATE_ACC_LEN=2.5" in by_arm["eagle3-forced"].message

    # one verdict, both parts, in the report's summary, report.json and the console
    data = json.loads((d / "report.json").read_text())
    verdicts = data["verdicts"]
    assert verdicts["eagle3"].endswith("outputs identical to the baseline on 8/8 requests; deterministic pass: "
                                       "identical on 4/4 requests.")
    assert " -- NOT VALID: outputs differ from the baseline on " in verdicts["eagle3-lossy"]
    assert "cost only (declared" in verdicts["eagle3-forced"] and "no speedup claim" in verdicts["eagle3-forced"]
    for line in verdicts.values():
        assert f"verdict: {line}" in out
    assert "8/8 identical" in out           # the console table's outputs column
    md = (d / "report.md").read_text()
    assert "## Output validity" in md and "eagle3-loop: NOT VALID" in md
    _deterministic_pass_is_the_simulators(e, v, trace, out, data, md)


def _deterministic_pass_is_the_simulators(e, v, trace: Path, out: str, data: dict, md: str) -> None:
    """--correctness: the pass ran after the measured block, apart from every measured statistic, and reports
    exactly the departures the simulator made in its deterministic mode."""
    det = e.deterministic
    measured = {a.name for a in e.arms}
    assert {a.name for a in det.arms} == {f"{a}-det" for a in measured - {"eagle3-forced"}}
    assert "arm eagle3-forced: no deterministic pass (--correctness)" in out      # the plan's notice: cost only
    assert not {r.arm for r in e.runs} & {a.name for a in det.arms}              # never a measured run
    assert set(stats.analyse(e).speedups) == measured - {"baseline"} and set(data["verdicts"]) == set(v.arms)
    assert min(r.seq for r in det.runs) > max(r.seq for r in e.runs)             # after the measured block ...
    assert {r.block for r in det.runs} == {2} and all(r.ok and len(r.measured) == 4 for r in det.runs)  # ... its own
    assert all(r.server_args.get("enable_deterministic_inference") is True for r in det.runs)   # the server's readback
    assert not any(r.server_args.get("enable_deterministic_inference") for r in e.runs)
    truth = {r.arm: {q.i: rec["diverged_at"] for q, rec in trace_of(trace, r)} for r in det.runs}
    assert all(x is None for x in truth["eagle3-late-det"].values())     # numerics off: no late divergence (every
    # measured request of the arm had one)
    assert all(x is None for x in truth["eagle3-det"].values()) and all(x is None for x in truth["baseline-det"].values())
    for arm in ("eagle3", "eagle3-late", "eagle3-lossy", "eagle3-loop"):
        p = v.deterministic[arm]
        assert p.mode == "--enable-deterministic-inference" and p.compared == 4
        assert {q.i: (None if q.identical else q.agreed) for q in p.requests} == truth[f"{arm}-det"], arm
    for arm in ("eagle3", "eagle3-late"):
        assert v.deterministic[arm].status == validity.IDENTICAL
        assert data["verdicts"][arm].endswith("; deterministic pass: identical on 4/4 requests."), data["verdicts"][arm]
    found = {f.arm: f for f in doctor.diagnose(e, stats.analyse(e), validity=v) if f.rule == "deterministic-pass-differs"}
    assert set(found) == {"eagle3-lossy", "eagle3-loop"}
    for arm in ("eagle3-lossy", "eagle3-loop"):
        p, departed = v.deterministic[arm], {i: x for i, x in truth[f"{arm}-det"].items() if x is not None}
        first = min(departed.items(), key=lambda kv: (kv[1], kv[0]))
        line = f"BUG: differs in deterministic mode on {len(departed)}/4 requests from token {first[1]}"
        assert p.status == validity.BUG and p.line == line and line in data["verdicts"][arm]
        assert f"--require-valid: {arm}: {line}" in out
        assert found[arm].severity == "error" and f"the first at request {first[0]} after {first[1]} agreeing" in \
            found[arm].message and "--enable-deterministic-inference" in found[arm].message
    assert "### Deterministic pass" in md and "eagle3-lossy: BUG: differs in deterministic mode" in md
    assert "| deterministic pass (not measured) | 5 |" in md                    # in the verdict cost, apart
    assert "deterministic pass (--correctness: not measured, not in the table" in out   # the console's summary
