#!/usr/bin/env python3
"""Streaming benchmark client for SGLang-compatible servers (stdlib only).

Runs on the GPU node next to the server, so it imports nothing outside the Python standard
library and keeps to Python 3.8 syntax. Usage (the contract in docs/architecture.md):

    python3 loadgen.py --url http://127.0.0.1:30000 --api generate --num-requests 8 --warmup 2 \
        --input-len 128 --output-len 256 --ignore-eos true --concurrency 1 --request-rate 0 --client-procs auto \
        --seed 1 --timeout 600 --out bench.jsonl --summary bench_summary.json

It writes one bench.jsonl line per request as soon as the request finishes (warm-up requests are
marked ``"warmup": true``), then the summary JSON. With ``--phase-metrics FILE`` it scrapes the server's
``/metrics`` just before the first and just after the last measured request and writes the deltas of the
per-phase timing counters there (phasemetrics.py; ``"available": false`` with the reason when the server
has no metrics); a failed scrape never fails the benchmark. Exit 0 when every measured request succeeded,
1 otherwise (the records written so far are kept), 2 on bad usage.

Token accounting per streamed chunk (one SSE ``data:`` event):
  * ``generate``: ``meta_info.completion_tokens`` (cumulative) when present, else ``output_ids``
    (cumulative or incremental, detected), else one token per non-empty chunk (flagged inexact).
  * ``completions`` / ``chat``: ``usage.completion_tokens`` (asked per chunk with
    ``continuous_usage_stats``), else the chunk's ``token_ids`` (asked with ``return_token_ids``: SGLang 0.5.17,
    vLLM 0.32), else one token per chunk with text, and the final usage chunk (``include_usage``) gives the exact
    total.

Every record keeps its output for the output-validity check (the speculative arm against its baseline, request by
request): ``output_ids`` where the server sent token ids (``generate``'s ``output_ids``, the OpenAI chunks'
``token_ids``), else ``output_text``.

Known-truth models (``driver.py known-truth build``): when the served target's folder (``model_path`` in the
run's ``args.json``, next to ``--out``) holds ``known_truth.json``, prompts are seeded token ids in
``[first, vocab_size)`` (``generate``: ``input_ids``; ``completions``: a token-id ``prompt``; ``chat`` is refused),
every record adds ``prompt_last_token`` and ``output_ids``, and the summary's ``known_truth`` carries the target's
and the draft's files (the draft's agreement set as a bitmap) so the analysis can recompute every cycle; a
``known_truth.json`` that cannot be used, or a speculative run whose draft has none, is named in the summary's
``known_truth_problems``. On vLLM,
whose responses carry no per-request cycle count, each request's ``spec_verify_ct`` is the delta of
``vllm:spec_decode_num_drafts`` around it (concurrency 1 only).

Client processes (``--client-procs``, bench.client_procs): the concurrency slots are threads of this process, or,
divided among worker processes (``auto``: one per SLOTS_PER_PROC slots, at most one per CPU), threads of those; this
process then hands out the prompts in order and writes the records. The summary's ``client_cpu_s`` is every client
process's CPU over the measured requests, ``client_cpu_max_proc_s`` the busiest one's (a process at a whole core is
the bottleneck however many there are), ``client_cpu_per_proc_s`` each one's (this process first), ``client_procs``
how many worked.

Under speculative decoding one chunk carries several tokens (one verify step), so per-chunk gaps
are not per-token latencies; ``decode_tok_s`` and ``tpot_s`` are computed from token counts, and the summary's
``latency`` has the inter-token latency both per chunk (``itl_s``) and per token (``itl_token_s``: a chunk's gap
spread over its tokens). Under an open load (``--request-rate``) each measured record has its scheduled arrival
(``arrival_s``, from the measurement's start) and how long it waited after it for a free slot (``arrival_wait_s``).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.client
import json
import os
import queue
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, fields
from multiprocessing import connection as mp_connection
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple
from urllib.parse import urlsplit

from specab.node import cli, osutil, phasemetrics
from specab.vocab import contract, dataset, engines

APIS = ("generate", "completions", "chat")
# the experiment's bench: keys the client reads (a queue entry's bench mapping, resolved on the controller)
BENCH_KEYS = ("api", "num_requests", "warmup_requests", "input_len", "output_len", "concurrency", "seed", "timeout_s",
              "ignore_eos", "request_rate", "client_procs", "temperature", "top_p")
# A request was delivered in bursts (`buffered`) when more than BUFFERED_SHARE of its tokens after the first came
# in chunks that followed the previous one within 1/BUFFERED_RATE_RATIO of the request's own time per token, with
# at least BUFFERED_MIN_TOKENS of them: a CPU-starved API server forwarding what the engine made long before (seen
# on a real vLLM on 2 loaded cores: 128 tokens within 1.5 ms after a 0.39 s wait, or the second half of a request
# at once). Its chunk times say nothing about the engine's decode pace: no decode_tok_s/tpot_s for it. Scale-free
# (a time-scaled simulator keeps it); steady streaming, a long prefill or several tokens per chunk (speculation)
# stay far from it.
BUFFERED_RATE_RATIO = 5.0
BUFFERED_SHARE = 0.5
BUFFERED_RUN = 4
BUFFERED_INFLATION = 2.0
BUFFERED_MAX_GAP_S = 0.001     # and within 1 ms: no engine step is that short (a long prefill inflates the per-token time)
BUFFERED_MIN_TOKENS = 16
# bench.client_procs (contract.client_procs): auto is one process per SLOTS_PER_PROC slots, at most one per CPU
AUTO = contract.CLIENT_PROCS_AUTO
SLOTS_PER_PROC = contract.CLIENT_SLOTS_PER_PROC
API_PATHS = {"generate": "/generate", "completions": "/v1/completions", "chat": "/v1/chat/completions"}

# A fixed vocabulary: prompts are seeded word sequences, identical on every node and arm.
_WORDS = (
    "the of and to in is was for on that with as by at from his it an were are which this be "
    "or has had not have first one their its new after but who they two her she been other "
    "when there all during into school time may years more most only over city some world would "
    "where later up such used many can state about national out known university united then "
    "made also under between system through three river people before north could game second "
    "south work while four best part since early number year well member house series film "
    "around season family group team both called life government following area war history "
    "several until county high water music each album however team public island based center "
    "because large small long short light dark open close river mountain valley ocean forest "
    "garden market station bridge library museum theater village harbor castle temple tower "
    "question answer problem reason result example method value model engine server request "
    "token speed memory signal energy motion pressure number letter picture story journey"
).split()


class UsageError(Exception):
    """Bad command-line values (exit code 2)."""


# ----------------------------------------------------------------------------------------------
# prompts


def make_prompt(seed: int, kind: str, index: int, input_len: int) -> str:
    """A deterministic prompt of ``input_len`` words for request ``index`` of ``kind``."""
    rng = random.Random("specab:%d:%s:%d" % (seed, kind, index))
    return " ".join(rng.choice(_WORDS) for _ in range(input_len))


def make_prompts(seed: int, kind: str, count: int, input_len: int) -> List[str]:
    return [make_prompt(seed, kind, i, input_len) for i in range(count)]


def make_token_prompts(seed: int, kind: str, count: int, input_len: int, first: int, vocab: int) -> List[List[int]]:
    """Deterministic token-id prompts over [first, vocab) (known-truth models: no special token)."""
    rngs = (random.Random("specab:%d:%s:%d:ids" % (seed, kind, index)) for index in range(count))
    return [[rng.randrange(first, vocab) for _ in range(input_len)] for rng in rngs]


def dataset_hash(prompts: List[Any]) -> str:
    h = hashlib.sha256()
    for p in prompts:
        h.update((p if isinstance(p, str) else json.dumps(p)).encode("utf-8"))
        h.update(b"\0")
    return "sha256:" + h.hexdigest()


KNOWN_TRUTH_FILE = "known_truth.json"
_KT_WORD = re.compile(r"(?<![^\s])w(\d+)(?![^\s])")


def _read_known_truth(folder: Any, problems: List[str]) -> Optional[Dict[str, Any]]:
    """A model folder's known_truth.json; None when the folder has none. A file that is there but cannot be read or
    does not describe a known-truth model adds to ``problems`` (the file, what is wrong): the known-truth check of
    the run must not vanish without a word."""
    if not isinstance(folder, str) or not folder:
        return None
    path = os.path.join(folder, KNOWN_TRUTH_FILE)
    if not os.path.lexists(path):
        return None
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
        doc = json.loads(raw.decode("utf-8"))
    except (OSError, ValueError) as exc:
        problems.append("%s: cannot be read as JSON (%s)" % (path, exc))
        return None
    if not isinstance(doc, dict) or doc.get("rule") != "t+1":
        problems.append("%s: not a known-truth model's file (%s)" % (
            path, "rule %r, not 't+1'" % doc.get("rule") if isinstance(doc, dict) else "not a JSON object"))
        return None
    if not all(isinstance(doc.get(k), int) for k in ("vocab_size", "first")):
        problems.append("%s: needs integer 'vocab_size' and 'first'" % path)
        return None
    doc["path"] = path
    doc["sha256"] = "sha256:" + hashlib.sha256(raw).hexdigest()
    return doc


def known_truth_of(run_dir: str) -> Tuple[Optional[Dict[str, Any]], List[str]]:
    """The served models' known truth, found through the run's args.json: {"target": doc, "draft": doc or None}
    (a draft's ``agree`` list becomes ``agree_bitmap_b64``), None when the target carries no known_truth.json; and
    what keeps it from being checked: a known_truth.json of the target or the draft that cannot be used, or a
    speculative run on a known-truth target whose draft has none (each names the file)."""
    problems = []  # type: List[str]
    args = osutil.json_or_none(os.path.join(run_dir, "args.json"))
    if not isinstance(args, dict):
        return None, problems
    target = _read_known_truth(args.get("model_path") or args.get("model"), problems)
    if target is None:
        return None, problems
    view = engines.speculative_view(args)
    draft = _read_known_truth(view.draft_model, problems) if view.draft_model else None
    if view.algorithm and draft is None and not problems:
        problems.append(("%s: no such file: the run speculates (%s) on a known-truth target, but its draft has no "
                         "truth, so its cycles cannot be checked" % (
                             os.path.join(view.draft_model, KNOWN_TRUTH_FILE), view.algorithm)) if view.draft_model
                        else ("the run speculates (%s) on a known-truth target (%s) without a draft model: no truth "
                              "for its cycles" % (view.algorithm, target["path"])))
    if draft is not None and isinstance(draft.get("agree"), list):
        bits = bytearray((int(draft["vocab_size"]) + 7) // 8)
        for t in draft.pop("agree"):
            bits[int(t) >> 3] |= 1 << (int(t) & 7)
        draft["agree_bitmap_b64"] = base64.b64encode(bytes(bits)).decode("ascii")
    return {"target": target, "draft": draft, "steps": view.steps, "algorithm": view.algorithm}, problems


# ----------------------------------------------------------------------------------------------
# request bodies and chunk decoding


def build_body(api: str, prompt: Any, output_len: int, model: Optional[str], ignore_eos: bool,
               temperature: float = 0.0, top_p: float = 1.0) -> Dict[str, Any]:
    """A streaming request; ``prompt`` is text, a list of token ids (generate: input_ids; completions: prompt) or a
    dataset record ({"prompt": text} or, chat only, {"messages": [...]}, sent as they are so the engine applies the
    model's chat template). ``ignore_eos``: every answer runs to ``output_len`` (True) or ends at the model's end;
    ``temperature`` and ``top_p``: the sampling (temperature 0: greedy)."""
    if isinstance(prompt, dict):
        if "messages" in prompt and api != "chat":
            raise UsageError("a dataset record with \"messages\" needs --api chat (got %s)" % api)
        prompt = prompt["messages"] if "messages" in prompt else prompt["prompt"]
    if api == "generate":
        return {
            ("input_ids" if isinstance(prompt, list) else "text"): prompt,
            "sampling_params": {"max_new_tokens": output_len, "temperature": temperature, "top_p": top_p,
                                "ignore_eos": ignore_eos},
            "stream": True,
        }
    body = {
        "model": model or "default",
        "max_tokens": output_len,
        "temperature": temperature,
        "top_p": top_p,
        "ignore_eos": ignore_eos,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "return_token_ids": True,       # the output's ids, for the output-validity check
    }  # type: Dict[str, Any]
    if api == "completions":
        body["prompt"] = prompt
    elif isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
        body["messages"] = prompt
    else:
        body["messages"] = [{"role": "user", "content": prompt}]
    return body


class ChunkCounter:
    """Turns successive SSE event payloads into per-chunk new-token counts.

    ``feed`` returns the number of new tokens the event carries; ``exact`` stays True as long as
    every count came from a server-reported token count (not a one-token-per-chunk guess).
    """

    def __init__(self, api: str) -> None:
        self.api = api
        self.total = 0  # tokens counted so far
        self.exact = True
        self.source = None  # type: Optional[str]
        self.reported_total = None  # type: Optional[int]  # server's completion_tokens, last seen
        self.prompt_tokens = None  # type: Optional[int]
        self.meta = {}  # type: Dict[str, Any]  # last meta_info (generate)
        self.text = ""  # the output text so far (generate: SGLang's cumulative text; OpenAI: the deltas joined)
        self.ids = []  # type: List[int]  # generate's output_ids so far, when the server sends them
        self._ids_seen = None  # type: Optional[List[int]]
        self._ids_mode = None  # type: Optional[bool]  # True: cumulative lists

    def _add_text(self, text: str, cumulative: bool) -> None:
        if text:
            self.text = text if cumulative else self.text + text

    def _add_ids(self, ids: List[int]) -> None:
        prev = self._ids_seen
        if self._ids_mode is None and prev is not None:
            # Cumulative lists start with the previous list; incremental ones do not (as a rule).
            self._ids_mode = len(ids) >= len(prev) and ids[: len(prev)] == prev
        self._ids_seen = ids
        self.ids = list(ids) if self._ids_mode in (None, True) and len(ids) >= len(self.ids) else self.ids + list(ids)

    def _set_source(self, source: str) -> None:
        if self.source is None:
            self.source = source
        elif self.source != source:
            self.source = "mixed"

    def feed(self, event: Dict[str, Any]) -> int:
        if self.api == "generate":
            return self._feed_generate(event)
        return self._feed_openai(event)

    def _from_cumulative(self, completion_tokens: int, source: str) -> int:
        self._set_source(source)
        self.reported_total = completion_tokens
        new = max(0, completion_tokens - self.total)
        self.total += new
        return new

    def _feed_generate(self, event: Dict[str, Any]) -> int:
        if isinstance(event.get("text"), str):
            self._add_text(event["text"], True)
        if isinstance(event.get("output_ids"), list):
            self._add_ids(event["output_ids"])
        meta = event.get("meta_info") or {}
        if meta:
            # spec fields come in the final chunk only (0.5.23; engines-2026.md A4): keep every spec_* seen
            spec = {k: v for k, v in self.meta.items() if k.startswith("spec_")}
            self.meta = {**spec, **meta}
            if meta.get("prompt_tokens") is not None:
                self.prompt_tokens = int(meta["prompt_tokens"])
        ct = meta.get("completion_tokens")
        if isinstance(ct, int):
            return self._from_cumulative(ct, "completion_tokens")
        ids = event.get("output_ids")
        if isinstance(ids, list):
            self._set_source("output_ids")
            new = max(0, len(ids) - self.total) if self._ids_mode else len(ids)
            self.total += new
            return new
        return self._guess_one(bool(event.get("text")))

    def _guess_one(self, has_text: bool) -> int:
        """No token count in the event: one token per chunk with text (flagged inexact)."""
        if not has_text:
            return 0
        self._set_source("chunks")
        self.exact = False
        self.total += 1
        return 1

    def _feed_openai(self, event: Dict[str, Any]) -> int:
        text = ""
        ids = None  # type: Optional[List[int]]
        for choice in event.get("choices") or []:
            if self.api == "chat":
                text += (choice.get("delta") or {}).get("content") or ""
            else:
                text += choice.get("text") or ""
            if isinstance(choice.get("token_ids"), list):       # return_token_ids: this chunk's new ids
                ids = (ids or []) + [int(t) for t in choice["token_ids"]]
        self._add_text(text, False)
        if ids is not None:
            self.ids.extend(ids)
        usage = event.get("usage")
        if isinstance(usage, dict):
            if usage.get("prompt_tokens") is not None:
                self.prompt_tokens = int(usage["prompt_tokens"])
            ct = usage.get("completion_tokens")
            if isinstance(ct, int):
                if self.source in ("chunks", "token_ids"):
                    # The final include_usage chunk after per-chunk counts (guessed, or the chunks' ids): the
                    # total is the server's now.
                    self.reported_total = ct
                    return 0
                return self._from_cumulative(ct, "usage")
        if ids:
            self._set_source("token_ids")
            self.total += len(ids)
            return len(ids)
        return self._guess_one(bool(text))


# ----------------------------------------------------------------------------------------------
# one streamed request


@dataclass
class Target:
    host: str
    port: int
    scheme: str = "http"
    base_path: str = ""

    @classmethod
    def from_url(cls, url: str) -> "Target":
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UsageError("--url %r: expected http://HOST:PORT" % url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return cls(parts.hostname, port, parts.scheme, parts.path.rstrip("/"))

    def connect(self, timeout: float) -> http.client.HTTPConnection:
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)


class RequestFailed(Exception):
    pass


def _sse_events(resp: http.client.HTTPResponse, deadline: float, sock_timeout: Callable[[float], None]
                ) -> Iterator[Tuple[float, Optional[Dict[str, Any]]]]:
    """Yield (arrival perf_counter, payload) per SSE ``data:`` event; payload None for [DONE]."""
    buf = b""
    while True:
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            raise RequestFailed("timeout: stream not finished within the request timeout")
        sock_timeout(remaining)
        data = resp.read1(65536)
        now = time.perf_counter()
        if not data:
            if buf.strip():
                raise RequestFailed("stream ended inside an event: %r" % buf[:200])
            return
        buf += data
        while True:
            nl = buf.find(b"\n")
            if nl < 0:
                break
            line = buf[:nl].rstrip(b"\r")
            buf = buf[nl + 1:]
            if not line.startswith(b"data:"):
                continue  # blank separators, comments, "event:" lines
            payload = line[5:].strip()
            if payload == b"[DONE]":
                yield now, None
                continue
            try:
                obj = json.loads(payload)
            except ValueError:
                raise RequestFailed("malformed SSE data line: %r" % payload[:200])
            if not isinstance(obj, dict):
                raise RequestFailed("SSE data is not a JSON object: %r" % payload[:200])
            yield now, obj


def _error_text(obj: Dict[str, Any]) -> Optional[str]:
    err = obj.get("error")
    if err is None:
        if obj.get("object") == "error":
            return str(obj.get("message"))
        return None
    if isinstance(err, dict):
        return str(err.get("message") or err)
    return str(err)


def run_request(target: Target, api: str, body: Dict[str, Any], timeout: float) -> Dict[str, Any]:
    """Send one streaming request; return the measured fields and the output (``output_ids`` where the server
    sent ids, else ``output_text``); never raises for request errors."""
    rec = {
        "ok": False, "error": None, "start_ts": time.time(), "prompt_tokens": None,
        "output_tokens": None, "ttft_s": None, "e2e_s": None, "chunk_t_s": [], "chunk_tokens": [],
        "chunk_tokens_exact": None, "tokens_from": None, "decode_tok_s": None, "tpot_s": None,
        "spec_verify_ct": None, "accept_len": None, "spec_correct_drafts": None, "spec_proposed_drafts": None,
        "finish_reason": None,
    }  # type: Dict[str, Any]
    counter = ChunkCounter(api)
    path = target.base_path + API_PATHS[api]
    payload = json.dumps(body).encode("utf-8")
    t0 = time.perf_counter()
    # perf_counter is CLOCK_MONOTONIC on Linux: comparable with other processes' on the same node.
    rec["send_mono_s"] = t0
    deadline = t0 + timeout
    conn = target.connect(timeout)
    chunk_t = rec["chunk_t_s"]
    chunk_n = rec["chunk_tokens"]
    done = False
    try:
        conn.request("POST", path, body=payload, headers={
            "Content-Type": "application/json", "Accept": "text/event-stream"})
        resp = conn.getresponse()
        if resp.status != 200:
            text = resp.read(2000).decode("utf-8", "replace").strip()
            raise RequestFailed("HTTP %d %s from %s: %s" % (resp.status, resp.reason, path, text))

        def set_timeout(remaining: float) -> None:
            if conn.sock is not None:
                conn.sock.settimeout(max(0.001, min(timeout, remaining)))

        for now, obj in _sse_events(resp, deadline, set_timeout):
            if obj is None:
                done = True
                break
            err = _error_text(obj)
            if err is not None:
                raise RequestFailed("server error in stream: %s" % err)
            n = counter.feed(obj)
            if n > 0:
                chunk_t.append(round(now - t0, 6))
                chunk_n.append(n)
            reason = _finish_reason(api, obj)
            if reason is not None:
                rec["finish_reason"] = reason
        t_end = time.perf_counter()
        if not done:
            raise RequestFailed("stream closed before 'data: [DONE]'")
        if not chunk_t:
            raise RequestFailed("stream finished without any generated token")
        _finish_record(rec, counter, t_end - t0)
    except RequestFailed as exc:
        rec["error"] = str(exc)
    except socket.timeout:
        rec["error"] = "timeout: no data from %s:%d for the rest of the %.0f s request timeout" % (
            target.host, target.port, timeout)
    except (OSError, http.client.HTTPException) as exc:
        rec["error"] = "%s talking to %s:%d%s: %s" % (type(exc).__name__, target.host, target.port, path, exc)
    finally:
        conn.close()
    if counter.ids:
        rec["output_ids"] = counter.ids
    else:
        rec["output_text"] = counter.text
    if rec["error"] is not None:
        rec["e2e_s"] = round(time.perf_counter() - t0, 6)
        rec["output_tokens"] = counter.total or None
        rec["ttft_s"] = chunk_t[0] if chunk_t else None
    return rec


def _finish_reason(api: str, obj: Dict[str, Any]) -> Optional[Any]:
    if api == "generate":
        fr = (obj.get("meta_info") or {}).get("finish_reason")
        if isinstance(fr, dict):
            return fr.get("type")
        return fr
    return next((c["finish_reason"] for c in obj.get("choices") or [] if c.get("finish_reason")), None)


def _buffered(chunk_t: List[float], chunk_n: List[int], after_first: int, per_token_s: float) -> bool:
    """Whether most tokens after the first arrived in bursts: runs of at least BUFFERED_RUN chunks that each followed
    the previous one within 1/BUFFERED_RATE_RATIO of the request's time per token and within BUFFERED_MAX_GAP_S
    (BUFFERED_SHARE). Two chunks read at once (a coalesced TCP read) are not a burst."""
    if after_first < BUFFERED_MIN_TOKENS or per_token_s <= 0:
        return False
    burst_gap = min(per_token_s / BUFFERED_RATE_RATIO, BUFFERED_MAX_GAP_S)
    burst = run_tokens = run_len = 0
    for prev, t, n in zip(chunk_t, chunk_t[1:] + [float("inf")], chunk_n[1:] + [0]):
        if t - prev < burst_gap:
            run_len += 1
            run_tokens += n
            continue
        if run_len >= BUFFERED_RUN:
            burst += run_tokens
        run_len = run_tokens = 0
    return burst > BUFFERED_SHARE * after_first


def _finish_record(rec: Dict[str, Any], counter: ChunkCounter, e2e: float) -> None:
    chunk_t = rec["chunk_t_s"]
    chunk_n = rec["chunk_tokens"]
    out = counter.reported_total if counter.reported_total is not None else counter.total
    e2e = round(e2e, 6)  # derived values below use the stored (rounded) times
    rec.update(decode_tok_s=None, tpot_s=None, spec_verify_ct=None, accept_len=None, spec_correct_drafts=None,
               spec_proposed_drafts=None, ok=True, output_tokens=out, prompt_tokens=counter.prompt_tokens,
               ttft_s=chunk_t[0], e2e_s=e2e, tokens_from=counter.source,
               chunk_tokens_exact=counter.exact and counter.total == out)
    # Tokens that arrived after the first chunk, over the time they took to arrive. Equals
    # (output_tokens - 1) / (t_last - t_first) when the first chunk carries one token.
    span = chunk_t[-1] - chunk_t[0]
    after_first = out - chunk_n[0]
    # buffered: a burst structure that would claim a pace at least BUFFERED_INFLATION x the request's whole pace
    # (the stall went before the burst, into the first token's wait). A client that reads slowly, in bursts all
    # along, keeps its own (low) pace: that is the client-bottleneck finding's evidence, not a void timing.
    rec["buffered"] = bool(span > 0 and out > 0 and e2e > 0 and after_first / span > BUFFERED_INFLATION * out / e2e
                           and _buffered(chunk_t, chunk_n, after_first, e2e / out)) or (span <= 0 and after_first > 0)
    # a buffered request keeps its token and speculative counts (below); only its chunk timing is void
    if span > 0 and after_first > 0 and not rec["buffered"]:
        rec["decode_tok_s"] = after_first / span
    if out > 1 and not rec["buffered"]:
        rec["tpot_s"] = (e2e - chunk_t[0]) / (out - 1)
    verify = counter.meta.get("spec_verify_ct")
    if isinstance(verify, int) and verify > 0:
        rec["spec_verify_ct"] = verify
        ct = counter.meta.get("completion_tokens")
        rec["accept_len"] = (ct if isinstance(ct, int) else out) / verify
    # both field-name generations (0.5.9 spec_accept_token_num/spec_draft_token_num, 0.5.23 renamed)
    spec = engines.spec_meta(counter.meta)
    for src, dst in (("spec_num_correct_drafts", "spec_correct_drafts"),
                     ("spec_num_proposed_drafts", "spec_proposed_drafts")):
        if isinstance(spec.get(src), int):
            rec[dst] = spec[src]
    per_pos = engines.accepted_per_position(spec.get("spec_correct_drafts_histogram"))
    if per_pos is not None:     # the engine's histogram as it came, and the cycles that accepted each position
        rec["spec_accept_hist"] = spec["spec_correct_drafts_histogram"]
        rec["spec_accepted_per_pos"] = per_pos


# ----------------------------------------------------------------------------------------------
# the run


def procs_setting(value: Any) -> Any:
    """bench.client_procs as the client takes it: AUTO or an integer >= 1 (a whole number written as text too)."""
    try:
        return contract.client_procs(value, "bench client_procs (--client-procs)")
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _flag(value: Any, name: str) -> bool:
    """A bench setting that is true or false (a queue entry's JSON bool; "true"/"false" as on the command line)."""
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("true", "false"):
        return str(value).lower() == "true"
    raise UsageError("bench %s must be true or false, got %r" % (name, value))


@dataclass
class BenchConfig:
    """One benchmark run. The values come from the controller (``specab.config.defaults.bench``: the
    experiment's ``bench:`` over ``roles/specab``'s defaults); the client has none of its own."""
    url: str = cli.arg("server base URL, e.g. http://127.0.0.1:30000")
    api: str = cli.arg(choices=APIS)
    num_requests: int = cli.arg("measured requests")
    warmup: int = cli.arg("warm-up requests (excluded from the summary)")
    input_len: int = cli.arg("prompt length in words")
    output_len: int = cli.arg("output tokens asked per request")
    concurrency: int
    seed: int
    timeout: float = cli.arg("per-request timeout in seconds")
    # the flag takes true|false, parse_args makes it the bool
    ignore_eos: bool = cli.arg("true: every answer runs to --output-len; false: answers end where the model ends "
                                  "them", choices=("true", "false"))
    request_rate: float = cli.arg(
        "measured requests per second at seeded Poisson arrival times, at most --concurrency in flight (an open "
        "load); 0: each as soon as one in flight ends (a closed loop of --concurrency users)")
    # AUTO or a number >= 1 (procs_setting)
    client_procs: Any = cli.arg("client processes the --concurrency slots are divided among; auto: one per %d "
                                   "slots, at most one per CPU" % SLOTS_PER_PROC, metavar="auto|N")
    out: str = "bench.jsonl"
    summary: Optional[str] = "bench_summary.json"
    model: Optional[str] = cli.arg("model name for the OpenAI APIs (default: /v1/models)", default=None)
    phase_metrics: Optional[str] = cli.arg("scrape /metrics before and after the measured requests, write the "
                                              "deltas here (phase_metrics.json)", default=None, metavar="FILE")
    dataset: Optional[str] = cli.arg("JSONL prompts ({\"prompt\"} or {\"messages\"}, optional \"category\"; "
                                        "dataset.py), drawn with --seed (default: the seeded word list)",
                                        default=None, metavar="FILE")
    # the controller always passes them (bench.temperature, bench.top_p); the defaults are the greedy requests the
    # client sent before they were settings
    temperature: float = cli.arg("sampling temperature of every request, 0 to 2 (0: greedy)", default=0.0)
    top_p: float = cli.arg("nucleus sampling share of every request, in (0, 1]", default=1.0)

    @classmethod
    def from_settings(cls, url: str, bench: Dict[str, Any], out: str, summary: Optional[str],
                      phase_metrics: Optional[str]) -> "BenchConfig":
        """From a resolved ``bench`` mapping (a queue entry's: every key of ``BENCH_KEYS`` present)."""
        missing = [k for k in BENCH_KEYS if bench.get(k) is None]
        if missing:
            raise UsageError("the bench settings lack %s: the controller resolves every one (experiment bench: "
                             "over roles/specab defaults) before the run is queued" % ", ".join(missing))
        return cls(url=url, api=str(bench["api"]), num_requests=int(bench["num_requests"]),
                   warmup=int(bench["warmup_requests"]), input_len=int(bench["input_len"]),
                   output_len=int(bench["output_len"]), concurrency=int(bench["concurrency"]),
                   seed=int(bench["seed"]), timeout=float(bench["timeout_s"]),
                   ignore_eos=_flag(bench["ignore_eos"], "ignore_eos"), request_rate=float(bench["request_rate"]),
                   client_procs=procs_setting(bench["client_procs"]), out=out, summary=summary,
                   model=None if bench.get("model") is None else str(bench["model"]), phase_metrics=phase_metrics,
                   dataset=None if bench.get("dataset") is None else str(bench["dataset"]),
                   temperature=float(bench["temperature"]), top_p=float(bench["top_p"]))

    def to_argv(self) -> List[str]:
        """The client's command line for this config (``parse_args(cfg.to_argv()) == cfg`` when it has a summary): a
        flag per field that is set (--ignore-eos true|false, a float as its repr; --dataset: <node_dir>/datasets/<name>,
        copied there by node_prepare)."""
        argv = []  # type: List[str]
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                argv += ["--" + f.name.replace("_", "-"), ("true" if value else "false") if isinstance(value, bool)
                         else repr(value) if isinstance(value, float) else str(value)]
        return argv

    def validate(self) -> None:
        if self.api not in APIS:
            raise UsageError("--api %r: choose one of %s" % (self.api, ", ".join(APIS)))
        for name in ("num_requests", "input_len", "output_len", "concurrency"):
            if getattr(self, name) < 1:
                raise UsageError("--%s must be >= 1 (got %r)" % (name.replace("_", "-"), getattr(self, name)))
        if self.warmup < 0:
            raise UsageError("--warmup must be >= 0 (got %r)" % self.warmup)
        if not self.request_rate >= 0 or self.request_rate == float("inf"):
            raise UsageError("--request-rate must be a number of requests per second >= 0 (0: as soon as one in "
                             "flight ends), got %r" % self.request_rate)
        if self.timeout <= 0:
            raise UsageError("--timeout must be > 0 (got %r)" % self.timeout)
        if not 0.0 <= self.temperature <= 2.0:
            raise UsageError("--temperature must be in [0, 2] (0: greedy), got %r" % self.temperature)
        if not 0.0 < self.top_p <= 1.0:
            raise UsageError("--top-p must be in (0, 1] (1: the whole distribution), got %r" % self.top_p)
        procs_setting(self.client_procs)
        Target.from_url(self.url)


@dataclass
class _Recorder:
    """Writes records as requests finish; thread-safe."""
    fh: Any
    lock: threading.Lock = field(default_factory=threading.Lock)
    records: List[Dict[str, Any]] = field(default_factory=list)

    def write(self, rec: Dict[str, Any]) -> None:
        line = json.dumps(rec, separators=(",", ":")) + "\n"
        with self.lock:
            self.fh.write(line)
            self.fh.flush()
            self.records.append(rec)


def _known_truth_fields(rec: Dict[str, Any], prompt: List[int], kt: Dict[str, Any]) -> None:
    """prompt_last_token and output_ids (from the known-truth tokenizer's words when the server sent text)."""
    rec["prompt_last_token"] = prompt[-1]
    if "output_text" in rec:
        first = int(kt["target"]["first"])
        rec["output_ids"] = [int(m) + first for m in _KT_WORD.findall(rec.pop("output_text") or "")]


def _vllm_request_counts(target: Target, before: Dict[str, Any], out_tokens: Optional[int],
                         timeout: float) -> Dict[str, Any]:
    """One request's spec-decode counter deltas (vLLM /metrics around it, nothing else in flight). vLLM records a
    finished request's stats as its output is processed, which may follow the response's last chunk: poll until
    the finished requests' generation tokens have grown by this request's."""
    deadline = time.monotonic() + min(timeout, 5.0)
    while True:
        after = vllm_spec_metrics(target, timeout)
        if after is None:
            return {}
        grown = after["decode"]["generation_tokens"] - before["decode"]["generation_tokens"]
        if (out_tokens is not None and grown >= out_tokens) or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    positions = sorted(set(after["per_position"]) | set(before["per_position"]))
    return {"spec_verify_ct": int(after["drafts"] - before["drafts"]),
            "spec_accepted_drafts": int(after["accepted"] - before["accepted"]),
            "spec_accepted_per_pos": [int(after["per_position"].get(p, 0.0) - before["per_position"].get(p, 0.0))
                                      for p in positions],
            "spec_draft_tokens": int(after["draft_tokens"] - before["draft_tokens"]),
            "verify_ct_from": "vllm /metrics delta around the request",
            "verify_ct_settled": bool(out_tokens is not None and grown >= out_tokens)}


def arrival_offsets(rate: float, n: int, seed: int) -> List[float]:
    """Seconds from the measurement's start at which each of `n` requests is due: a Poisson process of `rate` per
    second (exponential gaps, seeded, the first at 0), the same for every arm of one seed; all 0 at rate 0."""
    if rate <= 0:
        return [0.0] * n
    rng = random.Random("arrivals:%d" % seed)
    out, t = [], 0.0
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def _one_request(cfg: BenchConfig, target: Target, i: int, prompt: Any, warmup: bool, kt: Optional[Dict[str, Any]],
                 per_request_vllm: bool, arrival: Optional[Tuple[float, float]] = None) -> Dict[str, Any]:
    """Request ``i``'s bench.jsonl record (never raises: a client bug is the record's error). ``arrival``: (its
    scheduled arrival in seconds from the measurement's start, that arrival on time.monotonic()) under an open load:
    the record keeps both the arrival (``arrival_s``) and how long after it the request was sent (``arrival_wait_s``:
    it waited for a free slot of the client's in-flight cap), so a latency can be counted from the arrival."""
    body = build_body(cfg.api, prompt, cfg.output_len, cfg.model, cfg.ignore_eos, cfg.temperature, cfg.top_p)
    try:
        before = vllm_spec_metrics(target, cfg.timeout) if per_request_vllm else None
        wait = None if arrival is None else max(0.0, time.monotonic() - arrival[1])
        rec = run_request(target, cfg.api, body, cfg.timeout)
        if arrival is not None:
            rec["arrival_s"], rec["arrival_wait_s"] = round(arrival[0], 6), round(wait or 0.0, 6)
        if kt is not None:
            _known_truth_fields(rec, prompt, kt)
        if before is not None and rec.get("ok"):
            counts = _vllm_request_counts(target, before, rec.get("output_tokens"), cfg.timeout)
            if rec.get("spec_verify_ct") is None and counts.get("spec_verify_ct"):
                rec.update(counts)
    except Exception as exc:  # a bug must not lose the other requests' records
        rec = {"ok": False, "error": "client error: %s: %s" % (type(exc).__name__, exc)}
    return _record(i, prompt, warmup, rec)


def _record(i: int, prompt: Any, warmup: bool, rec: Dict[str, Any]) -> Dict[str, Any]:
    out = {"i": i, "warmup": warmup}
    if isinstance(prompt, dict) and "category" in prompt:
        out["category"] = prompt["category"]
    out.update(rec)
    return out


def _sleep_until(due: float) -> None:
    """Until time.monotonic() reaches ``due`` (a scheduled arrival: nothing to poll for before it)."""
    wait = due - time.monotonic()
    if wait > 0:
        time.sleep(wait)


def _cpus() -> int:
    """The CPUs this process may run on (its affinity: a taskset or a container's cpuset), else the machine's."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def client_procs_for(setting: Any, concurrency: int, cpus: Optional[int] = None) -> int:
    """The client processes for ``concurrency`` slots: ``auto`` is one per SLOTS_PER_PROC slots (one process up to
    that many in flight), at most one per CPU; a number is taken as given. Never more processes than slots."""
    if setting == AUTO:
        n = -(-concurrency // SLOTS_PER_PROC)
        n = min(n, cpus if cpus is not None else _cpus())
    else:
        n = int(setting)
    return max(1, min(n, concurrency))


def _run_phase(cfg: BenchConfig, target: Target, prompts: List[Any], warmup: bool,
               recorder: _Recorder, kt: Optional[Dict[str, Any]] = None, per_request_vllm: bool = False) -> None:
    """Every prompt sent once from threads of this process, at most cfg.concurrency in flight, each record written as
    it comes (the client in one process; ``_ProcPool`` spreads the slots over several)."""
    jobs = queue.Queue()  # type: queue.Queue
    # warm-ups go back to back: the arrival schedule is the measured load's
    due = arrival_offsets(0.0 if warmup else cfg.request_rate, len(prompts), cfg.seed)
    open_load = not warmup and cfg.request_rate > 0
    slots = min(cfg.concurrency, len(prompts))
    t0 = time.monotonic()
    for i, p in enumerate(prompts):
        jobs.put((i, p, t0 + due[i], warmup, due[i] if open_load else None))
    for _ in range(slots):
        jobs.put(None)          # after every job: a slot that takes one finds no more work
    for t in _start_slots(slots, jobs, cfg, target, kt, per_request_vllm, lambda i, rec: recorder.write(rec)):
        t.join()


def _start_slots(slots: int, jobs: "queue.Queue[Any]", cfg: BenchConfig, target: Target, kt: Optional[Dict[str, Any]],
                 per_request_vllm: bool, done: Callable[[int, Dict[str, Any]], None]) -> List[threading.Thread]:
    """``slots`` threads started, each sending the jobs it takes from ``jobs`` one at a time until it takes a None: (i,
    prompt, due on time.monotonic(), warmup, the scheduled arrival from the phase's start under an open load or None);
    each record goes to ``done(i, record)`` as it finishes."""
    def slot() -> None:
        for i, prompt, due, warmup, offset in iter(jobs.get, None):
            _sleep_until(due)
            done(i, _one_request(cfg, target, i, prompt, warmup, kt, per_request_vllm,
                                 None if offset is None else (offset, due)))

    threads = [threading.Thread(target=slot, name="loadgen-%d" % k, daemon=True) for k in range(slots)]
    for t in threads:
        t.start()
    return threads


# A worker process's program: a fresh interpreter that imports this module by name from the package root (argv[1])
# and serves the connection on the file descriptor argv[2]. Not multiprocessing's spawn, which runs the parent's
# __main__ again in each child (a test or a script that imports loadgen without a __main__ guard would start over),
# and not fork, which copies whatever lock another thread of the parent holds at that moment.
WORKER_BOOT = ("import sys; sys.path.insert(0, sys.argv[1]); from specab.node import loadgen; "
               "loadgen.worker_process(int(sys.argv[2]))")


def worker_process(fd: int) -> None:
    """A worker process's entry: its settings are the connection's first message."""
    conn = mp_connection.Connection(fd)
    try:
        settings, kt, slots = conn.recv()
    except (EOFError, OSError):
        os._exit(3)
    _worker_main(conn, settings, kt, slots)


def _worker_main(conn: Any, settings: Dict[str, Any], kt: Optional[Dict[str, Any]], slots: int) -> None:
    """One client worker process, serving the benchmark's phases (warm-up, measured) one after another: per phase,
    ``slots`` threads that each send the jobs the parent hands this process, one at a time ((i, prompt, due, warmup,
    offset) with due on time.monotonic(), which is system-wide: the parent's clock, and offset the scheduled arrival
    from the phase's start under an open load, else None), and send each record back as it
    finishes. Messages to the parent: ("ready", pid) once, ("rec", i, record), and ("done", cpu_s) at each phase's
    end (this process's CPU seconds in that phase); from it: a job, or None (this phase has no more for it). The
    parent's end closing ends this process: between phases that is the benchmark's end, within one the parent died
    (nobody would write what this process measures)."""
    cfg = BenchConfig(**settings)
    target = Target.from_url(cfg.url)
    send_lock = threading.Lock()

    def send(msg: Any) -> None:
        with send_lock:
            conn.send(msg)

    send(("ready", os.getpid()))
    while True:
        jobs = queue.Queue()  # type: queue.Queue
        threads = _start_slots(slots, jobs, cfg, target, kt, False, lambda i, rec: send(("rec", i, rec)))
        cpu0 = time.process_time()
        given = 0
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                os._exit(3 if given else 0)
            if msg is None:
                break
            jobs.put(msg)
            given += 1
        for _ in threads:
            jobs.put(None)
        for t in threads:
            t.join()
        send(("done", time.process_time() - cpu0))


def _exit_words(code: Optional[int]) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return "killed by %s" % signal.Signals(-code).name
        except ValueError:
            return "killed by signal %d" % -code
    return "exit status %d" % code


class _ProcPool(object):
    """The client's worker processes (``_worker_main``), started once for a benchmark and serving its phases one after
    another (the warm-up, then the measured requests: one set of interpreter starts per run), the concurrency slots
    divided among them. Per phase this process hands out the jobs in order: a worker is given the next prompt whenever
    one of its slots is free (it holds at most its slots' count), so the load in flight and the order are the threads'
    (a free slot takes the next prompt), and the arrival schedule keeps its absolute due times from one t0, taken when
    the phase starts. Records come back as each request finishes and are written here. A worker that dies: each request
    it held is recorded failed with its exit named, and no further request of that phase is sent (the load would no
    longer be the configured one): those are recorded failed too. Nothing is dropped: every prompt gets exactly one
    record. ``renew`` starts the whole set again when a phase lost a worker, so the next phase has its full load."""

    def __init__(self, cfg: BenchConfig, kt: Optional[Dict[str, Any]], procs: int, slots: int) -> None:
        self.cfg, self.kt = cfg, kt
        procs = min(procs, slots)
        self.slots = [slots // procs + (1 if w < slots % procs else 0) for w in range(procs)]
        self.procs = []  # type: List[subprocess.Popen]
        self.conns = []  # type: List[Any]
        self.alive = set()  # type: set  # workers not lost
        # the phase being run
        self.prompts = []  # type: List[Any]
        self.warmup = False
        self.recorder = None  # type: Optional[_Recorder]
        self.held = [set() for _ in range(procs)]  # type: List[set]
        self.cpu = [None] * procs  # type: List[Optional[float]]
        self.died = None  # type: Optional[str]

    def __enter__(self) -> "_ProcPool":
        """The workers started, each ready for work (so a measured window that starts after this holds no interpreter
        start); one that fails to start is a lost worker (the requests a phase gives it are recorded failed)."""
        try:
            self._start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _start(self) -> None:
        settings = {f.name: getattr(self.cfg, f.name) for f in fields(self.cfg)}
        for w, n in enumerate(self.slots):
            mine, theirs = socket.socketpair()
            try:
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-c", WORKER_BOOT, cli.PACKAGE_ROOT, str(theirs.fileno())],
                    pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL))
            except BaseException:
                mine.close()
                raise
            finally:
                theirs.close()          # the worker's end is the worker's alone: its exit is our EOF
            self.conns.append(mp_connection.Connection(mine.detach()))
            self.alive.add(w)
            with contextlib.suppress(OSError):  # its EOF is read below
                self.conns[w].send((settings, self.kt, n))
        waiting = set(self.alive)       # not ready yet
        for w in sorted(self.alive):
            while w in waiting and w in self.alive:
                self._receive(w, waiting, block=True)

    def __exit__(self, *exc: Any) -> None:
        """Every worker gone: its connection closed (a worker waiting for work reads EOF and exits), waited for, killed
        after 10 s."""
        for c in self.conns:
            c.close()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs, self.conns, self.alive = [], [], set()

    def renew(self) -> None:
        """A worker lost in the last phase, or ended since: every worker ended and a new set started, so the next
        phase runs its full load."""
        if len(self.alive) < len(self.slots) or any(p.poll() is not None for p in self.procs):
            self.__exit__()
            self.died = None
            self._start()

    def run(self, prompts: List[Any], warmup: bool, recorder: _Recorder) -> List[float]:
        """One phase's requests; returns the CPU seconds in this phase of each worker that finished it."""
        self.prompts, self.warmup, self.recorder = prompts, warmup, recorder
        self.held = [set() for _ in self.slots]
        self.cpu = [None] * len(self.slots)
        self._dispatch()
        return [c for c in self.cpu if c is not None]

    def _fail(self, i: int, error: str) -> None:
        assert self.recorder is not None
        self.recorder.write(_record(i, self.prompts[i], self.warmup, {"ok": False, "error": error}))

    def _dispatch(self) -> None:
        conns = self.conns
        live = set(self.alive)          # the phase's workers that have not said "done" (nor died)
        due = arrival_offsets(0.0 if self.warmup else self.cfg.request_rate, len(self.prompts), self.cfg.seed)
        open_load = not self.warmup and self.cfg.request_rate > 0
        t0 = time.monotonic()
        nxt = 0
        finished = set()                # told there is no more work
        while True:
            for w in sorted(live - finished):
                while self.died is None and nxt < len(self.prompts) and len(self.held[w]) < self.slots[w]:
                    self.held[w].add(nxt)
                    try:
                        conns[w].send((nxt, self.prompts[nxt], t0 + due[nxt], self.warmup,
                                       due[nxt] if open_load else None))
                    except OSError:
                        self.held[w].discard(nxt)   # not sent: recorded with the rest (its EOF is read below)
                        break
                    nxt += 1
                if not self.held[w] and (self.died is not None or nxt >= len(self.prompts)):
                    with contextlib.suppress(OSError):
                        conns[w].send(None)
                    finished.add(w)
            if self.died is not None:
                for i in range(nxt, len(self.prompts)):
                    self._fail(i, "not sent: %s, so the load was no longer %d in flight" % (
                        self.died, self.cfg.concurrency))
                nxt = len(self.prompts)
            if not live:
                return
            ready = mp_connection.wait([conns[w] for w in live])
            for w in list(live):
                if conns[w] in ready:
                    self._receive(w, live, block=False)

    def _receive(self, w: int, waiting: set, block: bool) -> None:
        """Worker w's messages that are there (``block``: at least one, or its end); w leaves ``waiting`` with its
        "ready" or "done", or its end. A worker's end closes its pipe (poll() then says readable and recv() raises
        EOFError once what it sent before is read): without its "done" that is a lost worker."""
        conn, proc = self.conns[w], self.procs[w]
        while True:
            if not conn.poll():
                if not block:
                    return
                mp_connection.wait([conn])
                continue
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)
                self._lost(w, proc)
                waiting.discard(w)
                return
            block = False
            if msg[0] == "ready":
                waiting.discard(w)
            elif msg[0] == "rec":
                self.held[w].discard(msg[1])
                assert self.recorder is not None
                self.recorder.write(msg[2])
            elif msg[0] == "done":
                self.cpu[w] = float(msg[1])
                waiting.discard(w)
                return

    def _lost(self, w: int, proc: Any) -> None:
        """Worker w ended without its "done": the requests it held are recorded failed."""
        what = "client worker process %d (pid %s) ended (%s) before it finished its requests" % (
            w, proc.pid, _exit_words(proc.poll()))
        self.alive.discard(w)
        if self.died is None:
            self.died = what
        for i in sorted(self.held[w]):
            self._fail(i, "%s; this request was in flight there and its record was lost" % what)
        self.held[w].clear()


def _span(ok: List[Dict[str, Any]]) -> Optional[float]:
    ends = [(r["start_ts"], r["start_ts"] + r["e2e_s"]) for r in ok
            if r.get("start_ts") is not None and r.get("e2e_s") is not None]
    return max(e for _, e in ends) - min(s for s, _ in ends) if ends else None


def _median(values: List[float]) -> Optional[float]:
    return statistics.median(values) if values else None


def _mean(values: List[float]) -> Optional[float]:
    return statistics.fmean(values) if values else None


LATENCY_PERCENTILES = (50, 90, 95, 99)


def percentile(values: List[float], q: float) -> Optional[float]:
    """The q-th percentile (0-100) by linear interpolation between the closest ranks (numpy's default), or None."""
    if not values:
        return None
    v = sorted(values)
    pos = (len(v) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def inter_token_latencies(rec: Dict[str, Any]) -> List[float]:
    """A request's inter-token latencies per streamed chunk (``itl_s``): the gaps between its consecutive chunks
    (seconds). A chunk that carries several tokens (a speculative cycle's accepted drafts) is one gap, as a user sees
    it arrive."""
    t = rec.get("chunk_t_s") or []
    return [b - a for a, b in zip(t, t[1:])]


def per_token_latencies(chunk_t: List[float], chunk_n: List[int]) -> List[float]:
    """Inter-token latencies per token (``itl_token_s``): each chunk after the first spreads its gap over the tokens
    it carries, one value per token (a chunk of 3 tokens 6 ms after the previous one: three values of 2 ms). Their
    mean is the request's time per token after its first chunk: a speculative arm's chunks of several tokens compare
    with a baseline's chunks of one. A chunk that carries no token count is skipped."""
    return [(b - a) / n for a, b, n in zip(chunk_t, chunk_t[1:], chunk_n[1:]) if n and n > 0
            for _ in range(int(n))]


def latency_percentiles(ok: List[Dict[str, Any]]) -> Dict[str, Dict[str, Optional[float]]]:
    """p50/p90/p95/p99 of the measured requests' TTFT, TPOT and end-to-end latency (one value per request), of their
    inter-token latencies per chunk (``itl_s``: every gap of every request) and per token (``itl_token_s``: every
    token's share of its chunk's gap; requests delivered in a burst left out, as for TPOT), seconds."""
    cols = {k: [r[k] for r in ok if r.get(k) is not None] for k in ("ttft_s", "tpot_s", "e2e_s")}
    cols["itl_s"] = [g for r in ok for g in inter_token_latencies(r)]
    cols["itl_token_s"] = [g for r in ok if not r.get("buffered")
                           for g in per_token_latencies(r.get("chunk_t_s") or [], r.get("chunk_tokens") or [])]
    return {k: {"p%g" % q: percentile(v, q) for q in LATENCY_PERCENTILES} for k, v in cols.items()}


def spec_positions(records: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """Per-position acceptance over measured ok requests that carry it (SGLang's per-request histogram, or vLLM's
    counters around each request): cycles, and the cycles that accepted draft position i (i = 1..steps); None
    unless every request with a cycle count has it."""
    counted = [r for r in records if r.get("spec_verify_ct")]
    have = [r for r in counted if isinstance(r.get("spec_accepted_per_pos"), list)]
    if not have or len(have) != len(counted):
        return None
    k = max(len(r["spec_accepted_per_pos"]) for r in have)
    accepted = [sum(r["spec_accepted_per_pos"][i] for r in have if i < len(r["spec_accepted_per_pos"]))
                for i in range(k)]
    return {"cycles": sum(int(r["spec_verify_ct"]) for r in have), "accepted_per_pos": accepted,
            "requests": len(have), "from": "requests"}


def summarize(cfg: BenchConfig, records: List[Dict[str, Any]], duration_s: float,
              cpu_s: Any, data_hash: str, data: Optional[Dict[str, Any]] = None, procs: int = 1) -> Dict[str, Any]:
    """``cpu_s``: the client's CPU seconds over the measured requests, per process (this one first, then each worker
    that reported), or one number (one process)."""
    per_proc = [float(c) for c in cpu_s] if isinstance(cpu_s, (list, tuple)) else [float(cpu_s)]
    cpu_s = sum(per_proc)
    measured = [r for r in records if not r.get("warmup")]
    ok = [r for r in measured if r.get("ok")]

    def col(key: str) -> List[float]:
        return [r[key] for r in ok if r.get(key) is not None]

    out_tokens = sum(r.get("output_tokens") or 0 for r in ok)
    out_tok_s = out_tokens / duration_s if duration_s > 0 else None
    return {
        "requests": len(measured),
        "ok": len(ok),
        "failed": len(measured) - len(ok),
        "decode_tok_s_median": _median(col("decode_tok_s")),
        "decode_tok_s_mean": _mean(col("decode_tok_s")),
        "ttft_s_median": _median(col("ttft_s")),
        "tpot_s_median": _median(col("tpot_s")),
        "e2e_s_median": _median(col("e2e_s")),
        "accept_len_mean": _mean(col("accept_len")),
        "output_tok_s": out_tok_s,
        # the measured requests' window, first sent to last finished (their span: the run's throughput window)
        "measured_span_s": _span(ok),
        "latency": latency_percentiles(ok),
        "duration_s": duration_s,
        # every client process's CPU together; the busiest one's: a process at a whole core is the bottleneck
        # (one GIL), whatever the sum over processes
        "client_cpu_s": cpu_s,
        "client_cpu_max_proc_s": max(per_proc),
        "client_cpu_per_proc_s": per_proc,
        "client_procs": procs,
        "client_procs_setting": cfg.client_procs,
        "client_cpu_s_per_1k_tok_s": (cpu_s / duration_s) / (out_tok_s / 1000.0)
        if out_tok_s and duration_s > 0 else None,
        "output_tokens": out_tokens,
        "warmup_requests": len(records) - len(measured),
        "warmup_failed": sum(1 for r in records if r.get("warmup") and not r.get("ok")),
        "errors": sorted({str(r.get("error")) for r in measured if not r.get("ok")})[:10],
        # delivered in a burst: no decode pace (BUFFERED_RATE_RATIO); decode_tok_s_* are over the others
        "buffered_requests": sum(1 for r in ok if r.get("buffered")),
        "api": cfg.api, "url": cfg.url, "model": cfg.model, "concurrency": cfg.concurrency,
        "request_rate": cfg.request_rate,
        "input_len": cfg.input_len, "output_len": cfg.output_len, "seed": cfg.seed,
        "dataset_hash": data_hash,
        # where the prompts came from: the seeded word list (synthetic) or a file with its sha256
        "dataset": data or {"kind": "synthetic"},
        "ignore_eos": cfg.ignore_eos,
        "temperature": cfg.temperature, "top_p": cfg.top_p,
        "tokens_from": sorted({str(r.get("tokens_from")) for r in ok}),
        "spec_positions": spec_positions(ok),
    }


def discover_model(target: Target, timeout: float) -> Optional[str]:
    """First model id from /v1/models, or None when the server does not say."""
    conn = target.connect(min(timeout, 10.0))
    try:
        conn.request("GET", target.base_path + "/v1/models")
        resp = conn.getresponse()
        if resp.status != 200:
            return None
        data = json.loads(resp.read())
        models = data.get("data") or []
        return str(models[0]["id"]) if models else None
    except (OSError, ValueError, KeyError, TypeError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def scrape_metrics(target: Target, timeout: float = 10.0) -> str:
    """GET /metrics as text; raises OSError (or http.client errors) with the status in the message."""
    conn = target.connect(timeout)
    try:
        conn.request("GET", target.base_path + "/metrics")
        resp = conn.getresponse()
        body = resp.read().decode("utf-8", "replace")
        if resp.status != 200:
            raise OSError("GET /metrics answered %d%s" % (
                resp.status, " (the server runs without --enable-metrics)" if resp.status == 404 else ""))
        return body
    finally:
        conn.close()


class _PhaseWindow(object):
    """The two /metrics scrapes around the measured requests and the phase_metrics.json they make."""

    def __init__(self, target: Target, path: str) -> None:
        self.target, self.path = target, path
        self.before = None  # type: Optional[str]
        self.error = None  # type: Optional[str]
        self.t0 = self.at0 = 0.0

    def start(self) -> None:
        self.at0, self.t0 = time.time(), time.perf_counter()
        try:
            self.before = scrape_metrics(self.target)
        except (OSError, http.client.HTTPException) as exc:
            self.error = "before the measured requests: %s" % exc

    def finish(self) -> Dict[str, Any]:
        window = time.perf_counter() - self.t0
        res = None  # type: Optional[Dict[str, Any]]
        if self.error is None and self.before is not None:
            try:
                after = scrape_metrics(self.target)
                res = phasemetrics.result(self.before, after, window, self.at0, time.time())
            except (OSError, http.client.HTTPException) as exc:
                self.error = "after the measured requests: %s" % exc
            except engines.MetricsParseError as exc:
                self.error = "unreadable /metrics: %s" % exc
        if res is None:
            res = phasemetrics.unavailable(self.error or "not scraped")
        osutil.write_json(self.path, res)
        return res


def vllm_spec_metrics(target: "Target", timeout: float) -> Optional[Dict[str, Any]]:
    """vLLM's spec-decode counters from /metrics, or None when the server has none (SGLang, the simulator)."""
    try:
        text = scrape_metrics(target, min(timeout, 10.0))
    except (OSError, http.client.HTTPException):
        return None
    if "vllm:" not in text:
        return None
    counters = engines.vllm_spec_counters(text)
    counters["decode"] = engines.vllm_decode_counters(text)
    return counters


def add_engine_acceptance(summary: Dict[str, Any], before: Optional[Dict[str, Any]],
                          after: Optional[Dict[str, Any]]) -> None:
    """The engine's own acceptance over the measured requests (vLLM: /metrics deltas): summary["spec_metrics"]
    (drafts, draft_tokens, accepted, accept_len = 1 + accepted/drafts, accept_rate = accepted/draft tokens,
    per_position_rate); accept_len_mean takes it when the responses carried no per-request acceptance.
    summary["engine_decode"]: the engine's own decode rate over the same requests (engines.vllm_decode_rate),
    what the results table shows when the stream reached the client in bursts (buffered requests)."""
    if before is None or after is None:
        return
    summary["engine_decode"] = dict(engines.vllm_decode_rate(before["decode"], after["decode"]),
                                    source="vllm /metrics delta over the measured requests")
    acc = engines.vllm_acceptance(before, after)
    acc["source"] = "vllm /metrics delta over the measured requests"
    # the server's totals at the end (warm-up and readiness requests included): what vLLM's periodic
    # `SpecDecoding metrics:` log lines add up to at most (a cross-check; the last interval may be unlogged)
    acc["totals_after"] = {k: int(after[k]) for k in ("drafts", "draft_tokens", "accepted")}
    summary["spec_metrics"] = acc
    if summary.get("spec_positions") is None and acc["drafts"] > 0 and acc["per_position"]:
        # over the measured window (concurrent requests included): the counters' delta, not per request
        summary["spec_positions"] = {"cycles": acc["drafts"], "accepted_per_pos": acc["per_position"],
                                     "requests": summary.get("ok"), "from": "metrics"}
    if summary.get("accept_len_mean") is None and acc["accept_len"] is not None:
        summary["accept_len_mean"] = acc["accept_len"]
        summary["accept_len_from"] = "metrics"


def _prompts(cfg: BenchConfig, kt: Optional[Dict[str, Any]], log: Callable[[str], None]
             ) -> Tuple[List[Any], List[Any], Optional[Dict[str, Any]]]:
    """The warm-up and measured prompts: drawn from bench.dataset (with what the summary says of the file), else
    token-id prompts for known-truth models, else the seeded word list."""
    data = None  # type: Optional[Dict[str, Any]]
    if cfg.dataset is not None:
        if kt is not None:
            raise UsageError("the served model is a known-truth model (%s), which takes token-id prompts: drop "
                             "bench.dataset" % kt["target"]["path"])
        try:
            cfg.dataset = os.path.expanduser(cfg.dataset)
            records = dataset.load(cfg.dataset)
        except dataset.DatasetError as exc:
            raise UsageError(str(exc))
        if dataset.needs_chat(records) and cfg.api != "chat":
            raise UsageError("%s holds chat records (\"messages\"): use --api chat" % cfg.dataset)
        warm_prompts = dataset.sample(records, cfg.seed, "warmup", cfg.warmup)  # type: List[Any]
        prompts = dataset.sample(records, cfg.seed, "measure", cfg.num_requests)  # type: List[Any]
        data = {"kind": "file", "path": os.path.abspath(cfg.dataset), "sha256": dataset.sha256_of(cfg.dataset),
                "records": len(records), "categories": dataset.categories(records)}
        builtin = dataset.builtin_of(cfg.dataset)
        if builtin is not None:         # bench.dataset: <name>, made by the controller from its package
            data["builtin"] = builtin
        log("dataset %s: %d record(s)" % (cfg.dataset, len(records)))
    elif kt is None:
        warm_prompts = make_prompts(cfg.seed, "warmup", cfg.warmup, cfg.input_len)
        prompts = make_prompts(cfg.seed, "measure", cfg.num_requests, cfg.input_len)
    else:
        if cfg.api == "chat":
            raise UsageError("the served model is a known-truth model (%s), which takes token-id prompts: use "
                             "bench.api generate or completions, not chat" % kt["target"]["path"])
        first, vocab = int(kt["target"]["first"]), int(kt["target"]["vocab_size"])
        warm_prompts = make_token_prompts(cfg.seed, "warmup", cfg.warmup, cfg.input_len, first, vocab)
        prompts = make_token_prompts(cfg.seed, "measure", cfg.num_requests, cfg.input_len, first, vocab)
        log("known-truth models (%s): token-id prompts, outputs recorded" % kt["target"]["path"])
    return warm_prompts, prompts, data


def run_benchmark(cfg: BenchConfig, log: Callable[[str], None] = lambda s: None) -> Dict[str, Any]:
    """Run warm-up then measured requests; write cfg.out (and cfg.summary); return the summary."""
    cfg.validate()
    target = Target.from_url(cfg.url)
    if cfg.api != "generate" and not cfg.model:
        cfg.model = discover_model(target, cfg.timeout)
    out_dir = os.path.dirname(os.path.abspath(cfg.out))
    kt, kt_problems = known_truth_of(out_dir)
    warm_prompts, prompts, data = _prompts(cfg, kt, log)
    data_hash = dataset_hash(prompts)
    os.makedirs(out_dir, exist_ok=True)
    with open(cfg.out, "w", encoding="utf-8") as fh:
        recorder = _Recorder(fh)
        # vLLM's counters per request need nothing else in flight: concurrency 1, so one process
        per_request = kt is not None and cfg.concurrency == 1
        # never more processes than prompts in flight at once: one for a single prompt
        slots = min(cfg.concurrency, len(prompts))
        procs = client_procs_for(cfg.client_procs, slots)
        with contextlib.ExitStack() as stack:
            # the worker processes started and ready before the warm-up, and so before the /metrics window and the
            # measured clock: their interpreters' start is no measured time or CPU, and is paid once per run
            pool = stack.enter_context(_ProcPool(cfg, kt, procs, slots)) if procs > 1 else None
            if warm_prompts:
                log("warm-up: %d request(s)" % len(warm_prompts))
                if pool is not None:
                    pool.run(warm_prompts, True, recorder)
                    pool.renew()
                else:
                    _run_phase(cfg, target, warm_prompts, True, recorder, kt)
            log("measuring: %d request(s) at concurrency %d%s%s" % (len(prompts), cfg.concurrency, (
                ", %g per second at seeded arrival times" % cfg.request_rate) if cfg.request_rate else "",
                ", over %d client processes" % procs if procs > 1 else ""))
            window = _PhaseWindow(target, cfg.phase_metrics) if cfg.phase_metrics else None
            if window is not None:
                window.start()
            before = vllm_spec_metrics(target, cfg.timeout)
            per_request = per_request and before is not None
            cpu0 = time.process_time()
            t0 = time.perf_counter()
            if pool is not None:
                workers_cpu = pool.run(prompts, False, recorder)
            else:
                _run_phase(cfg, target, prompts, False, recorder, kt, per_request)
                workers_cpu = []
            duration = time.perf_counter() - t0
            # this process's (the slots' threads, or the dispatch and the writing) and each worker's own
            cpu = [time.process_time() - cpu0] + workers_cpu
        if window is not None:
            phases = window.finish()
            log("phase metrics: %s" % ("categories " + ", ".join(phases["categories"]) if phases.get("available")
                                       else "not available (%s)" % phases.get("reason")))
        after = vllm_spec_metrics(target, cfg.timeout) if before is not None else None
    summary = summarize(cfg, recorder.records, duration, cpu, data_hash, data, procs)
    add_engine_acceptance(summary, before, after)
    if kt is not None:
        summary["known_truth"] = kt
    if kt_problems:
        summary["known_truth_problems"] = kt_problems
    if cfg.summary:
        osutil.write_json(cfg.summary, summary)
    return summary


def parse_args(argv: Optional[List[str]] = None) -> BenchConfig:
    ns = cli.spec_parser(BenchConfig, "loadgen", __doc__).parse_args(argv)
    ns.client_procs = procs_setting(ns.client_procs)
    ns.ignore_eos = ns.ignore_eos == "true"
    return BenchConfig(**vars(ns))


def main(argv: Optional[List[str]] = None) -> int:
    def log(msg: str) -> None:
        print("loadgen: " + msg, file=sys.stderr, flush=True)

    try:
        cfg = parse_args(argv)
        summary = run_benchmark(cfg, log)
    except UsageError as exc:
        print("loadgen: %s" % exc, file=sys.stderr)
        return 2
    except OSError as exc:
        print("loadgen: cannot write results: %s" % exc, file=sys.stderr)
        return 1
    log("%d/%d ok, decode %.1f tok/s median, TTFT %s s median" % (
        summary["ok"], summary["requests"], summary["decode_tok_s_median"] or 0.0,
        summary["ttft_s_median"]))
    if summary["failed"]:
        log("%d measured request(s) failed, first errors: %s" % (summary["failed"], summary["errors"][:3]))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
