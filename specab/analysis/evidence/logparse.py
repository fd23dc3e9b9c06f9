"""Version-agnostic parser for SGLang (0.4.x, 0.5.x) and vLLM server logs.

One record per recognised line, every field the line carries, plus a summary:

* SGLang ``Prefill batch`` / ``Decode batch`` lines, both ``batch.`` (<= 0.5.3) and ``batch,``
  (>= 0.5.5), with or without `` [iter]`` (SGLANG_LOG_FORWARD_ITERS), ``accept len``/``accept rate``,
  a trailing ``, `` or not, rank prefixes (``TP0``, ``DP0 TP0``, ``PP0 TP3``), hybrid-SWA token
  fields, ``cuda graph``/``cpu graph``, ``input throughput``, ``#pending-token``; unknown
  ``key: value`` fields are kept under a normalised name;
* the ready line, load-phase lines (weights, KV cache, memory pool, CUDA-graph capture of the target
  and the draft, the capacity line ``max_total_num_tokens=...``);
* ``NCCL INFO <VAR> set by environment to <value>`` lines (and ``NCCL version``);
* vLLM ``SpecDecoding metrics:`` lines (parsed per key, so every format revision works) and the
  ``Avg prompt throughput`` stats line.

``iter_records`` streams over a text file object (constant memory); ``decode_stats`` is a fast
path over a binary file object for the decode statistics of large logs. Run as
``python -m specab.analysis.evidence.logparse <server.log>`` or ``specab parse-log`` (``register``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import sys
from dataclasses import dataclass, field
from typing import IO, Any, Iterable, Iterator, Sequence

from specab.vocab import engines
from specab.vocab.contract import READY_LINE

# --------------------------------------------------------------------------------------------------
# SGLang

# "[2025-10-22 10:27:57 DP0 TP0] " : logging's "[%(asctime)s{prefix}] %(message)s"
_SGL_PREFIX = re.compile(
    r"\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:[.,]\d+)?(?P<rank>(?: [A-Z][A-Z_]*\d+)*)\] ")
_BATCH = re.compile(r"(?P<kind>Prefill|Decode) batch(?: \[(?P<iter>\d+)\])?[.,] ")
_GRAPH_KEY = re.compile(r"^(\w+) graph$")

_BATCH_KEYS = {
    "#new-seq": "new_seq",
    "#new-token": "new_token",
    "#cached-token": "cached_token",
    "#running-req": "running_req",
    "#queue-req": "queue_req",
    "#token": "token",
    "token usage": "token_usage",
    "#full token": "full_token",
    "full token usage": "full_token_usage",
    "#swa token": "swa_token",
    "swa token usage": "swa_token_usage",
    "accept len": "accept_len",
    "accept rate": "accept_rate",
    "gen throughput (token/s)": "gen_throughput",
    "input throughput (token/s)": "input_throughput",
    "#pending-token": "pending_token",
}

_NUM = r"(-?[0-9.]+)"
# (marker substring, phase name)
_LOAD = [
    ("Init torch distributed begin", "dist_begin"),
    ("Init torch distributed ends", "dist_end"),
    ("Load weight begin", "weights_begin"),
    ("Load weight end", "weights_end"),
    ("KV Cache is allocated", "kv_cache"),
    ("Memory pool end", "memory_pool_end"),
]
_WEIGHTS_END = re.compile(r"type=(?P<model_type>[^,]+)(?:, dtype=(?P<dtype>[^,]+))?")
_AVAIL = re.compile(r"avail mem=" + _NUM + r" ?GB")
_MEM_USAGE = re.compile(r"mem usage=" + _NUM + r" ?GB")
_KV = re.compile(r"#tokens: (?P<tokens>\d+)(?:, K size: (?P<k>[0-9.]+) GB, V size: (?P<v>[0-9.]+) GB"
                 r"|, KV size: (?P<kv>[0-9.]+) GB)?")
# 0.5.9 "Capture [draft [extend ]]cuda graph begin|end"; 0.5.23 "Capture target|draft decode|verify CUDA graph
# begin. backend=full, ..." / "... end. bs=[...], elapsed=X s, mem usage=..." (engines-2026.md A3)
_CAPTURE = re.compile(r"Capture (?:(?P<role>target|draft) (?P<gphase>decode|verify|extend) (?P<backend_new>CUDA) graph"
                      r"|(?P<which>draft extend |draft )?(?P<backend>\w+) graph) (?P<edge>begin|end)")
_ELAPSED = re.compile(r"(?:Time elapsed: |elapsed=)" + _NUM + r" ?s")
_GRAPH_MODE = re.compile(r"backend=(\w+)")
_SHARDS = re.compile(r"Loading (?P<what>[\w ]+?) checkpoint shards:\s+(?P<pct>\d+)% Completed \| "
                     r"(?P<done>\d+)/(?P<total>\d+)")
_CAPACITY = re.compile(r"(\w+)=([^,\s]+)")

# --------------------------------------------------------------------------------------------------
# NCCL

_NCCL_ORIGIN = re.compile(r"(?:(?P<host>[^\s:]+):(?P<pid>\d+):(?P<tid>\d+) )?\[(?P<dev>\d+)\] NCCL INFO ")
_NCCL_ENV = re.compile(r"NCCL INFO (?P<var>[A-Z][A-Z0-9_]*) set by environment to (?P<value>.*?)\s*$")
_NCCL_VERSION = re.compile(r"NCCL INFO NCCL version (?P<version>\S+)")
_NCCL_INVALID = re.compile(r"NCCL INFO Invalid value (?P<value>.*) for (?P<var>[A-Z][A-Z0-9_]*), "
                           r"using default (?P<default>-?\d+)")

# --------------------------------------------------------------------------------------------------
# vLLM

_VLLM_PREFIX = re.compile(r"(?P<level>DEBUG|INFO|WARNING|ERROR) (?P<ts>\d\d-\d\d \d\d:\d\d:\d\d)")
_VLLM_SPEC = [
    ("mean_accept_len", re.compile(r"Mean acceptance length: ([0-9.]+)"), float),
    ("accepted_tok_s", re.compile(r"Accepted throughput: ([0-9.]+) tokens/s"), float),
    ("drafted_tok_s", re.compile(r"Drafted throughput: ([0-9.]+) tokens/s"), float),
    ("accepted_tokens", re.compile(r"Accepted: (\d+) tokens"), int),
    ("drafted_tokens", re.compile(r"Drafted: (\d+) tokens"), int),
    ("accept_rate_pct", re.compile(r"Draft acceptance rate: ([0-9.]+)%"), float),
    ("per_position_accept_rate",
     re.compile(r"Per-position acceptance rate: ([0-9.]+(?:, [0-9.]+)*)"),
     lambda s: [float(x) for x in s.split(", ")]),
    ("draft_length_histogram", re.compile(r"Draft length histogram: (.*?)(?:, Avg Draft|$)"), str),
]
_VLLM_STATS = [
    ("engine", re.compile(r"Engine (\d+):"), int),
    ("prompt_throughput", re.compile(r"Avg prompt throughput: ([0-9.]+) tokens/s"), float),
    ("gen_throughput", re.compile(r"Avg generation throughput: ([0-9.]+) tokens/s"), float),
    ("running", re.compile(r"Running: (\d+) reqs"), int),
    ("waiting", re.compile(r"Waiting: (\d+) reqs"), int),
    ("kv_cache_usage_pct", re.compile(r"KV cache usage: ([0-9.]+)%"), float),
    ("prefix_cache_hit_pct", re.compile(r"Prefix cache hit rate: ([0-9.]+)%"), float),
]


def _value(text: str) -> Any:
    if text == "True":
        return True
    if text == "False":
        return False
    if "." not in text:         # int() never takes a ".": skip its exception for every decimal number
        with contextlib.suppress(ValueError):
            return int(text)
    try:
        return float(text)
    except ValueError:
        return text


def _norm_key(key: str) -> str:
    return re.sub(r"[^0-9a-z]+", "_", key.lower()).strip("_")


def _sgl_prefix(line: str, rec: dict[str, Any]) -> None:
    m = _SGL_PREFIX.search(line)
    if m:
        rec["ts"] = m.group("ts")
        rec["rank"] = m.group("rank").strip() or None


def _batch_fields(rest: str, rec: dict[str, Any], wanted: frozenset[str] | None = None) -> None:
    """Parse the fields after a batch line's ``batch, `` into rec (later fields override earlier ones).
    wanted: convert only these record keys (the others are skipped, not stored)."""
    for part in rest.split(", "):
        key, sep, val = part.partition(": ")
        if not sep:
            continue
        key = key.strip()
        name = _BATCH_KEYS.get(key)
        if name is None:
            g = _GRAPH_KEY.match(key)
            if g:
                if wanted is None or "cuda_graph" in wanted:
                    rec["cuda_graph"] = _value(val.strip())
                    if wanted is None:
                        rec["graph_backend"] = g.group(1)
                continue
            name = _norm_key(key)
        if wanted is not None and name not in wanted:
            continue          # (a wanted name never ends in _pct, so skipping before the % rule is exact)
        val = val.strip()
        if val.endswith("%"):   # 0.4.x Prefill "cache hit rate: 0.00%"
            name += "_pct"
            val = val[:-1]
            if wanted is not None:
                continue
        rec[name] = _value(val)


def _parse_batch(line: str, m: re.Match) -> dict[str, Any]:
    rec: dict[str, Any] = {"kind": m.group("kind").lower(), "ts": None, "rank": None}
    _sgl_prefix(line[: m.start()], rec)
    if m.group("iter"):
        rec["iter"] = int(m.group("iter"))
    _batch_fields(line[m.end():].rstrip().rstrip(","), rec)
    if "accept_rate" in rec:
        # the accept-rate definition changed in 0.5.15+ ((tau-1)/K; 0.5.9 tau/(K+1)): say so when the line tells
        gen = engines.accept_rate_generation([p.partition(": ")[0].strip() for p in line[m.end():].split(", ")])
        if gen:
            rec["accept_rate_def"] = gen
    return rec


def _parse_load(line: str) -> dict[str, Any] | None:
    for marker, phase in _LOAD:
        if marker in line:
            rec: dict[str, Any] = {"kind": "load", "phase": phase, "ts": None, "rank": None}
            _sgl_prefix(line, rec)
            if phase == "weights_end":
                w = _WEIGHTS_END.search(line)
                if w:
                    rec["model_type"] = w.group("model_type")
                    if w.group("dtype"):
                        rec["dtype"] = w.group("dtype")
            elif phase == "kv_cache":
                k = _KV.search(line)
                if k:
                    rec["tokens"] = int(k.group("tokens"))
                    for g, name in (("k", "k_size_gb"), ("v", "v_size_gb"), ("kv", "kv_size_gb")):
                        if k.group(g):
                            rec[name] = float(k.group(g))
            for rx, name in ((_AVAIL, "avail_mem_gb"), (_MEM_USAGE, "mem_usage_gb")):
                x = rx.search(line)
                if x:
                    rec[name] = float(x.group(1))
            return rec
    c = _CAPTURE.search(line)
    if c:
        if c.group("role"):
            which = c.group("role") if c.group("gphase") != "extend" else c.group("role") + "_extend"
            rec = {"kind": "load", "phase": "graph_" + c.group("edge"), "graph": which,
                   "graph_phase": c.group("gphase"), "graph_backend": c.group("backend_new").lower(),
                   "ts": None, "rank": None}
            mode = _GRAPH_MODE.search(line)
            if mode:
                rec["graph_mode"] = mode.group(1)
        else:
            which = (c.group("which") or "").strip().replace(" ", "_") or "target"
            rec = {"kind": "load", "phase": "graph_" + c.group("edge"), "graph": which,
                   "graph_backend": c.group("backend"), "ts": None, "rank": None}
        _sgl_prefix(line, rec)
        for rx, name in ((_ELAPSED, "elapsed_s"), (_AVAIL, "avail_mem_gb"), (_MEM_USAGE, "mem_usage_gb")):
            x = rx.search(line)
            if x:
                rec[name] = float(x.group(1))
        return rec
    s = _SHARDS.search(line)
    if s:
        return {"kind": "load", "phase": "weights_progress", "what": s.group("what"),
                "pct": int(s.group("pct")), "done": int(s.group("done")), "total": int(s.group("total")),
                "ts": None, "rank": None}
    return None


def _parse_nccl(line: str) -> dict[str, Any] | None:
    m = _NCCL_ENV.search(line)
    if m:
        value: Any = m.group("value")
        if re.fullmatch(r"-?\d+\.", value):   # integer params print "%lld." (trailing period)
            value = int(value[:-1])
        rec: dict[str, Any] = {"kind": "nccl_env", "var": m.group("var"), "value": value}
    else:
        m = _NCCL_VERSION.search(line)
        if m:
            rec = {"kind": "nccl_version", "version": m.group("version")}
        else:
            m = _NCCL_INVALID.search(line)
            if not m:
                return None
            rec = {"kind": "nccl_env_invalid", "var": m.group("var"), "value": m.group("value"),
                   "default": int(m.group("default"))}
    o = _NCCL_ORIGIN.search(line)
    if o:
        rec["host"] = o.group("host")
        rec["pid"] = int(o.group("pid")) if o.group("pid") else None
        rec["cuda_dev"] = int(o.group("dev"))
    return rec


def _parse_vllm(line: str, kind: str, fields: list) -> dict[str, Any]:
    rec: dict[str, Any] = {"kind": kind, "ts": None}
    p = _VLLM_PREFIX.search(line)
    if p:
        rec["ts"] = p.group("ts")
    for name, rx, conv in fields:
        m = rx.search(line)
        if m:
            try:
                rec[name] = conv(m.group(1))
            except ValueError:          # a number cut or garbled ("1.2.3"): the line is not read
                rec.setdefault("unreadable", []).append(name)
    return rec


# The numeric fields of the lines summarised, and the range each value must lie in (an out-of-range value is kept in
# its record, marked, and left out of the summary): counts, throughputs and lengths are never negative, rates are
# fractions (vLLM's percentages up to 100).
_NUMERIC = {**{name: (0.0, None) for name in _BATCH_KEYS.values()}, "accept_rate": (0.0, 1.0),
            **{name: (0.0, None) for name, _, conv in _VLLM_SPEC + _VLLM_STATS if conv in (int, float)},
            "accept_rate_pct": (0.0, 100.0), "kv_cache_usage_pct": (0.0, 100.0), "prefix_cache_hit_pct": (0.0, 100.0)}


def _checked(rec: dict[str, Any]) -> dict[str, Any]:
    """Mark a batch or vLLM stats record's fields that hold no number (``unreadable``: the line is not read) or a
    number out of its range (``out_of_range``: that value is not summarised); a line with no number at all is not
    read either."""
    unreadable, out = list(rec.pop("unreadable", [])), []
    numbers = 0
    for name, (low, high) in _NUMERIC.items():
        if name not in rec:
            continue
        v = rec[name]
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            unreadable.append(name)
        elif not math.isfinite(v) or v < low or (high is not None and v > high):
            out.append(name)
        else:
            numbers += 1
    if unreadable or not (numbers or out):
        rec["unreadable"] = unreadable or ["no field"]
    if out:
        rec["out_of_range"] = out
    return rec


def parse_line(line: str) -> dict[str, Any] | None:
    """The record for one log line, or None when the line is not one we read."""
    if "batch" in line:
        m = _BATCH.search(line)
        if m:
            return _checked(_parse_batch(line, m))
    if "NCCL INFO" in line:
        return _parse_nccl(line)
    if "SpecDecoding metrics:" in line:
        return _checked(_parse_vllm(line, "vllm_spec", _VLLM_SPEC))
    if "Avg generation throughput:" in line:
        return _checked(_parse_vllm(line, "vllm_stats", _VLLM_STATS))
    if READY_LINE in line:       # the node contract's ready line (specab/vocab/contract.py)
        rec: dict[str, Any] = {"kind": "ready", "ts": None, "rank": None}
        _sgl_prefix(line, rec)
        return rec
    if "max_total_num_tokens=" in line:
        rec = {"kind": "capacity", "ts": None, "rank": None}
        _sgl_prefix(line, rec)
        body = line[line.index("max_total_num_tokens="):]
        rec.update({k: _value(v) for k, v in _CAPACITY.findall(body)})
        return rec
    if ("Load weight" in line or "graph begin" in line or "graph end" in line or "Init torch" in line
            or "KV Cache is" in line or "Memory pool end" in line or "Completed |" in line):
        return _parse_load(line)
    return None


def iter_records(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """Records of every recognised line, with ``line`` (1-based line number); streams."""
    for n, line in enumerate(lines, 1):
        rec = parse_line(line)
        if rec is not None:
            rec["line"] = n
            yield rec


# --------------------------------------------------------------------------------------------------
# summary


@dataclass
class _Mean:
    n: int = 0
    total: float = 0.0

    def add(self, v: Any) -> None:
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            self.n += 1
            self.total += v

    @property
    def mean(self) -> float | None:
        return self.total / self.n if self.n else None


@dataclass
class Summary:
    """Accumulates records (constant memory); ``to_dict`` gives the summary."""
    counts: dict[str, int] = field(default_factory=dict)
    accept_len: _Mean = field(default_factory=_Mean)
    accept_rate: _Mean = field(default_factory=_Mean)
    gen_throughput: _Mean = field(default_factory=_Mean)
    graph_true: int = 0
    graph_false: int = 0
    running_req_max: int | None = None
    prefill_new_tokens: int = 0
    prefill_cached_tokens: int = 0
    first_ts: str | None = None
    last_ts: str | None = None
    ranks: set = field(default_factory=set)
    phases: dict[str, str | None] = field(default_factory=dict)
    ready_ts: str | None = None
    capacity: dict[str, Any] = field(default_factory=dict)
    nccl_env: dict[str, Any] = field(default_factory=dict)
    nccl_conflicts: dict[str, list] = field(default_factory=dict)
    nccl_versions: set = field(default_factory=set)
    vllm_accept_len: _Mean = field(default_factory=_Mean)
    vllm_accepted: int = 0
    vllm_drafted: int = 0
    vllm_gen_throughput: _Mean = field(default_factory=_Mean)
    accept_rate_defs: set = field(default_factory=set)     # engine generations whose definition a line showed
    unreadable: int = 0                                     # lines of a summarised kind that held no number
    unreadable_at: list = field(default_factory=list)       # the first few: "line N (field, ...)"
    out_of_range: dict[str, int] = field(default_factory=dict)     # values left out of the summary, per field
    out_of_range_at: list = field(default_factory=list)     # the first few: "line N: field=value"

    def _screened(self, rec: dict[str, Any]) -> dict[str, Any] | None:
        """The record as summarised: None for a line that could not be read (counted), else without the values
        out of range (counted)."""
        where = f"line {rec['line']}" if "line" in rec else "a line"
        if rec.get("unreadable"):
            self.unreadable += 1
            if len(self.unreadable_at) < 5:
                self.unreadable_at.append(f"{where} ({', '.join(rec['unreadable'])})")
            return None
        if rec.get("out_of_range"):
            for name in rec["out_of_range"]:
                self.out_of_range[name] = self.out_of_range.get(name, 0) + 1
                if len(self.out_of_range_at) < 5:
                    self.out_of_range_at.append(f"{where}: {name}={rec[name]}")
            rec = {k: v for k, v in rec.items() if k not in rec["out_of_range"]}
        return rec

    def add(self, rec: dict[str, Any]) -> None:
        screened = self._screened(rec)
        if screened is None:
            return
        rec = screened
        kind = rec["kind"]
        self.counts[kind] = self.counts.get(kind, 0) + 1
        ts = rec.get("ts")
        if ts:
            if self.first_ts is None:
                self.first_ts = ts
            self.last_ts = ts
        if rec.get("rank"):
            self.ranks.add(rec["rank"])
        if kind == "decode":
            self.accept_len.add(rec.get("accept_len"))
            self.accept_rate.add(rec.get("accept_rate"))
            if rec.get("accept_rate_def"):
                self.accept_rate_defs.add(rec["accept_rate_def"])
            self.gen_throughput.add(rec.get("gen_throughput"))
            g = rec.get("cuda_graph")
            if g is True:
                self.graph_true += 1
            elif g is False:
                self.graph_false += 1
            r = rec.get("running_req")
            if isinstance(r, int) and (self.running_req_max is None or r > self.running_req_max):
                self.running_req_max = r
        elif kind == "prefill":
            self.prefill_new_tokens += rec.get("new_token") or 0
            self.prefill_cached_tokens += rec.get("cached_token") or 0
        elif kind == "load":
            self.phases.setdefault(rec["phase"] + ("_" + rec["graph"] if "graph" in rec else ""), ts)
        elif kind == "ready" and self.ready_ts is None:
            self.ready_ts = ts
        elif kind == "capacity":
            self.capacity = {k: v for k, v in rec.items() if k not in ("kind", "ts", "rank", "line")}
        elif kind == "nccl_env":
            var, val = rec["var"], rec["value"]
            if var in self.nccl_env and self.nccl_env[var] != val:
                seen = self.nccl_conflicts.setdefault(var, [self.nccl_env[var]])
                if val not in seen:
                    seen.append(val)
            else:
                self.nccl_env[var] = val
        elif kind == "nccl_version":
            self.nccl_versions.add(rec["version"])
        elif kind == "vllm_spec":
            self.vllm_accept_len.add(rec.get("mean_accept_len"))
            self.vllm_accepted += rec.get("accepted_tokens") or 0
            self.vllm_drafted += rec.get("drafted_tokens") or 0
        elif kind == "vllm_stats":
            self.vllm_gen_throughput.add(rec.get("gen_throughput"))

    def to_dict(self) -> dict[str, Any]:
        graphed = self.graph_true + self.graph_false
        out: dict[str, Any] = {
            "counts": dict(sorted(self.counts.items())),
            "decode_lines": self.counts.get("decode", 0),
            "prefill_lines": self.counts.get("prefill", 0),
            "accept_len_mean": self.accept_len.mean,
            "accept_len_lines": self.accept_len.n,
            "accept_rate_mean": self.accept_rate.mean,
            # which accept-rate definition the lines used, when they said (0.5.23: (tau-1)/K; else unknown)
            "accept_rate_def": (next(iter(self.accept_rate_defs)) if len(self.accept_rate_defs) == 1
                                else sorted(self.accept_rate_defs) or None),
            "gen_throughput_mean": self.gen_throughput.mean,
            "cuda_graph_true": self.graph_true,
            "cuda_graph_false": self.graph_false,
            "cuda_graph_share": self.graph_true / graphed if graphed else None,
            "running_req_max": self.running_req_max,
            "prefill_new_tokens": self.prefill_new_tokens,
            "prefill_cached_tokens": self.prefill_cached_tokens,
            "first_ts": self.first_ts,
            "last_ts": self.last_ts,
            "ranks": sorted(self.ranks),
            "ready_ts": self.ready_ts,
            "load_phases": self.phases,
            "capacity": self.capacity,
            "nccl_env": dict(sorted(self.nccl_env.items())),
            "nccl_env_conflicts": self.nccl_conflicts,
            "nccl_versions": sorted(self.nccl_versions),
            "unreadable_lines": self.unreadable,
            "unreadable_at": list(self.unreadable_at),
            "out_of_range": dict(self.out_of_range),
            "out_of_range_at": list(self.out_of_range_at),
        }
        if self.counts.get("vllm_spec") or self.counts.get("vllm_stats"):
            out["vllm"] = {
                "spec_lines": self.counts.get("vllm_spec", 0),
                "mean_accept_len_mean": self.vllm_accept_len.mean,
                "accepted_tokens": self.vllm_accepted,
                "drafted_tokens": self.vllm_drafted,
                "accept_rate": self.vllm_accepted / self.vllm_drafted if self.vllm_drafted else None,
                "gen_throughput_mean": self.vllm_gen_throughput.mean,
            }
        return out


def summarize(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    s = Summary()
    for rec in records:
        s.add(rec)
    return s.to_dict()


# --------------------------------------------------------------------------------------------------
# fast path: decode statistics of large logs

_FAST_DECODE = re.compile(rb"Decode batch(?: \[\d+\])?[.,] ([^\n]*)")
_FNUM = rb"([0-9]+(?:\.[0-9]+)?)(?![0-9.])"   # always a valid, finite float
_FAST_FIELDS = (
    ("accept_len", re.compile(rb", accept len: " + _FNUM)),
    ("accept_rate", re.compile(rb", accept rate: " + _FNUM)),
    ("gen_throughput", re.compile(rb", gen throughput \(token/s\): " + _FNUM)),
)


def decode_stats(fh: IO[bytes], block_size: int = 8 << 20) -> dict[str, Any]:
    """Decode statistics of a log read as bytes in blocks: the decode part of ``summarize``.

    Same numbers as the per-line parser (tested), several times faster, constant memory: the
    decode lines of a block are found by one regex scan, then each field by one scan over them.
    """
    lines = 0
    sums = {name: [0, 0.0] for name, _ in _FAST_FIELDS}
    g_true = g_false = 0
    carry = b""
    while True:
        block = fh.read(block_size)
        if block:
            data = carry + block
            cut = data.rfind(b"\n") + 1
            data, carry = data[:cut], data[cut:]
        else:
            data, carry = carry, b""
        tails = _FAST_DECODE.findall(data) if data else None
        if tails:
            lines += len(tails)
            # A tail starts after "Decode batch, ": every field but the first follows ", ".
            joined = b", " + b"\n, ".join(tails) + b"\n"
            for name, rx in _FAST_FIELDS:
                values = rx.findall(joined)
                acc = sums[name]
                acc[0] += len(values)
                acc[1] += sum(map(float, values))
            # "cuda graph: True, " (the graph field is never the last one of a decode line)
            g_true += joined.count(b" graph: True, ")
            g_false += joined.count(b" graph: False, ")
        if not block:
            break
    graphed = g_true + g_false

    def mean(name: str) -> float | None:
        n, total = sums[name]
        return total / n if n else None

    return {
        "decode_lines": lines,
        "accept_len_mean": mean("accept_len"),
        "accept_len_lines": sums["accept_len"][0],
        "accept_rate_mean": mean("accept_rate"),
        "gen_throughput_mean": mean("gen_throughput"),
        "cuda_graph_true": g_true,
        "cuda_graph_false": g_false,
        "cuda_graph_share": g_true / graphed if graphed else None,
    }


# --------------------------------------------------------------------------------------------------
# what the analysis reads from a run's server log

_RUN_LOG_HIT = re.compile(r"batch|NCCL INFO|Avg generation throughput:")
RUN_LOG_DECODE_FIELDS = ("accept_len", "cuda_graph", "gen_throughput", "running_req", "queue_req")
_RUN_LOG_WANTED = frozenset(RUN_LOG_DECODE_FIELDS)


def run_log_records(fh: IO[str], block_chars: int = 4 << 20) -> Iterator[dict[str, Any]]:
    """The ``decode``, ``nccl_env`` and ``vllm_stats`` records of a text log, exactly as ``parse_line`` makes them
    for those lines, in file order, with ``raw`` (the line without its newline). Decode records carry only
    RUN_LOG_DECODE_FIELDS (those present). Streams in blocks of whole lines.

    The analysis reads every run's log (a 1,000-run experiment: 1,000 logs): only lines holding
    ``batch``, ``NCCL INFO`` or vLLM's stats are looked at (one regex scan per block finds them), and of a decode
    line only those fields are converted, by the same field splitting as ``parse_line``.
    """
    carry = ""
    while True:
        block = fh.read(block_chars)
        if block:
            data = carry + block
            cut = data.rfind("\n") + 1
            data, carry = data[:cut], data[cut:]
        else:
            data, carry = carry, ""
        pos = 0
        while data:
            hit = _RUN_LOG_HIT.search(data, pos)
            if hit is None:
                break
            start = data.rfind("\n", 0, hit.start()) + 1
            end = data.find("\n", hit.end())
            end = len(data) if end < 0 else end + 1
            pos = end
            line = data[start:end]            # as `for line in fh` yields it: with its newline
            if "batch" in line:
                m = _BATCH.search(line)
                if m:
                    if m.group("kind") == "Decode":
                        rec: dict[str, Any] = {"kind": "decode"}
                        _batch_fields(line[m.end():].rstrip().rstrip(","), rec, _RUN_LOG_WANTED)
                        rec["raw"] = line.rstrip("\n")
                        yield rec
                    continue
            if "NCCL INFO" in line:
                rec2 = _parse_nccl(line)
                if rec2 is not None and rec2["kind"] == "nccl_env":
                    rec2["raw"] = line.rstrip("\n")
                    yield rec2
            elif "Avg generation throughput:" in line:       # vLLM's stats: its running and waiting requests
                yield _parse_vllm(line, "vllm_stats", _VLLM_STATS)
        if not block:
            break


# --------------------------------------------------------------------------------------------------
# CLI

_TEXT_SKIP = ("kind", "ts", "rank", "line")


def _text_record(rec: dict[str, Any]) -> str:
    head = "%6d %-19s %-8s %-10s" % (rec.get("line", 0), rec.get("ts") or "-", rec.get("rank") or "-",
                                      rec["kind"])
    return head + " " + " ".join("%s=%s" % (k, v) for k, v in rec.items() if k not in _TEXT_SKIP)


def _text_summary(s: dict[str, Any]) -> str:
    def fmt(v: Any) -> str:
        return "%.3f" % v if isinstance(v, float) else str(v)

    rows = ["summary:"]
    for k, v in s.items():
        if isinstance(v, dict):
            if v:
                rows.append("  %s:" % k)
                rows.extend("    %s: %s" % (kk, fmt(vv)) for kk, vv in v.items())
        else:
            rows.append("  %s: %s" % (k, fmt(v)))
    return "\n".join(rows)


def screening_notes(summary: dict[str, Any]) -> list[str]:
    """What the summary left out, in words: the lines it could not read and the values out of range."""
    notes = []
    if summary.get("unreadable_lines"):
        notes.append("%d line(s) of a summarised kind could not be read and are left out (%s)"
                     % (summary["unreadable_lines"], "; ".join(summary.get("unreadable_at") or [])))
    if summary.get("out_of_range"):
        notes.append("%d value(s) out of range are left out of the means (%s)"
                     % (sum(summary["out_of_range"].values()), "; ".join(summary.get("out_of_range_at") or [])))
    return notes


def cmd_parse_log(ns: argparse.Namespace, out: IO[str] | None = None) -> int:
    """The ``parse-log`` subcommand; ``out`` defaults to stdout (the driver's CLI passes its own)."""
    path = ns.log
    out = out or sys.stdout
    try:
        if ns.summary_only and ns.fast:
            with open(path, "rb") as fb:
                summary = decode_stats(fb)
            recognised = bool(summary.get("decode_lines"))
        else:
            def shown(records: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
                for rec in records:
                    if not ns.summary_only:
                        out.write((json.dumps(rec) if ns.format == "json" else _text_record(rec)) + "\n")
                    yield rec
            # lines end at "\n" only: tqdm bars redraw with bare "\r" inside one line of the log (the real
            # 0.5.17's graph capture), and the records' line numbers are the file's
            with open(path, encoding="utf-8", errors="replace", newline="\n") as fh:
                summary = summarize(shown(iter_records(fh)))
            recognised = bool(summary["counts"])
    except BrokenPipeError:     # the reader of `out` went away (`parse-log LOG | head`): not the log's fault
        raise
    except OSError as exc:
        print("parse-log: cannot read %s: %s" % (path, exc.strerror or exc), file=sys.stderr)
        return 1
    if not recognised:      # an empty, binary or foreign file: the hint, not a summary of nothing
        print("parse-log: no line of %s was recognised (empty, binary, or not an SGLang/vLLM server log?). "
              "Pass the server.log of a run (SGLang at --log-level info)." % path, file=sys.stderr)
        return 1
    if ns.format == "json":
        out.write(json.dumps({"kind": "summary", **summary}) + "\n")
    else:
        out.write(_text_summary(summary) + "\n")
    for note in screening_notes(summary):
        print("parse-log: %s" % note, file=sys.stderr)
    if not summary.get("decode_lines") and not summary.get("counts", {}).get("vllm_spec"):
        print("parse-log: no Decode batch or SpecDecoding lines in %s (is it a server log at "
              "--log-level info?)" % path, file=sys.stderr)
    return 0


def register(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "parse-log", help="parse an SGLang/vLLM server log: one record per line + summary",
        description="Reads SGLang 0.4.x/0.5.x Prefill/Decode batch lines, load phases, the ready line, "
                    "NCCL env echo lines and vLLM SpecDecoding lines. Prints one record per recognised "
                    "line, then a summary (mean accept length, mean gen throughput, CUDA-graph share).")
    p.add_argument("log", help="server log file")
    p.add_argument("--format", choices=["json", "text"], default="text",
                   help="json: one JSON object per line, the summary last (kind=summary)")
    p.add_argument("--summary-only", action="store_true", help="print only the summary")
    p.add_argument("--fast", action="store_true",
                   help="with --summary-only: decode statistics only, from a block scan (large logs)")
    p.set_defaults(func=cmd_parse_log)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specab.analysis.evidence.logparse")
    sub = ap.add_subparsers(dest="command")
    register(sub)
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] != "parse-log":
        args = ["parse-log"] + args
    ns = ap.parse_args(args)
    try:
        return ns.func(ns)
    except BrokenPipeError:     # `... | head`: end quietly with the status of a process SIGPIPE ended (128 + 13)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    raise SystemExit(main())
