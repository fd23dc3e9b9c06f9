"""Namespace hosts for the scale-out tests: each a routed network namespace with its own address and
sshd (tests/netns.py), running a private simulated GPU node (its own node directory and GPU state),
written into one inventory with the layout under test (one multi-node server, or a fleet)."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import yaml

from tests.netns import NetnsHost, control_path_dir

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
VENV_BIN = Path(PYTHON).parent
NCCL_TUNED = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_P2P_LEVEL": "SYS", "NCCL_MAX_NCHANNELS": "16",
              "NCCL_BUFFSIZE": "16777216", "NCCL_NTHREADS": "512"}
EAGLE3 = {"speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "/models/Kimi-K2.5-EAGLE3",
          "speculative_num_steps": 2, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 3}
SMI = [PYTHON, "-m", "specab.sim.smi"]


@dataclass
class Node:
    """One namespace host with its simulated GPU node."""
    name: str
    ns: NetnsHost
    root: Path
    time_scale: str
    profile: str = "instant"

    @property
    def node_dir(self) -> Path:
        return self.root / "node"

    @property
    def state_dir(self) -> Path:
        return self.node_dir / "gpus"

    def node_env(self) -> dict[str, str]:
        return {"SPECAB_SIM_STATE": str(self.state_dir), "SPECAB_SIM_TIME_SCALE": self.time_scale,
                "SPECAB_SIM_PROFILE": self.profile, "PYTHONPATH": str(REPO)}

    def host_vars(self) -> dict[str, Any]:
        return {**self.ns.ansible_vars(),
                "ansible_python_interpreter": PYTHON, "specab_python": PYTHON,
                "specab_engine_cmd": [PYTHON, "-m", "specab.sim.launch_server"],
                "specab_smi_cmd": SMI, "specab_node_dir": str(self.node_dir),
                "specab_node_env": self.node_env(), "specab_gpu_indices": "all"}

    def server_record(self, name: str = "server.json") -> Optional[dict[str, Any]]:
        path = self.node_dir / name
        return json.loads(path.read_text()) if path.exists() else None

    def compute_apps(self) -> str:
        """The simulated nvidia-smi's compute processes of this node ('' when none)."""
        env = {**os.environ, **self.node_env()}
        proc = subprocess.run([*SMI, "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
                              env=env, capture_output=True, text=True, timeout=30)
        return proc.stdout.strip()

    def stop(self) -> None:
        """Stop whatever server of ours the node recorded (fixture finalizers)."""
        tools = self.node_dir / "bin" / "specab" / "node"
        if (tools / "stop.py").exists():
            subprocess.run([PYTHON, str(tools), "stop", "--node-dir", str(self.node_dir),
                            "--smi", json.dumps(SMI), "--grace", "5"],
                           env={**os.environ, **self.node_env()}, capture_output=True, timeout=60)


@contextlib.contextmanager
def namespace_nodes(root: Path, count: int, time_scale: str = "20",
                    profile: str = "instant") -> Iterator[list[Node]]:
    """``count`` routed namespace hosts (they reach each other), each with a simulated node."""
    with contextlib.ExitStack() as stack:
        nodes = []
        for i in range(count):
            ns = stack.enter_context(NetnsHost.create(root / f"ns{i}", routed=True))
            node = Node(name=f"gpu{i}", ns=ns, root=root / f"gpu{i}", time_scale=time_scale, profile=profile)
            stack.callback(node.stop)      # runs before the namespace goes (LIFO)
            nodes.append(node)
        yield nodes


def write_inventory(path: Path, groups: dict[str, list[Node]], group_vars: Optional[dict[str, dict]] = None,
                    main_group: str = "gpu_nodes") -> Path:
    """An inventory with ``main_group`` as parent of the given groups (or holding the hosts)."""
    group_vars = group_vars or {}
    children: dict[str, Any] = {}
    for g, nodes in groups.items():
        body: dict[str, Any] = {"hosts": {n.name: n.host_vars() for n in nodes}}
        if group_vars.get(g):
            body["vars"] = group_vars[g]
        children[g] = body
    inv = {"all": {"children": children}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    return path


def experiment(name: str, port: int, tp: int = 16, num_requests: int = 2, output_len: int = 24,
               arms: Optional[list[dict[str, Any]]] = None) -> dict[str, Any]:
    return {
        "name": name, "model_path": "/models/Kimi-K2.5-INT4",
        "server_args": {"tp_size": tp, "mem_fraction_static": 0.88, "disable_custom_all_reduce": True,
                        "trust_remote_code": True, "host": "127.0.0.1", "port": port},
        "env": dict(NCCL_TUNED),
        "arms": arms or [{"name": "baseline"}, {"name": "eagle3-s2", "server_args": dict(EAGLE3)}],
        "bench": {"api": "generate", "num_requests": num_requests, "warmup_requests": 1, "input_len": 16,
                  "output_len": output_len, "concurrency": 1, "seed": 1, "timeout_s": 60},
        "timeouts": {"ready_s": 120, "stop_grace_s": 5, "gpu_free_s": 30},
    }


def resolved_arm(exp: dict[str, Any], index: int) -> dict[str, Any]:
    arm = exp["arms"][index]
    args = {"model_path": exp["model_path"], **exp["server_args"], **(arm.get("server_args") or {})}
    env = {**exp["env"], **(arm.get("env") or {})}
    return {"name": arm["name"], "server_args": {k: v for k, v in args.items() if v is not None},
            "env": {k: v for k, v in env.items() if v is not None}}


def ansible_env(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["ANSIBLE_NOCOLOR"] = "1"
    env["ANSIBLE_LOCAL_TEMP"] = str(root / "ansible-local")
    env["ANSIBLE_SSH_CONTROL_PATH_DIR"] = control_path_dir(root)
    env.pop("ANSIBLE_CONFIG", None)
    return env


def run_playbook(root: Path, inventory: Path, playbook: str, extravars: dict[str, Any],
                 timeout: float = 300) -> subprocess.CompletedProcess:
    xv = root / f"xv-{len(list(root.glob('xv-*')))}.json"
    xv.write_text(json.dumps(extravars))
    return subprocess.run([str(VENV_BIN / "ansible-playbook"), "-i", str(inventory), playbook, "-e", f"@{xv}"],
                          cwd=REPO, env=ansible_env(root), capture_output=True, text=True, timeout=timeout)


def run_driver(root: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """``python driver.py ARGS`` from the repository root, as a user runs it."""
    return subprocess.run([PYTHON, "driver.py", *args], cwd=REPO, env=ansible_env(root), capture_output=True,
                          text=True, timeout=timeout)


def start_driver(root: Path, *args: str) -> subprocess.Popen:
    out = open(root / "driver.out", "w")
    return subprocess.Popen([PYTHON, "driver.py", *args], cwd=REPO, env=ansible_env(root), stdout=out,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)


def wait_while_driving(drv: subprocess.Popen, root: Path, cond: Callable[[], bool], timeout: float = 600,
                       interval: float = 0.05) -> None:
    """Poll ``cond`` until it holds; fail with the tail of the driver's output when the driver exits first or
    ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert drv.poll() is None and time.monotonic() < deadline, (root / "driver.out").read_text()[-4000:]
        time.sleep(interval)


def reap_driver(drv: subprocess.Popen) -> None:
    """A test's ``finally``: a driver still running gets SIGTERM in its whole session (it stops its servers)."""
    if drv.poll() is None:
        os.killpg(drv.pid, signal.SIGTERM)
        drv.wait(timeout=120)


def write_experiment(root: Path, exp: dict[str, Any]) -> Path:
    path = root / f"{exp['name']}.yml"
    path.write_text(yaml.safe_dump({"specab_experiment": exp}, sort_keys=False))
    return path


def experiment_dirs(runs_dir: Path) -> list[Path]:
    return sorted(p for p in runs_dir.iterdir() if (p / "results.sqlite").exists()) if runs_dir.exists() else []


def runs_of(exp_dir: Path) -> list[dict[str, Any]]:
    import sqlite3
    with contextlib.closing(sqlite3.connect(exp_dir / "results.sqlite")) as c:
        c.row_factory = sqlite3.Row
        return [dict(r) for r in c.execute("SELECT * FROM runs ORDER BY seq")]


def pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:].split()[0] not in ("Z", "X")
