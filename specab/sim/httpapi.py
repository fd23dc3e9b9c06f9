"""HTTP endpoints of the simulated SGLang server (aiohttp), same paths, statuses and JSON as SGLang 0.5.x.

/health, /health_generate, /get_server_info, /server_info, /get_model_info, /model_info, /v1/models,
/generate (SSE stream or JSON; with ``return_logprob`` and ``logprob_start_len`` the input's log-probabilities,
scoring.py), /v1/completions, /v1/chat/completions, /tokenize and /v1/tokenize, /flush_cache, /metrics,
/start_profile, /stop_profile, /openapi.json. A request with a temperature > 0 is sampled (sampling.py); without one it
is greedy.
"""
from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from aiohttp import web

from specab.sim.args import ServerArgs
from specab.sim import versions
from specab.sim.engine import Engine, GenRequest, count_prompt_tokens
from specab.sim.limits import context_error
from specab.sim.loadplan import Capacity
from specab.sim.sampling import Sampling
from specab.sim import scoring
from specab.sim.profiler import Profiler, ProfileRequestError
from specab.sim.simlog import SimLogger

HEALTH_CHECK_TIMEOUT_S = 20.0
FLUSH_TEXT = ("Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting "
              "requests, the operation will not be performed.)\n")


@dataclass
class ServerState:
    args: ServerArgs
    cap: Capacity
    engine: Engine
    log: SimLogger
    version: str
    architecture: str
    status: str = "starting"          # starting | ready | exiting
    inflight: int = 0                 # generation requests whose HTTP response is not finished yet
    started_at: float = field(default_factory=time.time)
    simulator: dict[str, Any] = field(default_factory=dict)
    buffered_stream: bool = False     # fault: a starved front end, every stream's chunks sent at its end
    on_flush: Optional[Callable[[bool], None]] = None     # told of every /flush_cache answered (done or refused)


class _StreamOut:
    """Writes SSE events at once, or (the buffered_stream fault) holds them until the stream ends: the client
    then waits for the first token as long as the whole generation and gets every token in one burst."""

    def __init__(self, resp: web.StreamResponse, hold: bool) -> None:
        self.resp, self.held = resp, ([] if hold else None)

    async def write(self, data: bytes) -> None:
        if self.held is None:
            await self.resp.write(data)
        else:
            self.held.append(data)

    async def end(self) -> None:
        if self.held:       # in one write, as a starved front end forwards what it had queued
            await self.resp.write(b"".join(self.held))
        self.held = None


async def _after_the_step() -> None:
    """A stream's end (the [DONE] event, the response's close, the access log line) waits one turn of the event loop,
    so that every stream with a chunk of the same engine step sends it first: ending each response in turn delayed the
    last chunks of 32 requests that finished in one step by up to 15 ms, which a client then measured as decode time."""
    await asyncio.sleep(0)


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(data), status=status, content_type="application/json")


def _error(message: str, status: int = 400, etype: str = "BadRequestError") -> web.Response:
    return _json({"object": "error", "message": message, "type": etype, "param": None, "code": status}, status)


async def _body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise web.HTTPBadRequest(text=json.dumps({"error": f"invalid JSON body: {exc}"}),
                                 content_type="application/json")
    if not isinstance(data, dict):
        raise web.HTTPBadRequest(text=json.dumps({"error": "the JSON body must be an object"}),
                                 content_type="application/json")
    return data


def _sampling(temperature: Any, top_p: Any) -> Optional[Sampling]:
    """A request's sampling (None: greedy, temperature absent or 0); a value out of range is a ValueError."""
    t = 0.0 if temperature is None else float(temperature)
    p = 1.0 if top_p is None else float(top_p)
    if t < 0 or not 0 < p <= 1:
        raise ValueError(f"temperature must be >= 0 and top_p in (0, 1], got {temperature!r}, {top_p!r}")
    return Sampling(t, p) if t > 0 else None


class Api:
    def __init__(self, state: ServerState):
        self.s = state
        self.vocab = scoring.Vocab()

    # ----- app
    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._access_log])
        r = app.router
        r.add_get("/health", self.health)
        r.add_get("/health_generate", self.health)
        r.add_get("/get_server_info", self.get_server_info)
        r.add_get("/server_info", self.server_info)
        r.add_get("/get_model_info", self.get_model_info)
        r.add_get("/model_info", self.model_info)
        r.add_get("/v1/models", self.models)
        r.add_route("POST", "/generate", self.generate)
        r.add_route("PUT", "/generate", self.generate)
        r.add_post("/v1/completions", self.completions)
        r.add_post("/v1/chat/completions", self.chat)
        r.add_post("/tokenize", self.tokenize)
        r.add_post("/v1/tokenize", self.tokenize)
        r.add_route("GET", "/flush_cache", self.flush_cache)
        r.add_route("POST", "/flush_cache", self.flush_cache)
        r.add_get("/metrics", self.metrics)
        r.add_get("/openapi.json", self.openapi)
        r.add_route("GET", "/start_profile", self.start_profile)
        r.add_route("POST", "/start_profile", self.start_profile)
        r.add_route("GET", "/stop_profile", self.stop_profile)
        r.add_route("POST", "/stop_profile", self.stop_profile)
        return app

    @web.middleware
    async def _access_log(self, request: web.Request, handler: Any) -> web.StreamResponse:
        generating = request.path in ("/generate", "/v1/completions", "/v1/chat/completions")
        if generating:
            self.s.inflight += 1
        try:
            resp = await handler(request)
        finally:
            if generating:
                self.s.inflight -= 1
        peer = request.remote or "127.0.0.1"
        port = request.transport.get_extra_info("peername")[1] if request.transport else 0
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 503: "Service Unavailable"}.get(resp.status, "")
        self.s.log.raw(f'INFO:     {peer}:{port} - "{request.method} {request.path_qs} HTTP/'
                       f'{request.version.major}.{request.version.minor}" {resp.status} {reason}')
        return resp

    # ----- health
    async def health(self, request: web.Request) -> web.Response:
        if self.s.status != "ready":
            return web.Response(status=503)
        eng = self.s.engine
        if eng.busy():
            return web.Response(status=200)
        req = eng.submit(["0"], 1, True, rid=f"HEALTH_CHECK_{time.time()}", prompt_tokens=1,
                         internal=True)
        try:
            await asyncio.wait_for(self._drain(req), HEALTH_CHECK_TIMEOUT_S)
        except asyncio.TimeoutError:
            eng.abort(req)
            return web.Response(status=503)
        return web.Response(status=200)

    async def _drain(self, req: GenRequest) -> None:
        while True:
            em = await req.queue.get()
            if em.finished:
                return

    # ----- info
    def _internal_state(self) -> dict[str, Any]:
        eng = self.s.engine
        st: dict[str, Any] = {
            "last_gen_throughput": eng.stats.last_gen_throughput,
            "memory_usage": {"weight": round(self.s.cap.weights_mib / 1024, 2),
                             "kvcache": round(self.s.cap.kv_mib / 1024, 2),
                             "token_capacity": self.s.cap.max_total_num_tokens,
                             "graph": round(self.s.cap.graph_mib / 1024, 2)},
            "load": len(eng.running) + len(eng.waiting),
        }
        if self.s.args.speculative_algorithm:
            st["avg_spec_accept_length"] = eng.avg_spec_accept_length
        return st

    def _server_info(self) -> dict[str, Any]:
        args = self.s.args.to_dict()
        if versions.current().name != "0.5.9":
            # 0.5.23: no cuda_graph_max_bs/_bs keys; the resolved graph settings sit in cuda_graph_config
            a = self.s.args
            max_bs = self.s.engine.timing.cuda_graph_max_bs
            for k in ("cuda_graph_max_bs", "cuda_graph_bs", "cuda_graph_max_bs_prefill", "cuda_graph_bs_prefill",
                      "cuda_graph_backend_decode", "cuda_graph_backend_prefill", "stream_output"):
                args.pop(k, None)
            args["cuda_graph_config"] = {
                "decode": {"backend": "disabled" if a.disable_cuda_graph else (a.cuda_graph_backend_decode or "full"),
                           "max_bs": max_bs,
                           "bs": list(a.cuda_graph_bs) if a.cuda_graph_bs else
                           [b for b in (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64) if b <= max_bs] or [1]},
                "prefill": {"backend": a.cuda_graph_backend_prefill or ("disabled" if a.disable_cuda_graph else "full"),
                            "max_bs": a.cuda_graph_max_bs_prefill, "bs": a.cuda_graph_bs_prefill}}
        return {**args,
                "max_total_num_tokens": self.s.cap.max_total_num_tokens,
                "max_req_input_len": self.s.cap.context_len - 5,
                "internal_states": [self._internal_state()],
                "version": self.s.version,
                "startup_time": self.s.started_at,
                "simulator": {**self.s.simulator,
                              "schedule_lag_max_s": round(self.s.engine.stats.schedule_lag_max_s, 4),
                              "schedule_resets": self.s.engine.stats.schedule_resets}}

    async def get_server_info(self, request: web.Request) -> web.Response:
        self.s.log.warning("Endpoint '/get_server_info' is deprecated and will be removed in a future version. "
                           "Please use '/server_info' instead.")
        return _json(self._server_info())

    async def server_info(self, request: web.Request) -> web.Response:
        return _json(self._server_info())

    def _model_info(self) -> dict[str, Any]:
        a = self.s.args
        return {"model_path": a.model_path, "tokenizer_path": a.tokenizer_path, "is_generation": True,
                "preferred_sampling_params": None, "weight_version": "default"}

    async def get_model_info(self, request: web.Request) -> web.Response:
        self.s.log.warning("Endpoint '/get_model_info' is deprecated and will be removed in a future version. "
                           "Please use '/model_info' instead.")
        return _json(self._model_info())

    async def model_info(self, request: web.Request) -> web.Response:
        return _json({**self._model_info(), "served_model_name": self.s.args.served_model_name,
                      "architectures": [self.s.architecture], "model_type": "kimi_k2",
                      "context_length": self.s.cap.context_len})

    async def models(self, request: web.Request) -> web.Response:
        a = self.s.args
        return _json({"object": "list", "data": [{"id": a.served_model_name, "object": "model",
                                                  "created": int(self.s.started_at), "owned_by": "sglang",
                                                  "root": a.model_path, "max_model_len": self.s.cap.context_len}]})

    async def flush_cache(self, request: web.Request) -> web.Response:
        ok = self.s.engine.flush_cache()
        if self.s.on_flush is not None:
            self.s.on_flush(ok)
        return web.Response(text=FLUSH_TEXT, status=200 if ok else 400)

    async def openapi(self, request: web.Request) -> web.Response:
        """FastAPI's route list, as SGLang's server (a FastAPI app) serves it: every path with its methods."""
        paths: dict[str, dict[str, Any]] = {}
        for route in request.app.router.routes():
            path = route.resource.canonical if route.resource is not None else ""
            if route.method in ("GET", "POST", "PUT") and path:
                paths.setdefault(path, {})[route.method.lower()] = {"summary": path.strip("/").replace("_", " ")}
        return _json({"openapi": "3.1.0", "info": {"title": "FastAPI", "version": "0.1.0"}, "paths": paths})

    # ----- generation
    def _not_ready(self) -> Optional[web.Response]:
        if self.s.status == "exiting":
            return _error("The server is shutting down.", 503, "ServiceUnavailableError")
        if self.s.status != "ready":
            return _error("The server is not ready yet.", 503, "ServiceUnavailableError")
        return None

    def _submit(self, prompt: Any, input_ids: Any, max_new: int, ignore_eos: bool,
                rid: Optional[str] = None, sampled: Optional[Sampling] = None, internal: bool = False) -> GenRequest:
        if input_ids is not None:
            if not isinstance(input_ids, list) or not all(isinstance(i, int) for i in input_ids):
                raise ValueError("input_ids must be a list of integers")
            words, tokens = self.vocab.words_of(input_ids), len(input_ids)
        elif not isinstance(prompt, str):
            raise ValueError("text must be a string or a list of strings")
        else:
            words = count_prompt_tokens(prompt)
            tokens = len(words) + 1          # the tokenizer's BOS, as the engine counts a text prompt
        refused = context_error(tokens, max_new, self.s.cap.context_len)
        if refused:
            raise ValueError(refused)
        return self.s.engine.submit(words, max_new, ignore_eos, rid, prompt_tokens=tokens, sampled=sampled,
                                    internal=internal)

    async def tokenize(self, request: web.Request) -> web.Response:
        """SGLang 0.5.17's /tokenize: ``prompt`` (a string or a list of them) or chat ``messages``; ``tokens`` and
        ``count`` (a list of each for a list of prompts), ``max_model_len``."""
        body = await _body(request)
        prompt = body.get("prompt")
        if isinstance(body.get("messages"), list):
            prompt = scoring.chat_prompt(body["messages"])
        if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
            tokens: Any = [self.vocab.ids(count_prompt_tokens(p)) for p in prompt]
            count: Any = [len(t) for t in tokens]
        elif isinstance(prompt, str):
            tokens = self.vocab.ids(count_prompt_tokens(prompt))
            count = len(tokens)
        else:
            return _error("Invalid prompt type: expected str or List[str], or messages")
        return _json({"tokens": tokens, "count": count, "max_model_len": self.s.cap.context_len})

    async def _score(self, body: dict[str, Any], max_new: int) -> web.Response:
        """A non-streaming ``/generate`` of ``input_ids`` with ``return_logprob``: the engine prefills it (and
        generates ``max_new`` greedy tokens: 0 or 1 for scoring) without a trace line, and the answer's meta_info
        holds ``input_token_logprobs`` from ``logprob_start_len`` on (scoring.py)."""
        ids = body.get("input_ids")
        start = int(body.get("logprob_start_len", -1))
        req = self._submit(None, ids, max_new, True, body.get("rid"), internal=True)
        await self._drain(req)
        out = self._gen_out(req, req.completion_tokens, True, None)
        out["meta_info"]["input_token_logprobs"] = scoring.input_token_logprobs(list(req.prompt), ids, start)
        out["meta_info"]["output_token_logprobs"] = []
        return _json(out)

    def _meta(self, req: GenRequest, count: int, finished: bool) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "id": req.rid,
            "finish_reason": req.finished_reason if finished else None,
            "prompt_tokens": req.prompt_tokens,
            "weight_version": "default",
            "completion_tokens": count,
            "cached_tokens": req.cached_tokens,
        }
        if self.s.args.speculative_algorithm and finished:
            # per-request spec fields in the final chunk only (both versions; engines-2026.md A4), 0.5.23 names
            meta["spec_verify_ct"] = req.verify_ct
            meta["spec_accept_length"] = count / req.verify_ct if req.verify_ct else 0.0
            k = max(1, (self.s.args.speculative_num_draft_tokens or 1) - 1)
            # as SGLang counts: every cycle's correct proposals, the last cycle's also past the request's end
            # (the histogram's weighted sum; the known-truth facts), so they can exceed count - verify_ct by a few
            hist = list(req.accept_hist) if finished else []
            correct = sum(j * c for j, c in enumerate(hist)) if hist else max(0, count - req.verify_ct)
            proposed = req.verify_ct * k
            old = versions.current().name == "0.5.9"
            meta["spec_accept_token_num" if old else "spec_num_correct_drafts"] = correct
            meta["spec_draft_token_num" if old else "spec_num_proposed_drafts"] = proposed
            if hist:
                meta["spec_accept_histogram" if old else "spec_correct_drafts_histogram"] = hist
            if not old:
                meta["spec_accept_rate"] = correct / proposed if proposed else 0.0
        if finished:
            meta["e2e_latency"] = (req.finished_at or time.time()) - req.created
        return meta

    def _gen_out(self, req: GenRequest, count: int, finished: bool, index: Optional[int]) -> dict[str, Any]:
        out = {"text": req.text(count), "output_ids": req.output_ids[:count],
               "meta_info": self._meta(req, count, finished)}
        if index is not None:
            out["index"] = index
        return out

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await _body(request)
        if (resp := self._not_ready()) is not None:
            return resp
        sp = body.get("sampling_params") or {}
        max_new = int(sp.get("max_new_tokens", 128))
        ignore_eos = bool(sp.get("ignore_eos", False))
        text, ids = body.get("text"), body.get("input_ids")
        batch = isinstance(text, list) or (isinstance(ids, list) and ids and isinstance(ids[0], list))
        try:
            sampled = _sampling(sp.get("temperature"), sp.get("top_p"))
            if body.get("return_logprob") and not batch and not body.get("stream") and isinstance(ids, list):
                return await self._score(body, max_new)
            if batch:
                items = text if isinstance(text, list) else ids
                reqs = [self._submit(t if isinstance(text, list) else None,
                                     None if isinstance(text, list) else t, max_new, ignore_eos, sampled=sampled)
                        for t in items]
            else:
                reqs = [self._submit(text, ids, max_new, ignore_eos, body.get("rid"), sampled)]
        except ValueError as exc:
            return _json({"error": {"message": str(exc)}}, 400)
        if not body.get("stream"):
            await asyncio.gather(*(self._drain(r) for r in reqs))
            outs = [self._gen_out(r, r.completion_tokens, True, None) for r in reqs]
            return _json(outs if batch else outs[0])
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        out = _StreamOut(resp, self.s.buffered_stream)
        try:
            await self._stream_many(out, reqs, batch)
            await _after_the_step()
            await out.write(b"data: [DONE]\n\n")
            await out.end()
        except (ConnectionResetError, asyncio.CancelledError):
            for r in reqs:
                self.s.engine.abort(r)
            raise
        return resp

    async def _stream_many(self, resp: "_StreamOut", reqs: list[GenRequest], batch: bool) -> None:
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(i: int, r: GenRequest) -> None:
            while True:
                em = await r.queue.get()
                await queue.put((i, r, em))
                if em.finished:
                    return
        tasks = [asyncio.create_task(pump(i, r)) for i, r in enumerate(reqs)]
        try:
            left = len(reqs)
            while left:
                i, r, em = await queue.get()
                payload = self._gen_out(r, em.count, em.finished, i if batch else None)
                await resp.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
                if em.finished:
                    left -= 1
        finally:
            for t in tasks:
                t.cancel()

    # ----- OpenAI
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, chat=True)

    async def _openai(self, request: web.Request, chat: bool) -> web.StreamResponse:
        body = await _body(request)
        if (resp := self._not_ready()) is not None:
            return resp
        if chat:
            msgs = body.get("messages")
            if not isinstance(msgs, list) or not msgs:
                return _error("messages must be a non-empty list")
            prompt = scoring.chat_prompt(msgs)
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1:
                prompt = prompt[0]
            if not isinstance(prompt, str):
                return _error("prompt must be a string")
        max_tokens = body.get("max_completion_tokens") if chat else None
        max_tokens = max_tokens or body.get("max_tokens") or (None if chat else 16)
        if max_tokens is None:
            max_tokens = 128
        ignore_eos = bool(body.get("ignore_eos", False))
        token_ids = bool(body.get("return_token_ids"))
        try:
            req = self._submit(prompt, None, int(max_tokens), ignore_eos,
                               sampled=_sampling(body.get("temperature"), body.get("top_p")))
        except ValueError as exc:
            return _error(str(exc))
        model = body.get("model") or self.s.args.served_model_name
        rid = req.rid
        created = int(time.time())
        obj = "chat.completion" if chat else "text_completion"

        def usage() -> dict[str, Any]:
            return {"prompt_tokens": req.prompt_tokens, "completion_tokens": req.completion_tokens,
                    "total_tokens": req.prompt_tokens + req.completion_tokens, "prompt_tokens_details": None}

        def reason() -> Optional[str]:
            fr = req.finished_reason or {}
            return fr.get("type")

        if not body.get("stream"):
            await self._drain(req)
            if chat:
                choice = {"index": 0, "message": {"role": "assistant", "content": req.text(),
                                                  "reasoning_content": None, "tool_calls": None},
                          "logprobs": None, "finish_reason": reason(), "matched_stop": None}
            else:
                choice = {"index": 0, "text": req.text(), "logprobs": None, "finish_reason": reason(),
                          "matched_stop": None}
            if token_ids:
                choice["token_ids"] = list(req.output_ids)
            return _json({"id": rid, "object": obj, "created": created, "model": model,
                          "choices": [choice], "usage": usage()})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        chunk_obj = "chat.completion.chunk" if chat else "text_completion"
        out = _StreamOut(resp, self.s.buffered_stream)

        async def send(choices: list[dict[str, Any]], use: Optional[dict[str, Any]] = None) -> None:
            payload = {"id": rid, "object": chunk_obj, "created": created, "model": model,
                       "choices": choices, "usage": use}
            await out.write(b"data: " + json.dumps(payload).encode() + b"\n\n")

        try:
            sent = 0
            first = True
            while True:
                em = await req.queue.get()
                delta = req.text(em.count)[len(req.text(sent)):]
                before, sent = sent, em.count
                fr = reason() if em.finished else None
                if chat:
                    d: dict[str, Any] = {"content": delta}
                    if first:
                        d = {"role": "assistant", "content": delta}
                    choice = {"index": 0, "delta": d, "logprobs": None, "finish_reason": fr, "matched_stop": None}
                else:
                    choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": fr, "matched_stop": None}
                if token_ids:       # SGLang 0.5.17 / vLLM 0.32 return_token_ids: the chunk's new ids
                    choice["token_ids"] = req.output_ids[before:em.count]
                first = False
                await send([choice])
                if em.finished:
                    break
            await _after_the_step()
            opts = body.get("stream_options") or {}
            if isinstance(opts, dict) and opts.get("include_usage"):
                await send([], usage())
            await out.write(b"data: [DONE]\n\n")
            await out.end()
        except (ConnectionResetError, asyncio.CancelledError):
            self.s.engine.abort(req)
            raise
        return resp

    # ----- profiling (engines-2026.md A6; sglang.md /start_profile)
    async def start_profile(self, request: web.Request) -> web.Response:
        body = await _body(request)
        eng = self.s.engine
        if eng.profiler is not None:
            return web.Response(status=400, text="Profiling is already in progress. Call /stop_profile first.\n")
        try:
            eng.profiler = Profiler.from_request(body, os.environ,
                                                 phase_spans=versions.current().name != "0.5.9")
        except ProfileRequestError as exc:
            return web.Response(status=400, text=f"{exc}\n")
        return web.Response(text="Start profiling.\n")

    async def stop_profile(self, request: web.Request) -> web.Response:
        self.s.engine.finish_profile()
        return web.Response(text="Stop profiling. This will take some time.\n")

    # ----- metrics
    async def metrics(self, request: web.Request) -> web.Response:
        if not self.s.args.enable_metrics:
            return web.Response(status=404, text="Not Found")
        eng = self.s.engine
        new = versions.current().name != "0.5.9"
        model = f'model_name="{self.s.args.served_model_name}",engine_type="unified"'
        labels = f'{model},tp_rank="0",pp_rank="0"'
        sched = f'{model},moe_ep_rank="0",pp_rank="0",tp_rank="0"'    # scheduler metrics (0.5.17 probe)
        lines: list[str] = []

        def metric(name: str, kind: str, help_text: str, value: float) -> None:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            lines.append(f"{name}{{{labels}}} {float(value)}")

        def family(name: str, help_text: str, label: str, values: dict[str, float]) -> None:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} counter")
            for key, value in values.items():
                lines.append(f'{name}{{{label}="{key}",{sched}}} {float(value)}')

        metric("sglang:num_running_reqs", "gauge", "The number of running requests.", len(eng.running))
        metric("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.", len(eng.waiting))
        metric("sglang:token_usage", "gauge", "The token usage.", eng.stats.last_token_usage)
        metric("sglang:gen_throughput", "gauge", "The generation throughput (token/s).",
               eng.stats.last_gen_throughput)
        metric("sglang:spec_accept_length", "gauge", "The average acceptance length of speculative decoding.",
               eng.stats.last_accept_length)
        metric("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
               eng.stats.prompt_tokens_total)
        metric("sglang:generation_tokens_total", "counter", "Number of generation tokens processed.",
               eng.stats.generation_tokens_total)
        metric("sglang:num_requests_total", "counter", "Number of requests processed.",
               eng.stats.num_requests_total)
        if new:     # 0.5.23 only (engines-2026.md A5)
            metric("sglang:spec_verify_calls_total", "counter", "Number of speculative verify calls.",
                   eng.stats.spec_verify_calls_total)
            family("sglang:cuda_graph_passes_total", "Total number of forward passes categorized by CUDA graph.",
                   "mode", dict(eng.stats.graph_passes))
            if eng.timing.env.get("SGLANG_ENABLE_METRICS_DEVICE_TIMER") == "1":
                family("sglang:forward_execution_seconds_total",
                       "Total time that GPU is busy executing model forward passes. Refer to ForwardMode for "
                       "category labels.", "category", dict(eng.stats.forward_s))
        return web.Response(text="\n".join(lines) + "\n",
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


