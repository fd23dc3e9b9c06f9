"""The simulated server's per-phase timing (SGLang 0.5.23 /metrics device-timer categories, CUDA-graph passes,
verify calls) and its /start_profile trace agree with its own timing model; 0.5.9 has none of them."""
from __future__ import annotations

import gzip
import json

from specab.node import phasemetrics
from specab.sim.profile import load_profile
from specab.sim.timing import TimingModel
from tests.sim.client import request_json
from tests.sim.conftest import EAGLE_S2, TUNED

TIMER = {"SGLANG_ENABLE_METRICS_DEVICE_TIMER": "1"}
BODY = {"text": "hello " * 20, "sampling_params": {"max_new_tokens": 120, "ignore_eos": True}}


def _scrape(port: int) -> dict:
    status, text, _ = request_json(port, "GET", "/metrics")
    assert status == 200
    return phasemetrics.snapshot(text)


def test_phase_seconds_follow_the_timing_model(launch, tmp_path):
    srv = launch([*EAGLE_S2, "--enable-metrics"], env={**TUNED, **TIMER}, scale=20)
    before = _scrape(srv.port)
    status, _, _ = request_json(srv.port, "POST", "/generate", BODY)
    assert status == 200
    d = phasemetrics.delta(before, _scrape(srv.port))
    verify_calls = d["spec_verify_calls"]
    assert verify_calls and verify_calls > 30
    assert set(d["forward_s"]) == {"eagle_draft", "eagle_draft_extend", "target_verify", "extend"}
    # per cycle, in simulated ms (x time scale): the profile's split, jitter averaged out
    prof = load_profile("default")
    model = TimingModel.create(prof, {"speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "d",
                                      "speculative_num_steps": 2, "speculative_eagle_topk": 1,
                                      "speculative_num_draft_tokens": 3, "tp_size": 2}, TUNED)
    nominal = model.nominal_spec_phases_ms()
    per_cycle = {k: v / verify_calls * 1000 * 20 for k, v in d["forward_s"].items()}
    for cat, want in (("eagle_draft", nominal.draft_ms), ("target_verify", nominal.verify_ms),
                      ("eagle_draft_extend", nominal.draft_extend_ms)):
        assert abs(per_cycle[cat] - want) / want < 0.05, (cat, per_cycle[cat], want)
    # the default profile's verify runs without a CUDA graph: every target pass is decode_none
    assert d["graph_passes"].get("decode_none") == verify_calls and not d["graph_passes"].get("decode_cuda_graph")
    # a 5-step profile: the real span names, durations in the same proportion
    status, text, _ = request_json(srv.port, "POST", "/start_profile",
                                   {"num_steps": 5, "output_dir": str(tmp_path), "profile_id": "p1"})
    assert status == 200 and text == "Start profiling.\n"
    request_json(srv.port, "POST", "/generate", BODY)
    trace = tmp_path / "p1-TP-0.trace.json.gz"
    assert trace.exists()
    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    names = {e["name"] for e in events}
    assert {"step[DRAFT bs=1]", "step[VERIFY bs=1]", "draft", "draft_extend"} <= names
    assert sum(1 for e in events if e["name"] == "step[VERIFY bs=1]" and e["cat"] == "user_annotation") == 5


def test_baseline_decode_category_and_graph_passes(launch):
    srv = launch(["--enable-metrics"], env={**TUNED, **TIMER}, scale=20, tp=1)
    before = _scrape(srv.port)
    request_json(srv.port, "POST", "/generate", BODY)
    d = phasemetrics.delta(before, _scrape(srv.port))
    assert set(d["forward_s"]) == {"decode", "extend"}
    assert d["graph_passes"]["decode_cuda_graph"] == 119 and d["spec_verify_calls"] == 0
    assert abs(d["forward_s"]["decode"] / 119 * 1000 * 20 - 12.17) / 12.17 < 0.05


def test_no_categories_without_the_device_timer_nor_on_0_5_9(launch):
    srv = launch([*EAGLE_S2, "--enable-metrics"], env=TUNED, scale=20)
    snap = _scrape(srv.port)
    assert snap["forward_s"] == {} and snap["spec_verify_calls"] is not None
    old = launch([*EAGLE_S2, "--enable-metrics"], env={**TUNED, **TIMER, "SPECAB_SIM_SGLANG_VERSION": "0.5.9"},
                 scale=20)
    request_json(old.port, "POST", "/generate", BODY)
    snap = _scrape(old.port)
    assert snap["forward_s"] == {} and snap["graph_passes"] == {} and snap["spec_verify_calls"] is None
