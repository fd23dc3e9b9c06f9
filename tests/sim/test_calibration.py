"""Calibration of the default profile: the rates a running simulator serves, against the profile's targets.

tok/s is the seed's definition: one request's decode speed, (output tokens - 1) / (t_last - t_first), single
stream, 256-token outputs, at a time scale (durations / scale) and reported back at scale 1. The point is the
simulator's arithmetic, so the times are the server's own schedule: its trace (``SPECAB_SIM_TRACE``) records when
each chunk was due on the absolute deadlines its steps run on (``emit_due``), which neither a loaded box nor the
test client's reads move; the server never emits a chunk before it is due (tests/sim/test_server.py). A schedule the
server restarted (it fell 0.5 s behind) is refused. The log's gen throughput is measured on the server's wall clock:
its bound adds the server's worst schedule lag (``simulator.schedule_lag_max_s``) relative to the shortest span.
Every measurement also checks the stream against the trace (``check_stream``): the client received each emitted
chunk with its tokens, never before it was emitted, at the emission times' rate.
"""
from __future__ import annotations

import json
import statistics
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

import pytest

from specab.sim.profile import load_profile
from specab.sim.timing import TimingModel, request_rng, true_decode_tok_s
from tests.sim.client import StreamResult, request_json, stream
from tests.sim.conftest import EAGLE_S2, TUNED, Launcher, wait_for
from tests.sim.test_process import parse_batch_line

ARGS = ["--mem-fraction-static", "0.88", "--disable-custom-all-reduce", "--trust-remote-code"]
STREAM_TOL = 0.02
SPEC_S2 = {"speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "/models/eagle3",
           "speculative_num_steps": 2, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 3}


@dataclass
class Measured:
    srv: Any
    scale: float
    results: list[StreamResult]   # what the client read: counts and metadata, never its times
    trace: list[dict]             # the server's record of each request, in request order
    sim: dict                     # /server_info's simulator block, read after the requests

    @property
    def rates(self) -> list[float]:
        """Each request's decode tok/s at scale 1, from the times the server's schedule had its chunks due."""
        return [(r["completion_tokens"] - 1) / self.span(r) / self.scale for r in self.trace]

    @staticmethod
    def span(rec: dict) -> float:
        return rec["emit_due"][-1] - rec["emit_due"][0]

    @property
    def slack(self) -> float:
        """The most the server's own lateness can move a rate read on its wall clock (the log's), relative."""
        return self.sim["schedule_lag_max_s"] / min(map(self.span, self.trace))

    @property
    def client_rates(self) -> list[float]:
        """Each request's decode tok/s at scale 1 as the client read the stream: the tokens after the first chunk over
        the time between reading the first and the last."""
        return [(r.final["meta_info"]["completion_tokens"] - r.chunks[0]["meta_info"]["completion_tokens"])
                / (r.chunk_t[-1] - r.chunk_t[0]) / self.scale for r in self.results]

    @property
    def emitted_rates(self) -> list[float]:
        """The same tokens over the times the server emitted their chunks."""
        return [(rec["completion_tokens"] - rec["emit_tokens"][0]) / (rec["emit_mono"][-1] - rec["emit_mono"][0])
                / self.scale for rec in self.trace]

    def decodes(self) -> list[dict]:
        return [r for r in map(parse_batch_line, self.srv.log_text().splitlines()) if r and r["kind"] == "decode"]

    def why(self) -> str:
        return (f"scale {self.scale}, rates {[round(r, 2) for r in self.rates]}, scheduler lag max "
                f"{self.sim['schedule_lag_max_s']} s (slack {self.slack:.2%}), resets {self.sim['schedule_resets']}")


def run_requests(srv, n: int, output_len: int = 256, concurrency: int = 1) -> list[StreamResult]:
    def one(i: int) -> StreamResult:
        body = {"text": f"request {i}: " + "lorem ipsum dolor sit amet " * 25,
                "sampling_params": {"max_new_tokens": output_len, "ignore_eos": True, "temperature": 0},
                "stream": True}
        res = stream(srv.port, "/generate", body, timeout=120)
        assert res.done and res.final["meta_info"]["completion_tokens"] == output_len
        return res
    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, range(n)))


def measure(launch: Launcher, args: list[str], env: dict, scale: float, n: int, tp: int = 8,
            output_len: int = 256, concurrency: int = 1) -> Measured:
    """n requests against a fresh server, with the server's trace and its lag; refuses a restarted schedule."""
    trace = launch.root / f"trace{len(launch.started)}.jsonl"
    srv = launch(args, env={**env, "SPECAB_SIM_TRACE": str(trace)}, scale=scale, tp=tp)
    results = run_requests(srv, n, output_len, concurrency)
    # the trace line is written as a request finishes, the last chunk reaches the client at the same moment
    wait_for(lambda: trace.is_file() and len(trace.read_text().splitlines()) == n, 10, f"{n} trace lines")
    recs = [json.loads(line) for line in trace.read_text().splitlines()]
    rid = {r.final["meta_info"]["id"]: i for i, r in enumerate(results)}
    recs.sort(key=lambda rec: rid[rec["rid"]])
    sim = request_json(srv.port, "GET", "/server_info")[1]["simulator"]
    m = Measured(srv, scale, results, recs, sim)
    assert all(r["time_scale"] == scale and r["completion_tokens"] == output_len for r in recs), recs
    assert all(e >= d for r in recs for e, d in zip(r["emit_mono"], r["emit_due"])), "a chunk emitted before due"
    assert sim["schedule_resets"] == 0, f"the box held the simulator 0.5 s behind: it restarted its schedule: {m.why()}"
    check_stream(m)
    return m


def check_stream(m: Measured) -> None:
    """What the client received is what the server emitted: one chunk per emission carrying the emitted tokens
    (cumulative counts exact), none read before it was emitted (one monotonic clock on the box), and the decode
    rate the client reads within STREAM_TOL of the emission times' (a late read of a first or last chunk moves a
    span of ~0.5 s by a few ms; a stream held back, merged or paced on another clock moves it far more)."""
    for res, rec in zip(m.results, m.trace):
        counts = [c["meta_info"]["completion_tokens"] for c in res.chunks]
        assert counts == list(accumulate(rec["emit_tokens"])), (rec["rid"], counts, rec["emit_tokens"])
        assert all(read >= emitted for read, emitted in zip(res.chunk_t, rec["emit_mono"])), rec["rid"]
    client, emitted = statistics.median(m.client_rates), statistics.median(m.emitted_rates)
    assert client == pytest.approx(emitted, rel=STREAM_TOL), (client, emitted, m.why())


def test_baseline_with_tuned_nccl_is_82_tok_s(launch):
    m = measure(launch, ARGS, TUNED, scale=5, n=7)
    assert statistics.median(m.rates) == pytest.approx(82.2, rel=0.02), m.why()
    truth = m.sim["true_decode_tok_s"] / m.scale
    assert statistics.median(m.rates) == pytest.approx(truth, rel=0.02), "agrees with the model's truth"
    decodes = m.decodes()
    assert decodes and all(r["cuda graph"] == "True" for r in decodes)
    gen = statistics.median(float(r["gen throughput (token/s)"]) for r in decodes) / m.scale
    assert gen == pytest.approx(82.2, rel=0.05 + m.slack), "the log's gen throughput reads like the seed's"


def test_baseline_without_the_nccl_variables_is_63_tok_s(launch):
    m = measure(launch, ARGS, {}, scale=5, n=5)
    assert statistics.median(m.rates) == pytest.approx(63.0, rel=0.02), m.why()
    assert m.sim["nccl_factor"] > 1.3


def test_eagle3_two_steps_is_60_5_tok_s_at_accept_length_2_1(launch):
    m = measure(launch, [*ARGS, *EAGLE_S2], TUNED, scale=8, n=20)
    assert statistics.fmean(m.rates) == pytest.approx(60.5, rel=0.02), m.why()
    accept = [r.final["meta_info"]["completion_tokens"] / r.final["meta_info"]["spec_verify_ct"]
              for r in m.results]
    assert statistics.fmean(accept) == pytest.approx(2.10, abs=0.05), accept
    for r, rec in zip(m.results, m.trace):   # one streamed chunk per verify step, so chunks = verify steps + prefill
        assert len(r.chunks) == r.final["meta_info"]["spec_verify_ct"] + 1 == len(rec["emit_mono"])
    # the pure model draws the same requests: coverage studies in-process see what the server serves, request
    # by request (the server's rate is the model's up to its own lateness)
    model = TimingModel.create(load_profile("default"), {"tp_size": 8, **SPEC_S2}, TUNED, seed=0,
                               instance=m.sim["instance"])
    twins = [model.simulate_request(256, rng=request_rng(0, m.sim["instance"], i + 1)) for i in range(20)]
    assert [t.verify_ct for t in twins] == [r.final["meta_info"]["spec_verify_ct"] for r in m.results]
    for twin, rate in zip(twins, m.rates):
        assert rate == pytest.approx(twin.decode_tok_s, rel=0.005), (twin, m.why())
    decodes = m.decodes()
    assert decodes and all(r["cuda graph"] == "False" for r in decodes), "verify in extend mode, no CUDA graph"
    assert statistics.fmean(float(r["accept len"]) for r in decodes) == pytest.approx(2.10, abs=0.1)
    info = request_json(m.srv.port, "GET", "/server_info")[1]
    assert info["internal_states"][0]["avg_spec_accept_length"] == pytest.approx(2.10, abs=0.06)


def test_simulate_acc_len_forces_the_accept_length(launch):
    srv = launch([*ARGS, *EAGLE_S2], env={**TUNED, "SGLANG_SIMULATE_ACC_LEN": "2.6"}, scale=20, tp=2)
    results = run_requests(srv, 4, output_len=200)
    accept = statistics.fmean(r.final["meta_info"]["spec_accept_length"] for r in results)
    assert accept == pytest.approx(2.45, abs=0.12), "N(2.6, 1) rounded and clamped to [1, 3]"


def test_rates_scale_with_the_time_scale(launch):
    """The simulator's arithmetic of the time scale: at scale 2 and at 8 the same requests take simulated spans whose
    wall spans (the server's trace) are divided by the scale. A wrong scale moves a rate by its factor (x4 between
    these two), far beyond the 2-3 % the bounds allow."""
    slow = measure(launch, ARGS, TUNED, scale=2, n=3, tp=2)
    fast = measure(launch, ARGS, TUNED, scale=8, n=3, tp=2)
    # the profile's 82.2 tok/s within its per-request noise (2 %), at each scale
    for m in (slow, fast):
        assert statistics.median(m.rates) == pytest.approx(82.2, rel=0.02), m.why()
        # the server's own truth for this instance, in wall tok/s, is the scale times the simulated one
        assert statistics.median(m.rates) == pytest.approx(m.sim["true_decode_tok_s"] / m.scale, rel=0.02), \
            (m.why(), m.sim)
    # the same simulated rate at both scales, so the wall rate at 8 is four times the one at 2
    assert statistics.median(fast.rates) == pytest.approx(statistics.median(slow.rates), rel=0.03), \
        (slow.why(), fast.why())


def test_concurrent_requests_are_batched_and_each_decodes_slower(launch):
    expected = true_decode_tok_s(load_profile("default").without_noise(), {"tp_size": 2}, TUNED, bs=4)
    assert expected < 80.0
    m = measure(launch, ARGS, TUNED, scale=2, n=4, tp=2, concurrency=4)
    assert statistics.median(m.rates) == pytest.approx(expected, rel=0.05), m.why()
    assert max(int(r["#running-req"]) for r in m.decodes()) == 4, "continuous batching ran them together"
