"""A simulated GPU node for driver tests: private state, node dir, free port; cleaned up afterwards."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
NCCL_TUNED = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_P2P_LEVEL": "SYS", "NCCL_MAX_NCHANNELS": "16",
              "NCCL_BUFFSIZE": "16777216", "NCCL_NTHREADS": "512"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def experiment_yaml(name: str, port: int, arms: str, num_requests: int = 3, output_len: int = 48) -> str:
    import yaml
    exp = {
        "name": name, "model_path": "/models/Kimi-K2.5-INT4",
        "server_args": {"tp_size": 8, "mem_fraction_static": 0.88, "disable_custom_all_reduce": True,
                        "trust_remote_code": True, "host": "127.0.0.1", "port": port},
        "env": dict(NCCL_TUNED),
        "arms": yaml.safe_load(arms)["arms"],
        "bench": {"api": "generate", "num_requests": num_requests, "warmup_requests": 1, "input_len": 16,
                  "output_len": output_len, "concurrency": 1, "seed": 1, "timeout_s": 120},
        "timeouts": {"ready_s": 120, "stop_grace_s": 5, "gpu_free_s": 30},
    }
    return yaml.safe_dump({"specab_experiment": exp}, sort_keys=False)


SPEC_ARMS = """\
arms:
  - name: baseline
  - name: eagle3-s2
    server_args:
      speculative_algorithm: EAGLE3
      speculative_draft_model_path: /models/Kimi-K2.5-EAGLE3
      speculative_num_steps: 2
      speculative_eagle_topk: 1
      speculative_num_draft_tokens: 3
"""


@dataclass
class SimNode:
    root: Path
    port: int
    time_scale: str = "1"
    host: str = "simT"
    profile: str = "default"

    @property
    def node_dir(self) -> Path:
        return self.root / "node"

    @property
    def state_dir(self) -> Path:
        return self.root / "node" / "gpus"

    @property
    def runs_dir(self) -> Path:
        return self.root / "runs"

    def node_env(self) -> dict[str, str]:
        return {"SPECAB_SIM_STATE": str(self.state_dir), "SPECAB_SIM_TIME_SCALE": self.time_scale,
                "SPECAB_SIM_PROFILE": self.profile, "PYTHONPATH": str(REPO)}

    def host_vars(self) -> dict[str, object]:
        return {"ansible_connection": "local", "ansible_python_interpreter": PYTHON, "specab_python": PYTHON,
                "specab_engine_cmd": [PYTHON, "-m", "specab.sim.launch_server"],
                "specab_smi_cmd": [PYTHON, "-m", "specab.sim.smi"], "specab_node_dir": str(self.node_dir),
                "specab_node_env": self.node_env(), "specab_gpu_indices": "all"}

    def write_inventory(self, host_vars: dict[str, object] | None = None) -> Path:
        inv = {"all": {"children": {"gpu_nodes": {"hosts": {self.host: host_vars or self.host_vars()}}}}}
        p = self.root / "inventory.yml"
        p.write_text(json.dumps(inv, indent=1))     # JSON is YAML
        return p

    def write_experiment(self, name: str, arms: str = SPEC_ARMS, **kw: int) -> Path:
        p = self.root / f"{name}.yml"
        p.write_text(experiment_yaml(name, self.port, arms, **kw))
        return p

    def smi(self, *query: str) -> str:
        env = dict(os.environ, **self.node_env())
        return subprocess.run([PYTHON, "-m", "specab.sim.smi", *query], capture_output=True, text=True, env=env,
                              timeout=30, check=True).stdout

    def gpus_busy(self) -> list[str]:
        """GPU rows with memory used above 64 MiB, and compute processes (empty when the node is clean)."""
        busy = [line for line in self.smi("--query-gpu=index,memory.used", "--format=csv,noheader,nounits")
                .splitlines() if line.strip() and int(line.split(",")[1]) > 64]
        apps = [line for line in self.smi("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
                .splitlines() if line.strip()]
        return busy + apps

    def server(self) -> dict | None:
        try:
            return json.loads((self.node_dir / "server.json").read_text())
        except (OSError, json.JSONDecodeError):
            return None

    def server_alive(self) -> bool:
        s = self.server()
        if not s or not isinstance(s.get("pid"), int):
            return False
        try:
            os.kill(s["pid"], 0)
        except ProcessLookupError:
            return False
        return Path(f"/proc/{s['pid']}").exists() and "Z" not in _state(s["pid"])

    def cleanup(self) -> None:
        """Kill a server this test left behind (ours: its group is recorded in server.json)."""
        s = self.server()
        if s and isinstance(s.get("pgid"), int) and self.server_alive():
            try:
                os.killpg(s["pgid"], signal.SIGKILL)
            except ProcessLookupError:
                pass


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "X"


def driver(*args: str, env: dict[str, str] | None = None, **kw) -> subprocess.Popen:
    return subprocess.Popen([PYTHON, str(REPO / "driver.py"), *args], cwd=str(REPO),
                            env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def reap_driver(proc: subprocess.Popen, timeout: float) -> None:
    """A test's `finally`: a driver still running gets SIGTERM (it stops its server itself), then
    SIGKILL when it has not exited within ``timeout`` seconds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def wait_for(pred, timeout: float, interval: float = 0.2, what: str = "condition",
             proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        if proc is not None and proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            raise AssertionError(f"the driver exited (rc {proc.returncode}) before {what}:\n{out[-4000:]}")
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
