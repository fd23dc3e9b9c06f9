"""The client's latency percentiles (node/loadgen `latency`) on the records a real SGLang 0.5.17 EAGLE-3 run wrote
(tests/fixtures/sglang-0.5.17/eagle3-s2.bench.jsonl: the H200 ab_test run's bench.jsonl, 128 tokens per request)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from specab.node import loadgen

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "sglang-0.5.17" / "eagle3-s2.bench.jsonl"


def test_latency_percentiles_of_a_real_run() -> None:
    recs = [json.loads(x) for x in REAL.read_text().splitlines() if x.strip()]
    ok = [r for r in recs if not r["warmup"] and r["ok"]]
    assert ok and all(len(r["chunk_t_s"]) > 10 for r in ok)
    lat = loadgen.latency_percentiles(ok)
    gaps = np.concatenate([np.diff(r["chunk_t_s"]) for r in ok])
    for q in (50, 90, 99):
        assert lat["itl_s"][f"p{q}"] == pytest.approx(float(np.percentile(gaps, q)))
        for k in ("ttft_s", "tpot_s", "e2e_s"):
            assert lat[k][f"p{q}"] == pytest.approx(float(np.percentile([r[k] for r in ok], q)))
    # one gap per chunk, whatever it carries: a cycle's accepted drafts arrive as one gap
    r = ok[0]
    assert len(loadgen.inter_token_latencies(r)) == len(r["chunk_t_s"]) - 1
    # the summary carries them with the measured span
    s = loadgen.summarize(_cfg(), recs, duration_s=1.0, cpu_s=0.1, data_hash="x")
    assert s["latency"] == lat
    assert s["measured_span_s"] == pytest.approx(max(r["start_ts"] + r["e2e_s"] for r in ok)
                                                 - min(r["start_ts"] for r in ok))


def _cfg() -> loadgen.BenchConfig:
    return loadgen.BenchConfig(url="http://127.0.0.1:1", api="generate", num_requests=6, warmup=2, input_len=64,
                               output_len=128, concurrency=1, seed=1, timeout=60.0, ignore_eos=True,
                               request_rate=0.0, client_procs="auto")


def test_per_token_itl_spreads_each_chunks_gap_over_its_tokens() -> None:
    """ITL per token (itl_token_s) beside ITL per chunk (itl_s): on the real EAGLE-3 run a chunk carries several tokens,
    each of its tokens gets the chunk's gap over their number, so a request's per-token values add up to its decode
    span and there is one per token after the first chunk; the analysis recomputes the same from the stored arrays."""
    from specab.analysis.measures.latency import per_token_latencies as analysis_rule
    recs = [json.loads(x) for x in REAL.read_text().splitlines() if x.strip()]
    ok = [r for r in recs if not r["warmup"] and r["ok"]]
    assert any(n > 1 for r in ok for n in r["chunk_tokens"][1:])          # speculative chunks of several tokens
    for r in ok:
        per = loadgen.per_token_latencies(r["chunk_t_s"], r["chunk_tokens"])
        assert len(per) == sum(r["chunk_tokens"][1:])
        assert sum(per) == pytest.approx(r["chunk_t_s"][-1] - r["chunk_t_s"][0])
        assert per == analysis_rule(r["chunk_t_s"], r["chunk_tokens"])
    lat = loadgen.latency_percentiles(ok)
    tokens = np.concatenate([loadgen.per_token_latencies(r["chunk_t_s"], r["chunk_tokens"]) for r in ok])
    assert lat["itl_token_s"]["p95"] == pytest.approx(float(np.percentile(tokens, 95)))
    assert lat["itl_token_s"]["p50"] < lat["itl_s"]["p50"]                # a chunk's gap is several tokens' gaps
    # a chunk of 3 tokens 6 ms after the previous one: three values of 2 ms
    assert loadgen.per_token_latencies([0.0, 0.004, 0.010], [1, 1, 3]) == pytest.approx([0.004, 0.002, 0.002, 0.002])
