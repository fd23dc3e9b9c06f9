"""Requests delivered in bursts (node/loadgen `buffered`): their chunk times are not the engine's decode pace. Held
against a real vLLM 0.32.0's stream on 2 loaded cores (tests/fixtures/vllm-0.32.0/bench_bursty.jsonl)."""
from __future__ import annotations

import json
from pathlib import Path

from specab.node import loadgen

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32.0" / "bench_bursty.jsonl"


def _finished(chunk_t: list[float], chunk_n: list[int], e2e: float) -> dict:
    rec = {"chunk_t_s": list(chunk_t), "chunk_tokens": list(chunk_n)}
    counter = loadgen.ChunkCounter("completions")
    counter.total = sum(chunk_n)
    loadgen._finish_record(rec, counter, e2e)
    return rec


def test_the_real_stalled_requests_are_buffered_and_the_streamed_ones_are_not() -> None:
    recs = [json.loads(line) for line in FIX.read_text().splitlines()]
    got = [_finished(r["chunk_t_s"], r["chunk_tokens"], r["e2e_s"]) for r in recs]
    # warm-up and the first measured request streamed (~3 ms a token); the last two waited ~0.4 s for their first
    # token, then got all the others at once: buffered, no pace
    assert [g["buffered"] for g in got] == [False, False, False, True, True]
    assert all(g["decode_tok_s"] is None and g["tpot_s"] is None for g in got[3:])
    assert 200 < got[1]["decode_tok_s"] < 400          # the streamed request's own pace, as before
    # the third stalled 0.41 s after 11 tokens, then a burst: its pace over the whole decode (stall included) is
    # what a reader saw, not inflated; it is kept (as a slow client's pace is: the client-bottleneck evidence)
    assert 200 < got[2]["decode_tok_s"] < 400
    # without the rule the last one would have claimed ~26,000 tok/s
    t = recs[4]["chunk_t_s"]
    assert (sum(recs[4]["chunk_tokens"]) - 1) / (t[-1] - t[0]) > 20000


def test_steady_pairs_and_speculative_chunks_are_not_bursts() -> None:
    step = 0.005
    # two chunks read at once every other step (a coalesced TCP read): not a burst
    pairs = [0.1 + (i // 2) * 2 * step + (i % 2) * 1e-5 for i in range(128)]
    assert not _finished(pairs, [1] * 128, pairs[-1] + 1e-3)["buffered"]
    # speculation: 4 tokens per chunk every 12 ms
    spec = [0.05 + i * 0.012 for i in range(32)]
    assert not _finished(spec, [1] + [4] * 31, spec[-1])["buffered"]
    # a long prefill (2 s) before 20 steadily streamed tokens
    slow = [2.0 + i * step for i in range(20)]
    assert not _finished(slow, [1] * 20, slow[-1])["buffered"]
