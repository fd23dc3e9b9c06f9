"""The analysis's log reader (`logparse.run_log_records`, used for every run's server.log by the report)
gives exactly the records the per-line parser (`parse_line`) gives for the lines it keeps.

The reader skips every line without ``batch`` or ``NCCL INFO`` and converts only four fields of a
decode line; these tests feed it lines built to trip a shortcut: repeated and normalised keys, values
with ``%``, non-numeric values, lines that mention ``batch`` without being batch lines, NCCL lines
inside batch lines, CRLF and CR line ends, a last line without a newline, lines longer than a
block, and a block size so small that lines straddle every block boundary.
"""
from __future__ import annotations

import io
import random
import statistics

import pytest

from specab.analysis.evidence import model as analysis
from specab.analysis.evidence import logparse

DECODE_059 = ("[2026-01-05 10:00:{s:02d} TP0] Decode batch [{it}], #running-req: {run}, #token: {tok}, "
              "token usage: 0.01, accept len: {acc}, accept rate: 0.61, cuda graph: {g}, "
              "gen throughput (token/s): {gen}, #queue-req: 0")
DECODE_052 = ("[2026-01-05 10:00:{s:02d} DP0 TP0] Decode batch. #running-req: {run}, #token: {tok}, token usage: 0.01, "
              "accept len: {acc}, accept rate: 0.61, cuda graph: {g}, gen throughput (token/s): {gen}, #queue-req: 0,")
ODD = [
    # repeated key: the later value wins in parse_line
    "[2026-01-05 10:00:00 TP0] Decode batch, #running-req: 1, accept len: 2.00, accept len: 3.50, "
    "cuda graph: True, gen throughput (token/s): 10.00, gen throughput (token/s): 12.00",
    # keys that normalise onto the ones the analysis reads
    "[2026-01-05 10:00:00 TP0] Decode batch, Accept Len: 4.25, running req: 2, gen throughput: 33.5, cuda graph: False",
    # a % value renames the key (accept_len_pct): not an accept length
    "[2026-01-05 10:00:00 TP0] Decode batch, #running-req: 1, accept len: 55%, cuda graph: True, "
    "gen throughput (token/s): 20.00",
    # non-numeric and float running-req
    "[2026-01-05 10:00:00 TP0] Decode batch, #running-req: 1.5, cuda graph: maybe, gen throughput (token/s): 9.00",
    "[2026-01-05 10:00:00 TP0] Decode batch, #running-req: 0, cuda graph: True, gen throughput (token/s): 0.00",
    # the graph field last (no trailing comma) and a cpu graph
    "[2026-01-05 10:00:00 TP0] Decode batch, #running-req: 3, gen throughput (token/s): 90.00, cpu graph: True",
    # a prefill line and lines that only mention batch
    "[2026-01-05 10:00:00 TP0] Prefill batch, #new-seq: 1, #new-token: 28, #running-req: 0, #queue-req: 0",
    "[2026-01-05 10:00:00 TP0] max_prefill_tokens=16384, chunked_prefill_size=8192, batch sizes: 1 2 4",
    "[2026-01-05 10:00:00 TP0] Capture cuda graph bs [1, 2, 4, 8], batch of decode steps",
    # a line with both: the batch record wins, as in parse_line
    "[2026-01-05 10:00:00 TP0] Decode batch, #running-req: 1, note: NCCL INFO NCCL_PROTO set by environment to LL",
    # NCCL lines: integer with a trailing period, repeated variable (first wins), version, invalid value
    "node:1:1 [0] NCCL INFO NCCL_MAX_NCHANNELS set by environment to 16.",
    "node:1:2 [1] NCCL INFO NCCL_MAX_NCHANNELS set by environment to 32.",
    "node:1:1 [0] NCCL INFO NCCL_PROTO set by environment to LL   ",
    "node:1:1 [0] NCCL INFO NCCL version 2.28.9+cuda13.0",
    "node:1:1 [0] NCCL INFO Invalid value x for NCCL_ALGO, using default 0",
    "NCCL_BUFFSIZE set by environment to 16777216.",
    # unrelated lines
    "[2026-01-05 10:00:00] The server is fired up and ready to roll!",
    "INFO:     127.0.0.1:53312 - \"POST /generate HTTP/1.1\" 200 OK",
    "x" * 300 + " Decode batch, #running-req: 1, accept len: 1.25, cuda graph: False, gen throughput (token/s): 7.5",
]


def _log(rng: random.Random, n: int) -> str:
    lines = []
    for i in range(n):
        if rng.random() < 0.15:
            lines.append(rng.choice(ODD))
            continue
        fmt = DECODE_059 if rng.random() < 0.5 else DECODE_052
        lines.append(fmt.format(s=i % 60, it=40 * i, run=rng.choice([0, 1, 1, 2, 8]), tok=100 + i,
                                acc=f"{rng.uniform(1, 4):.2f}", g=rng.choice(["True", "True", "False"]),
                                gen=f"{rng.uniform(0, 200):.2f}"))
    ends = [rng.choice(["\n", "\n", "\n", "\r\n", "\r"]) for _ in lines]
    return "".join(line + end for line, end in zip(lines, ends))


def _reference(text: str) -> list[dict]:
    """What parse_line makes of the lines (text mode, universal newlines), reduced to what the reader keeps."""
    out = []
    for line in io.StringIO(text, newline=None):
        rec = logparse.parse_line(line)
        if rec is None or rec["kind"] not in ("decode", "nccl_env"):
            continue
        if rec["kind"] == "decode":
            rec = {"kind": "decode", **{k: rec[k] for k in logparse.RUN_LOG_DECODE_FIELDS if k in rec}}
        rec["raw"] = line.rstrip("\n")
        out.append(rec)
    return out


def _fast(text: str, block_chars: int) -> list[dict]:
    return list(logparse.run_log_records(io.StringIO(text, newline=None), block_chars=block_chars))


def _norm(recs: list[dict]) -> list[list]:
    """Records with their value types (True is not 1, 2 is not 2.0) so the comparison is exact."""
    return [sorted((k, type(v).__name__, v) for k, v in r.items()) for r in recs]


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("block_chars", [7, 61, 4096, 4 << 20])
def test_reader_gives_the_per_line_parsers_records(seed, block_chars):
    text = _log(random.Random(seed), 400)
    ref = _reference(text)
    assert len(ref) > 300 and any(r["kind"] == "nccl_env" for r in ref)
    assert _norm(_fast(text, block_chars)) == _norm(ref)


def test_last_line_without_newline_and_empty_log():
    text = "node:1:1 [0] NCCL INFO NCCL_ALGO set by environment to Ring\n" + DECODE_059.format(
        s=1, it=40, run=1, tok=5, acc="2.00", g="True", gen="50.00")
    assert _norm(_fast(text, 16)) == _norm(_reference(text)) and len(_reference(text)) == 2
    assert _fast("", 16) == []


def test_log_stats_equal_the_per_line_parsers(tmp_path):
    """parse_server_log (the analysis's LogStats of a run) from the reader equals LogStats built from
    parse_line's records of every line, as the analysis did before."""
    rng = random.Random(9)
    for k in range(5):
        p = tmp_path / f"server{k}.log"
        p.write_bytes(_log(rng, 300).encode("utf-8") + b"caf\xff Decode batch, #running-req: 1, accept len: 2.00\n")
        got = analysis.parse_server_log(p)
        nccl: dict[str, str] = {}
        decode = []
        with open(p, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                rec = logparse.parse_line(line)
                if rec is None:
                    continue
                rec["raw"] = line.rstrip("\n")
                if rec["kind"] == "nccl_env":
                    nccl.setdefault(rec["var"], str(rec["value"]).rstrip("."))
                elif rec["kind"] == "decode":
                    decode.append(rec)
        want = analysis.log_stats_from_records(decode, nccl)
        assert got == want
        per_req = [float(r["gen_throughput"]) / r["running_req"] for r in decode
                   if r.get("gen_throughput") is not None and isinstance(r.get("running_req"), int)
                   and r["running_req"] > 0]
        assert got.gen_tok_s_per_req_median == statistics.median(per_req)
        assert got.no_graph_example and "cuda graph: False" in got.no_graph_example
        assert got.nccl_env["NCCL_MAX_NCHANNELS"] in ("16", "32") and "NCCL_BUFFSIZE" not in got.nccl_env
