#!/usr/bin/env python3
"""The engine's per-phase timing counters, read from its Prometheus ``/metrics`` (stdlib only).

The benchmark client (loadgen.py) scrapes ``/metrics`` just before and just after the measured requests and
writes the deltas to ``phase_metrics.json`` in the run directory (schema in docs/results.md). Metrics read
(the 2026 engines reference A5; SGLang 0.5.23 needs ``--enable-metrics`` and, for the categories,
``SGLANG_ENABLE_METRICS_DEVICE_TIMER=1``):

* ``sglang:forward_execution_seconds_total{category}``: GPU forward seconds per category (``eagle_draft``,
  ``eagle_draft_extend``, ``target_verify``, ``decode``, ``extend``; 0.5.17 has only ``extend``/``decode``);
* ``sglang:cuda_graph_passes_total{mode}``: forward passes per CUDA-graph mode (``decode_cuda_graph``,
  ``decode_none``, ``prefill_none``, ...);
* ``sglang:spec_verify_calls_total``: verify calls (cycles), on a speculative server (0.5.17 and 0.5.23);
  ``sglang:generation_tokens_total``.

Only ``tp_rank="0"`` series are read for the per-rank metrics (the ranks run in lockstep); series of one name that
differ in other labels (``is_streaming``) are summed. Python 3.8 syntax: it runs on GPU nodes.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Optional

from specab.vocab import engines

SCHEMA = 1
FORWARD = "sglang:forward_execution_seconds_total"
GRAPH = "sglang:cuda_graph_passes_total"
VERIFY = "sglang:spec_verify_calls_total"
GENERATED = "sglang:generation_tokens_total"

def snapshot(text: str) -> Dict[str, Any]:
    """The phase counters of one scrape: {forward_s: {category: s}, graph_passes: {mode: n},
    spec_verify_calls: n or None, generation_tokens: n or None}."""
    forward = {}  # type: Dict[str, float]
    graph = {}  # type: Dict[str, float]
    verify = None  # type: Optional[float]
    generated = None  # type: Optional[float]
    for name, labels, value in engines.parse_prometheus(text, strict=True):
        if labels.get("tp_rank", "0") != "0" or math.isnan(value):
            continue
        if name == FORWARD and "category" in labels:
            forward[labels["category"]] = forward.get(labels["category"], 0.0) + value
        elif name == GRAPH and "mode" in labels:
            graph[labels["mode"]] = graph.get(labels["mode"], 0.0) + value
        elif name == VERIFY:
            verify = (verify or 0.0) + value
        elif name == GENERATED:
            generated = (generated or 0.0) + value
    return {"forward_s": forward, "graph_passes": graph, "spec_verify_calls": verify,
            "generation_tokens": generated}


def delta(before: Dict[str, Any], after: Dict[str, Any]) -> Dict[str, Any]:
    """after - before of two snapshots (a key missing before counts from 0: the counter appeared in the window)."""
    def sub(a: Optional[float], b: Optional[float]) -> Optional[float]:
        return None if b is None else b - (a or 0.0)

    out = {}  # type: Dict[str, Any]
    for key in ("forward_s", "graph_passes"):
        b, a = before.get(key) or {}, after.get(key) or {}
        out[key] = {k: a[k] - b.get(k, 0.0) for k in sorted(a)}
    out.update({key: sub(before.get(key), after.get(key)) for key in ("spec_verify_calls", "generation_tokens")})
    return out


def unavailable(reason: str) -> Dict[str, Any]:
    return {"schema": SCHEMA, "available": False, "reason": reason}


def result(before_text: str, after_text: str, window_s: float, before_at: float, after_at: float) -> Dict[str, Any]:
    """The phase_metrics.json object for two scrapes around the measured requests."""
    d = delta(snapshot(before_text), snapshot(after_text))
    d.update({"schema": SCHEMA, "available": True, "window_s": window_s, "before_at": before_at,
              "after_at": after_at, "categories": sorted(d["forward_s"])})
    if not d["forward_s"]:
        d["reason"] = ("no sglang:forward_execution_seconds_total{category} series: the engine does not split "
                       "forward time by phase (SGLang < 0.5.23, vLLM), or SGLANG_ENABLE_METRICS_DEVICE_TIMER=1 "
                       "is not set")
    return d
