"""A simulated node laid out as the controller's enqueue playbook leaves it, for the sequencer's tests
and its dead-time measurement (``python -m tests.node.seq_deadtime``).

The node tools are shipped into ``<node>/bin/specab/node/`` (as node_prepare does: the package, the benchmark
client ``loadgen.py`` among its tools); each run directory gets launch.sh / nccl.env / args.json rendered from the
same templates with the same Jinja settings as the server_start role (``specab.driver.render``) and
handed, with its queue entry (docs/architecture.md), to ``sequence.py stage`` as enqueue.yml does.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from specab.config import defaults
from specab.driver import render
from tests.node.helpers import ship_node_package

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
BENCH = {"api": "generate", "num_requests": 2, "warmup_requests": 1, "input_len": 16, "output_len": 16,
         "concurrency": 1, "seed": 1, "timeout_s": 60, "ignore_eos": True, "request_rate": 0,
         "client_procs": "auto", "temperature": 0, "top_p": 1}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Result:
    rc: int
    data: Dict[str, Any]
    stderr: str

    @property
    def error(self) -> str:
        return str(self.data.get("error", ""))


def proc_session(pid: int) -> Optional[int]:
    try:
        raw = open("/proc/%d/stat" % pid).read()
    except OSError:
        return None
    rest = raw[raw.rfind(")") + 2:].split()
    return None if rest[0] in ("Z", "X") else int(rest[3])


def session_pids(sid: int) -> List[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit() and proc_session(int(d)) == sid]


def wait_for(cond, timeout: float = 30.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(interval)
    return bool(cond())


@dataclass
class SeqNode:
    root: Path
    experiment_id: str = "exp-20261129-100000"
    tp: int = 2
    scale: float = 10.0
    profile: str = "instant"
    port: int = field(default_factory=free_port)
    sessions: List[int] = field(default_factory=list)
    gpu: bool = False          # GPU mode: real CUDA allocations and the real nvidia-smi (docs/simulator.md)

    def __post_init__(self) -> None:
        self.node_dir = self.root / "node"
        self.bin = self.node_dir / "bin"
        self.tools = ship_node_package(self.bin)      # <bin>/specab/node: `python <tools> TOOL ARGS`
        self.state = self.root / "gpus"

    # -- the node's environment (specab_node_env) -------------------------------------------

    @property
    def node_env(self) -> Dict[str, str]:
        env = {"SPECAB_SIM_STATE": str(self.state), "SPECAB_SIM_TIME_SCALE": str(self.scale),
               "SPECAB_SIM_PROFILE": self.profile, "PYTHONPATH": str(REPO)}
        if self.gpu:
            env["SPECAB_SIM_GPU"] = "cuda"
        return env

    @property
    def env(self) -> Dict[str, str]:
        return dict(os.environ, **self.node_env)

    @property
    def smi(self) -> List[str]:
        return ["nvidia-smi"] if self.gpu else [PY, "-m", "specab.sim.smi"]

    # -- what the enqueue playbook does ------------------------------------------------------

    def arm(self, name: str, **server_args: Any) -> Dict[str, Any]:
        sa = {"model_path": "/models/Kimi-K2.5-INT4", "tp_size": self.tp, "mem_fraction_static": 0.88,
              "host": "127.0.0.1", "port": self.port}
        sa.update(server_args)
        return {"name": name, "server_args": {k: v for k, v in sa.items() if v is not None},
                "env": {"NCCL_PROTO": "LL", "NCCL_DEBUG": "INFO"}}

    def batch_run(self, seq: int, arm: Dict[str, Any], bench: Optional[Dict[str, Any]] = None,
                  node_env_extra: Optional[Dict[str, str]] = None, experiment_id: Optional[str] = None,
                  gpu_free_threshold_mib: float = 64, gpu_free_s: float = 30,
                  instance: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        """One run of a `sequence.py stage` batch: its files rendered from the templates, its queue entry
        (``instance``: its instance {id, keep, engine}, one server across the loads, docs/decisions/0011)."""
        run_id = "%03d-%s" % (seq, arm["name"])
        run_dir = self.node_dir / "runs" / run_id
        env = render.environment()
        ctx = {"specab_arm": arm, "specab_engine_cmd": [PY, "-m", "specab.sim.launch_server"],
               "specab_node_env": dict(self.node_env, **(node_env_extra or {})), "specab_run_id": run_id}
        files = [{"name": "launch.sh", "mode": "0755", "check": "bash",
                  "content": env.get_template(render.LAUNCH_TEMPLATE).render(ctx)},
                 {"name": "nccl.env", "mode": "0600", "content": env.get_template(render.ENV_TEMPLATE).render(ctx)},
                 {"name": "args.json", "mode": "0644",
                  "content": json.dumps(arm["server_args"], indent=4, sort_keys=True) + "\n"}]
        exp = experiment_id or self.experiment_id
        host = str(arm["server_args"].get("host", "127.0.0.1"))
        port = int(arm["server_args"].get("port", 30000))
        entry = {"version": 1, "experiment_id": exp, "seq": seq, "run_id": run_id, "arm": arm["name"],
                 "run_dir": str(run_dir), "host": host, "port": port, "url": "http://%s:%d" % (host, port),
                 "smi": self.smi, "gpus": "all", "python": PY, "engine_python": PY,
                 "timeouts": {"stop_grace_s": 15, "gpu_free_s": gpu_free_s, "ready_s": 120},
                 "gpu_free": {"threshold_mib": gpu_free_threshold_mib},
                 "bench": dict(bench or BENCH), "bench_env": self.node_env, "sample_interval_s": 0.2,
                 "env_verify": {"server_info": True},
                 "manifest": {"seed": 1, "extra": {"experiment_id": exp, "run_id": run_id, "arm": arm["name"],
                                                   "specab_git": "test", "ansible_version": "none",
                                                   "inventory_hostname": "simnode"}}}
        if instance is not None:
            entry["instance"] = instance
        return {"seq": seq, "run_id": run_id, "files": files, "entry": entry}

    def stage(self, runs: List[Dict[str, Any]], *extra: str, experiment_id: Optional[str] = None) -> Result:
        """`sequence.py stage`: the batch document on stdin, as enqueue.yml hands it over."""
        doc = json.dumps({"version": 1, "runs": runs})
        return self.seq("stage", "--experiment-id", experiment_id or self.experiment_id, *extra, stdin=doc)

    def enqueue(self, seq: int, arm: Dict[str, Any], bench: Optional[Dict[str, Any]] = None,
                node_env_extra: Optional[Dict[str, str]] = None, experiment_id: Optional[str] = None,
                gpu_free_threshold_mib: float = 64, gpu_free_s: float = 30) -> str:
        """Queue one run as enqueue.yml does (a batch of one through `sequence.py stage`); its run id."""
        run = self.batch_run(seq, arm, bench, node_env_extra, experiment_id, gpu_free_threshold_mib, gpu_free_s)
        r = self.stage([run], experiment_id=run["entry"]["experiment_id"])
        assert r.rc == 0, "sequence.py stage failed: %r %s" % (r.data, r.stderr)
        return run["run_id"]

    # -- the sequencer's CLI -------------------------------------------------------------------

    def seq(self, *args: str, timeout: float = 120, stdin: Optional[str] = None) -> Result:
        p = subprocess.run([PY, str(self.tools), "sequence", "--node-dir", str(self.node_dir)] + list(args),
                           env=self.env, capture_output=True, text=True, timeout=timeout,
                           input=stdin if stdin is not None else "")
        try:
            data = json.loads(p.stdout.strip().splitlines()[-1]) if p.stdout.strip() else {}
        except ValueError:
            raise AssertionError("sequence.py printed no JSON: %r %r" % (p.stdout, p.stderr))
        return Result(p.returncode, data, p.stderr)

    def runner_args(self) -> List[str]:
        """The sequencer's settings as enqueue.yml passes them (roles/specab's values; a test's own after them win)."""
        return ["--idle-timeout", str(defaults.get("queue_idle_timeout_s")),
                "--lease-s", str(defaults.get("lease_stale_s")), "--gpus", "all",
                "--gpu-free-timeout", "30", "--gpu-free-threshold-mib", str(defaults.get("gpu_free_threshold_mib")),
                "--stop-grace", str(defaults.get("stop_grace_s"))]

    def reset(self) -> Result:
        return self.seq("reset", "--experiment-id", self.experiment_id, "--stop-grace", str(defaults.get("stop_grace_s")),
                        "--gpu-free-timeout", "30")

    def ensure(self, *extra: str, experiment_id: Optional[str] = None, smi: bool = True) -> Result:
        """`sequence.py ensure` as enqueue.yml runs it (``smi=False``: without the startup stop and GPU check)."""
        r = self.seq("ensure", "--experiment-id", experiment_id or self.experiment_id, *self.runner_args(),
                     *(["--smi", json.dumps(self.smi)] if smi else []), *extra)
        if r.rc == 0 and r.data.get("sid"):
            self.sessions.append(int(r.data["sid"]))
        return r

    def wait(self, run_id: str, timeout: float = 90) -> Result:
        return self.seq("wait", "--run-id", run_id, "--timeout", str(timeout), timeout=timeout + 30)

    def record(self) -> Dict[str, Any]:
        return json.loads((self.node_dir / "sequencer.json").read_text())

    def run_file(self, run_id: str, name: str) -> Path:
        return self.node_dir / "runs" / run_id / name

    def phases(self, run_id: str) -> List[Dict[str, Any]]:
        return [json.loads(l) for l in self.run_file(run_id, "phases.jsonl").read_text().splitlines() if l.strip()]

    def cleanup(self) -> None:
        """Kill whatever is left in the sessions this node's records name (all started by the test)."""
        sids = set(self.sessions)
        for name in ("sequencer.json", "server.json", "last_server.json"):
            p = self.node_dir / name
            try:
                rec = json.loads(p.read_text())
                sids.add(int(rec.get("sid") or rec["pid"]))
            except (OSError, ValueError, KeyError, TypeError):
                pass
        for sid in sids:
            for pid in session_pids(sid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        # the simulator's GPU watcher of this node's state (a held allocation with a long release lag keeps it
        # watching): started for this test's node only, so it is ours to end
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(a.startswith(b"specab-sim-watcher") for a in argv[:1]) and str(self.state).encode() in b" ".join(argv):
                try:
                    os.kill(int(proc.name), signal.SIGKILL)
                except OSError:
                    pass
