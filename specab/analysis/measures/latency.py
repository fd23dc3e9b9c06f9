"""Each measured request's latencies as a user of an open or closed load sees them, recomputed from the records.

Definitions (the report's latency columns: docs/analysis.md, "Verdict per load"):
- TTFT and end-to-end latency are counted from the request's scheduled arrival under an open load (bench.request_rate:
  the client's arrival plus its wait for a free slot of the in-flight cap, ``arrival_wait_s``), from its send in a
  closed loop, where a request arrives when a slot frees;
- TPOT is the client's: (e2e - TTFT) / (output tokens - 1) from the send, void for a request delivered in a burst;
- the inter-token latency per chunk (``itl_chunk``) is every gap between consecutive streamed chunks; per token
  (``itl_token``) each chunk after the first spreads its gap over the tokens it carries (node/loadgen
  ``per_token_latencies``, recomputed here from the stored chunk arrays, so a store written before the client
  recorded it has it too);
- queueing: a request's wait from its scheduled arrival to its first token beyond the run's unloaded TTFT, the
  smallest TTFT of the run's requests (the prefill of a request that found the server idle, or nearly). It holds the
  client's wait for a slot and the engine's queue (SGLang's ``#queue-req``) alike.
Times are simulated seconds on a time-scaled simulated node, as everywhere in the analysis.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from specab.analysis.evidence.chunks import run_chunks
from specab.analysis.evidence.model import Experiment, Run

PERCENTILES = (50.0, 90.0, 95.0, 99.0)


def per_token_latencies(chunk_t: list[float], chunk_n: list[int]) -> list[float]:
    """One value per token after the first chunk: its chunk's gap over the tokens the chunk carried (the client's
    rule, node/loadgen.per_token_latencies, restated here: the analysis does not import the node tools)."""
    return [(b - a) / n for a, b, n in zip(chunk_t, chunk_t[1:], chunk_n[1:]) if n and n > 0
            for _ in range(int(n))]


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (linear interpolation between the closest ranks, numpy's default and the client's)."""
    return float(np.percentile(values, q)) if values else None


@dataclass
class RequestTimes:
    """One measured request's latencies (seconds), as the SLO terms and the queueing measures read them."""
    i: int
    ttft_s: float | None          # from the scheduled arrival (open load) or the send (closed loop)
    e2e_s: float | None           # likewise
    tpot_s: float | None
    itl_token_s: list[float] = field(default_factory=list)
    itl_chunk_s: list[float] = field(default_factory=list)
    arrival_s: float | None = None     # open load: scheduled arrival from the measurement's start
    wait_s: float = 0.0                # open load: the client's wait for a slot after that arrival
    queue_s: float | None = None       # TTFT (from the arrival) beyond the run's unloaded TTFT
    output_tokens: int = 0


@dataclass
class RunTimes:
    """A run's requests' latencies and what they add up to."""
    run_id: str
    requests: list[RequestTimes]
    unloaded_ttft_s: float | None
    open_load: bool

    def values(self, metric: str) -> list[float]:
        """Every value of a metric over the run's requests: one per request (ttft_s, e2e_s, tpot_s, queue_s), or
        every gap of every request (itl_token_s, itl_chunk_s)."""
        if metric in ("itl_token_s", "itl_chunk_s"):
            return [g for r in self.requests for g in getattr(r, metric)]
        return [v for r in self.requests if (v := getattr(r, metric)) is not None]

    def percentile(self, metric: str, q: float) -> float | None:
        return percentile(self.values(metric), q)

    def percentiles(self) -> dict[str, dict[str, float | None]]:
        return {m: {f"p{q:g}": self.percentile(m, q) for q in PERCENTILES}
                for m in ("ttft_s", "tpot_s", "e2e_s", "itl_token_s", "itl_chunk_s", "queue_s")}


def run_times(exp: Experiment, run: Run) -> RunTimes:
    """The run's measured, answered requests' latencies (its chunk arrays read from its bench.jsonl or the store)."""
    chunks = {i: (t, n) for i, t, n in run_chunks(exp, run)}
    reqs = []
    for q in run.measured:
        ts, ns = chunks.get(q.i, ([], []))
        wait = q.arrival_wait_s or 0.0
        from_arrival = q.arrival_s is not None
        reqs.append(RequestTimes(
            i=q.i, ttft_s=None if q.ttft_s is None else q.ttft_s + (wait if from_arrival else 0.0),
            e2e_s=None if q.e2e_s is None else q.e2e_s + (wait if from_arrival else 0.0), tpot_s=q.tpot_s,
            itl_token_s=[] if q.buffered else per_token_latencies(ts, ns),
            itl_chunk_s=[b - a for a, b in zip(ts, ts[1:])], arrival_s=q.arrival_s, wait_s=wait,
            output_tokens=int(q.output_tokens or 0)))
    ttfts = [q.ttft_s for q in run.measured if q.ttft_s is not None]
    unloaded = min(ttfts) if ttfts else None
    for r in reqs:
        if r.ttft_s is not None and unloaded is not None:
            r.queue_s = max(0.0, r.ttft_s - unloaded)
    return RunTimes(run.run_id, reqs, unloaded, any(r.arrival_s is not None for r in reqs))


def times_of(exp: Experiment, runs: list[Run] | None = None) -> dict[str, RunTimes]:
    """run_id -> RunTimes of the given runs (default: every ok run), each read once."""
    return {r.run_id: run_times(exp, r) for r in (runs if runs is not None else [r for r in exp.runs if r.ok])}
