"""What the simulated SGLang server answers, as plain data from its state: /server_info, /generate's meta_info,
/metrics' text, an OpenAI request's prompt and length (the aiohttp handlers of httpapi.py send them)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

from specab.sim import scoring, versions
from specab.sim.args import ServerArgs
from specab.sim.engine import Engine, GenRequest, count_prompt_tokens
from specab.sim.loadplan import Capacity
from specab.sim.simlog import SimLogger


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


def internal_state(s: ServerState) -> dict[str, Any]:
    """/server_info's internal_states entry: throughput, memory, load, acceptance."""
    eng = s.engine
    st: dict[str, Any] = {
        "last_gen_throughput": eng.stats.last_gen_throughput,
        "memory_usage": {"weight": round(s.cap.weights_mib / 1024, 2),
                         "kvcache": round(s.cap.kv_mib / 1024, 2),
                         "token_capacity": s.cap.max_total_num_tokens,
                         "graph": round(s.cap.graph_mib / 1024, 2)},
        "load": len(eng.running) + len(eng.waiting),
    }
    if s.args.speculative_algorithm:
        st["avg_spec_accept_length"] = eng.avg_spec_accept_length
    return st


def server_info(s: ServerState) -> dict[str, Any]:
    """/server_info (and /get_server_info): the server args as the version shows them, the capacity, the state."""
    args = s.args.to_dict()
    if versions.current().name != "0.5.9":
        # 0.5.23: no cuda_graph_max_bs/_bs keys; the resolved graph settings sit in cuda_graph_config
        a = s.args
        max_bs = s.engine.timing.cuda_graph_max_bs
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
            "max_total_num_tokens": s.cap.max_total_num_tokens,
            "max_req_input_len": s.cap.context_len - 5,
            "internal_states": [internal_state(s)],
            "version": s.version,
            "startup_time": s.started_at,
            "simulator": {**s.simulator,
                          "schedule_lag_max_s": round(s.engine.stats.schedule_lag_max_s, 4),
                          "schedule_resets": s.engine.stats.schedule_resets}}


def meta(s: ServerState, req: GenRequest, count: int, finished: bool) -> dict[str, Any]:
    """/generate's meta_info of a request after ``count`` tokens (its final chunk's when ``finished``)."""
    meta: dict[str, Any] = {
        "id": req.rid,
        "finish_reason": req.finished_reason if finished else None,
        "prompt_tokens": req.prompt_tokens,
        "weight_version": "default",
        "completion_tokens": count,
        "cached_tokens": req.cached_tokens,
    }
    if s.args.speculative_algorithm and finished:
        # per-request spec fields in the final chunk only (both versions; engines-2026.md A4), 0.5.23 names
        meta["spec_verify_ct"] = req.verify_ct
        meta["spec_accept_length"] = count / req.verify_ct if req.verify_ct else 0.0
        k = max(1, (s.args.speculative_num_draft_tokens or 1) - 1)
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



def gen_out(s: ServerState, req: GenRequest, count: int, finished: bool, index: int | None) -> dict[str, Any]:
    """One /generate answer (or stream chunk) of a request after ``count`` tokens (``index``: its place in a batch)."""
    out = {"text": req.text(count), "output_ids": req.output_ids[:count], "meta_info": meta(s, req, count, finished)}
    if index is not None:
        out["index"] = index
    return out


def metrics_text(s: ServerState) -> str:
    """/metrics: the Prometheus text of the simulated version's metrics."""
    eng = s.engine
    new = versions.current().name != "0.5.9"
    model = f'model_name="{s.args.served_model_name}",engine_type="unified"'
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
    return "\n".join(lines) + "\n"


def openai_request(body: dict[str, Any], chat: bool) -> tuple[str, int]:
    """The prompt (a chat's messages joined under the model's chat template) and the tokens asked for of an OpenAI
    completion or chat request; ValueError for a request SGLang refuses."""
    if chat:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise ValueError("messages must be a non-empty list")
        prompt = scoring.chat_prompt(msgs)
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise ValueError("prompt must be a string")
    max_tokens = body.get("max_completion_tokens") if chat else None
    max_tokens = max_tokens or body.get("max_tokens") or (None if chat else 16)
    return prompt, int(128 if max_tokens is None else max_tokens)


def finish_type(req: GenRequest) -> str | None:
    """An OpenAI choice's finish_reason: the type of the request's finish (length, stop, abort)."""
    return (req.finished_reason or {}).get("type")


def openai_usage(req: GenRequest) -> dict[str, Any]:
    return {"prompt_tokens": req.prompt_tokens, "completion_tokens": req.completion_tokens,
            "total_tokens": req.prompt_tokens + req.completion_tokens, "prompt_tokens_details": None}


def openai_choice(req: GenRequest, chat: bool, token_ids: bool) -> dict[str, Any]:
    """The one choice of a finished request's non-streamed OpenAI answer (with its token ids when asked)."""
    if chat:
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": req.text(),
                                                          "reasoning_content": None, "tool_calls": None},
                                  "logprobs": None, "finish_reason": finish_type(req), "matched_stop": None}
    else:
        choice = {"index": 0, "text": req.text(), "logprobs": None, "finish_reason": finish_type(req),
                  "matched_stop": None}
    if token_ids:
        choice["token_ids"] = list(req.output_ids)
    return choice


def model_info(s: ServerState) -> dict[str, Any]:
    """/get_model_info (and the start of /model_info)."""
    a = s.args
    return {"model_path": a.model_path, "tokenizer_path": a.tokenizer_path, "is_generation": True,
            "preferred_sampling_params": None, "weight_version": "default"}


def tokenized(vocab: scoring.Vocab, body: dict[str, Any], context_len: int) -> dict[str, Any]:
    """SGLang 0.5.17's /tokenize of ``prompt`` (a string or a list of them) or chat ``messages``: ``tokens`` and
    ``count`` (a list of each for a list of prompts), ``max_model_len``; ValueError for another prompt."""
    prompt = body.get("prompt")
    if isinstance(body.get("messages"), list):
        prompt = scoring.chat_prompt(body["messages"])
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        tokens: Any = [vocab.ids(count_prompt_tokens(p)) for p in prompt]
        count: Any = [len(t) for t in tokens]
    elif isinstance(prompt, str):
        tokens = vocab.ids(count_prompt_tokens(prompt))
        count = len(tokens)
    else:
        raise ValueError("Invalid prompt type: expected str or List[str], or messages")
    return {"tokens": tokens, "count": count, "max_model_len": context_len}



def openapi_doc(routes: Iterable[tuple[str, str]]) -> dict[str, Any]:
    """FastAPI's route list (/openapi.json), as SGLang's server (a FastAPI app) serves it: every path of the
    (method, path) routes with its methods."""
    paths: dict[str, dict[str, Any]] = {}
    for method, path in routes:
        if method in ("GET", "POST", "PUT") and path:
            paths.setdefault(path, {})[method.lower()] = {"summary": path.strip("/").replace("_", " ")}
    return {"openapi": "3.1.0", "info": {"title": "FastAPI", "version": "0.1.0"}, "paths": paths}
