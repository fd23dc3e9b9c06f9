"""The slow-down faults: GPU clock throttling (`throttle=`) and a slow server instance (`slow_instance=`)."""
from __future__ import annotations

import concurrent.futures
import json
import time

import pytest

from specab.sim.engine import Engine
from specab.sim.gpustate import GpuNode
from specab.sim.loadplan import capacity
from specab.sim.profile import load_profile
from specab.sim.settings import Faults, SettingsError
from specab.sim.simlog import SimLogger
from specab.sim.throttle import SlowInstance, Throttle, parse_reasons
from specab.sim.timing import TimingModel
from tests.sim.client import request_json, stream
from tests.sim.conftest import TUNED, smi, wait_for

GEN = {"text": "hello world", "sampling_params": {"max_new_tokens": 96, "ignore_eos": True}, "stream": True}


# ----------------------------------------------------------------------------------------- parsing

def test_fault_specs_parse_with_nvml_reason_names_or_bits():
    f = Faults.parse("throttle=30:0.7:SwThermalSlowdown,slow_instance=2:15")
    assert f.throttle == Throttle(30.0, 0.7, 0x20)
    assert f.slow_instance == SlowInstance(2, 15.0)
    assert parse_reasons("0x4") == 0x4 and parse_reasons("8") == 0x8
    assert parse_reasons("swpowercap+HwSlowdown") == 0x4 | 0x8


@pytest.mark.parametrize("spec, words", [
    ("throttle=0:0.7", "throttle=<from_s>:<ratio>:<reason>"),
    ("throttle=0:1.5:0x4", "clock fraction"),
    ("throttle=-1:0.5:0x4", ">= 0"),
    ("throttle=0:0.5:GpuIdle", "not a slowdown"),
    ("throttle=0:0.5:0x200", "NVML's bits"),
    ("throttle=0:0.5:Hot", "give an NVML bit"),
    ("slow_instance=x:10", "slow_instance=<k>:<pct>"),
    ("slow_instance=1:100", "0 < <pct> < 100"),
    ("slow_instance=2-1:10", "<k2> >= <k>"),
    ("slow_instance=0-x:10", "<k>-<k2>:<pct>"),
])
def test_bad_fault_specs_are_refused_with_the_expected_form(spec, words):
    with pytest.raises(SettingsError, match="SPECAB_SIM_FAULT") as exc:
        Faults.parse(spec)
    assert words in str(exc.value)


def test_throttle_slows_forwards_by_the_clock_ratio_from_its_start():
    t = Throttle(from_s=60.0, clock_ratio=0.8, reasons=0x4)
    assert t.time_factor(59.9) == 1.0 and not t.active(59.9)
    assert t.time_factor(60.0) == pytest.approx(1.25) and t.active(61)
    assert SlowInstance(3, 20).speed_factor(3) == pytest.approx(0.8)
    assert SlowInstance(3, 20).speed_factor(2) == 1.0
    first_two = Faults.parse("slow_instance=0-1:20").slow_instance
    assert first_two == SlowInstance(0, 20.0, 1)
    assert [first_two.speed_factor(k) for k in range(4)] == [pytest.approx(0.8), pytest.approx(0.8), 1.0, 1.0]


def test_the_engine_applies_the_throttle_on_the_servers_clock(tmp_path):
    prof = load_profile("default")
    args = {"tp_size": 8}
    timing = TimingModel.create(prof, args, TUNED)
    cap = capacity(prof, timing.args)

    def engine(started_ago_wall_s: float) -> Engine:
        return Engine(timing, cap, SimLogger(""), time_scale=10.0, epoch=time.time(), seed=0,
                      decode_log_interval=40, throttle=Throttle(100.0, 0.5, 0x8),
                      started_at=time.time() - started_ago_wall_s)
    early, late = engine(5.0), engine(20.0)          # 50 and 200 simulated seconds after the start
    assert early.throttled() is None and early.slowdown() == 1.0
    assert late.throttled() is not None and late.slowdown() == pytest.approx(2.0)


# ----------------------------------------------------------------------------------------- smi

def test_smi_reports_the_lowered_clock_and_reason_while_busy(tmp_path):
    node = GpuNode(tmp_path / "n")
    node.ensure("default")
    node.set_activity([0, 1], 30.0, clock_ratio=0.7, reasons=0x20)
    rows = smi(node.state, "--query-gpu=index,clocks.sm,clocks.max.sm,clocks_event_reasons.active",
               "--format=csv,noheader,nounits").stdout.splitlines()
    assert rows[0] == "0, 1386, 1980, 0x0000000000000020"
    assert rows[1] == "1, 1386, 1980, 0x0000000000000020"
    assert rows[2] == "2, 345, 1980, 0x0000000000000001"          # not computing: the idle look
    node.set_activity([0], 30.0)
    row = smi(node.state, "--query-gpu=clocks.sm,clocks_throttle_reasons.active", "--format=csv,noheader,nounits",
              "-i", "0").stdout.strip()
    assert row == "1980, 0x0000000000000000"                      # busy, full clock, no reason


# ----------------------------------------------------------------------------------------- servers

def _traced(launch, env: dict, **kw):
    """A server that writes its trace (``SPECAB_SIM_TRACE``: when its schedule had each chunk due): the rates below
    are the simulator's arithmetic, so they are read from its own schedule, which neither the box's load nor the
    test client's reads move."""
    trace = launch.root / f"trace{len(launch.started)}.jsonl"
    return launch([], env={**env, "SPECAB_SIM_TRACE": str(trace)}, **kw), trace


def _rate(srv, trace, res) -> tuple[float, dict]:
    """The request's decode tok/s at scale 1 from the server's schedule (``emit_due``), and /server_info's simulator
    block; refuses a schedule the server restarted (it fell 0.5 s behind: the deadlines after it moved)."""
    assert res.status == 200 and res.done
    rid = res.final["meta_info"]["id"]
    rec = wait_for(lambda: next((r for r in map(json.loads, trace.read_text().splitlines()) if r["rid"] == rid), None)
                   if trace.is_file() else None, 10, "the request's trace line")
    span = rec["emit_due"][-1] - rec["emit_due"][0]
    sim = request_json(srv.port, "GET", "/server_info")[1]["simulator"]
    assert sim["schedule_resets"] == 0, f"the box held the simulator 0.5 s behind: it restarted its schedule: {sim}"
    return (rec["completion_tokens"] - 1) / span / srv.scale, sim


def _measure(srv, trace) -> tuple[float, dict]:
    return _rate(srv, trace, stream(srv.port, "/generate", GEN))


def test_a_throttled_server_decodes_slower_and_smi_shows_why(launch):
    srv, trace = _traced(launch, {**TUNED, "SPECAB_SIM_FAULT": "throttle=0:0.5:HwSlowdown"}, scale=10, tp=2)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        fut = pool.submit(stream, srv.port, "/generate",
                          {**GEN, "sampling_params": {"max_new_tokens": 600, "ignore_eos": True}})
        busy = wait_for(lambda: next((row for row in [smi(srv.state, "--query-gpu=clocks.sm,clocks_event_reasons.active",
                                                           "--format=csv,noheader,nounits", "-i", "0").stdout.strip()]
                                      if not row.endswith("0x0000000000000001")), None), 60,
                        "the GPU's busy look during the request")
        tok_s, sim = _rate(srv, trace, fut.result(timeout=120))
    assert sim["throttle"] == {"from_s": 0.0, "clock_ratio": 0.5, "reasons": "0x8"}
    assert sim["true_decode_tok_s"] / srv.scale == pytest.approx(82.2 / 2, rel=0.03)
    # the served rate is the throttled truth within the per-request noise (<1 %)
    assert tok_s == pytest.approx(sim["true_decode_tok_s"] / srv.scale, rel=0.02), (tok_s, sim)
    assert busy == "990, 0x0000000000000008"


def test_the_kth_start_on_a_node_is_the_slow_instance(launch, tmp_path):
    env = {**TUNED, "SPECAB_SIM_FAULT": "slow_instance=1:25"}
    state = tmp_path / "node"
    seen = []
    for _ in range(3):
        srv, trace = _traced(launch, env, scale=10, tp=2, state=state)
        seen.append(_measure(srv, trace))
        srv.kill()
    truths = [s["true_decode_tok_s"] / 10 for _, s in seen]
    assert [s["instance"] for _, s in seen] == [0, 1, 2]
    assert [s["slow_instance"]["this_instance"] for _, s in seen] == [False, True, False]
    assert truths[1] == pytest.approx(truths[0] * 0.75, rel=0.02)
    assert truths[2] == pytest.approx(truths[0], rel=0.02)
    for measured, sim in seen:      # each instance serves its own truth: the slow one 25 % below the others
        assert measured == pytest.approx(sim["true_decode_tok_s"] / 10, rel=0.02), (measured, sim)
