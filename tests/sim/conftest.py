"""Fixtures for the simulator tests: start simulated servers in their own session and state dir,
always cleaned up (process group SIGKILL), with polling (never fixed sleeps)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional

import pytest

from tests.sim.client import request_json

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
TUNED = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_P2P_LEVEL": "SYS", "NCCL_MAX_NCHANNELS": "16",
         "NCCL_BUFFSIZE": "16777216", "NCCL_NTHREADS": "512"}
EAGLE_S2 = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/models/eagle3",
            "--speculative-num-steps", "2", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "3"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_env(state: Path, scale: float, extra: Optional[dict[str, str]] = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SPECAB_SIM_", "NCCL_", "SGLANG_", "SGL_", "CUDA_VISIBLE"))}
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["SPECAB_SIM_STATE"] = str(state)
    env["SPECAB_SIM_TIME_SCALE"] = str(scale)
    env.update(extra or {})
    return env


def wait_for(cond: Callable[[], object], timeout: float, what: str, interval: float = 0.02) -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def smi(state: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "specab.sim.smi", *args], env=base_env(state, 1), capture_output=True,
                          text=True, timeout=30)


def memory_used(state: Path) -> list[int]:
    out = smi(state, "--query-gpu=memory.used", "--format=csv,noheader,nounits").stdout
    return [int(x) for x in out.split()]


def compute_pids(state: Path) -> list[int]:
    out = smi(state, "--query-compute-apps=pid", "--format=csv,noheader,nounits").stdout
    return [int(x) for x in out.split()]


def children_of(pid: int) -> list[int]:
    try:
        raw = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except FileNotFoundError:
        return []
    return [int(x) for x in raw.split()]


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


@dataclass
class SimServer:
    proc: subprocess.Popen
    port: int
    state: Path
    log: Path
    scale: float
    argv: list[str] = field(default_factory=list)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def health(self) -> int:
        try:
            status, _, _ = request_json(self.port, "GET", "/health_generate", timeout=5)
            return status
        except OSError:
            return 0

    def wait_ready(self, timeout: float = 90.0) -> "SimServer":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited rc={self.proc.returncode}:\n{self.log_text()[-3000:]}")
            if self.health() == 200:
                return self
            time.sleep(0.05)
        raise AssertionError(f"server not ready after {timeout}s:\n{self.log_text()[-3000:]}")

    def wait_exit(self, timeout: float = 30.0) -> int:
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


class Launcher:
    """Starts simulated servers in their own sessions; ``close`` SIGKILLs every group it started."""

    def __init__(self, root: Path):
        self.root = root
        self.started: list[SimServer] = []

    def __call__(self, args: list[str], env: Optional[dict[str, str]] = None, scale: float = 20, tp: int = 2,
                 state: Optional[Path] = None, wait: bool = True, port: Optional[int] = None,
                 model: str = "/models/Kimi-K2.5-INT4") -> SimServer:
        n = len(self.started)
        port = port or free_port()
        state = state or (self.root / f"node{n}")
        log = self.root / f"server{n}.log"
        argv = [PY, "-m", "specab.sim.launch_server", "--model-path", model, "--tp-size", str(tp),
                "--host", "127.0.0.1", "--port", str(port), *args]
        with open(log, "wb") as fh:
            proc = subprocess.Popen(argv, env=base_env(state, scale, env), stdin=subprocess.DEVNULL, stdout=fh,
                                    stderr=subprocess.STDOUT, start_new_session=True, cwd=str(REPO))
        srv = SimServer(proc, port, state, log, scale, argv)
        self.started.append(srv)
        if wait:
            srv.wait_ready()
        return srv

    def close(self) -> None:
        for srv in self.started:
            srv.kill()


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Launcher]:
    launcher = Launcher(tmp_path)
    yield launcher
    launcher.close()


@pytest.fixture(scope="module")
def module_launch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    launcher = Launcher(tmp_path_factory.mktemp("sim"))
    yield launcher
    launcher.close()
