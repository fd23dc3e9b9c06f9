"""Calibration of the default profile, measured by a streaming client against running simulators.

tok/s is the seed's definition: one request's decode speed, (output tokens - 1) / (t_last - t_first),
single stream, 256-token outputs. Measured at a time scale (durations / scale), reported back at scale 1.
"""
from __future__ import annotations

import statistics
from concurrent.futures import ThreadPoolExecutor

import pytest

from specab.sim.profile import load_profile
from specab.sim.timing import true_decode_tok_s
from tests.sim.client import request_json, stream
from tests.sim.conftest import EAGLE_S2, TUNED
from tests.sim.test_process import parse_batch_line

SCALE = 10
ARGS = ["--mem-fraction-static", "0.88", "--disable-custom-all-reduce", "--trust-remote-code"]


def measure(srv, n: int, scale: float, output_len: int = 256, concurrency: int = 1) -> tuple[list[float], list]:
    def one(i: int):
        body = {"text": f"request {i}: " + "lorem ipsum dolor sit amet " * 25,
                "sampling_params": {"max_new_tokens": output_len, "ignore_eos": True, "temperature": 0},
                "stream": True}
        res = stream(srv.port, "/generate", body, timeout=120)
        assert res.done and res.final["meta_info"]["completion_tokens"] == output_len
        return res
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(one, range(n)))
    return [r.decode_tok_s() / scale for r in results], results


def reported_truth(srv) -> float:
    return request_json(srv.port, "GET", "/server_info")[1]["simulator"]["true_decode_tok_s"] / srv.scale


def test_baseline_with_tuned_nccl_is_82_tok_s(module_launch):
    srv = module_launch(ARGS, env=TUNED, scale=SCALE, tp=8)
    rates, _ = measure(srv, 8, SCALE)
    median = statistics.median(rates)
    assert median == pytest.approx(82.2, rel=0.02), rates
    assert median == pytest.approx(reported_truth(srv), rel=0.02), "measured agrees with the model's truth"
    decodes = [r for r in map(parse_batch_line, srv.log_text().splitlines()) if r and r["kind"] == "decode"]
    assert decodes and all(r["cuda graph"] == "True" for r in decodes)
    gen = statistics.median(float(r["gen throughput (token/s)"]) for r in decodes) / SCALE
    assert gen == pytest.approx(82.2, rel=0.05), "the log's gen throughput reads like the seed's"


def test_baseline_without_the_nccl_variables_is_63_tok_s(module_launch):
    srv = module_launch(ARGS, env={}, scale=SCALE, tp=8)
    rates, _ = measure(srv, 6, SCALE)
    assert statistics.median(rates) == pytest.approx(63.0, rel=0.02), rates
    assert request_json(srv.port, "GET", "/server_info")[1]["simulator"]["nccl_factor"] > 1.3


def test_eagle3_two_steps_is_60_5_tok_s_at_accept_length_2_1(module_launch):
    srv = module_launch([*ARGS, *EAGLE_S2], env=TUNED, scale=SCALE, tp=8)
    rates, results = measure(srv, 20, SCALE)
    accept = [r.final["meta_info"]["completion_tokens"] / r.final["meta_info"]["spec_verify_ct"] for r in results]
    assert statistics.fmean(accept) == pytest.approx(2.10, abs=0.05), accept
    assert statistics.fmean(rates) == pytest.approx(60.5, rel=0.02), rates
    for r in results:   # one streamed chunk per verify step, so chunks = verify steps + the prefill token
        assert len(r.chunks) == r.final["meta_info"]["spec_verify_ct"] + 1
    decodes = [r for r in map(parse_batch_line, srv.log_text().splitlines()) if r and r["kind"] == "decode"]
    assert decodes and all(r["cuda graph"] == "False" for r in decodes), "verify in extend mode, no CUDA graph"
    log_accept = statistics.fmean(float(r["accept len"]) for r in decodes)
    assert log_accept == pytest.approx(2.10, abs=0.1)
    info = request_json(srv.port, "GET", "/server_info")[1]
    assert info["internal_states"][0]["avg_spec_accept_length"] == pytest.approx(2.10, abs=0.06)


def test_simulate_acc_len_forces_the_accept_length(launch):
    srv = launch([*ARGS, *EAGLE_S2], env={**TUNED, "SGLANG_SIMULATE_ACC_LEN": "2.6"}, scale=20, tp=2)
    _, results = measure(srv, 4, 20, output_len=200)
    accept = statistics.fmean(r.final["meta_info"]["spec_accept_length"] for r in results)
    assert accept == pytest.approx(2.45, abs=0.12), "N(2.6, 1) rounded and clamped to [1, 3]"


def test_rates_scale_with_the_time_scale(launch):
    slow = launch(ARGS, env=TUNED, scale=4, tp=2)
    fast = launch(ARGS, env=TUNED, scale=20, tp=2)
    r_slow = statistics.median(measure(slow, 3, 4, output_len=128)[0])
    r_fast = statistics.median(measure(fast, 3, 20, output_len=128)[0])
    assert r_slow == pytest.approx(r_fast, rel=0.03), (r_slow, r_fast)
    assert r_slow == pytest.approx(82.2, rel=0.02)


def test_concurrent_requests_are_batched_and_each_decodes_slower(launch):
    srv = launch(ARGS, env=TUNED, scale=SCALE, tp=2)
    rates, _ = measure(srv, 4, SCALE, output_len=256, concurrency=4)
    expected = true_decode_tok_s(load_profile("default").without_noise(), {"tp_size": 2}, TUNED, bs=4)
    assert expected < 80.0
    assert statistics.median(rates) == pytest.approx(expected, rel=0.05), rates
    decodes = [r for r in map(parse_batch_line, srv.log_text().splitlines()) if r and r["kind"] == "decode"]
    assert max(int(r["#running-req"]) for r in decodes) == 4, "continuous batching ran them together"
