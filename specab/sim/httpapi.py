"""HTTP endpoints of the simulated SGLang server (aiohttp), same paths, statuses and JSON as SGLang 0.5.x.

/health, /health_generate, /get_server_info, /server_info, /get_model_info, /model_info, /v1/models,
/generate (SSE stream or JSON; with ``return_logprob`` and ``logprob_start_len`` the input's log-probabilities,
scoring.py), /v1/completions, /v1/chat/completions, /tokenize and /v1/tokenize, /flush_cache, /metrics,
/start_profile, /stop_profile, /openapi.json. A request with a temperature > 0 is sampled (sampling.py); without one it
is greedy.
"""
from __future__ import annotations

import asyncio
from functools import partial
import json
import os
import time
from typing import Any, Optional

from aiohttp import web

from specab.sim import versions
from specab.sim.engine import GenRequest, count_prompt_tokens
from specab.sim.limits import context_error
from specab.sim.profiler import Profiler, ProfileRequestError
from specab.sim.replies import (ServerState, finish_type, gen_out, metrics_text, model_info, openai_choice,
                                openai_request, openai_usage, openapi_doc, server_info, tokenized)
from specab.sim.sampling import Sampling
from specab.sim import scoring

HEALTH_CHECK_TIMEOUT_S = 20.0
FLUSH_TEXT = ("Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting "
              "requests, the operation will not be performed.)\n")


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


# (methods, path, Api handler): the SGLang routes the simulator serves
ROUTES = (("GET", "/health", "health"), ("GET", "/health_generate", "health"),
          ("GET", "/get_server_info", "get_server_info"), ("GET", "/server_info", "server_info"),
          ("GET", "/get_model_info", "get_model_info"), ("GET", "/model_info", "model_info"),
          ("GET", "/v1/models", "models"), ("POST PUT", "/generate", "generate"),
          ("POST", "/v1/completions", "completions"), ("POST", "/v1/chat/completions", "chat"),
          ("POST", "/tokenize", "tokenize"), ("POST", "/v1/tokenize", "tokenize"),
          ("GET POST", "/flush_cache", "flush_cache"), ("GET", "/metrics", "metrics"), ("GET", "/openapi.json", "openapi"),
          ("GET POST", "/start_profile", "start_profile"), ("GET POST", "/stop_profile", "stop_profile"))


class Api:
    def __init__(self, state: ServerState):
        self.s = state
        self.vocab = scoring.Vocab()

    # ----- app
    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._access_log])
        for methods, path, handler in ROUTES:
            for method in methods.split():      # a GET answers HEAD too, as Starlette's (SGLang's) routes do
                (app.router.add_get if method == "GET" else partial(app.router.add_route, method))(
                    path, getattr(self, handler))
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

    async def get_server_info(self, request: web.Request) -> web.Response:
        self.s.log.warning("Endpoint '/get_server_info' is deprecated and will be removed in a future version. "
                           "Please use '/server_info' instead.")
        return _json(server_info(self.s))

    async def server_info(self, request: web.Request) -> web.Response:
        return _json(server_info(self.s))

    async def get_model_info(self, request: web.Request) -> web.Response:
        self.s.log.warning("Endpoint '/get_model_info' is deprecated and will be removed in a future version. "
                           "Please use '/model_info' instead.")
        return _json(model_info(self.s))

    async def model_info(self, request: web.Request) -> web.Response:
        return _json({**model_info(self.s), "served_model_name": self.s.args.served_model_name,
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
        return _json(openapi_doc((r.method, r.resource.canonical if r.resource is not None else "")
                                 for r in request.app.router.routes()))

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
        body = await _body(request)
        try:
            return _json(tokenized(self.vocab, body, self.s.cap.context_len))
        except ValueError as exc:
            return _error(str(exc))

    async def _score(self, body: dict[str, Any], max_new: int) -> web.Response:
        """A non-streaming ``/generate`` of ``input_ids`` with ``return_logprob``: the engine prefills it (and
        generates ``max_new`` greedy tokens: 0 or 1 for scoring) without a trace line, and the answer's meta_info
        holds ``input_token_logprobs`` from ``logprob_start_len`` on (scoring.py)."""
        ids = body.get("input_ids")
        start = int(body.get("logprob_start_len", -1))
        req = self._submit(None, ids, max_new, True, body.get("rid"), internal=True)
        await self._drain(req)
        out = gen_out(self.s, req, req.completion_tokens, True, None)
        out["meta_info"]["input_token_logprobs"] = scoring.input_token_logprobs(list(req.prompt), ids, start)
        out["meta_info"]["output_token_logprobs"] = []
        return _json(out)

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
            outs = [gen_out(self.s, r, r.completion_tokens, True, None) for r in reqs]
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
                payload = gen_out(self.s, r, em.count, em.finished, i if batch else None)
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
        try:
            prompt, max_tokens = openai_request(body, chat)
            req = self._submit(prompt, None, max_tokens, bool(body.get("ignore_eos", False)),
                               sampled=_sampling(body.get("temperature"), body.get("top_p")))
        except ValueError as exc:
            return _error(str(exc))
        token_ids = bool(body.get("return_token_ids"))
        model = body.get("model") or self.s.args.served_model_name
        rid = req.rid
        created = int(time.time())
        obj = "chat.completion" if chat else "text_completion"
        if not body.get("stream"):
            await self._drain(req)
            return _json({"id": rid, "object": obj, "created": created, "model": model,
                          "choices": [openai_choice(req, chat, token_ids)], "usage": openai_usage(req)})
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
                fr = finish_type(req) if em.finished else None
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
                await send([], openai_usage(req))
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
        return web.Response(text=metrics_text(self.s),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


