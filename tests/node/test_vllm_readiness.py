"""ready.py and envcheck.py against a stand-in that answers like a real vLLM: /health_generate and
/server_info are 404; /health 200 alone is not readiness (a real vLLM answered 200 while its engine could not
serve), so ready.py proves one generation; envcheck reads the args back from the `non-default args` log line.
The stand-in's answers and log lines are the real ones of tests/fixtures/vllm-0.32.0/."""
from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import pytest

from specab.node import envcheck, ready

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32.0"
ENGINE_ERROR = ('{"error":{"message":"EngineCore encountered an issue. See stack trace (above) for the root cause.",'
                '"type":"InternalServerError","param":null,"code":500}}')
WORKER_ERROR = ("(Worker pid=4242) ERROR 12-01 04:50:01 [llama_eagle3.py:201] RuntimeError: shape '[-1, 1536]' is "
                "invalid for input of size 5120")


class VllmLike(BaseHTTPRequestHandler):
    broken = False

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, code: int, body: str, ctype: str = "application/json") -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send(200, "")
        elif self.path == "/v1/models":
            self._send(200, (FIX / "v1_models.json").read_text())
        elif self.path == "/metrics":
            self._send(200, (FIX / "metrics_after.txt").read_text(), "text/plain")
        else:
            self._send(404, '{"detail":"Not Found"}')

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path != "/v1/completions":
            self._send(404, '{"detail":"Not Found"}')
        elif self.broken:
            self._send(500, ENGINE_ERROR)
        else:
            self._send(200, json.dumps({"choices": [{"text": " w1 w2"}], "usage": {"completion_tokens": 2}}))


@pytest.fixture
def vllm_like() -> Iterator[tuple[str, type]]:
    handler = type("Handler", (VllmLike,), {"broken": False})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", handler
    srv.shutdown()


def test_ready_needs_a_real_generation_and_gets_one(vllm_like: tuple[str, type], tmp_path: Path) -> None:
    url, _ = vllm_like
    log = tmp_path / "server.log"
    log.write_text((FIX / "server.log").read_text().split("SpecDecoding")[0])
    out = ready.main(["--url", url, "--pid", str(os.getpid()), "--log", str(log), "--timeout", "20"])
    assert out["ready"] and out["endpoint"] == "/health"
    assert out["generation_check"] == "POST /v1/completions generated 2 token(s)"


def test_health_200_with_an_engine_that_cannot_serve_fails_quoting_the_log(vllm_like: tuple[str, type],
                                                                            tmp_path: Path) -> None:
    url, handler = vllm_like
    handler.broken = True
    log = tmp_path / "server.log"
    log.write_text("(APIServer pid=1) INFO 12-01 04:49:00 [launcher.py:195] Route: /health, Methods: GET\n"
                   "(Worker pid=4242) ERROR 12-01 04:50:01 [core.py:1] Traceback (most recent call last):\n"
                   + WORKER_ERROR + "\n")
    with pytest.raises(ready.ToolError) as exc:
        ready.main(["--url", url, "--pid", str(os.getpid()), "--log", str(log), "--timeout", "20"])
    msg = str(exc.value)
    assert "answered /health 200" in msg and "could not generate" in msg and "HTTP 500" in msg
    assert "EngineCore encountered an issue" in msg
    assert "shape '[-1, 1536]' is invalid" in msg          # the worker's own error, from the log
    assert exc.value.result["fatal_line"] == WORKER_ERROR and exc.value.result["ready"] is False


def test_envcheck_reads_vllm_args_from_its_log_models_and_metrics(vllm_like: tuple[str, type]) -> None:
    url, _ = vllm_like
    info = envcheck.vllm_readback(url, [str(FIX / "server.log")], 5.0)
    assert info is not None
    model = "/tmp/specab-vllm/models/tiny-llama"
    assert info["model"] == info["served_model"] == model and info["metrics_model_name"] == [model]
    expected = envcheck.vllm_expected({"model_path": model, "load_format": "dummy", "port": 30899,
                                       "enforce_eager": False, "trust_remote_code": None,
                                       "speculative_config": {"method": "draft_model", "model": model,
                                                              "num_speculative_tokens": 3}})
    report, problems = envcheck.check_args(expected, info, absent_is_default=True)
    assert problems == [] and report["model"]["ok"] and report["speculative_config"]["ok"]
    # a speculative config that differs from what the server runs is caught
    expected["speculative_config"] = {**expected["speculative_config"], "num_speculative_tokens": 2}
    _, problems = envcheck.check_args(expected, info, absent_is_default=True)
    assert len(problems) == 1 and "speculative_config" in problems[0]
    assert envcheck.vllm_readback(url, [str(FIX / "README.md")], 5.0) is None     # not a vLLM log


def test_the_root_cause_of_the_real_eagle3_failure_is_what_readiness_quotes() -> None:
    """In the real log the API server's EngineDeadError comes last; the worker's RuntimeError first: quote that."""
    watcher = ready.LogWatcher(str(FIX / "eagle3-dies-after-health.log"))
    watcher.flush()
    assert watcher.root_cause_line().endswith("RuntimeError: shape '[-1, 1536]' is invalid for input of size 20480")
    assert "EngineDeadError" in watcher.exception_line
    # the processes write the same log: the API server's report may come first (seen in a real run)
    lines = (FIX / "eagle3-dies-after-health.log").read_text().splitlines()
    dead = [l for l in lines if "EngineDeadError" in l]
    swapped = ready.LogWatcher("/nonexistent")
    for line in ["Traceback (most recent call last):"] + dead + lines:
        swapped.feed(line)
    assert swapped.exception_lines[0] == dead[0].strip()
    assert "RuntimeError: shape '[-1, 1536]'" in swapped.root_cause_line()
