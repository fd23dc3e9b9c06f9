"""The benchmark client against a scripted SSE server that knows when it emitted each token.

The server lives in this process, so its emit times (time.perf_counter) share the client's clock:
every client measurement can be checked against ground truth.
"""

from __future__ import annotations

import ast
import json
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from specab.node import loadgen
from tests.node.helpers import client_config, client_default_argv

LOADGEN = Path(loadgen.__file__)


@dataclass
class Script:
    """What the fake server streams for every request."""
    first_delay_s: float = 0.05          # request received -> first chunk (prefill)
    gap_s: float = 0.03                  # between later chunks
    chunks: list[int] = field(default_factory=lambda: [1, 3, 2, 3, 1, 2])  # tokens per chunk
    spec: bool = True                    # send spec_verify_ct in the final meta_info
    chunked: bool = True                 # HTTP/1.1 chunked transfer (uvicorn does this)
    meta_counts: bool = True             # generate: meta_info.completion_tokens
    ids_mode: str = "cumulative"         # generate output_ids: cumulative | incremental | none
    usage: str = "continuous"            # openai: continuous | final | none
    fail: str = ""                       # "" | http500 | cut | hang | error_event


class FakeServer:
    def __init__(self, script: Script) -> None:
        self.script = script
        self.emits: list[list[tuple[float, int]]] = []   # per request: (perf_counter, tokens)
        self.bodies: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                if self.path == "/v1/models":
                    body = json.dumps({"data": [{"id": "fake-model"}]}).encode()
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                else:
                    self.send_error(404)

            def do_POST(self) -> None:
                server.handle(self)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        s = self.script
        t_recv = time.perf_counter()
        body = json.loads(h.rfile.read(int(h.headers["Content-Length"])))
        with self.lock:
            self.bodies.append(body)
            emits: list[tuple[float, int]] = []
            self.emits.append(emits)
        if s.fail == "http500":
            msg = b'{"error": "boom"}'
            h.send_response(500)
            h.send_header("Content-Length", str(len(msg)))
            h.end_headers()
            h.wfile.write(msg)
            return
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        if s.chunked:
            h.send_header("Transfer-Encoding", "chunked")
        else:
            h.send_header("Connection", "close")
        h.end_headers()

        def send(obj: Any) -> None:
            data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
            if s.chunked:
                data = b"%x\r\n%s\r\n" % (len(data), data)
            h.wfile.write(data)
            h.wfile.flush()

        path = h.path
        total = 0
        ids: list[int] = []
        n_chunks = len(s.chunks)
        for k, n in enumerate(s.chunks):
            due = t_recv + s.first_delay_s + k * s.gap_s
            while (left := due - time.perf_counter()) > 0:
                time.sleep(min(left, 0.002))
            if s.fail == "hang" and k == 1:
                self.stop.wait(30)
                return
            if s.fail == "error_event" and k == 1:
                send({"error": {"message": "scheduler died"}})
                send(b"[DONE]")
                return
            total += n
            new_ids = list(range(total - n, total))
            ids += new_ids
            last = k == n_chunks - 1
            if path == "/generate":
                event: dict[str, Any] = {"text": "w" * total}
                if s.ids_mode == "cumulative":
                    event["output_ids"] = list(ids)
                elif s.ids_mode == "incremental":
                    event["output_ids"] = new_ids
                meta: dict[str, Any] = {"id": "r", "prompt_tokens": 7,
                                        "finish_reason": {"type": "length", "length": total} if last else None}
                if s.meta_counts:
                    meta["completion_tokens"] = total
                if last and s.spec:
                    meta["spec_verify_ct"] = n_chunks
                event["meta_info"] = meta
            else:
                chat = path.endswith("/chat/completions")
                choice: dict[str, Any] = {"index": 0, "finish_reason": "length" if last else None}
                if chat:
                    choice["delta"] = {"content": "w" * n}
                else:
                    choice["text"] = "w" * n
                event = {"id": "c", "choices": [choice]}
                if s.usage == "continuous":
                    event["usage"] = {"prompt_tokens": 7, "completion_tokens": total,
                                      "total_tokens": 7 + total}
            send(event)
            emits.append((time.perf_counter(), n))
            if s.fail == "cut" and k == 2:
                if s.chunked:
                    h.wfile.write(b"0\r\n\r\n")
                h.close_connection = True
                return
        if path != "/generate" and s.usage == "final":
            send({"id": "c", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": total,
                                                       "total_tokens": 7 + total}})
        send(b"[DONE]")
        if s.chunked:
            h.wfile.write(b"0\r\n\r\n")
            h.wfile.flush()


@pytest.fixture
def make_server():
    servers: list[FakeServer] = []

    def make(**kw: Any) -> FakeServer:
        srv = FakeServer(Script(**kw))
        servers.append(srv)
        return srv

    yield make
    for srv in servers:
        srv.close()


def run(srv: FakeServer, tmp_path: Path, **kw: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    cfg = client_config(srv.url, str(tmp_path / "bench.jsonl"), str(tmp_path / "bench_summary.json"), **kw)
    summary = loadgen.run_benchmark(cfg)
    records = [json.loads(line) for line in (tmp_path / "bench.jsonl").read_text().splitlines()]
    assert json.loads((tmp_path / "bench_summary.json").read_text()) == summary
    return summary, records


# ------------------------------------------------------------------------------------------------
# arithmetic, exactly


def test_record_arithmetic_is_exact_for_multi_token_chunks() -> None:
    counter = loadgen.ChunkCounter("generate")
    for total in (1, 4, 6):
        counter.feed({"meta_info": {"completion_tokens": total, "prompt_tokens": 9}})
    counter.feed({"meta_info": {"completion_tokens": 6, "spec_verify_ct": 3, "prompt_tokens": 9}})
    rec = {"chunk_t_s": [0.05, 0.07, 0.09], "chunk_tokens": [1, 3, 2]}
    loadgen._finish_record(rec, counter, 0.1)
    # 5 tokens after the first chunk arrived over 0.04 s; per-chunk timing would say 2 gaps.
    assert rec["decode_tok_s"] == pytest.approx(5 / 0.04, rel=1e-12)
    assert rec["tpot_s"] == pytest.approx((0.1 - 0.05) / 5, rel=1e-12)
    assert rec["ttft_s"] == 0.05
    assert rec["output_tokens"] == 6 and rec["prompt_tokens"] == 9
    assert rec["spec_verify_ct"] == 3 and rec["accept_len"] == 2.0
    assert rec["chunk_tokens_exact"] is True and rec["tokens_from"] == "completion_tokens"


def test_first_chunk_with_several_tokens_does_not_inflate_decode_speed() -> None:
    counter = loadgen.ChunkCounter("generate")
    for total in (4, 8):
        counter.feed({"meta_info": {"completion_tokens": total}})
    rec = {"chunk_t_s": [0.1, 0.3], "chunk_tokens": [4, 4]}
    loadgen._finish_record(rec, counter, 0.3)
    assert rec["decode_tok_s"] == pytest.approx(4 / 0.2)
    assert rec["spec_verify_ct"] is None and rec["accept_len"] is None


@pytest.mark.parametrize("first,second,expected", [
    ([5, 6], [5, 6, 7, 8], [2, 2]),    # cumulative: the second list extends the first
    ([5, 6], [7, 8, 9], [2, 3]),       # incremental
])
def test_output_ids_cumulative_or_incremental(first: list[int], second: list[int], expected: list[int]) -> None:
    counter = loadgen.ChunkCounter("generate")
    assert [counter.feed({"output_ids": first}), counter.feed({"output_ids": second})] == expected
    assert counter.source == "output_ids"


def test_openai_usage_final_only_gives_exact_total_and_flags_guessed_split() -> None:
    counter = loadgen.ChunkCounter("chat")
    assert counter.feed({"choices": [{"delta": {"role": "assistant", "content": ""}}]}) == 0
    assert counter.feed({"choices": [{"delta": {"content": "abc"}}]}) == 1
    assert counter.feed({"choices": [{"delta": {"content": "de"}}]}) == 1
    assert counter.feed({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5}}) == 0
    assert counter.reported_total == 5 and counter.exact is False and counter.prompt_tokens == 3


def test_prompts_are_deterministic_and_seeded() -> None:
    a = loadgen.make_prompts(1, "measure", 3, 50)
    assert a == loadgen.make_prompts(1, "measure", 3, 50)
    assert a != loadgen.make_prompts(2, "measure", 3, 50)
    assert all(len(p.split()) == 50 for p in a) and len(set(a)) == 3
    assert loadgen.dataset_hash(a) == loadgen.dataset_hash(list(a))
    assert loadgen.dataset_hash(a) != loadgen.dataset_hash(a[:2])


def test_loadgen_is_stdlib_only_and_python38_syntax() -> None:
    tree = ast.parse(LOADGEN.read_text(), feature_version=(3, 8))
    stdlib = set(sys.stdlib_module_names)
    for node in ast.walk(tree):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        for name in names:
            # stdlib, or the stdlib-only packages node_prepare ships with it (specab.node, specab.vocab)
            assert name.split(".")[0] in stdlib or name.startswith(("specab.node", "specab.vocab")), name
    # Builtin generics (list[int]) and X | Y in annotations are not evaluated thanks to the future
    # import; make sure nothing else of 3.9+ sneaks in.
    src = LOADGEN.read_text()
    assert "from __future__ import annotations" in src
    for newer in ("removeprefix", "removesuffix", "match ", "zip(strict"):
        assert newer not in src.replace("# ", ""), newer


# ------------------------------------------------------------------------------------------------
# against the scripted server


def _check_against_emits(rec: dict[str, Any], emits: list[tuple[float, int]], slack: float = 0.05) -> None:
    """Chunk token counts exact; chunk arrival gaps within `slack` of the server's emit gaps."""
    assert rec["chunk_tokens"] == [n for _, n in emits]
    for t_client, (t_emit, _) in zip(rec["chunk_t_s"], emits):
        assert abs((t_client - rec["chunk_t_s"][0]) - (t_emit - emits[0][0])) <= slack
    truth = (sum(n for _, n in emits) - emits[0][1]) / (emits[-1][0] - emits[0][0])
    assert rec["decode_tok_s"] == pytest.approx(truth, rel=0.35)   # generous: shared CI cores


def test_generate_stream_measured_against_server_emit_times(make_server, tmp_path: Path) -> None:
    srv = make_server()
    summary, records = run(srv, tmp_path, num_requests=2, warmup=1, input_len=16, output_len=12)
    assert [r["warmup"] for r in records] == [True, False, False]
    body = srv.bodies[-1]
    assert body["sampling_params"] == {"max_new_tokens": 12, "temperature": 0.0, "top_p": 1.0, "ignore_eos": True}
    assert body["stream"] is True and len(body["text"].split()) == 16
    for rec, emits in zip(records, srv.emits):
        assert rec["ok"] and rec["error"] is None
        assert rec["output_tokens"] == 12 and rec["prompt_tokens"] == 7
        assert rec["spec_verify_ct"] == 6 and rec["accept_len"] == 2.0
        assert rec["finish_reason"] == "length"
        assert rec["ttft_s"] >= 0.05
        assert rec["tpot_s"] == pytest.approx((rec["e2e_s"] - rec["ttft_s"]) / 11)
        span = rec["chunk_t_s"][-1] - rec["chunk_t_s"][0]
        assert rec["decode_tok_s"] == pytest.approx(11 / span)
        _check_against_emits(rec, emits)
    assert summary["requests"] == 2 and summary["ok"] == 2 and summary["failed"] == 0
    assert summary["accept_len_mean"] == 2.0 and summary["warmup_requests"] == 1
    assert summary["output_tok_s"] == pytest.approx(24 / summary["duration_s"])
    assert summary["dataset_hash"] == loadgen.dataset_hash(loadgen.make_prompts(1, "measure", 2, 16))
    assert summary["client_cpu_s"] >= 0


@pytest.mark.parametrize("api,usage", [("completions", "continuous"), ("chat", "continuous"),
                                       ("completions", "final"), ("chat", "final")])
def test_openai_streams(make_server, tmp_path: Path, api: str, usage: str) -> None:
    srv = make_server(usage=usage, spec=False)
    summary, records = run(srv, tmp_path, api=api, num_requests=1, warmup=0, output_len=12)
    rec = records[0]
    body = srv.bodies[0]
    assert body["model"] == "fake-model" and body["max_tokens"] == 12 and body["ignore_eos"] is True
    assert body["stream_options"]["include_usage"] is True
    assert ("messages" in body) == (api == "chat")
    assert rec["ok"] and rec["output_tokens"] == 12 and rec["accept_len"] is None
    if usage == "continuous":
        assert rec["chunk_tokens_exact"] and rec["tokens_from"] == "usage"
        _check_against_emits(rec, srv.emits[0])
    else:
        assert rec["chunk_tokens"] == [1] * 6 and rec["chunk_tokens_exact"] is False
        assert rec["decode_tok_s"] == pytest.approx(11 / (rec["chunk_t_s"][-1] - rec["chunk_t_s"][0]))


@pytest.mark.parametrize("api", ["generate", "completions", "chat"])
def test_the_sampling_settings_go_in_every_request_and_the_summary(make_server, tmp_path: Path, api: str) -> None:
    """bench.temperature and bench.top_p reach the engine on every API (generate: sampling_params) and the summary
    records them (the report's workload line, the distribution check)."""
    srv = make_server(spec=False)
    summary, _ = run(srv, tmp_path, api=api, num_requests=2, warmup=1, output_len=12, temperature=0.8, top_p=0.9)
    for body in srv.bodies:
        sent = body["sampling_params"] if api == "generate" else body
        assert (sent["temperature"], sent["top_p"]) == (0.8, 0.9), body
    assert (summary["temperature"], summary["top_p"]) == (0.8, 0.9)


@pytest.mark.parametrize("kw", [dict(meta_counts=False, ids_mode="incremental"),
                                dict(meta_counts=False, ids_mode="cumulative"),
                                dict(chunked=False)])
def test_generate_token_count_fallbacks(make_server, tmp_path: Path, kw: dict[str, Any]) -> None:
    srv = make_server(**kw)
    _, records = run(srv, tmp_path, num_requests=1, warmup=0)
    rec = records[0]
    assert rec["ok"] and rec["output_tokens"] == 12
    _check_against_emits(rec, srv.emits[0])


def test_concurrency_overlaps_requests(make_server, tmp_path: Path) -> None:
    srv = make_server(first_delay_s=0.1, gap_s=0.05)
    t0 = time.perf_counter()
    summary, records = run(srv, tmp_path, num_requests=8, warmup=0, concurrency=8)
    # Eight sequential requests would take >= 8 * 0.35 s.
    assert time.perf_counter() - t0 < 8 * 0.35
    assert summary["ok"] == 8 and sorted(r["i"] for r in records) == list(range(8))
    for rec in records:
        assert rec["chunk_tokens"] == [1, 3, 2, 3, 1, 2]


def test_arrivals_are_a_seeded_poisson_process_the_same_for_every_arm() -> None:
    due = loadgen.arrival_offsets(4.0, 4000, seed=1)
    assert due == loadgen.arrival_offsets(4.0, 4000, seed=1) != loadgen.arrival_offsets(4.0, 4000, seed=2)
    gaps = [b - a for a, b in zip(due, due[1:])]
    assert due[0] == 0.0 and all(g > 0 for g in gaps)
    assert abs(sum(gaps) / len(gaps) - 0.25) < 0.25 * 0.05          # mean gap 1/rate
    assert abs(statistics.pstdev(gaps) / 0.25 - 1) < 0.05             # exponential: sd = mean
    assert loadgen.arrival_offsets(0.0, 3, seed=1) == [0.0, 0.0, 0.0]  # a closed loop has no schedule


def test_an_open_load_sends_each_request_at_its_arrival_time(make_server, tmp_path: Path) -> None:
    """At a rate of 20 per second with every request's slot free (concurrency 6), request i goes no earlier than its
    seeded arrival; the warm-up is not scheduled; the summary records the rate."""
    srv = make_server(first_delay_s=0.01, gap_s=0.005)
    summary, records = run(srv, tmp_path, num_requests=6, warmup=1, concurrency=6, request_rate=20.0)
    due = loadgen.arrival_offsets(20.0, 6, seed=summary["seed"])
    measured = sorted((r for r in records if not r["warmup"]), key=lambda r: r["i"])
    t0 = measured[0]["start_ts"]
    for r in measured:
        assert r["start_ts"] - t0 >= due[r["i"]] - 0.005, (r["i"], r["start_ts"] - t0, due[r["i"]])
    assert due[-1] > 0.05 and summary["request_rate"] == 20.0 and summary["ok"] == 6


@pytest.mark.parametrize("procs", [1, 2])
def test_an_open_load_records_each_arrival_and_the_wait_for_a_slot(make_server, tmp_path: Path, procs: int) -> None:
    """At most 2 in flight at 40 arrivals per second for requests of ~0.1 s: later requests find both slots busy and
    go out late. Each record keeps its scheduled arrival (arrival_s, the seeded schedule's) and how long after it it
    was sent (arrival_wait_s): arrival + wait is when it went, on one clock with the others' (the client's threads
    and its worker processes alike); a closed loop's records have neither."""
    srv = make_server(first_delay_s=0.02, gap_s=0.02)
    summary, records = run(srv, tmp_path, num_requests=8, warmup=1, concurrency=2, request_rate=40.0,
                           client_procs=procs)
    due = loadgen.arrival_offsets(40.0, 8, seed=summary["seed"])
    measured = sorted((r for r in records if not r["warmup"]), key=lambda r: r["i"])
    t0 = measured[0]["start_ts"] - measured[0]["arrival_wait_s"]
    for r in measured:
        assert r["arrival_s"] == pytest.approx(due[r["i"]], abs=1e-6)
        assert r["start_ts"] - t0 == pytest.approx(r["arrival_s"] + r["arrival_wait_s"], abs=0.01), r["i"]
    assert max(r["arrival_wait_s"] for r in measured) > 0.05          # the slots were busy: a real wait
    assert all("arrival_s" not in r for r in records if r["warmup"])
    _, closed = run(srv, tmp_path, num_requests=2, warmup=0, concurrency=2, request_rate=0.0)
    assert all("arrival_s" not in r and "arrival_wait_s" not in r for r in closed)


@pytest.mark.parametrize("fail,needle", [("http500", "HTTP 500"), ("cut", "before 'data: [DONE]'"),
                                         ("error_event", "scheduler died"), ("hang", "timeout")])
def test_failures_are_recorded_not_fatal(make_server, tmp_path: Path, fail: str, needle: str) -> None:
    srv = make_server(fail=fail)
    summary, records = run(srv, tmp_path, num_requests=2, warmup=0, concurrency=2, timeout=1.0)
    assert len(records) == 2 and summary["failed"] == 2 and summary["ok"] == 0
    for rec in records:
        assert rec["ok"] is False and needle in rec["error"]
    assert summary["decode_tok_s_median"] is None


def test_connection_refused_is_a_recorded_error(tmp_path: Path) -> None:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = client_config("http://127.0.0.1:%d" % port, str(tmp_path / "b.jsonl"), None, num_requests=1, warmup=0,
                        timeout=5)
    summary = loadgen.run_benchmark(cfg)
    rec = json.loads((tmp_path / "b.jsonl").read_text())
    assert summary["failed"] == 1 and "ConnectionRefusedError" in rec["error"]


def test_cli_exit_codes_and_files(make_server, tmp_path: Path) -> None:
    srv = make_server()
    out, summ = tmp_path / "b.jsonl", tmp_path / "s.json"
    base = [sys.executable, str(LOADGEN), *client_default_argv(), "--url", srv.url, "--num-requests", "2", "--warmup", "1",
            "--input-len", "8", "--output-len", "12", "--out", str(out), "--summary", str(summ)]
    proc = subprocess.run(base, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(summ.read_text())
    pinned = {"requests", "ok", "failed", "decode_tok_s_median", "decode_tok_s_mean", "ttft_s_median",
              "tpot_s_median", "e2e_s_median", "accept_len_mean", "output_tok_s", "duration_s",
              "client_cpu_s"}
    assert pinned <= set(summary) and summary["ok"] == 2
    assert len(out.read_text().splitlines()) == 3

    srv.script.fail = "http500"
    proc = subprocess.run(base, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "HTTP 500" in proc.stderr
    assert len(out.read_text().splitlines()) == 3   # records kept

    proc = subprocess.run(base + ["--concurrency", "0"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--concurrency must be >= 1" in proc.stderr
    proc = subprocess.run(base + ["--request-rate", "-1"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--request-rate must be a number of requests per second >= 0" in proc.stderr


@pytest.mark.parametrize("names", [
    ("spec_num_correct_drafts", "spec_num_proposed_drafts"),     # SGLang 0.5.23 (tokenizer_manager.py:2507-2558)
    ("spec_accept_token_num", "spec_draft_token_num"),           # SGLang 0.5.9
])
def test_spec_fields_from_the_final_chunk_in_both_name_generations(names) -> None:
    """0.5.23 sends the per-request spec fields in the final chunk only, three of them renamed."""
    counter = loadgen.ChunkCounter("generate")
    for total in (1, 4):
        counter.feed({"meta_info": {"completion_tokens": total, "prompt_tokens": 9}})
    counter.feed({"meta_info": {"completion_tokens": 8, "prompt_tokens": 9, "finish_reason": {"type": "length"},
                                "spec_verify_ct": 4, "spec_accept_length": 2.0, names[0]: 4, names[1]: 8}})
    rec = {"chunk_t_s": [0.05, 0.07, 0.09], "chunk_tokens": [1, 3, 4]}
    loadgen._finish_record(rec, counter, 0.1)
    assert rec["spec_verify_ct"] == 4 and rec["accept_len"] == 2.0
    assert rec["spec_correct_drafts"] == 4 and rec["spec_proposed_drafts"] == 8


def test_a_queue_entrys_bench_reaches_the_client_with_ignore_eos_and_dataset() -> None:
    """The sequencer's typed spec: a queue entry's bench (roles/specab's values, ignore_eos and the dataset's node
    path included) becomes the client's command line and back unchanged; a bench without ignore_eos is refused
    (the controller resolves it, the client has no default)."""
    from specab.config import defaults
    bench = dict(defaults.bench({}), ignore_eos=False, dataset="/node/datasets/chat.jsonl", api="chat")
    cfg = loadgen.BenchConfig.from_settings("http://127.0.0.1:1", bench, out="b.jsonl", summary="s.json",
                                            phase_metrics="p.json")
    assert cfg.ignore_eos is False and cfg.dataset == "/node/datasets/chat.jsonl"
    argv = cfg.to_argv()
    assert argv[argv.index("--ignore-eos") + 1] == "false" and argv[argv.index("--dataset") + 1] == cfg.dataset
    assert loadgen.parse_args(argv) == cfg
    synthetic = loadgen.BenchConfig.from_settings("http://127.0.0.1:1", defaults.bench({}), out="b.jsonl",
                                                  summary="s.json", phase_metrics=None)
    assert synthetic.ignore_eos is defaults.get("bench_ignore_eos") and "--dataset" not in synthetic.to_argv()
    with pytest.raises(loadgen.UsageError, match="lack ignore_eos"):
        loadgen.BenchConfig.from_settings("http://127.0.0.1:1", {k: v for k, v in bench.items() if k != "ignore_eos"},
                                          out="b.jsonl", summary=None, phase_metrics=None)
    with pytest.raises(SystemExit):     # the command line has no default either
        loadgen.parse_args([w for i, w in enumerate(argv) if "--ignore-eos" not in argv[max(i - 1, 0):i + 1]])
