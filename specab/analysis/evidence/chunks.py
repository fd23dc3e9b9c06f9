"""The per-chunk arrays of a run's measured requests (bench.jsonl ``chunk_t_s`` and ``chunk_tokens``): when each
streamed chunk reached the client and how many tokens it carried. The loaders leave them out of the model (a large
experiment holds millions of them); the latency analysis reads them here, run by run, when it needs them."""
from __future__ import annotations

from pathlib import Path

from specab.analysis.evidence.model import Experiment, Run, bench_records
from specab.results.store import Store

Chunks = list[tuple[int, list[float], list[int]]]


def _from_bench_jsonl(path: Path) -> Chunks | None:
    records = bench_records(path)
    if records is None:
        return None
    return [(int(rec.get("i") or 0), list(rec.get("chunk_t_s") or []), list(rec.get("chunk_tokens") or []))
            for rec in records if rec.get("ok") and not rec.get("warmup")]


def _from_store(exp: Experiment, run: Run) -> Chunks | None:
    """The run's arrays from the store its request rows are in (Experiment.stores_of: a pooled experiment's come from
    several); None where that store is gone."""
    groups, _gone = exp.stores_of([run])
    for path, seqs in groups.items():
        with Store.open(path) as store:
            return store.request_chunks(seqs[0][1])
    return None


def run_chunks(exp: Experiment, run: Run) -> Chunks:
    """(i, chunk times since the request's send in simulated seconds on a time-scaled node, tokens per chunk) of each
    measured, answered request of the run: from its bench.jsonl where the run directory is here, else from the
    store; [] where neither has them."""
    found = _from_bench_jsonl(run.run_dir / "bench.jsonl") if run.run_dir is not None else None
    if found is None:
        found = _from_store(exp, run)
    scale = run.time_scale or 1.0
    return [(i, [t * scale for t in ts], ns) for i, ts, ns in (found or [])]
