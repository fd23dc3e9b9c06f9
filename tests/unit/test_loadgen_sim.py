"""The benchmark client against the simulated node (python -m specab.sim.launch_server), run as on a
node: loadgen.py as its own process. Its per-request accept length is cross-checked against the
server log's ``accept len`` read by the log parser, as the analysis does."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

from specab.analysis.evidence import logparse
from tests.node.helpers import client_default_argv

REPO = Path(__file__).resolve().parents[2]
NODE = REPO / "specab" / "node"
EAGLE_S2 = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/models/eagle3",
            "--speculative-num-steps", "2", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "3"]
SCALE = 20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Sim:
    def __init__(self, tmp: Path, args: list[str], scale: float = SCALE) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / "server.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SPECAB_SIM_", "NCCL_", "SGLANG_"))}
        env.update(PYTHONPATH=str(REPO), SPECAB_SIM_STATE=str(tmp / "state"), SPECAB_SIM_TIME_SCALE=str(scale))
        with open(self.log, "wb") as fh:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "specab.sim.launch_server", "--model-path", "/models/Kimi-K2.5-INT4",
                 "--tp-size", "2", "--host", "127.0.0.1", "--port", str(self.port), *args],
                env=env, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
                cwd=str(REPO))

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"simulated server exited: {self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/health_generate", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"simulated server not ready: {self.log.read_text()[-2000:]}")

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)


@pytest.fixture
def sim(tmp_path: Path) -> Iterator:
    started: list[Sim] = []

    def start(args: list[str], scale: float = SCALE) -> Sim:
        s = Sim(tmp_path, args, scale)
        started.append(s)
        s.wait_ready()
        return s

    yield start
    for s in started:
        s.kill()


def run_loadgen(url: str, tmp: Path, *extra: str) -> tuple[int, dict, list[dict]]:
    out, summ = tmp / "bench.jsonl", tmp / "bench_summary.json"
    proc = subprocess.run([sys.executable, str(NODE), "loadgen", *client_default_argv(), "--url", url, "--input-len", "32",
                           "--output-len", "64",
                           "--seed", "3", "--out", str(out), "--summary", str(summ), "--timeout", "120", *extra],
                          capture_output=True, text=True, timeout=300)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    return proc.returncode, json.loads(summ.read_text()), records


@pytest.mark.slow
def test_spec_arm_on_the_simulator(sim, tmp_path: Path) -> None:
    s = sim(EAGLE_S2)
    rc, summary, records = run_loadgen(s.url, tmp_path, "--num-requests", "6", "--warmup", "1",
                                       "--concurrency", "2")
    assert rc == 0, summary
    measured = [r for r in records if not r["warmup"]]
    assert len(measured) == 6 and summary["ok"] == 6
    for r in measured:
        assert r["output_tokens"] == 64 and sum(r["chunk_tokens"]) == 64
        assert r["tokens_from"] == "completion_tokens" and r["chunk_tokens_exact"]
        assert max(r["chunk_tokens"]) > 1            # speculation: multi-token chunks
        assert r["accept_len"] == pytest.approx(64 / r["spec_verify_ct"])
        assert 1.0 <= r["accept_len"] <= 3.0          # steps=2 -> at most 3 tokens per verify
    # The log's interval accept length and the client's per-request one measure the same thing.
    log = logparse.summarize(logparse.iter_records(s.log.read_text().splitlines()))
    assert log["decode_lines"] > 0 and log["ready_ts"] is not None and log["accept_len_lines"] > 0
    assert log["accept_len_mean"] == pytest.approx(summary["accept_len_mean"], rel=0.25)


@pytest.mark.slow
@pytest.mark.parametrize("api", ["completions", "chat"])
def test_baseline_openai_apis_on_the_simulator(sim, tmp_path: Path, api: str) -> None:
    # at a time scale of 2 a token takes milliseconds: at 20 (~0.6 ms a token) a client descheduled for a few ms on
    # a loaded box reads the backlog as a burst, rightly marks the request buffered and gives it no decode rate
    s = sim([], scale=2)
    rc, summary, records = run_loadgen(s.url, tmp_path, "--api", api, "--num-requests", "2", "--warmup", "0")
    assert rc == 0, summary
    for r in records:
        assert r["ok"] and r["output_tokens"] == 64 and r["accept_len"] is None
        assert r["decode_tok_s"] > 0 and r["ttft_s"] > 0
    assert summary["accept_len_mean"] is None


@pytest.mark.slow
def test_phase_metrics_window_on_the_simulator(sim, tmp_path: Path) -> None:
    """--phase-metrics: /metrics scraped around the measured requests only (the warm-up's verify calls are
    outside the window); a server without --enable-metrics gives "available": false with the reason."""
    s = sim([*EAGLE_S2, "--enable-metrics"])
    pm = tmp_path / "phase_metrics.json"
    rc, summary, records = run_loadgen(s.url, tmp_path, "--num-requests", "3", "--warmup", "1",
                                       "--phase-metrics", str(pm))
    assert rc == 0, summary
    res = json.loads(pm.read_text())
    measured = [r for r in records if not r["warmup"]]
    assert res["available"] and res["spec_verify_calls"] == sum(r["spec_verify_ct"] for r in measured)
    assert res["generation_tokens"] == 3 * 64 and res["window_s"] > 0
    assert res["forward_s"] == {} and "SGLANG_ENABLE_METRICS_DEVICE_TIMER" in res["reason"]


@pytest.mark.slow
def test_phase_metrics_without_enable_metrics(sim, tmp_path: Path) -> None:
    pm = tmp_path / "phase_metrics.json"
    plain = sim(EAGLE_S2)
    rc, _, _ = run_loadgen(plain.url, tmp_path, "--num-requests", "1", "--warmup", "0", "--phase-metrics", str(pm))
    res = json.loads(pm.read_text())
    assert rc == 0 and res == {"schema": 1, "available": False,
                               "reason": "before the measured requests: GET /metrics answered 404 "
                                         "(the server runs without --enable-metrics)"}


def test_a_chat_dataset_reaches_the_engine_as_messages_with_natural_lengths(sim, tmp_path: Path) -> None:
    """bench.dataset on the chat API: each record's messages are what the engine templated (its prompt tokens are
    the record's words plus the chat template's), each request keeps its record's category, the summary names the
    file with its sha256; with ignore_eos false the answers end where the engine ends them (finish reason stop, fewer
    tokens than asked) instead of all running to --output-len."""
    import hashlib
    data = tmp_path / "chat.jsonl"
    lines = [{"messages": [{"role": "user", "content": "write a function " * (3 + i)}], "category": "code"}
             for i in range(3)] + [{"prompt": "tell me a story " * 2, "category": "chat"}]
    data.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    s = sim([])
    rc, summary, recs = run_loadgen(s.url, tmp_path, "--api", "chat", "--dataset", str(data), "--num-requests", "8",
                                    "--warmup", "0", "--output-len", "40", "--ignore-eos", "false")
    assert rc == 0, summary
    assert summary["dataset"] == {"kind": "file", "path": str(data), "records": 4, "categories": ["chat", "code"],
                                  "sha256": "sha256:" + hashlib.sha256(data.read_bytes()).hexdigest()}
    assert summary["ignore_eos"] is False
    # the simulator counts a word per token: every record was sent (each twice: the seeded order walks all four
    # before repeating) and each prompt is the record's words plus the same chat template
    words = sorted(len((x["messages"][0]["content"] if "messages" in x else x["prompt"]).split()) for x in lines)
    template = min(r["prompt_tokens"] for r in recs) - words[0]
    assert template > 0 and sorted({r["prompt_tokens"] - template for r in recs}) == words
    assert {r["category"] for r in recs} == {"code", "chat"} and all(r["ok"] for r in recs)
    stopped = [r for r in recs if r["finish_reason"] == "stop"]
    assert stopped and all(r["output_tokens"] < 40 for r in stopped)
    # the same run forced to the end: every answer is 40 tokens
    rc, summary, recs = run_loadgen(s.url, tmp_path, "--api", "chat", "--dataset", str(data), "--num-requests", "4",
                                    "--warmup", "0", "--output-len", "40")
    assert rc == 0 and summary["ignore_eos"] is True and {r["output_tokens"] for r in recs} == {40}
