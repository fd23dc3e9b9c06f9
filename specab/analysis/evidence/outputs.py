"""The measured requests' outputs, read for the output checks (validity.py).

Every bench.jsonl record keeps its output: ``output_ids`` where the server sent token ids, else ``output_text``
(specab/node/loadgen.py). They live in the store's ``requests.extra_json`` (a pooled experiment's in each source
store, under the seq it had there) or, for a round of ``ab_test.yml``, in each run directory's bench.jsonl. They are
read here per run, apart from the ``Request`` records, so the statistics never carry them.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from specab.analysis.evidence.model import Experiment, Run, bench_records


@dataclass(frozen=True)
class Output:
    """One measured request's output as the client received it."""
    i: int                              # the request index: the same prompt in every arm and block
    tokens: tuple[Any, ...]             # token ids, or the words of the text where the server sent no ids
    unit: str                           # "tokens" (ids) or "words" (text split on white space)
    finish_reason: str | None
    text: str | None = None             # the text, where the server sent no ids (compared whole, not as words)

    @property
    def comparable(self) -> tuple[Any, ...] | str:
        return self.tokens if self.text is None else self.text


def _from_record(rec: dict[str, Any]) -> Output | None:
    if rec.get("warmup") or not rec.get("ok"):
        return None
    i = rec.get("i")
    if not isinstance(i, int):
        return None
    ids = rec.get("output_ids")
    if isinstance(ids, list):
        return Output(i=i, tokens=tuple(ids), unit="tokens", finish_reason=rec.get("finish_reason"))
    text = rec.get("output_text")
    if isinstance(text, str):
        return Output(i=i, tokens=tuple(text.split()), unit="words", finish_reason=rec.get("finish_reason"),
                      text=text)
    return None


def _records_of_store(path: Path, seqs: list[int]) -> dict[int, list[dict[str, Any]]]:
    from specab.results.store import Store
    store = Store.open(path)
    try:
        return {seq: store.request_outputs(seq) for seq in seqs}
    finally:
        store.close()


def read(exp: Experiment, runs: Iterable[Run]) -> dict[int, dict[int, Output]]:
    """Each run's measured outputs by request index, by the run's seq in ``exp`` (runs with none left out)."""
    by_store, elsewhere = exp.stores_of(runs)
    records = {r.seq: bench_records(Path(r.run_dir) / "bench.jsonl") or []
               for r in elsewhere if r.run_dir is not None}
    for path, pairs in by_store.items():
        there = _records_of_store(path, [seq for _, seq in pairs])
        records.update({here: there[seq] for here, seq in pairs})
    out: dict[int, dict[int, Output]] = {}
    for seq, recs in records.items():
        outs = {o.i: o for o in (_from_record(r) for r in recs) if o is not None}
        if outs:
            out[seq] = outs
    return out
