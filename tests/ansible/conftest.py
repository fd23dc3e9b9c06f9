"""Helpers for running specab's playbooks against a private simulated node.

Every test gets its own node directory, simulated GPU state, runs directory and server port, so
tests never see each other's servers (other helpers run tests on the same machine concurrently).
The simulator runs fast (SPECAB_SIM_TIME_SCALE) with 2 tensor-parallel ranks and a tiny benchmark.
"""
from __future__ import annotations

import functools
import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest
import yaml

from tests.netns import control_path_dir

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
TIME_SCALE = "50"
NCCL_ENV = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_P2P_LEVEL": "SYS", "NCCL_MAX_NCHANNELS": "16",
            "NCCL_BUFFSIZE": "16777216", "NCCL_NTHREADS": "512"}
EAGLE3 = {"speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "/models/Kimi-K2.5-EAGLE3",
          "speculative_num_steps": 2, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 3}
PLAYBOOK_TIMEOUT_S = 540


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def experiment(port: int, **overrides: Any) -> dict[str, Any]:
    """A small experiment mirroring experiments/default.yml (TP 2 and a tiny bench, for speed)."""
    exp: dict[str, Any] = {
        "name": "t",
        "model_path": "/models/Kimi-K2.5-INT4",
        "server_args": {"tp_size": 2, "mem_fraction_static": 0.88, "disable_custom_all_reduce": True,
                        "trust_remote_code": True, "host": "127.0.0.1", "port": port,
                        # a logical name the simulated SGLang 0.5.23 spells --cuda-graph-max-bs-decode
                        "max_running_requests": 48, "cuda_graph_max_bs": 48},
        "env": dict(NCCL_ENV),
        "arms": [{"name": "baseline"}, {"name": "eagle3-s2", "server_args": dict(EAGLE3), "env": {}}],
        "bench": {"api": "generate", "num_requests": 2, "warmup_requests": 1, "input_len": 16,
                  "output_len": 32, "concurrency": 1, "seed": 1, "timeout_s": 60},
        "timeouts": {"ready_s": 120, "stop_grace_s": 10, "gpu_free_s": 30},
    }
    exp.update(overrides)
    return exp


@functools.lru_cache(maxsize=None)
def sim_flags(sglang_version: str = "") -> frozenset[str]:
    """The long flags the simulated SGLang's --help declares (its default generation, or `sglang_version`)."""
    from specab.driver.preflight import parse_help_flags
    env = {k: v for k, v in os.environ.items() if k != "SPECAB_SIM_SGLANG_VERSION"}
    if sglang_version:
        env["SPECAB_SIM_SGLANG_VERSION"] = sglang_version
    out = subprocess.run([sys.executable, "-m", "specab.sim.launch_server", "--help"], capture_output=True, text=True,
                         check=True, env=env).stdout
    return frozenset(parse_help_flags(out))


def resolved_arm(exp: dict[str, Any], index: int, sglang_version: str = "") -> dict[str, Any]:
    """The contract's resolution (common | arm, null removes, model_path added), for arm.yml and enqueue.yml, in the
    spelling of the simulated node's SGLang (its --help; `sglang_version` for another build), as the driver hands
    the arms over (cuda_graph_max_bs is --cuda-graph-max-bs-decode on 0.5.23)."""
    from specab.vocab import engines
    arm = exp["arms"][index]
    args = {"model_path": exp["model_path"], **exp["server_args"], **(arm.get("server_args") or {})}
    env = {**exp["env"], **(arm.get("env") or {})}
    # bench.phase_timing (default auto: speculative arms) adds the metrics flag and the device timer, last
    mode = (exp.get("bench") or {}).get("phase_timing", "auto")
    if (mode == "auto" and args.get("speculative_algorithm")) or (mode != "auto" and mode):
        args.setdefault("enable_metrics", True)
        env.setdefault("SGLANG_ENABLE_METRICS_DEVICE_TIMER", "1")
    args = {k: v for k, v in args.items() if v is not None}
    return {"name": arm["name"], "server_args": engines.spell_for("sglang", args, sim_flags(sglang_version)),
            "env": {k: v for k, v in env.items() if v is not None}}


@dataclass
class Result:
    rc: int
    output: str

    @property
    def flat(self) -> str:
        """The output with every run of whitespace made one space (the callback wraps long messages)."""
        return " ".join(self.output.split())

    def __str__(self) -> str:
        return f"exit {self.rc}\n{self.output[-6000:]}"


@dataclass
class SimNode:
    """One simulated GPU node in a private directory, reached locally or over SSH."""

    root: Path
    port: int = field(default_factory=free_port)
    name: str = "sim0"
    connection_vars: dict[str, Any] = field(default_factory=lambda: {"ansible_connection": "local"})

    @property
    def node_dir(self) -> Path:
        return self.root / "node"

    @property
    def runs_dir(self) -> Path:
        return self.root / "runs"

    @property
    def inventory(self) -> Path:
        return self.root / "inventory.yml"

    @property
    def state_dir(self) -> Path:
        return self.node_dir / "gpus"

    def node_env(self) -> dict[str, str]:
        return {"SPECAB_SIM_STATE": str(self.state_dir), "SPECAB_SIM_TIME_SCALE": TIME_SCALE,
                "PYTHONPATH": str(REPO)}

    def write_inventory(self, **host_vars: Any) -> Path:
        python = sys.executable
        hv = {**self.connection_vars,
              "ansible_python_interpreter": python,
              "specab_python": python,
              "specab_engine_cmd": [python, "-m", "specab.sim.launch_server"],
              "specab_smi_cmd": [python, "-m", "specab.sim.smi"],
              "specab_node_dir": str(self.node_dir),
              "specab_node_env": self.node_env(),
              "specab_gpu_indices": "all",
              **host_vars}
        inv = {"all": {"children": {"gpu_nodes": {"hosts": {self.name: hv}}}}}
        self.root.mkdir(parents=True, exist_ok=True)
        self.inventory.write_text(yaml.safe_dump(inv, sort_keys=False))
        return self.inventory

    def write_experiment(self, exp: dict[str, Any]) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / "experiment.yml"
        path.write_text(yaml.safe_dump({"specab_experiment": exp}, sort_keys=False))
        return path

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
        env["ANSIBLE_NOCOLOR"] = "1"
        env["ANSIBLE_FORCE_COLOR"] = "0"
        env["ANSIBLE_LOCAL_TEMP"] = str(self.root / "ansible-local")
        env["ANSIBLE_SSH_CONTROL_PATH_DIR"] = control_path_dir(self.root)
        env.pop("ANSIBLE_CONFIG", None)
        return env

    def playbook(self, playbook: str, extravars: Optional[dict[str, Any]] = None, *args: str,
                 timeout: float = PLAYBOOK_TIMEOUT_S, cwd: Optional[Path] = None) -> Result:
        """Run ansible-playbook from the repository root (its ansible.cfg) against this node; with ``cwd``,
        from that directory (the repository's ansible.cfg named by ANSIBLE_CONFIG)."""
        if not self.inventory.exists():
            self.write_inventory()
        xv = {"specab_runs_dir": str(self.runs_dir), **(extravars or {})}
        xv_file = self.root / f"extravars-{len(list(self.root.glob('extravars-*')))}.json"
        xv_file.write_text(json.dumps(xv))
        argv = [str(VENV_BIN / "ansible-playbook"), "-i", str(self.inventory), str(REPO / "playbooks" / playbook),
                "-e", f"@{xv_file}", *args]
        env = self.env()
        if cwd is not None:
            env["ANSIBLE_CONFIG"] = str(REPO / "ansible.cfg")
        proc = subprocess.run(argv, cwd=cwd or REPO, env=env, capture_output=True, text=True, timeout=timeout)
        return Result(proc.returncode, proc.stdout + proc.stderr)

    def infra_check(self, timeout: float = 120) -> Result:
        """The testinfra GPUs-free check (tests/infra) against this node's inventory."""
        argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout=100",
                str(REPO / "tests" / "infra"), "--hosts=ansible://gpu_nodes",
                f"--ansible-inventory={self.inventory}"]
        proc = subprocess.run(argv, cwd=REPO, env=self.env(), capture_output=True, text=True, timeout=timeout)
        return Result(proc.returncode, proc.stdout + proc.stderr)

    def server_record(self) -> Optional[dict[str, Any]]:
        path = self.node_dir / "server.json"
        return json.loads(path.read_text()) if path.exists() else None

    def stop(self) -> None:
        """Stop whatever server of ours the node recorded (used by fixture finalizers)."""
        tools = self.node_dir / "bin" / "specab" / "node"
        if (tools / "stop.py").exists():
            subprocess.run([sys.executable, str(tools), "stop", "--node-dir", str(self.node_dir),
                            "--smi", json.dumps([sys.executable, "-m", "specab.sim.smi"]), "--grace", "5"],
                           env={**self.env(), **self.node_env()}, capture_output=True, timeout=60)


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes whose argv mentions ``text`` (e.g. a private node directory)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in argv:
            found.append(f"{proc.name}: {argv.strip()}")
    return found


def pid_alive(pid: int, starttime: Optional[int] = None) -> bool:
    """Whether ``pid`` is a live process (zombies are dead); with ``starttime`` (from server.json),
    whether it is still *that* process and not a later one that reused the pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat[stat.rindex(")") + 2:].split()
    if fields[0] in ("Z", "X"):
        return False
    return starttime is None or int(fields[19]) == int(starttime)


def record_alive(record: dict[str, Any]) -> bool:
    """Whether the server a server.json/last_server.json record names is still running."""
    return pid_alive(int(record["pid"]), record.get("starttime"))


@pytest.fixture
def sim_node(tmp_path: Path) -> Iterator[SimNode]:
    node = SimNode(root=tmp_path / "sim")
    node.root.mkdir(parents=True)
    try:
        yield node
    finally:
        node.stop()
