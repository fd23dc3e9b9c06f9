"""Fixtures for the node-tool tests: run a tool as the roles do, a simulated GPU node, a server.

Helpers and fixtures of the node-tool tests. Every tool runs as ``python3 <file>.py ...`` in a subprocess (how the roles call them on a node),
against ``python -m specab.sim.smi`` on a per-test simulated node. Processes a test starts are
killed at teardown through the sessions recorded in the test's own server.json files.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from specab.config import defaults

REPO = Path(__file__).resolve().parents[2]
NODE_DIR_SRC = REPO / "specab" / "node"        # the node tools' package: `python NODE_DIR_SRC TOOL ARGS` runs one
HERE = Path(__file__).resolve().parent
PY = sys.executable


@dataclass
class ToolResult:
    rc: int
    data: Dict[str, Any]
    stderr: str
    wall_s: float

    @property
    def error(self) -> str:
        return self.data.get("error", "")


def ship_node_package(bin_dir: Path) -> Path:
    """What the node_prepare role ships into ``<node_dir>/bin``: specab/__init__.py, specab/vocab/*.py and
    specab/node/*.py, under their package paths. Returns the tools' folder (``python <it> TOOL ARGS`` runs a tool)."""
    shipped = [f for part in ("vocab", "node") for f in sorted((REPO / "specab" / part).glob("*.py"))]
    for rel in ["specab/__init__.py"] + [f.relative_to(REPO).as_posix() for f in shipped]:
        (bin_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, bin_dir / rel)
    return bin_dir / "specab" / "node"


def run_tool(tool: str, *args: str, env: Optional[Dict[str, str]] = None, timeout: float = 90,
             tools: Path = NODE_DIR_SRC) -> ToolResult:
    """``python <tools> TOOL ARGS`` (``tools``: the package folder, the checkout's or a shipped copy)."""
    t0 = time.monotonic()
    p = subprocess.run([PY, str(tools), tool] + [str(a) for a in args], env=env,
                       capture_output=True, text=True, timeout=timeout)
    wall = time.monotonic() - t0
    try:
        data = json.loads(p.stdout.strip().splitlines()[-1]) if p.stdout.strip() else {}
    except ValueError:
        raise AssertionError("%s printed no JSON: stdout=%r stderr=%r" % (tool, p.stdout, p.stderr))
    return ToolResult(p.returncode, data, p.stderr, wall)


def client_default_argv() -> List[str]:
    """The benchmark client's settings as the controller passes them with an empty ``bench:`` (roles/specab's
    values); a test's own flags after them win."""
    b = defaults.bench({})
    return ["--api", str(b["api"]), "--num-requests", str(b["num_requests"]), "--warmup", str(b["warmup_requests"]),
            "--input-len", str(b["input_len"]), "--output-len", str(b["output_len"]),
            "--ignore-eos", "true" if b["ignore_eos"] else "false",
            "--concurrency", str(b["concurrency"]), "--request-rate", str(b["request_rate"]), "--client-procs", str(b["client_procs"]),
            "--seed", str(b["seed"]), "--timeout", str(b["timeout_s"]), "--temperature", str(b["temperature"]),
            "--top-p", str(b["top_p"])]


def client_config(url: str, out: str, summary: Optional[str], **kw: Any) -> Any:
    """A ``loadgen.BenchConfig`` with roles/specab's bench values, overridden by ``kw``."""
    from specab.node import loadgen
    base = loadgen.BenchConfig.from_settings(url, defaults.bench({}), out=out, summary=summary, phase_metrics=None)
    return dataclasses.replace(base, **kw)


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def session_pids(sid: int) -> List[int]:
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            raw = open("/proc/%s/stat" % d).read()
        except OSError:
            continue
        rest = raw[raw.rfind(")") + 2:].split()
        if int(rest[3]) == sid and rest[0] not in ("Z", "X"):
            out.append(int(d))
    return out


def wait_for(cond, timeout: float = 20.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(interval)
    return bool(cond())


@dataclass
class SimNode:
    state: Path
    env: Dict[str, str]
    smi: List[str]
    extra_pids: List[int] = field(default_factory=list)

    @property
    def smi_json(self) -> str:
        return json.dumps(self.smi)

    def query(self, what: str) -> str:
        args = {"apps": ["--query-compute-apps=pid,process_name,used_memory,gpu_uuid",
                         "--format=csv,noheader,nounits"],
                "mem": ["--query-gpu=index,memory.used", "--format=csv,noheader,nounits"]}[what]
        return subprocess.run(self.smi + args, env=self.env, capture_output=True, text=True, timeout=30).stdout

    def memory_used(self) -> Dict[int, int]:
        return {int(l.split(",")[0]): int(l.split(",")[1]) for l in self.query("mem").splitlines() if l.strip()}

    def hold(self, gpu: int, mib: int, release_lag: float = 0.15, title: Optional[str] = None,
             new_session: bool = True) -> subprocess.Popen:
        cmd = [PY, "-m", "specab.sim.hold", "--gpu", str(gpu), "--mib", str(mib), "--release-lag", str(release_lag)]
        if title:
            cmd += ["--title", title]
        p = subprocess.Popen(cmd, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=new_session)
        p.stdout.readline()  # "holding ... as pid N": registered
        self.extra_pids.append(p.pid)
        return p


@pytest.fixture
def sim(tmp_path: Path):
    state = tmp_path / "simnode"
    env = dict(os.environ)
    env["SPECAB_SIM_STATE"] = str(state)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    node = SimNode(state=state, env=env, smi=[PY, "-m", "specab.sim.smi"])
    yield node
    for pid in node.extra_pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


@dataclass
class ServerSetup:
    node_dir: Path
    run_dir: Path
    port: int
    sim: SimNode
    config: Dict[str, Any]

    @property
    def url(self) -> str:
        return "http://127.0.0.1:%d" % self.port

    def write_launch(self, env_lines: str = "NCCL_PROTO=LL\nNCCL_DEBUG=INFO\n", source_env: bool = True,
                     extra_args: str = "", args: Optional[Dict[str, Any]] = None, spt_noenv: bool = True) -> Path:
        (self.run_dir / "nccl.env").write_text(env_lines)
        os.chmod(self.run_dir / "nccl.env", 0o600)
        cfg_path = self.run_dir / "fake.json"
        cfg_path.write_text(json.dumps(self.config))
        args = dict({"model_path": "/models/fake", "tp_size": 2, "port": self.port, "host": "127.0.0.1",
                     "mem_fraction_static": 0.88}, **(args or {}))
        (self.run_dir / "args.json").write_text(json.dumps(args))
        flags = " ".join("--%s %s" % (k.replace("_", "-"), shlex.quote(str(v))) for k, v in args.items())
        script = self.run_dir / "launch.sh"
        script.write_text("#!/bin/bash\nset -euo pipefail\ncd %s\n%s%sexec %s %s --config %s %s %s\n" % (
            shlex.quote(str(self.run_dir)), "export SPT_NOENV=1\n" if spt_noenv else "",
            "set -a\n. ./nccl.env\nset +a\n" if source_env else "",
            shlex.quote(PY), shlex.quote(str(HERE / "fake_server.py")), shlex.quote(str(cfg_path)), flags,
            extra_args))
        os.chmod(script, 0o755)
        return script

    def write_sim_launch(self, env_lines: str = "", extra_args: str = "", fault: str = "", scale: float = 10,
                         tp: int = 2, spt_noenv: bool = True, args: Optional[Dict[str, Any]] = None) -> Path:
        """launch.sh for the simulated SGLang server (``python -m specab.sim.launch_server``), the way
        the start role renders it: node env exported, env file sourced, the engine exec'd."""
        (self.run_dir / "nccl.env").write_text(env_lines)
        os.chmod(self.run_dir / "nccl.env", 0o600)
        args = dict({"model_path": "/models/Kimi-K2.5-INT4", "tp_size": tp, "host": "127.0.0.1",
                     "port": self.port, "mem_fraction_static": 0.88}, **(args or {}))
        (self.run_dir / "args.json").write_text(json.dumps(args))
        flags = []
        for k, v in args.items():
            flag = "--" + k.replace("_", "-")
            if v is True:
                flags.append(flag)
            elif v not in (False, None):
                flags.append("%s %s" % (flag, shlex.quote(str(v))))
        node_env = {"SPECAB_SIM_STATE": str(self.sim.state), "SPECAB_SIM_TIME_SCALE": str(scale),
                    "PYTHONPATH": str(REPO)}
        if fault:
            node_env["SPECAB_SIM_FAULT"] = fault
        if spt_noenv:
            node_env["SPT_NOENV"] = "1"
        script = self.run_dir / "launch.sh"
        script.write_text("#!/bin/bash\nset -euo pipefail\ncd %s\n%s\nset -a\n. ./nccl.env\nset +a\n"
                          "exec %s -m specab.sim.launch_server %s %s\n" % (
                              shlex.quote(str(self.run_dir)),
                              "\n".join("export %s=%s" % (k, shlex.quote(v)) for k, v in node_env.items()),
                              shlex.quote(PY), " ".join(flags), extra_args))
        os.chmod(script, 0o755)
        return script

    def start(self, **kw: Any) -> "ToolResult":
        script = self.run_dir / "launch.sh"
        if not script.exists():
            self.write_launch(**kw)
        return run_tool("start", "--node-dir", self.node_dir, "--run-dir", self.run_dir, "--script", script,
                        "--host", "127.0.0.1", "--port", str(self.port), env=self.sim.env)

    def ready(self, timeout: float = 120, *extra: str) -> "ToolResult":
        rec = json.loads((self.node_dir / "server.json").read_text())
        return run_tool("ready", "--url", self.url, "--pid", str(rec["pid"]), "--log", self.run_dir / "server.log",
                        "--timeout", str(timeout), *extra, env=self.sim.env)

    def stop(self, grace: float = 30, *extra: str) -> "ToolResult":
        return run_tool("stop", "--node-dir", self.node_dir, "--smi", self.sim.smi_json, "--grace", str(grace),
                        *extra, env=self.sim.env)

    def gpufree(self, timeout: float = 60, *extra: str) -> "ToolResult":
        return run_tool("gpufree", "--smi", self.sim.smi_json, "--gpus", "all", "--threshold-mib", "64",
                        "--timeout", str(timeout), "--node-dir", self.node_dir, *extra, env=self.sim.env)


@pytest.fixture
def server(tmp_path: Path, sim: SimNode):
    node_dir = tmp_path / "node"
    run_dir = node_dir / "runs" / "001-baseline"
    run_dir.mkdir(parents=True)
    setup = ServerSetup(node_dir=node_dir, run_dir=run_dir, port=free_port(), sim=sim,
                        config={"load_s": 0.3, "graph_s": 0.1, "mib": 1000, "gpus": 2})
    yield setup
    # teardown: everything in the sessions our own records name (this test started them)
    for name in ("server.json", "last_server.json"):
        p = node_dir / name
        if p.exists():
            rec = json.loads(p.read_text())
            for pid in session_pids(int(rec.get("sid") or rec["pid"])):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
