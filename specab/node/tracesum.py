#!/usr/bin/env python3
"""Summarise a torch-profiler trace (``*-TP-0.trace.json.gz``) with flat memory (stdlib only).

Real SGLang traces of 20 steps are 50-60 MB and millions of events (the facts of real SGLang 0.5.17 on an H200):
never load them whole. This reads the gzip stream in chunks, decodes one ``traceEvents`` object at a time and
keeps only per-(span, category) counts and total durations. Span names have their numbers replaced by N
(``step[VERIFY bs=4]`` -> ``step[VERIFY bs=N]``), as in span_summary.txt. Usage:

    python3 tracesum.py TRACE.json.gz [--out summary.json]
"""
from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from typing import IO, Any, Dict, Iterator, Optional

CHUNK = 1 << 20
_NUM = re.compile(r"=\d+")
KEY = '"traceEvents"'


class TraceError(ValueError):
    """The file is not a Chrome/torch trace JSON with a traceEvents array."""


def iter_events(fh: IO[str], chunk: int = CHUNK) -> Iterator[Dict[str, Any]]:
    """Yield each object of the top-level ``traceEvents`` array, reading ``chunk`` characters at a time."""
    dec = json.JSONDecoder()
    buf = ""
    # find the array
    while True:
        i = buf.find(KEY)
        if i >= 0:
            j = buf.find("[", i + len(KEY))
            if j >= 0:
                buf = buf[j + 1:]
                break
        more = fh.read(chunk)
        if not more:
            raise TraceError("no traceEvents array in the trace")
        buf = buf[-len(KEY):] + more if i < 0 else buf + more
    pos = 0
    eof = False
    while True:
        while pos < len(buf) and buf[pos] in " \t\r\n,":
            pos += 1
        if pos < len(buf) and buf[pos] == "]":
            return
        if pos < len(buf):
            try:
                obj, end = dec.raw_decode(buf, pos)
            except json.JSONDecodeError:
                if eof:
                    raise TraceError("the trace ends inside traceEvents (cut off?)") from None
            else:
                pos = end
                if isinstance(obj, dict):
                    yield obj
                continue
        elif eof:
            raise TraceError("the trace ends inside traceEvents (cut off?)")
        more = fh.read(chunk)
        eof = not more
        buf = buf[pos:] + more
        pos = 0


def summarise(path: str) -> Dict[str, Any]:
    """{events, spans: [{name, cat, count, total_ms}] (by total desc)} of a gzipped (or plain) trace file."""
    opener = gzip.open if path.endswith(".gz") else open
    agg = {}  # type: Dict[Tuple[str, str], list]
    n = 0
    with opener(path, "rt", encoding="utf-8") as fh:  # type: ignore[operator]
        for ev in iter_events(fh):
            n += 1
            if ev.get("ph") != "X" or "name" not in ev:
                continue
            key = (_NUM.sub("=N", str(ev["name"])), str(ev.get("cat", "")))
            slot = agg.get(key)
            if slot is None:
                slot = agg[key] = [0, 0.0]
            slot[0] += 1
            slot[1] += float(ev.get("dur") or 0.0) / 1000.0
    spans = [{"name": k[0], "cat": k[1], "count": v[0], "total_ms": round(v[1], 3)} for k, v in agg.items()]
    spans.sort(key=lambda s: -s["total_ms"])
    return {"events": n, "spans": spans}


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(prog="tracesum", description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--out", default=None)
    ns = ap.parse_args(argv)
    try:
        res = summarise(ns.trace)
    except (OSError, TraceError, EOFError) as exc:
        print("tracesum: %s: %s" % (ns.trace, exc), file=sys.stderr)
        return 1
    text = json.dumps(res, indent=2)
    if ns.out:
        with open(ns.out, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
