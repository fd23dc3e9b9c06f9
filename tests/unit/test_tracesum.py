"""The trace summariser on traces built from the real span names (shared/reference/engines-2026.md A6 and the
0.5.17 span_summary.txt), not from simulator output; a 50 MB trace is summarised with flat memory."""
from __future__ import annotations

import gzip
import io
import json
import tracemalloc

import pytest

from specab.node import tracesum

SPANS = [("step[DRAFT bs=1]", 4.0), ("draft", 4.0), ("step[VERIFY bs=1]", 29.0), ("draft_extend", 0.8),
         ("scheduler.run_batch", 35.0), ("scheduler.recv_requests", 0.06), ("step[EXTEND bs=1 toks=133]", 12.0)]


def _event(name: str, cat: str, ts: float, dur_ms: float) -> str:
    return json.dumps({"ph": "X", "cat": cat, "name": name, "pid": 1234, "tid": 1234, "ts": ts, "dur": dur_ms * 1000,
                       "args": {"External id": 17, "Record shapes": "padding " * 8}})


def _write_trace(path, cycles: int) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.write('{"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H200"}], '
                 '"distributedInfo": {"rank": 0}, "traceEvents": [\n')
        first = True
        for c in range(cycles):
            for name, dur in SPANS:
                for cat in ("user_annotation", "gpu_user_annotation"):
                    fh.write(("" if first else ",\n") + _event(name, cat, c * 40000.0, dur))
                    first = False
        fh.write('\n], "traceName": "x"}\n')


def test_small_trace_counts_and_durations(tmp_path):
    p = tmp_path / "1700000000.1-TP-0.trace.json.gz"
    _write_trace(p, 3)
    res = tracesum.summarise(str(p))
    assert res["events"] == 3 * len(SPANS) * 2
    spans = {(s["name"], s["cat"]): s for s in res["spans"]}
    assert spans[("step[VERIFY bs=N]", "gpu_user_annotation")] == {"name": "step[VERIFY bs=N]",
                                                                   "cat": "gpu_user_annotation", "count": 3,
                                                                   "total_ms": 87.0}
    assert ("step[EXTEND bs=N toks=N]", "user_annotation") in spans


def test_small_chunks_split_objects_anywhere():
    text = '{"traceEvents": [' + ",".join(_event(n, "c", 0, d) for n, d in SPANS) + "]}"
    events = list(tracesum.iter_events(io.StringIO(text), chunk=7))
    assert [e["name"] for e in events] == [n for n, _ in SPANS]


@pytest.mark.parametrize("text,msg", [('{"a": 1}', "no traceEvents"), ('{"traceEvents": [{"ph": "X"', "cut off")])
def test_bad_traces_raise(text, msg):
    with pytest.raises(tracesum.TraceError, match=msg):
        list(tracesum.iter_events(io.StringIO(text), chunk=4))


def test_a_50_mb_trace_is_summarised_with_flat_memory(tmp_path):
    p = tmp_path / "big-TP-0.trace.json.gz"
    per_cycle = sum(len(_event(n, "gpu_user_annotation", 0, d)) + 2 for n, d in SPANS) * 2
    cycles = 50 * 1024 * 1024 // per_cycle + 1
    _write_trace(p, cycles)
    with gzip.open(p, "rb") as fh:
        size = sum(len(b) for b in iter(lambda: fh.read(1 << 20), b""))
    assert size >= 50 * 1024 * 1024
    tracemalloc.start()
    try:
        res = tracesum.summarise(str(p))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert res["events"] == cycles * len(SPANS) * 2
    assert peak < 12 * 1024 * 1024, f"peak {peak / 2**20:.1f} MiB for a {size / 2**20:.0f} MiB trace"
