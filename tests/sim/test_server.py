"""Every endpoint of the simulated server and its JSON fields (one speculative and one baseline server)."""
from __future__ import annotations

import http.client
import json

import pytest

from tests.sim.client import request_json, stream
from tests.sim.conftest import EAGLE_S2, TUNED

PROMPT = "Explain speculative decoding to a new engineer. " * 8


@pytest.fixture(scope="module")
def spec_server(module_launch):
    return module_launch([*EAGLE_S2, "--enable-metrics", "--decode-log-interval", "5", "--mem-fraction-static", "0.88"],
                  env=TUNED, scale=20)


def gen_body(n: int = 32, stream_: bool = False, **extra) -> dict:
    return {"text": PROMPT, "sampling_params": {"max_new_tokens": n, "ignore_eos": True, "temperature": 0},
            "stream": stream_, **extra}


def test_server_info_has_sglang_fields_after_the_rules(spec_server):
    for path in ("/get_server_info", "/server_info"):
        status, info, _ = request_json(spec_server.port, "GET", path)
        assert status == 200
        assert info["tp_size"] == 2 and info["mem_fraction_static"] == 0.88
        assert info["speculative_algorithm"] == "EAGLE3"
        assert (info["speculative_num_steps"], info["speculative_eagle_topk"],
                info["speculative_num_draft_tokens"]) == (2, 1, 3)
        # 0.5.23 (the default): overlap kept on under spec; graph settings in cuda_graph_config (engines-2026.md A2/A4)
        assert info["max_running_requests"] == 48 and info["disable_overlap_schedule"] is False
        assert "cuda_graph_max_bs" not in info and info["cuda_graph_config"]["decode"]["backend"] == "full"
        assert info["cuda_graph_config"]["decode"]["max_bs"] >= 1
        assert info["host"] == "127.0.0.1" and info["port"] == spec_server.port
        assert info["model_path"] == "/models/Kimi-K2.5-INT4" and info["version"].startswith("0.5.")
        state = info["internal_states"][0]
        assert {"avg_spec_accept_length", "last_gen_throughput"} <= set(state)
    assert "Endpoint '/get_server_info' is deprecated" in spec_server.log_text()


def test_model_info_endpoints(spec_server):
    status, old, _ = request_json(spec_server.port, "GET", "/get_model_info")
    assert status == 200 and old["model_path"] == "/models/Kimi-K2.5-INT4" and old["is_generation"] is True
    assert {"tokenizer_path", "preferred_sampling_params", "weight_version"} <= set(old)
    status, new, _ = request_json(spec_server.port, "GET", "/model_info")
    assert status == 200 and new["served_model_name"] == "/models/Kimi-K2.5-INT4" and new["architectures"]
    status, models, _ = request_json(spec_server.port, "GET", "/v1/models")
    assert models["data"][0]["id"] == "/models/Kimi-K2.5-INT4"


def test_generate_non_streaming_meta_info(spec_server):
    status, out, _ = request_json(spec_server.port, "POST", "/generate", gen_body(40))
    assert status == 200
    meta = out["meta_info"]
    assert meta["completion_tokens"] == 40 and len(out["output_ids"]) == 40
    assert meta["finish_reason"] == {"type": "length", "length": 40}
    assert meta["prompt_tokens"] > 60 and meta["e2e_latency"] > 0
    assert 1 <= meta["spec_verify_ct"] < 40
    assert meta["spec_accept_length"] == pytest.approx(40 / meta["spec_verify_ct"])
    assert len(out["text"].split()) == 40


def test_generate_streaming_sse_one_chunk_per_verify_step(spec_server):
    res = stream(spec_server.port, "/generate", gen_body(64, True))
    assert res.status == 200 and res.done
    assert all(line.startswith(b"data: ") or line == b"\n" for line in res.raw_lines)
    assert res.raw_lines[-2:] == [b"\n", b"data: [DONE]\n"], "events end with a blank line; the last is [DONE]"
    counts = [c["meta_info"]["completion_tokens"] for c in res.chunks]
    assert counts == sorted(counts) and counts[-1] == 64
    steps = [b - a for a, b in zip(counts, counts[1:])]
    assert max(steps) > 1 and all(1 <= s <= 3 for s in steps), "a verify step carries 1..steps+1 tokens"
    texts = [c["text"] for c in res.chunks]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:])), "text is cumulative"
    final = res.final["meta_info"]
    assert final["finish_reason"]["type"] == "length" and final["spec_verify_ct"] == len(res.chunks) - 1
    assert res.chunks[0]["meta_info"]["finish_reason"] is None
    # spec fields in the final chunk only, under 0.5.23's names (engines-2026.md A4)
    assert not any(k.startswith("spec_") for c in res.chunks[:-1] for k in c["meta_info"])
    # as SGLang counts: every cycle's correct proposals (the histogram's), the last cycle's also past the 64th token
    hist = final["spec_correct_drafts_histogram"]
    assert sum(hist) == final["spec_verify_ct"] and len(hist) == 3
    assert final["spec_num_correct_drafts"] == sum(j * c for j, c in enumerate(hist)) >= 64 - final["spec_verify_ct"] - 1
    assert final["spec_num_proposed_drafts"] == final["spec_verify_ct"] * 2


def test_generate_without_ignore_eos_may_stop_early(spec_server):
    status, out, _ = request_json(spec_server.port, "POST", "/generate",
                                  {"text": PROMPT, "sampling_params": {"max_new_tokens": 64}})
    meta = out["meta_info"]
    assert 32 <= meta["completion_tokens"] <= 64
    if meta["completion_tokens"] < 64:
        assert meta["finish_reason"]["type"] == "stop"


def test_openai_completions_and_chat(spec_server):
    body = {"model": "x", "prompt": PROMPT, "max_tokens": 24, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    res = stream(spec_server.port, "/v1/completions", body)
    assert res.done and res.chunks[-1]["choices"] == []
    usage = res.chunks[-1]["usage"]
    assert usage["completion_tokens"] == 24 and usage["total_tokens"] == usage["prompt_tokens"] + 24
    assert res.chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert all(c["object"] == "text_completion" for c in res.chunks)
    text = "".join(c["choices"][0]["text"] for c in res.chunks[:-1])
    assert len(text.split()) == 24
    no_usage = stream(spec_server.port, "/v1/completions", {**body, "stream_options": None})
    assert all(c["choices"] for c in no_usage.chunks)
    chat = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    res = stream(spec_server.port, "/v1/chat/completions", chat)
    assert res.done and res.chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert res.chunks[-1]["usage"]["completion_tokens"] == 16
    assert all(c["object"] == "chat.completion.chunk" for c in res.chunks)
    status, out, _ = request_json(spec_server.port, "POST", "/v1/chat/completions", {**chat, "stream": False})
    assert status == 200 and out["choices"][0]["message"]["role"] == "assistant"
    assert out["usage"]["completion_tokens"] == 16 and out["object"] == "chat.completion"


def test_a_request_beyond_the_context_length_is_refused_with_sglangs_own_error(spec_server):
    """A 10,001-token prompt at a 4096-token context ran "ok" on the simulator; SGLang's TokenizerManager refuses a
    prompt of the context length or more, and a prompt and answer beyond it, before the scheduler sees them (400,
    its own words: python/sglang/srt/managers/tokenizer_manager.py, _validate_one_request)."""
    ctx = request_json(spec_server.port, "GET", "/model_info")[1]["context_length"]
    status, out, _ = request_json(spec_server.port, "POST", "/generate",
                                  {"input_ids": [7] * ctx, "sampling_params": {"max_new_tokens": 8}})
    assert status == 400 and out == {"error": {"message": f"The input ({ctx} tokens) is longer than the model's "
                                                          f"context length ({ctx} tokens)."}}
    status, out, _ = request_json(spec_server.port, "POST", "/generate", gen_body(10_000_000))
    n = len(PROMPT.split()) + len([c for c in PROMPT if c == "."]) + 1    # words, full stops, BOS
    assert status == 400 and out["error"]["message"] == (
        f"Requested token count exceeds the model's maximum context length of {ctx} tokens. You requested a total of "
        f"{n + 10_000_000} tokens: {n} tokens from the input messages and 10000000 tokens for the completion. Please "
        f"reduce the number of tokens in the input messages or the completion to fit within the limit.")
    status, out, _ = request_json(spec_server.port, "POST", "/v1/completions",
                                  {"model": "x", "prompt": PROMPT, "max_tokens": 10_000_000})
    assert status == 400 and out["object"] == "error" and out["type"] == "BadRequestError" and out["code"] == 400
    assert out["message"].startswith(f"Requested token count exceeds the model's maximum context length of {ctx}")
    assert request_json(spec_server.port, "POST", "/generate", gen_body(8))[0] == 200     # within: served


def test_flush_cache_refuses_while_running_and_resets_accept_length(spec_server):
    """SGLang refuses /flush_cache (400) while a request runs and flushes (200, accept length reset) when idle.
    The request is held open by the test itself (first chunk read, then the rest left unread), so it is running
    when the flush arrives however slow the machine: a request that merely takes long raced a loaded CI box."""
    request_json(spec_server.port, "POST", "/generate", gen_body(32))
    _, info, _ = request_json(spec_server.port, "GET", "/server_info")
    assert info["internal_states"][0]["avg_spec_accept_length"] > 1.0
    conn = http.client.HTTPConnection("127.0.0.1", spec_server.port, timeout=60)
    try:
        conn.request("POST", "/generate", body=json.dumps(gen_body(200_000, True)).encode(),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200
        assert resp.readline().startswith(b"data: ")          # the request is running now (minutes of tokens left)
        status, text, _ = request_json(spec_server.port, "POST", "/flush_cache")
        assert status == 400 and "Cache flushed." in text
        assert "Cache not flushed because there are pending requests" in spec_server.log_text()
    finally:
        conn.close()                                           # the client goes away: the engine aborts it
    from tests.sim.conftest import wait_for
    wait_for(lambda: request_json(spec_server.port, "GET", "/server_info")[1]["internal_states"][0]["load"] == 0,
             30, "the abandoned request to be aborted")
    status, text, _ = request_json(spec_server.port, "GET", "/flush_cache")
    assert status == 200 and text.startswith("Cache flushed.")
    _, info, _ = request_json(spec_server.port, "GET", "/server_info")
    assert info["internal_states"][0]["avg_spec_accept_length"] == 0.0
    assert "Cache flushed successfully!" in spec_server.log_text()
    # the node's own record of every answer (the one-server-per-instance tests count the resets by it)
    flushes = [json.loads(line) for line in (spec_server.state / "flushes.jsonl").read_text().splitlines()]
    assert [f["ok"] for f in flushes] == [False, True] and len({f["instance"] for f in flushes}) == 1
    # the route list FastAPI serves, as SGLang's server does: what the node reads before it relies on the route
    _, routes, _ = request_json(spec_server.port, "GET", "/openapi.json")
    assert set(routes["paths"]["/flush_cache"]) == {"get", "post"} and "post" in routes["paths"]["/generate"]


def test_metrics_with_enable_metrics(spec_server):
    request_json(spec_server.port, "POST", "/generate", gen_body(64))
    status, text, headers = request_json(spec_server.port, "GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = line.split("{")[0]
            values[name] = float(line.rsplit(" ", 1)[1])
            assert 'model_name="/models/Kimi-K2.5-INT4"' in line and 'tp_rank="0"' in line
    for name in ("sglang:gen_throughput", "sglang:spec_accept_length", "sglang:generation_tokens_total",
                 "sglang:spec_verify_calls_total", "sglang:num_running_reqs"):
        assert name in values, name
    assert values["sglang:generation_tokens_total"] >= 64 and values["sglang:spec_verify_calls_total"] > 0
    assert values["sglang:spec_accept_length"] > 1.0 and values["sglang:gen_throughput"] > 0


def test_baseline_server_has_no_spec_fields_and_no_metrics(launch):
    srv = launch(["--decode-log-interval", "8"], env=TUNED, scale=20, tp=1)
    status, out, _ = request_json(srv.port, "POST", "/generate", gen_body(16))
    assert status == 200 and "spec_verify_ct" not in out["meta_info"]
    _, info, _ = request_json(srv.port, "GET", "/server_info")
    assert info["speculative_algorithm"] is None and info["max_running_requests"] is None
    assert "avg_spec_accept_length" not in info["internal_states"][0]
    assert request_json(srv.port, "GET", "/metrics")[0] == 404
    assert request_json(srv.port, "GET", "/health")[0] == 200
    batch = request_json(srv.port, "POST", "/generate",
                         {"text": ["a b c", "d e"], "sampling_params": {"max_new_tokens": 5, "ignore_eos": True}})
    assert [o["meta_info"]["completion_tokens"] for o in batch[1]] == [5, 5]


def test_trace_records_the_ground_truth_of_each_request(launch, tmp_path):
    import json
    trace = tmp_path / "trace.jsonl"
    srv = launch(EAGLE_S2, env={**TUNED, "SPECAB_SIM_TRACE": str(trace)}, scale=20, tp=1)
    res = stream(srv.port, "/generate", gen_body(48, True))
    from tests.sim.conftest import wait_for
    wait_for(lambda: trace.is_file() and trace.read_text().strip(), 10, "the trace line")
    rec = json.loads(trace.read_text().splitlines()[-1])
    assert rec["completion_tokens"] == 48 and sum(rec["emit_tokens"]) == 48
    assert len(rec["emit_mono"]) == len(res.chunks), "one emission per streamed chunk"
    assert rec["spec_verify_ct"] == res.final["meta_info"]["spec_verify_ct"]
    # one monotonic clock on the box: no chunk reaches the client before the server emitted it (a client-read rate
    # would compare the box's load, not the trace)
    assert all(read >= emitted for read, emitted in zip(res.chunk_t, rec["emit_mono"])), (res.chunk_t, rec)
    span = rec["emit_mono"][-1] - rec["emit_mono"][0]
    assert rec["decode_tok_s"] == pytest.approx((48 - 1) / span), "the seed's tok/s of the emission times"
    assert all(b >= a for a, b in zip(rec["emit_mono"], rec["emit_mono"][1:]))
    # each chunk is emitted at or after the time its schedule had it due, never before
    assert len(rec["emit_due"]) == len(rec["emit_mono"])
    assert all(emitted >= due for emitted, due in zip(rec["emit_mono"], rec["emit_due"])), rec
