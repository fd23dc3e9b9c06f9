#!/usr/bin/env python3
"""specab GPU validation: the roles against real nvidia-smi, real CUDA processes
and real NCCL, with the simulated engine in GPU mode (SPECAB_SIM_GPU=cuda) on localhost.

    python3 scripts/gpu_validation.py run [--tp N] [--work DIR] [--time-scale S] [--cpu-sim]
                                          [--engine real-sglang --real-site DIR [--no-driver]]
    python3 scripts/gpu_validation.py summarize --work DIR
    python3 scripts/gpu_validation.py sample --smi JSON --out FILE [--interval S]

``run`` (normally through scripts/gpu_validation.sh, which exports the NVLink-multicast-off
variables first) does, on one machine, in a work directory:

1. preflight: versions (driver, CUDA, torch, NCCL), at least N GPUs, GPUs free (real CSV);
2. a background sampler of the raw ``nvidia-smi`` CSV (GPU memory + compute apps, ~10 Hz);
3. ``playbooks/ab_test.yml`` (inventory/gpu-local.yml, experiments/gpu-validation.yml, TP N);
4. fault ``orphan_workers``: the engine's main process dies, its workers keep real GPU memory;
   found through the real compute-apps list (session = ours), stopped, memory verified released;
5. env verification against an arm whose engine lacks NCCL_ALGO (``env -u NCCL_ALGO``): caught;
6. a foreign CUDA process (started here, not ours): the GPUs-free role refuses and names it, and
   nothing kills it;

With ``--engine real-sglang`` (the real SGLang from the bundle): (f) the real engine's readiness,
accept length and recorded shutdown, and 7. a short ``driver.py`` run of the same experiment to a report
(2 blocks, the node's run queue; ``--no-driver`` skips it), checked as (g).

then prints the summary (a)-(e) [(f), (g)] and exits 0 only when every check passed. ``--cpu-sim`` runs the
same steps on a machine without GPUs (simulated nvidia-smi, simulated foreign process): a dry run
of this script's logic. Only the Python standard library (plus PyYAML, which Ansible needs, and specab's own
stdlib-only engine knowledge, specab/vocab/engines.py) is used.
"""
from __future__ import annotations

import argparse
import csv
import datetime as dt
import io
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from specab.vocab import engines  # noqa: E402  (stdlib only: the engine knowledge, e.g. shutdown styles)
# engine -> (inventory, experiment): the simulated engine in GPU mode, or the REAL SGLang from the bundle of
# scripts/real_sglang_bundle.sh (docs/validation/sglang-real.md)
ENGINES = {
    "sim": (REPO / "inventory" / "gpu-local.yml", REPO / "experiments" / "gpu-validation.yml"),
    "real-sglang": (REPO / "inventory" / "gpu-real-sglang.yml", REPO / "experiments" / "real-sglang.yml"),
}
REAL_ENGINE = ["python3", "-m", "sglang.launch_server"]
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
TUNED_VARS = ("NCCL_PROTO", "NCCL_ALGO", "NCCL_P2P_LEVEL", "NCCL_MAX_NCHANNELS", "NCCL_BUFFSIZE", "NCCL_NTHREADS")
# NCCL reads NCCL_PROTO/NCCL_ALGO only when it tunes algorithms, i.e. with more than one rank
TUNING_VARS = ("NCCL_PROTO", "NCCL_ALGO")
MISSING_VAR = "NCCL_ALGO"
THRESHOLD_MIB = 64.0
GPU_QUERY = ("index", "uuid", "name", "memory.used", "memory.total")
APP_QUERY = ("pid", "process_name", "used_memory", "gpu_uuid")
NCCL_ENV_RE = re.compile(r"(?:(?P<host>[^\s:]+):(?P<pid>\d+):(?P<tid>\d+)\s+)?(?:\[(?P<dev>\d+)\]\s+)?"
                         r"NCCL INFO (?P<var>[A-Z][A-Z0-9_]*) set by environment to (?P<value>.*?)\s*$")
FOREIGN_MIB = 2048


class ValidationError(RuntimeError):
    """The validation cannot go on (bad machine state, missing tool); the message says what to do."""


# --------------------------------------------------------------------------- small helpers

def log(msg: str) -> None:
    print("[gpu-validation %s] %s" % (time.strftime("%H:%M:%S"), msg), flush=True)


def poll(cond: Callable[[], Any], timeout: float, interval: float = 0.1) -> Any:
    """Poll ``cond`` until truthy (returned) or the deadline passes (returns the last falsy value)."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def run_cmd(argv: Sequence[str], timeout: float = 30.0, env: Optional[Dict[str, str]] = None) -> Tuple[int, str, str]:
    try:
        p = subprocess.run(list(argv), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=timeout, env=env)
    except FileNotFoundError as exc:
        return 127, "", str(exc)
    except subprocess.TimeoutExpired:
        return 124, "", "timed out after %gs: %s" % (timeout, " ".join(argv))
    return p.returncode, p.stdout, p.stderr


def pid_alive(pid: int) -> bool:
    try:
        raw = Path("/proc/%d/stat" % pid).read_text()
    except OSError:
        return False
    return raw[raw.rfind(")") + 2:].split()[0] not in ("Z", "X")


def pid_session(pid: int) -> Optional[int]:
    try:
        raw = Path("/proc/%d/stat" % pid).read_text()
    except OSError:
        return None
    return int(raw[raw.rfind(")") + 2:].split()[3])


def iso_to_epoch(text: str) -> Optional[float]:
    """Ansible's command result times ('2026-11-29 07:47:01.123456', local time) → epoch seconds."""
    try:
        return dt.datetime.strptime(text.strip(), "%Y-%m-%d %H:%M:%S.%f").timestamp()
    except (ValueError, AttributeError):
        return None


# --------------------------------------------------------------------------- nvidia-smi CSV

def parse_cell(raw: str) -> Any:
    v = raw.strip()
    if v == "" or (v.startswith("[") and v.endswith("]")):
        return None
    try:
        return int(v)
    except ValueError:
        pass
    try:
        return float(v)
    except ValueError:
        return v


def parse_csv(text: str, fields: Sequence[str]) -> List[Dict[str, Any]]:
    """``--format=csv,noheader,nounits`` text → rows keyed by the query fields (mapped by position)."""
    rows = []
    for rec in csv.reader(io.StringIO(text), skipinitialspace=True):
        if not rec or all(not c.strip() for c in rec):
            continue
        if len(rec) > len(fields):
            rec = rec[:len(fields) - 1] + [", ".join(rec[len(fields) - 1:])]
        if len(rec) != len(fields):
            raise ValueError("nvidia-smi CSV line %r has %d columns, expected %d (%s)"
                             % (", ".join(rec), len(rec), len(fields), ",".join(fields)))
        rows.append({f: parse_cell(c) for f, c in zip(fields, rec)})
    return rows


@dataclass
class Smi:
    argv: List[str]
    env: Optional[Dict[str, str]] = None

    def raw(self, query: str, fields: Sequence[str], timeout: float = 15.0) -> str:
        rc, out, err = run_cmd(self.argv + ["--query-%s=%s" % (query, ",".join(fields)),
                                            "--format=csv,noheader,nounits"], timeout, self.env)
        if rc != 0:
            raise ValidationError("nvidia-smi --query-%s failed (rc %d): %s" % (query, rc, (err or out).strip()))
        return out

    def snapshot(self) -> Dict[str, Any]:
        """Both CSVs; ``t0`` before the calls, ``t`` after them: the state was read within [t0, t]."""
        t0 = time.time()
        gpu = self.raw("gpu", GPU_QUERY)
        apps = self.raw("compute-apps", APP_QUERY)
        return {"t0": round(t0, 4), "t": round(time.time(), 4), "gpu_csv": gpu, "apps_csv": apps}


def snapshot_rows(snap: Dict[str, Any]) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]:
    return parse_csv(snap["gpu_csv"], GPU_QUERY), parse_csv(snap["apps_csv"], APP_QUERY)


def snapshot_free(snap: Dict[str, Any], gpus: Optional[Iterable[int]] = None,
                  threshold: float = THRESHOLD_MIB) -> bool:
    """No compute process on the selected GPUs and memory.used <= threshold on each of them."""
    rows, apps = snapshot_rows(snap)
    sel = [r for r in rows if gpus is None or r["index"] in set(gpus)]
    uuids = {r["uuid"] for r in sel}
    if any(a["gpu_uuid"] in uuids for a in apps):
        return False
    return all(isinstance(r["memory.used"], (int, float)) and r["memory.used"] <= threshold for r in sel)


def used_mib(snap: Dict[str, Any], gpus: Optional[Iterable[int]] = None) -> float:
    rows, _ = snapshot_rows(snap)
    return float(sum(r["memory.used"] or 0 for r in rows if gpus is None or r["index"] in set(gpus)))


def csv_block(snap: Dict[str, Any], indent: str = "      ") -> str:
    """The raw nvidia-smi CSV of a snapshot, for the summary."""
    lines = ["%s%s" % (indent, ln) for ln in snap["gpu_csv"].strip().splitlines()]
    apps = snap["apps_csv"].strip().splitlines()
    lines += ["%scompute-apps: %s" % (indent, a) for a in apps] or ["%scompute-apps: (none)" % indent]
    return "\n".join(lines)


# --------------------------------------------------------------------------- sampler

def sample_main(a: argparse.Namespace) -> int:
    smi = Smi(json.loads(a.smi))
    stop = {"flag": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(flag=True))
    with open(a.out, "a") as fh:
        while not stop["flag"]:
            t0 = time.monotonic()
            try:
                snap = smi.snapshot()
            except ValidationError as exc:
                snap = {"t": round(time.time(), 4), "error": str(exc)}
            fh.write(json.dumps(snap) + "\n")
            fh.flush()
            time.sleep(max(0.0, a.interval - (time.monotonic() - t0)))
    return 0


def load_samples(path: Path) -> List[Dict[str, Any]]:
    out = []
    try:
        text = path.read_text()
    except OSError:
        return out
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a line cut by SIGTERM
        if "gpu_csv" in rec:
            out.append(rec)
    return out


def first_free_sample(samples: List[Dict[str, Any]], after: float, gpus: Optional[Iterable[int]] = None
                      ) -> Optional[Dict[str, Any]]:
    """The first sample read entirely after ``after`` that shows the GPUs free (its ``t`` bounds the
    release time from above)."""
    for s in samples:
        if s.get("t0", s["t"]) >= after and snapshot_free(s, gpus):
            return s
    return None


def first_no_apps_sample(samples: List[Dict[str, Any]], after: float, gpus: Optional[Iterable[int]] = None
                         ) -> Optional[Dict[str, Any]]:
    """The first sample read entirely after ``after`` whose compute-apps list has nothing on ``gpus``."""
    for s in samples:
        if s.get("t0", s["t"]) < after:
            continue
        rows, apps = snapshot_rows(s)
        uuids = {r["uuid"] for r in rows if gpus is None or r["index"] in set(gpus)}
        if not any(a["gpu_uuid"] in uuids for a in apps):
            return s
    return None


def last_sample_before(samples: List[Dict[str, Any]], t: float) -> Optional[Dict[str, Any]]:
    best = None
    for s in samples:
        if s["t"] <= t:
            best = s
    return best


def nearest_sample(samples: List[Dict[str, Any]], t: float) -> Optional[Dict[str, Any]]:
    return min(samples, key=lambda s: abs(s["t"] - t)) if samples else None


# --------------------------------------------------------------------------- Ansible

def junit_tasks(junit_dir: Path) -> List[Dict[str, Any]]:
    """Task results in run order from Ansible's junit callback: [{name, host, status, result}]."""
    tasks: List[Dict[str, Any]] = []
    for xml in sorted(junit_dir.glob("*.xml")):
        root = ET.parse(xml).getroot()
        for tc in root.iter("testcase"):
            name = tc.get("name") or ""
            m = re.match(r"^\[(?P<host>[^\]]*)\]\s*(?P<rest>.*)$", name)
            status = "ok"
            for tag in ("failure", "error", "skipped"):
                if tc.find(tag) is not None:
                    status = tag
            text = ""
            for tag in ("system-out", "failure", "error"):
                el = tc.find(tag)
                if el is not None and (el.text or "").strip().startswith("{"):
                    text = el.text or ""
                    break
            try:
                result = json.loads(text) if text else {}
            except ValueError:
                result = {}
            tasks.append({"name": m.group("rest") if m else name, "host": m.group("host") if m else "",
                          "status": status, "result": result})
    return tasks


# the keys of a task result that are Ansible's, not the node tool's (module specab_node returns the tool's keys)
TASK_KEYS = frozenset({"changed", "failed", "msg", "rc", "start", "end", "invocation", "skipped", "stdout", "stderr",
                       "stdout_lines", "stderr_lines", "cmd", "delta"})


def tool_outputs(tasks: List[Dict[str, Any]], marker: str) -> List[Dict[str, Any]]:
    """The node tool's JSON of every run of the task whose name holds ``marker``, in order, with the tool's
    start/end times (epoch s) and rc: the task's own keys (module specab_node), or its stdout (a command task)."""
    out = []
    for t in tasks:
        r = t["result"]
        if marker not in t["name"] or "rc" not in r:
            continue
        if "stdout" in r:
            try:
                data = json.loads(r.get("stdout") or "{}")
            except ValueError:
                data = {"unparsed_stdout": r.get("stdout")}
        else:
            data = {k: v for k, v in r.items() if k not in TASK_KEYS}
        out.append({"rc": r.get("rc"), "start": iso_to_epoch(r.get("start", "")),
                    "end": iso_to_epoch(r.get("end", "")), "data": data})
    return out


@dataclass
class Ctx:
    tp: int
    work: Path
    python: str
    cpu_sim: bool
    time_scale: str
    playbook_timeout_s: float = 420.0
    engine: str = "sim"
    real_site: Optional[str] = None          # the unpacked SGLang bundle (engine real-sglang)
    driver: bool = True                      # engine real-sglang: the short driver.py run to a report
    driver_timeout_s: float = 900.0
    node_dir: Path = field(init=False)
    smi: Smi = field(init=False)
    experiment_file: Path = field(init=False)
    experiment: Dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        self.node_dir = self.work / "node"
        env = None
        argv = ["nvidia-smi"]
        if self.cpu_sim:
            env = dict(os.environ, SPECAB_SIM_STATE=str(self.node_dir / "gpus"),
                       PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))
            argv = [self.python, "-m", "specab.sim.smi"]
        self.smi = Smi(argv, env)

    @property
    def real(self) -> bool:
        return self.engine != "sim"

    @property
    def inventory(self) -> Path:
        return ENGINES[self.engine][0]

    @property
    def engine_cmd(self) -> List[str]:
        return list(REAL_ENGINE) if self.real else [self.python, "-m", "specab.sim.launch_server"]

    @property
    def gpus(self) -> List[int]:
        return list(range(self.tp))

    def overrides(self) -> Dict[str, Any]:
        ov: Dict[str, Any] = {"gpu_validation_node_dir": str(self.node_dir),
                              "gpu_validation_time_scale": self.time_scale}
        if os.environ.get("PYTHONPATH"):
            ov["gpu_validation_pythonpath"] = os.environ["PYTHONPATH"]
        if self.real:
            ov["real_sglang_site"] = self.real_site
        if self.cpu_sim:
            ov["gpu_validation_sim_gpu"] = ""
            ov["specab_smi_cmd"] = self.smi.argv
        return ov

    def tool_env(self) -> Dict[str, str]:
        return dict(self.smi.env or os.environ)

    def resolved_arm(self, name: str) -> Dict[str, Any]:
        exp = self.experiment
        arm = next(a for a in exp["arms"] if a["name"] == name)
        args = dict({"model_path": exp["model_path"]}, **(exp.get("server_args") or {}))
        args.update(arm.get("server_args") or {})
        env = dict(exp.get("env") or {})
        env.update(arm.get("env") or {})
        return {"name": name, "server_args": {k: v for k, v in args.items() if v is not None},
                "env": {k: str(v) for k, v in env.items() if v is not None}}


def load_experiment(ctx: Ctx) -> None:
    import yaml  # Ansible's own dependency: present wherever ansible-playbook runs
    experiment = ENGINES[ctx.engine][1]
    doc = yaml.safe_load(experiment.read_text())
    exp = doc["specab_experiment"]
    if int(exp["server_args"].get("tp_size", 1)) != ctx.tp:
        exp["server_args"]["tp_size"] = ctx.tp
        exp["name"] = "%s-tp%d" % (exp["name"], ctx.tp)
        path = ctx.work / ("experiment-tp%d.yml" % ctx.tp)
        path.write_text("# written by scripts/gpu_validation.py from %s with tp_size %d\n"
                        % (experiment.relative_to(REPO), ctx.tp) + yaml.safe_dump(doc, sort_keys=False))
        ctx.experiment_file = path
    else:
        ctx.experiment_file = experiment
    ctx.experiment = exp


@dataclass
class PlaybookRun:
    label: str
    rc: int
    log: Path
    tasks: List[Dict[str, Any]]
    wall_s: float

    def text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""


def run_playbook(ctx: Ctx, label: str, playbook: str, extra: Dict[str, Any]) -> PlaybookRun:
    extra_file = ctx.work / ("%s.extra.json" % label)
    write_json(extra_file, dict(ctx.overrides(), **extra))
    junit = ctx.work / ("junit-%s" % label)
    junit.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_CALLBACKS_ENABLED="junit",
               JUNIT_OUTPUT_DIR=str(junit), ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1")
    env.update(MULTICAST_OFF)
    argv = [ctx.python, "-m", "ansible.cli.playbook", "-i", str(ctx.inventory), str(REPO / "playbooks" / playbook),
            "-e", "@" + str(extra_file)]
    logf = ctx.work / ("%s.log" % label)
    log("%s: %s" % (label, " ".join(shlex.quote(a) for a in argv)))
    t0 = time.monotonic()
    with open(logf, "w") as fh:
        try:
            rc = subprocess.run(argv, cwd=str(REPO), env=env, stdin=subprocess.DEVNULL, stdout=fh,
                                stderr=subprocess.STDOUT, timeout=ctx.playbook_timeout_s).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    wall = time.monotonic() - t0
    log("%s: rc %d after %.1f s (log %s)" % (label, rc, wall, logf))
    return PlaybookRun(label, rc, logf, junit_tasks(junit), wall)


def node_tool(ctx: Ctx, tool: str, args: Sequence[str], timeout: float = 120.0) -> Tuple[int, Dict[str, Any], str]:
    """Run a node tool as the roles do (the package deployed under the node dir's bin/, else the checkout's):
    `python <bin>/specab/node TOOL ARGS`; (rc, JSON, stderr)."""
    path = ctx.node_dir / "bin" / "specab" / "node"
    if not (path / ("%s.py" % tool)).exists():
        path = REPO / "specab" / "node"
    rc, out, err = run_cmd([ctx.python, str(path), tool] + list(args), timeout, ctx.tool_env())
    try:
        data = json.loads(out) if out.strip() else {}
    except ValueError:
        data = {"unparsed_stdout": out}
    return rc, data, err


# --------------------------------------------------------------------------- foreign process

FOREIGN_CODE = r"""
import os, signal, sys, torch
gpu, mib = int(sys.argv[1]), int(sys.argv[2])
x = torch.empty(mib * 1024 * 1024, dtype=torch.uint8, device="cuda:%d" % gpu)
torch.cuda.synchronize()
print("foreign: holding %d MiB on GPU %d as pid %d" % (mib, gpu, os.getpid()), flush=True)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
while True:
    signal.pause()
"""


def start_foreign(ctx: Ctx, gpu: int) -> subprocess.Popen:
    """A CUDA process that is not ours: own session, not recorded in server.json."""
    logf = open(ctx.work / "foreign.log", "w")
    if ctx.cpu_sim:
        argv = [ctx.python, "-m", "specab.sim.hold", "--gpu", str(gpu), "--mib", str(FOREIGN_MIB),
                "--state", str(ctx.node_dir / "gpus"), "--title", "foreign-cuda-job"]
        env = ctx.tool_env()
    else:
        script = ctx.work / "foreign_cuda_job.py"
        script.write_text(FOREIGN_CODE)
        argv = [ctx.python, str(script), str(gpu), str(FOREIGN_MIB)]
        env = dict(os.environ, **MULTICAST_OFF)
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                            start_new_session=True, env=env, cwd=str(REPO))


# --------------------------------------------------------------------------- steps

def preflight(ctx: Ctx) -> Dict[str, Any]:
    info: Dict[str, Any] = {"cpu_sim": ctx.cpu_sim, "tp": ctx.tp, "python": ctx.python}
    if not ctx.cpu_sim:
        rc, out, err = run_cmd(["nvidia-smi"], 30)
        if rc != 0:
            raise ValidationError("nvidia-smi does not run here (rc %d: %s); this validation needs a GPU "
                                  "machine (or --cpu-sim for a dry run)" % (rc, (err or out).strip()))
        m = re.search(r"Driver Version:\s*(\S+).*?CUDA Version:\s*(\S+)", out, re.S)
        info["driver"], info["cuda_driver_api"] = (m.group(1), m.group(2)) if m else (None, None)
        info["nvidia_smi_version"] = run_cmd(["nvidia-smi", "--version"], 30)[1].strip()
        code = ("import torch, json; print(json.dumps({'torch': torch.__version__, 'torch_cuda': torch.version.cuda, "
                "'nccl': (lambda v: '.'.join(map(str, v)) if isinstance(v, tuple) else str(v))(torch.cuda.nccl.version()), "
                "'device_count': torch.cuda.device_count(), "
                "'names': [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}))")
        rc, out, err = run_cmd([ctx.python, "-c", code], 120, dict(os.environ, **MULTICAST_OFF))
        if rc != 0:
            raise ValidationError("torch with CUDA is needed in %s: %s" % (ctx.python, err.strip()[-500:]))
        info.update(json.loads(out.strip().splitlines()[-1]))
    rc, out, err = run_cmd([ctx.python, "-c", "import ansible.release as r; print(r.__version__)"], 60)
    info["ansible_core"] = out.strip() if rc == 0 else None
    if rc != 0:
        raise ValidationError("ansible-core is not importable by %s: %s; install the wheels (.whl/) first"
                              % (ctx.python, err.strip()[-300:]))
    snap = ctx.smi.snapshot()
    rows, _ = snapshot_rows(snap)
    info["gpus"] = [{"index": r["index"], "name": r["name"], "memory_total_mib": r["memory.total"]} for r in rows]
    info["initial_csv"] = snap
    if len(rows) < ctx.tp:
        raise ValidationError("--tp %d needs %d GPUs, nvidia-smi lists %d" % (ctx.tp, ctx.tp, len(rows)))
    if not snapshot_free(snap):
        raise ValidationError("the GPUs are not free before the validation starts:\n%s\nstop what runs there "
                              "first; this script kills nothing that it did not start" % csv_block(snap))
    return info


def step_ab_test(ctx: Ctx) -> Dict[str, Any]:
    exp_id = "gpuval-ab-tp%d" % ctx.tp
    run = run_playbook(ctx, "ab_test", "ab_test.yml", {
        "specab_experiment_file": str(ctx.experiment_file), "specab_runs_dir": str(ctx.work / "runs"),
        "specab_experiment_id": exp_id})
    frees = tool_outputs(run.tasks, "GPUs free | Wait for no compute process")
    stops = tool_outputs(run.tasks, "Stop | Stop the server recorded in server.json")
    arms = []
    for i, arm in enumerate(ctx.experiment["arms"]):
        run_id = "%03d-%s" % (i + 1, arm["name"])
        arms.append({"arm": arm["name"], "run_id": run_id, "run_dir": "runs/%s/%s" % (exp_id, run_id),
                     "free_before": frees[2 * i] if 2 * i < len(frees) else None,
                     "free_after": frees[2 * i + 1] if 2 * i + 1 < len(frees) else None,
                     "stop_before": stops[2 * i] if 2 * i < len(stops) else None,
                     "stop_after": stops[2 * i + 1] if 2 * i + 1 < len(stops) else None})
    return {"rc": run.rc, "log": str(run.log), "wall_s": round(run.wall_s, 1), "arms": arms}


def run_one_arm(ctx: Ctx, label: str, arm_name: str, extra: Dict[str, Any]) -> Tuple[PlaybookRun, Path]:
    run_id = "001-%s" % arm_name
    exp_id = "gpuval-%s-tp%d" % (label, ctx.tp)
    run_dir = ctx.work / "runs" / exp_id / run_id
    vars_ = {"specab_experiment_file": str(ctx.experiment_file), "specab_experiment_id": exp_id,
             "specab_run_id": run_id, "specab_run_dir": str(run_dir), "specab_arm": ctx.resolved_arm(arm_name)}
    vars_.update(extra)
    return run_playbook(ctx, label, "arm.yml", vars_), run_dir


def compute_apps_of_session(ctx: Ctx, sid: int) -> List[Dict[str, Any]]:
    _, apps = snapshot_rows(ctx.smi.snapshot())
    return [dict(a, session=pid_session(a["pid"])) for a in apps
            if isinstance(a["pid"], int) and pid_session(a["pid"]) == sid]


def step_orphans(ctx: Ctx) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    # the simulated engine leaves its workers behind on request; the real one is killed as it is: whether its
    # scheduler outlives the main process is what this step observes
    fault = {} if ctx.real else {"gpu_validation_sim_fault": "orphan_workers"}
    run, run_dir = run_one_arm(ctx, "orphans", "baseline", dict({"specab_stop_after": False}, **fault))
    out.update(playbook_rc=run.rc, log=str(run.log))
    rec = read_json(ctx.node_dir / "server.json")
    if run.rc != 0 or not rec:
        out["error"] = "the orphan_workers arm did not start (rc %d); see %s" % (run.rc, run.log)
        return out
    pid, sid = int(rec["pid"]), int(rec.get("sid") or rec["pgid"])
    out.update(server_pid=pid, server_sid=sid)
    out["apps_before_kill"] = compute_apps_of_session(ctx, sid)
    t_kill = time.time()
    os.kill(pid, signal.SIGKILL)  # ours: server.json recorded it; only the main process dies
    out["t_kill"] = t_kill
    gone = poll(lambda: not pid_alive(pid), 15)
    out["main_gone_after_s"] = round(time.time() - t_kill, 3) if gone else None
    # observe a window: the workers must keep their real GPU memory without their parent
    window: List[Dict[str, Any]] = []
    t_end = time.monotonic() + 3.0
    while time.monotonic() < t_end:
        snap = ctx.smi.snapshot()
        _, apps = snapshot_rows(snap)
        orphans = [a for a in apps if isinstance(a["pid"], int) and pid_session(a["pid"]) == sid]
        window.append({"t": snap["t"], "orphans": len(orphans), "used_mib": used_mib(snap, ctx.gpus),
                       "snap": snap})
        time.sleep(0.25)
    out["window"] = [{k: w[k] for k in ("t", "orphans", "used_mib")} for w in window]
    out["orphan_csv"] = window[-1]["snap"] if window else None
    out["orphans_found"] = compute_apps_of_session(ctx, sid)
    rc, stop, err = node_tool(ctx, "stop", ["--node-dir", str(ctx.node_dir), "--smi", json.dumps(ctx.smi.argv),
                                            "--grace", "15", "--out", str(ctx.work / "orphans-stop.json")])
    out.update(stop_rc=rc, stop=stop, stop_stderr=err.strip()[-2000:])
    rc, free, err = node_tool(ctx, "gpufree", ["--smi", json.dumps(ctx.smi.argv), "--gpus", "all",
                                               "--threshold-mib", str(THRESHOLD_MIB), "--timeout", "60",
                                               "--node-dir", str(ctx.node_dir),
                                               "--out", str(ctx.work / "orphans-gpufree.json"),
                                               "--csv", str(ctx.work / "orphans-gpufree.csv")])
    out.update(free_rc=rc, free=free, free_stderr=err.strip()[-2000:])
    out["orphans_alive_after"] = [a["pid"] for a in out["orphans_found"] if pid_alive(a["pid"])]
    out["after_csv"] = ctx.smi.snapshot()
    return out


def step_missing_var(ctx: Ctx) -> Dict[str, Any]:
    engine = ctx.engine_cmd
    run, run_dir = run_one_arm(ctx, "missing-var", "baseline",
                               {"specab_engine_cmd": ["env", "-u", MISSING_VAR] + engine})
    out: Dict[str, Any] = {"playbook_rc": run.rc, "log": str(run.log), "run_dir": str(run_dir.relative_to(ctx.work)),
                           "env_check": read_json(run_dir / "env_check.json"),
                           "failure_lines": [ln.strip() for ln in run.text().splitlines()
                                             if "Env verification failed" in ln][:3]}
    rc, free, err = node_tool(ctx, "gpufree", ["--smi", json.dumps(ctx.smi.argv), "--gpus", "all",
                                               "--threshold-mib", str(THRESHOLD_MIB), "--timeout", "60",
                                               "--node-dir", str(ctx.node_dir)])
    out.update(free_rc=rc, free_error=free.get("error"))
    return out


def step_foreign(ctx: Ctx) -> Dict[str, Any]:
    gpu = ctx.tp - 1
    out: Dict[str, Any] = {"gpu": gpu}
    proc = start_foreign(ctx, gpu)
    out["pid"] = proc.pid
    try:
        listed = poll(lambda: proc.poll() is None and any(
            a["pid"] == proc.pid for a in snapshot_rows(ctx.smi.snapshot())[1]), 90, 0.2)
        if not listed:
            out["error"] = "the foreign CUDA process never showed up in nvidia-smi's compute apps (see %s)" % (
                ctx.work / "foreign.log")
            return out
        out["listed_csv"] = ctx.smi.snapshot()
        run, _ = run_one_arm(ctx, "foreign", "baseline", {})
        text = run.text()
        out.update(playbook_rc=run.rc, log=str(run.log))
        out["refusal_lines"] = [ln.strip() for ln in text.splitlines()
                                if "not ours" in ln and str(proc.pid) in ln][:3]
        out["failed_task"] = next((t["name"].split(" msg=")[0] for t in run.tasks
                                   if t["status"] in ("failure", "error")), None)
        out["alive_after"] = proc.poll() is None and pid_alive(proc.pid)
        out["still_listed_after"] = any(a["pid"] == proc.pid for a in snapshot_rows(ctx.smi.snapshot())[1])
        out["after_csv"] = ctx.smi.snapshot()
    finally:
        if proc.poll() is None:
            proc.terminate()  # ours: this script started it
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
    free = poll(lambda: snapshot_free(ctx.smi.snapshot()), 60, 0.1)
    out["free_after_cleanup"] = bool(free)
    return out


def thread_states(pid: int) -> Tuple[Optional[str], int]:
    """(state of the thread-group leader, number of its threads not yet dead) from /proc."""
    try:
        raw = Path("/proc/%d/stat" % pid).read_text()
    except OSError:
        return None, 0
    leader = raw[raw.rfind(")") + 2:].split()[0]
    live = 0
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        tids = []
    for tid in tids:
        try:
            t = Path("/proc/%d/task/%s/stat" % (pid, tid)).read_text()
        except OSError:
            continue
        if t[t.rfind(")") + 2:].split()[0] not in ("Z", "X", "x"):
            live += 1
    return leader, live


def step_exit_probe(ctx: Ctx) -> Dict[str, Any]:
    """Informational: how the death of a CUDA process looks from /proc and from nvidia-smi. A CUDA
    process of ours (own session) is SIGKILLed (what SIGTERM's default action does too) and left
    unreaped, so the leader's 'Z' is the kernel's, not a reaping delay; /proc is read every ~2 ms
    in a thread while nvidia-smi is polled."""
    import threading
    proc = start_foreign(ctx, 0)
    pid = proc.pid
    out: Dict[str, Any] = {"pid": pid}
    try:
        if not poll(lambda: proc.poll() is None and any(
                a["pid"] == pid for a in snapshot_rows(ctx.smi.snapshot())[1]), 90, 0.2):
            out["error"] = "the probe's CUDA process never showed up in compute-apps"
            return out
        out["threads_before"] = thread_states(pid)[1]
        transitions: List[Tuple[float, Optional[str], int]] = []
        done = threading.Event()

        def watch() -> None:
            last = None
            while not done.is_set():
                st = thread_states(pid)
                if st != last:
                    transitions.append((time.time(), st[0], st[1]))
                    last = st
                time.sleep(0.002)

        th = threading.Thread(target=watch, daemon=True)
        th.start()
        time.sleep(0.05)
        t_kill = time.time()
        os.kill(pid, signal.SIGKILL)  # ours: started above
        snaps = []
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            snap = ctx.smi.snapshot()
            rows, apps = snapshot_rows(snap)
            snaps.append({"t0": snap["t0"] - t_kill, "t": snap["t"] - t_kill, "used_mib": used_mib(snap, [0]),
                          "apps": [(a["pid"], a["process_name"], a["used_memory"]) for a in apps]})
            if snapshot_free(snap, [0]):
                break
        time.sleep(0.05)
        done.set()
        th.join(5)
        out["transitions"] = [(round(t - t_kill, 4), st, live) for t, st, live in transitions]
        out["smi"] = snaps
        zs = [t for t, st, _ in out["transitions"] if st == "Z"]
        gone = [t for t, st, live in out["transitions"] if t > 0 and live == 0]
        out["leader_zombie_s"] = zs[0] if zs else None
        out["threads_gone_s"] = gone[0] if gone else None
        out["apps_empty_s"] = next((s["t"] for s in snaps if not s["apps"]), None)
        out["memory_free_s"] = next((s["t"] for s in snaps if s["used_mib"] <= THRESHOLD_MIB and not s["apps"]), None)
        out["name_while_exiting"] = sorted({str(a[1]) for s in snaps for a in s["apps"]})
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
    return out


DRIVER_REPEATS = 2


def driver_inventory(ctx: Ctx) -> Path:
    """The engine's inventory with this validation's settings as group vars (the node dir, the bundle, the
    PYTHONPATH of the wheels): driver.py takes no extra vars, it renders the inventory's own templates."""
    import yaml
    doc = yaml.safe_load(ctx.inventory.read_text())
    doc["all"].setdefault("vars", {}).update(ctx.overrides())
    path = ctx.work / "driver-inventory.yml"
    path.write_text("# written by scripts/gpu_validation.py from %s with this validation's settings\n"
                    % ctx.inventory.relative_to(REPO) + yaml.safe_dump(doc, sort_keys=False))
    return path


def step_driver(ctx: Ctx) -> Dict[str, Any]:
    """A short driver.py run to a report (engine real-sglang; docs/validation/sglang-real.md): the engine's
    experiment, DRIVER_REPEATS interleaved blocks, the node's run queue, report.md/report.json. Past
    --driver-timeout the driver gets SIGINT (its own interrupt: it stops what runs on the node), then SIGKILL."""
    runs_dir = ctx.work / "driver-runs"
    argv = [ctx.python, str(REPO / "driver.py"), "-i", str(driver_inventory(ctx)), "-e", str(ctx.experiment_file),
            "--repeats", str(DRIVER_REPEATS), "--runs-dir", str(runs_dir)]
    logf = ctx.work / "driver.log"
    log("driver: %s" % " ".join(shlex.quote(a) for a in argv))
    t0 = time.monotonic()
    with open(logf, "w") as fh:
        proc = subprocess.Popen(argv, cwd=str(REPO), env=dict(os.environ, **MULTICAST_OFF), stdin=subprocess.DEVNULL,
                                stdout=fh, stderr=subprocess.STDOUT)
        try:
            rc = proc.wait(ctx.driver_timeout_s)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(180)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)
            rc = 124
    wall = time.monotonic() - t0
    log("driver: rc %d after %.1f s (log %s)" % (rc, wall, logf))
    exps = sorted(d for d in runs_dir.iterdir() if (d / "results.sqlite").exists()) if runs_dir.is_dir() else []
    return {"rc": rc, "wall_s": round(wall, 1), "log": str(logf), "argv": argv,
            "expected_runs": DRIVER_REPEATS * len(ctx.experiment["arms"]),
            "experiment_dirs": [str(d.relative_to(ctx.work)) for d in exps]}


def cleanup(ctx: Ctx) -> None:
    """Stop any server of ours the steps may have left (server.json), so nothing outlives the run."""
    if (ctx.node_dir / "server.json").exists() or (ctx.node_dir / "last_server.json").exists():
        rc, data, err = node_tool(ctx, "stop", ["--node-dir", str(ctx.node_dir), "--smi", json.dumps(ctx.smi.argv),
                                                "--grace", "5"])
        if rc != 0:
            log("cleanup: stop.py rc %d: %s" % (rc, data.get("error") or err.strip()[-300:]))


# --------------------------------------------------------------------------- evaluation

@dataclass
class Check:
    key: str
    title: str
    ok: bool
    lines: List[str]


def nccl_env_lines(text: str) -> List[Dict[str, Any]]:
    """NCCL's env-echo lines (``NCCL INFO <VAR> set by environment to <value>``) of a log."""
    out = []
    for line in text.splitlines():
        if "set by environment to" not in line:
            continue
        m = NCCL_ENV_RE.search(line)
        if m:
            out.append({"var": m.group("var"), "value": m.group("value"),
                        "pid": int(m.group("pid")) if m.group("pid") else None,
                        "dev": int(m.group("dev")) if m.group("dev") else None, "line": line.strip()})
    return out


def nccl_matches(expected: str, logged: str) -> bool:
    raw = logged[:-1] if logged.endswith(".") else logged
    if raw == expected:
        return True
    try:
        return int(expected, 0) == int(raw, 10)
    except ValueError:
        return False


def scheduler_pids(env_check: Dict[str, Any]) -> List[int]:
    return [p["pid"] for p in env_check.get("processes", [])
            if "scheduler" in (p.get("name") or "") and not p.get("skipped")]


def eval_env(env_check: Optional[Dict[str, Any]], log_text: str, tp: int, expected: Dict[str, str],
             source: str = "real", real_engine: bool = False) -> Tuple[bool, List[str]]:
    """(d) for one arm: every tuned variable in every scheduler's /proc/PID/environ, and real NCCL
    echo lines from every rank for each variable NCCL reads with this many ranks."""
    if not env_check:
        return False, ["env_check.json missing"]
    lines: List[str] = []
    ok = bool(env_check.get("ok"))
    scheds = scheduler_pids(env_check)
    if len(scheds) != tp:
        ok = False
        lines.append("expected %d scheduler processes, env_check saw %d" % (tp, len(scheds)))
    echoes = nccl_env_lines(log_text)
    for var in TUNED_VARS:
        info = env_check.get("variables", {}).get(var, {})
        env_pids = {int(e.split(":")[1]) for e in info.get("evidence", []) if e.startswith("environ:")}
        nccl_pids = {r["pid"] for r in echoes if r["var"] == var and nccl_matches(expected[var], r["value"])}
        # the simulated engine echoes every variable NCCL reads; the real one creates no communicator at TP 1
        need_nccl = tp > 1 or (var not in TUNING_VARS and not real_engine)
        env_ok = set(scheds) <= env_pids
        nccl_ok = set(scheds) <= nccl_pids
        good = env_ok and (nccl_ok or not need_nccl) and not info.get("mismatches")
        ok = ok and good
        lines.append("%-20s = %-9s environ %d/%d schedulers; NCCL line from %d/%d ranks%s  %s"
                     % (var, expected[var], len(set(scheds) & env_pids), len(scheds),
                        len(set(scheds) & nccl_pids), len(scheds),
                        "" if need_nccl else " (none expected: 1 rank)", "OK" if good else "FAIL"))
    shown = [r["line"] for r in echoes if r["var"] in TUNED_VARS][:8]
    lines += ["  %s: %s" % (source, s) for s in shown]
    return ok, lines


def evaluate(res: Dict[str, Any], work: Path) -> List[Check]:
    """The checks (a)-(e) from results.json and the files of the work dir (which may have moved)."""
    tp = res["preflight"]["tp"]
    gpus = list(range(tp))
    samples = load_samples(work / "samples.jsonl")
    checks: List[Check] = []
    ab = res.get("ab_test") or {}
    exp_env = res.get("expected_env", {})
    src = "simulated" if res["preflight"].get("cpu_sim") else "real"
    real_engine = res.get("engine", "sim") != "sim"

    # (a) GPUs free before/after each arm, with the real CSV
    lines, ok = [], ab.get("rc") == 0 and bool(ab.get("arms"))
    if ab.get("rc") != 0:
        lines.append("ab_test.yml rc %s (log %s)" % (ab.get("rc"), ab.get("log")))
    for arm in ab.get("arms", []):
        for when in ("free_before", "free_after"):
            f = arm.get(when)
            good = bool(f) and f["rc"] == 0 and len((f["data"].get("final") or [])) >= tp
            ok = ok and good
            if not f:
                lines.append("%s %s: no GPUs-free check ran" % (arm["arm"], when))
                continue
            final = f["data"].get("final") or []
            lines.append("%s, %s: rc %s, %s" % (
                arm["arm"], "before the start" if when == "free_before" else "after the stop",
                f["rc"], ", ".join("GPU %s %s MiB, %d compute procs" % (g["index"], g["memory_used_mib"],
                                                                       len(g["compute_processes"])) for g in final)))
            snap = nearest_sample(samples, f["end"]) if f.get("end") else None
            if snap:
                lines.append("    %s nvidia-smi CSV at %+.2f s from that check:" % (src, snap["t"] - f["end"]))
                lines.append(csv_block(snap))
    checks.append(Check("a", "GPUs-free check before/after each arm (real nvidia-smi CSV)", ok, lines))

    # (b) stop -> memory released, per arm
    lines, ok = [], bool(ab.get("arms"))
    for arm in ab.get("arms", []):
        stop = read_json(work / arm["run_dir"] / "stop.json") or {}
        free = read_json(work / arm["run_dir"] / "gpu_free.json") or {}
        sigs = stop.get("signals") or []
        t_term = sigs[0]["t"] if sigs else None
        rel = first_free_sample(samples, t_term, gpus) if t_term else None
        before = last_sample_before(samples, t_term) if t_term else None
        no_apps = first_no_apps_sample(samples, t_term, gpus) if t_term else None
        good = bool(t_term) and rel is not None and free.get("ok") is True
        ok = ok and good
        lines.append("%s: SIGTERM at %s; processes gone after %s s; stop total %s s; gpufree after stop: %s s; "
                     "sampler: compute-apps empty %s s, all GPUs free %s s after SIGTERM (held %s MiB just before)  %s"
                     % (
                         arm["arm"], "%.3f" % t_term if t_term else "?", stop.get("term_to_gone_s"),
                         stop.get("total_s"), free.get("time_to_free_s"),
                         "%.3f" % (no_apps["t"] - t_term) if no_apps and t_term else "?",
                         "%.3f" % (rel["t"] - t_term) if rel and t_term else "?",
                         "%.0f" % used_mib(before, gpus) if before else "?", "OK" if good else "FAIL"))
    p = res.get("exit_probe") or {}
    if p and not p.get("error"):
        lines.append("exit anatomy of one CUDA process (%d threads, SIGKILL, not reaped): leader 'Z' at %s s, "
                     "all threads gone at %s s, compute-apps empty at %s s, memory.used 0 at %s s; process "
                     "name in compute-apps while exiting: %s" % (
                         p.get("threads_before") or 0, p.get("leader_zombie_s"), p.get("threads_gone_s"),
                         p.get("apps_empty_s"), p.get("memory_free_s"), ", ".join(p.get("name_while_exiting", []))))
    elif p.get("error"):
        lines.append("exit probe: %s" % p["error"])
    checks.append(Check("b", "time from stop to memory released, per arm", ok, lines))

    # (c) orphaned workers
    o = res.get("orphans") or {}
    lines = []
    found = o.get("orphans_found") or []
    held = [w for w in o.get("window", [])]
    cleaned = o.get("stop_rc") == 0 and o.get("free_rc") == 0 and not o.get("orphans_alive_after")
    if real_engine:
        # the real engine is killed as it is: whether its scheduler outlives the main process is observed, not
        # provoked; either way nothing of ours may be left and the GPUs must be free
        ok = not o.get("error") and cleaned
        lines.append("real engine: %s" % ("its scheduler outlived the SIGKILLed main process (orphans below)" if found
                                          else "no orphan: its scheduler died with the main process"))
    else:
        ok = (not o.get("error") and len(found) >= tp and bool(held)
              and all(w["orphans"] >= tp and w["used_mib"] > THRESHOLD_MIB for w in held) and cleaned)
    if o.get("error"):
        lines.append(o["error"])
    lines.append("server main pid %s (session %s) SIGKILLed alone; gone after %s s" % (
        o.get("server_pid"), o.get("server_sid"), o.get("main_gone_after_s")))
    lines.append("orphans found via real compute-apps (session = ours): %s" % (
        ", ".join("pid %s %s %s MiB" % (a["pid"], a["process_name"], a["used_memory"]) for a in found) or "none"))
    if held:
        lines.append("held for %.1f s after the parent died: %s MiB used, %d..%d orphan compute procs" % (
            held[-1]["t"] - held[0]["t"], "%.0f" % min(w["used_mib"] for w in held),
            min(w["orphans"] for w in held), max(w["orphans"] for w in held)))
    if o.get("orphan_csv"):
        lines.append("    %s nvidia-smi CSV with the orphans:" % src)
        lines.append(csv_block(o["orphan_csv"]))
    stop = o.get("stop") or {}
    lines.append("stop.py rc %s: signals %s; GPU sweep orphans %s; total %s s" % (
        o.get("stop_rc"), ", ".join("%s->%s %s" % (s["signal"], s["target"], s["id"]) for s in stop.get("signals", [])),
        [a.get("pid") for a in stop.get("gpu_orphans", [])], stop.get("total_s")))
    free = o.get("free") or {}
    lines.append("gpufree rc %s: time to free %s s; orphans alive after: %s" % (
        o.get("free_rc"), free.get("time_to_free_s"), o.get("orphans_alive_after")))
    if o.get("after_csv"):
        lines.append("    %s nvidia-smi CSV after:" % src)
        lines.append(csv_block(o["after_csv"]))
    checks.append(Check("c", "orphaned workers found through real compute processes, cleaned, memory released",
                        ok, lines))

    # (d) env verification: real NCCL lines + /proc/PID/environ; an arm missing a variable is caught
    lines, ok = [], bool(ab.get("arms"))
    for arm in ab.get("arms", []):
        rd = work / arm["run_dir"]
        try:
            text = (rd / "server.log").read_text(errors="replace")
        except OSError:
            text = ""
        good, arm_lines = eval_env(read_json(rd / "env_check.json"), text, tp, exp_env, src, real_engine)
        ok = ok and good
        lines.append("%s: %s" % (arm["arm"], "OK" if good else "FAIL"))
        lines += ["    " + s for s in arm_lines]
    m = res.get("missing_var") or {}
    ec = m.get("env_check") or {}
    var = (ec.get("variables") or {}).get(MISSING_VAR, {})
    mism = var.get("mismatches") or []
    others_ok = all(not (ec.get("variables") or {}).get(v, {}).get("mismatches")
                    for v in TUNED_VARS if v != MISSING_VAR)
    caught = m.get("playbook_rc", 0) != 0 and ec.get("ok") is False and bool(mism) and others_ok
    ok = ok and caught and m.get("free_rc") == 0
    lines.append("arm with %s removed from the engine's env (env -u): playbook rc %s, env_check ok=%s  %s" % (
        MISSING_VAR, m.get("playbook_rc"), ec.get("ok"), "CAUGHT" if caught else "NOT CAUGHT"))
    lines += ["    " + s for s in mism[:3]]
    lines += ["    " + s[:300] for s in m.get("failure_lines", [])[:1]]
    checks.append(Check("d", "env verification by real NCCL lines and /proc/PID/environ", ok, lines))

    # (e) foreign CUDA process refused and named, not killed
    f = res.get("foreign") or {}
    lines = []
    ok = (not f.get("error") and f.get("playbook_rc", 0) != 0 and bool(f.get("refusal_lines"))
          and f.get("alive_after") is True and f.get("still_listed_after") is True and f.get("free_after_cleanup"))
    if f.get("error"):
        lines.append(f["error"])
    lines.append("foreign CUDA process pid %s on GPU %s (%d MiB, own session, started by this script)" % (
        f.get("pid"), f.get("gpu"), FOREIGN_MIB))
    if f.get("listed_csv"):
        lines.append("    %s nvidia-smi CSV:" % src)
        lines.append(csv_block(f["listed_csv"]))
    lines.append("arm.yml rc %s, failed task: %s" % (f.get("playbook_rc"), f.get("failed_task")))
    lines += ["    " + s[:400] for s in f.get("refusal_lines", [])[:1]]
    lines.append("after the playbook: alive=%s, still in compute-apps=%s; freed by this script after: %s" % (
        f.get("alive_after"), f.get("still_listed_after"), f.get("free_after_cleanup")))
    checks.append(Check("e", "foreign CUDA process refused and named, not killed", ok, lines))
    if real_engine:
        checks.append(real_engine_check(ab, work))
        d = res.get("driver") or {}
        if not d.get("skipped"):
            checks.append(driver_check(d, work))
    return checks


def eval_shutdown(stop: Dict[str, Any], version: Optional[str]) -> Tuple[bool, str]:
    """(f)'s shutdown part for one arm: stop.json's record of how the engine ended itself must be the style
    its version uses (engines.shutdown_style_of_version) and show that style's evidence: for tree-kill the
    drain begun and the main process's own kill_process_tree(include_parent=True); for shutdown-req the
    ShutdownReq. No record, or none of it, fails."""
    sd = stop.get("shutdown")
    if not isinstance(sd, dict):
        return False, "stop.json has no shutdown record"
    want = engines.shutdown_style_of_version(version or "")
    kt = sd.get("kill_tree") or {}
    if sd.get("style") == engines.SHUTDOWN_TREE_KILL:
        evidence = bool(sd.get("drain_begun")) and kt.get("include_parent") is True and kt.get("parent_pid") == stop.get("pid")
    elif sd.get("style") == engines.SHUTDOWN_REQ:
        evidence = bool(sd.get("shutdown_req_seen"))
    else:
        evidence = False
    good = evidence and (sd.get("style") == want if want else True)
    exit_info = sd.get("main_exit") or {}
    text = "%s (version %s: %s); drain begun %s, done %d; kill_process_tree %s; children crashed %s; main exit %s" % (
        sd.get("style"), version or "?", want or "style not known", sd.get("drain_begun"), sd.get("drain_lines") or 0,
        "parent_pid=%s include_parent=%s" % (kt.get("parent_pid"), kt.get("include_parent")) if kt else "not logged",
        ", ".join("%s %s" % (c.get("name"), c.get("exit_code")) for c in sd.get("children_crashed") or []) or "none",
        exit_info.get("status") if exit_info.get("observable") else "not observable")
    if sd.get("log_sigterm_to_kill_tree_s") is not None:
        text += "; log: SIGTERM -> kill_process_tree %s s" % sd["log_sigterm_to_kill_tree_s"]
    return good, text


def real_engine_check(ab: Dict[str, Any], work: Path) -> Check:
    """(f) the real engine under the roles: ready, per-request accept length from the real meta_info on the
    speculative arm, and the shutdown stop.json recorded after our SIGTERM (drain, kill_process_tree)."""
    lines: List[str] = []
    ok = bool(ab.get("arms"))
    for arm in ab.get("arms", []):
        rd = work / arm["run_dir"]
        ready = read_json(rd / "ready.json") or {}
        stop = read_json(rd / "stop.json") or {}
        try:
            recs = [json.loads(x) for x in (rd / "bench.jsonl").read_text().splitlines() if x.strip()]
        except (OSError, ValueError):
            recs = []
        measured = [r for r in recs if not r.get("warmup")]
        spec = "speculative_algorithm" in (read_json(rd / "args.json") or {})
        accept = [r.get("accept_len") for r in measured]
        good_bench = bool(measured) and all(r.get("ok") for r in measured) and (
            all(isinstance(a, (int, float)) for a in accept) if spec else all(a is None for a in accept))
        version = (read_json(rd / "server_info.json") or {}).get("version")
        good_shutdown, shutdown_text = eval_shutdown(stop, version if isinstance(version, str) else None)
        good = (bool(ready.get("ok")) and good_bench and bool(stop.get("ok")) and not stop.get("escalated")
                and good_shutdown)
        ok = ok and good
        lines.append("%s: ready %s s; %d/%d measured requests ok; accept_len per request %s; stop: SIGTERM -> all "
                     "gone %s s, escalated %s; shutdown: %s  %s" % (
                         arm["arm"], ready.get("elapsed_s"), sum(1 for r in measured if r.get("ok")), len(measured),
                         accept, stop.get("term_to_gone_s"), stop.get("escalated"), shutdown_text,
                         "OK" if good else "FAIL"))
    return Check("f", "the real engine: ready, accept length from meta_info, the shutdown it logs", ok, lines)


def driver_check(d: Dict[str, Any], work: Path) -> Check:
    """(g) driver.py to a report: exit 0, one experiment whose every planned run is ok, report.md and
    report.json written; per arm the report's tok/s and accept length, and each run's recorded shutdown."""
    import sqlite3
    lines: List[str] = []
    exps = [work / e for e in d.get("experiment_dirs") or []]
    runs: List[Tuple[str, str, str, Optional[str]]] = []
    if len(exps) == 1:
        try:
            con = sqlite3.connect("file:%s?mode=ro" % (exps[0] / "results.sqlite"), uri=True)
            try:
                runs = con.execute("SELECT run_id, arm, status, stop_json FROM runs ORDER BY seq").fetchall()
            finally:
                con.close()
        except sqlite3.Error as exc:
            lines.append("results.sqlite unreadable: %s" % exc)
    report = read_json(exps[0] / "report.json") if len(exps) == 1 else None
    has_md = len(exps) == 1 and (exps[0] / "report.md").is_file()
    n_ok = sum(1 for r in runs if r[2] == "ok")
    ok = (d.get("rc") == 0 and len(exps) == 1 and len(runs) == d.get("expected_runs") and n_ok == len(runs)
          and bool(report) and has_md)
    lines.append("driver.py rc %s after %s s (log %s): %d experiment(s); %d/%s runs ok; report.md %s, report.json %s"
                 % (d.get("rc"), d.get("wall_s"), d.get("log"), len(exps), n_ok, d.get("expected_runs"),
                    "written" if has_md else "missing", "written" if report else "missing"))
    if d.get("error"):
        lines.append(d["error"])
    for run_id, arm, status, stop_json in runs:
        try:
            sd = (json.loads(stop_json or "{}") or {}).get("shutdown") or {}
        except ValueError:
            sd = {}
        ex = sd.get("main_exit") or {}
        lines.append("    %s (%s): %s; shutdown %s, main exit %s" % (
            run_id, arm, status, sd.get("style", "not recorded"),
            ex.get("status") if ex.get("observable") else "not observable"))
    stats = (report or {}).get("stats") or {}
    for arm, a in sorted((stats.get("arms") or {}).items()):
        tok = (a.get("tok_s_run") or {}).get("median")
        acc = (a.get("accept_len") or {}).get("median")
        lines.append("    report: %s %s tok/s (median of runs), accept length %s" % (
            arm, "%.1f" % tok if isinstance(tok, (int, float)) else "?", "%.4f" % acc if acc else "-"))
    for arm, sp in sorted((stats.get("speedups") or {}).items()):
        ci = sp.get("ci") or {}
        lines.append("    report: speedup %s vs %s %.3f [%s, %s] (speeds mean nothing with dummy weights)" % (
            arm, sp.get("baseline"), sp.get("estimate") or 0.0, ci.get("lo"), ci.get("hi")))
    return Check("g", "driver.py to a report on the real engine", ok, lines)


def render_summary(res: Dict[str, Any], checks: List[Check]) -> str:
    pf = res["preflight"]
    head = ["specab GPU validation, TP=%d, %s, engine %s" % (pf["tp"], "CPU dry run (--cpu-sim)" if pf["cpu_sim"] else "real GPUs", res.get("engine", "sim")),
            "machine: %s; driver %s; CUDA (driver API) %s; torch %s (CUDA %s); NCCL %s; ansible-core %s" % (
                ", ".join("%s %s MiB" % (g["name"], g["memory_total_mib"]) for g in pf.get("gpus", [])[:8]),
                pf.get("driver"), pf.get("cuda_driver_api"), pf.get("torch"), pf.get("torch_cuda"),
                pf.get("nccl"), pf.get("ansible_core")),
            "work dir: %s; wall %.0f s" % (res["work"], res.get("wall_s", 0))]
    if (res.get("driver") or {}).get("skipped"):
        head.append("driver.py run to a report: skipped (%s)" % res["driver"]["skipped"])
    body = []
    for c in checks:
        body.append("(%s) %s: %s" % (c.key, c.title, "PASS" if c.ok else "FAIL"))
        body += ["    " + ln for ln in "\n".join(c.lines).splitlines()]
    verdict = "ALL PASS" if checks and all(c.ok for c in checks) else "FAILED: %s" % ", ".join(
        c.key for c in checks if not c.ok)
    return "\n".join(head + [""] + body + ["", "RESULT: " + verdict]) + "\n"


def summarize(work: Path) -> int:
    res = read_json(work / "results.json")
    if not res:
        raise ValidationError("no results.json in %s; run the validation first" % work)
    checks = evaluate(res, work)
    text = render_summary(res, checks)
    (work / "summary.txt").write_text(text)
    write_json(work / "summary.json", [{"key": c.key, "title": c.title, "ok": c.ok, "lines": c.lines} for c in checks])
    sys.stdout.write(text)
    return 0 if all(c.ok for c in checks) else 1


# --------------------------------------------------------------------------- main

def run_main(a: argparse.Namespace) -> int:
    work = Path(a.work).resolve()
    if work.exists() and any(work.iterdir()):
        raise ValidationError("work dir %s is not empty; pass a new --work" % work)
    work.mkdir(parents=True, exist_ok=True)
    if a.engine != "sim" and not a.real_site:
        raise ValidationError("--engine %s needs --real-site DIR: the unpacked bundle of scripts/real_sglang_bundle.sh"
                              % a.engine)
    if a.engine != "sim" and a.cpu_sim:
        raise ValidationError("--cpu-sim runs the simulated engine; it cannot be combined with --engine %s" % a.engine)
    ctx = Ctx(tp=a.tp, work=work, python=a.python or sys.executable, cpu_sim=a.cpu_sim, time_scale=a.time_scale,
              playbook_timeout_s=a.playbook_timeout, engine=a.engine,
              real_site=str(Path(a.real_site).resolve()) if a.real_site else None,
              driver=not a.no_driver, driver_timeout_s=a.driver_timeout)
    for k, v in MULTICAST_OFF.items():
        if os.environ.get(k) != v:
            raise ValidationError("%s=%s must be exported before running (NVLink multicast off in every process); "
                                  "use scripts/gpu_validation.sh" % (k, v))
    t0 = time.monotonic()
    res: Dict[str, Any] = {"work": str(work), "started": time.time(), "engine": a.engine}
    res["preflight"] = preflight(ctx)
    load_experiment(ctx)
    res["experiment_file"] = str(ctx.experiment_file)
    res["expected_env"] = {k: str(v) for k, v in (ctx.experiment.get("env") or {}).items()}
    log("preflight: %s" % json.dumps({k: v for k, v in res["preflight"].items() if k != "initial_csv"}))
    sampler = subprocess.Popen([ctx.python, str(Path(__file__).resolve()), "sample", "--smi", json.dumps(ctx.smi.argv),
                                "--out", str(work / "samples.jsonl"), "--interval", "0.1"],
                               stdin=subprocess.DEVNULL, env=ctx.tool_env())
    try:
        steps: List[Tuple[str, Callable[[Ctx], Dict[str, Any]]]] = [
            ("ab_test", step_ab_test), ("orphans", step_orphans), ("missing_var", step_missing_var),
            ("foreign", step_foreign), ("exit_probe", step_exit_probe)]
        if ctx.real and ctx.driver:
            steps.append(("driver", step_driver))
        elif ctx.real:
            res["driver"] = {"skipped": "--no-driver"}
        for name, step in steps:
            log("step %s" % name)
            try:
                res[name] = step(ctx)
            except (ValidationError, OSError, subprocess.SubprocessError, ValueError) as exc:
                res[name] = {"error": "%s: %s" % (type(exc).__name__, exc)}
                log("step %s failed: %s" % (name, exc))
            cleanup(ctx)
            write_json(work / "results.json", dict(res, wall_s=round(time.monotonic() - t0, 1)))
    finally:
        cleanup(ctx)
        sampler.terminate()
        try:
            sampler.wait(10)
        except subprocess.TimeoutExpired:
            sampler.kill()
    res["wall_s"] = round(time.monotonic() - t0, 1)
    write_json(work / "results.json", res)
    return summarize(work)


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="gpu_validation.py", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the whole validation")
    r.add_argument("--tp", type=int, default=1, help="tensor-parallel size: GPUs used (1 or 2)")
    r.add_argument("--work", default=str(REPO / "runs" / ("gpu-validation-" + time.strftime("%Y%m%d-%H%M%S"))))
    r.add_argument("--time-scale", default="4", help="SPECAB_SIM_TIME_SCALE of the engine")
    r.add_argument("--playbook-timeout", type=float, default=420.0,
                   help="seconds one ansible-playbook run may take (ab_test.yml took 56 s on an H200 machine)")
    r.add_argument("--python", default=None, help="Python with torch+CUDA and ansible-core (default: this one)")
    r.add_argument("--cpu-sim", action="store_true", help="dry run without GPUs: simulated nvidia-smi and foreign process")
    r.add_argument("--engine", choices=sorted(ENGINES), default="sim",
                   help="sim: the simulated engine in GPU mode; real-sglang: the real SGLang from the bundle")
    r.add_argument("--real-site", default=None, help="the unpacked bundle of scripts/real_sglang_bundle.sh")
    r.add_argument("--no-driver", action="store_true",
                   help="engine real-sglang: skip the short driver.py run to a report (check g)")
    r.add_argument("--driver-timeout", type=float, default=900.0,
                   help="seconds the driver.py run may take (4 runs took 283 s on an H200)")
    s = sub.add_parser("summarize", help="print the summary of a finished run")
    s.add_argument("--work", required=True)
    m = sub.add_parser("sample", help="raw nvidia-smi CSV sampler (until SIGTERM)")
    m.add_argument("--smi", required=True)
    m.add_argument("--out", required=True)
    m.add_argument("--interval", type=float, default=0.1)
    a = p.parse_args(argv)
    if a.cmd == "run" and a.tp < 1:
        p.error("--tp must be >= 1")
    return a


def main(argv: Optional[Sequence[str]] = None) -> int:
    a = parse_args(argv)
    try:
        if a.cmd == "sample":
            return sample_main(a)
        if a.cmd == "summarize":
            return summarize(Path(a.work))
        return run_main(a)
    except ValidationError as exc:
        print("gpu_validation: error: %s" % exc, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
