"""Read-only checks of each arm against the node it runs on, before any server starts.

- GPUs: the GPUs an arm's server takes on a host (TP x PP, x DP where each replica has its own GPUs, over the hosts
  of a multi-node server; SGLang's base_gpu_id and gpu_id_step) against the GPUs the host has (nvidia-smi) and the
  ones CUDA_VISIBLE_DEVICES lets it see (its count, duplicates, indices the node lacks).
- Context: an arm that sets no context length on its command line runs the model's own (its config.json on the
  node, read as the engines derive it: `specab.vocab.engines.context_of_config`); its prompts and answers must fit
  (`specab.config.armchecks.context_problem`).
- Space: the node directory's disk has room for a run's files.

Each refusal names the setting, the limit and where each came from. A check that cannot read what it needs (an
nvidia-smi that does not answer, a model that is no local directory) says so in a notice and leaves the final word
to the engine, as the engine-flag check does.
"""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any, Callable

from specab.config import armchecks
from specab.config.inventory import Host
from specab.config.spec import ArmSpec, ExperimentSpec
from specab.driver.preflight import PreflightError
from specab.driver.remote import Node, RemoteError, open_node
from specab.vocab import engines

NODE_MIN_FREE_MB = 200      # a run's files on the node: launch script, server log, bench records, GPU samples
PROBE_TIMEOUT_S = 60.0
# how each engine spells the parallel sizes (the experiment may use either engine's names)
TP_KEYS = ("tp_size", "tensor_parallel_size")
PP_KEYS = ("pp_size", "pipeline_parallel_size")
DP_KEYS = ("dp_size", "data_parallel_size")


@dataclass(frozen=True)
class Gpus:
    """What nvidia-smi on a host lists: each GPU's index and UUID."""
    indices: tuple[str, ...]
    uuids: tuple[str, ...]


def _size(args: dict[str, Any], keys: tuple[str, ...]) -> tuple[int, str | None]:
    for k in keys:
        v = args.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v, k
    return 1, None


def gpus_needed(arm: ArmSpec, hosts: int) -> tuple[int, list[str]]:
    """The GPUs the arm's server takes on each of its `hosts`, and the settings that make that number."""
    a = arm.server_args
    tp, tpk = _size(a, TP_KEYS)
    pp, ppk = _size(a, PP_KEYS)
    dp, dpk = _size(a, DP_KEYS)
    if a.get("enable_dp_attention"):
        dp, dpk = 1, None          # SGLang's DP attention splits the TP group, it adds no GPUs
    why = [f"{k} {v}" for k, v in ((tpk, tp), (ppk, pp), (dpk, dp)) if k]
    world = tp * pp * dp
    per_host = -(-world // max(1, hosts))
    if hosts > 1:
        why.append(f"over {hosts} hosts")
    base, step = a.get("base_gpu_id"), a.get("gpu_id_step")
    if isinstance(base, int) and base > 0 or isinstance(step, int) and step > 1:
        base, step = int(base or 0), int(step or 1)
        why.append(f"from GPU {base} every {step} (base_gpu_id, gpu_id_step)")
        return base + (per_host - 1) * step + 1, why
    return per_host, why


def read_gpus(host: Host, node: Node) -> Gpus | None:
    rc, out, _ = node.run(host.smi_cmd + ["--query-gpu=index,uuid", "--format=csv,noheader,nounits"],
                          timeout=PROBE_TIMEOUT_S, env=host.node_env or None)
    if rc != 0:
        return None
    rows = [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]
    return Gpus(tuple(r[0] for r in rows if len(r) >= 2), tuple(r[1] for r in rows if len(r) >= 2))


def visible_problem(cvd: str, gpus: Gpus, need: int) -> str | None:
    """What is wrong with a CUDA_VISIBLE_DEVICES value on a host of `gpus` for a server of `need` GPUs, or None."""
    ids = [x.strip() for x in cvd.split(",") if x.strip()]
    dup = sorted({x for x in ids if ids.count(x) > 1})
    if dup:
        return f"names GPU {', '.join(dup)} more than once"
    missing = [x for x in ids if x not in gpus.indices and x not in gpus.uuids]
    if missing:
        return (f"names GPU {', '.join(missing)}, which the host does not have (nvidia-smi lists "
                f"{', '.join(gpus.indices) or 'none'})")
    if len(ids) < need:
        return f"shows {len(ids)} GPU(s), fewer than the {need} the server takes"
    return None


def gpu_problems(exp: ExperimentSpec, arms: list[ArmSpec], host: Host, gpus: Gpus, hosts: int) -> list[str]:
    src = armchecks.Sources(exp)
    out = []
    for arm in arms:
        need, why = gpus_needed(arm, hosts)
        made = f"{' x '.join(why)}: {', '.join(_sources(src, arm, why))}" if why else "one GPU"
        if need > len(gpus.indices):
            out.append(f"arm {arm.name} on {host.name}: its server takes {need} GPU(s) ({made}) but {host.name} has "
                       f"{len(gpus.indices)} (nvidia-smi)")
            continue
        cvd, where = _visible(exp, arm, host, src)
        bad = visible_problem(cvd, gpus, need) if cvd is not None else None
        if bad:
            out.append(f"arm {arm.name} on {host.name}: CUDA_VISIBLE_DEVICES={cvd!r} ({where}) {bad} ({made})")
    return out


def _sources(src: armchecks.Sources, arm: ArmSpec, why: list[str]) -> list[str]:
    keys = [w.split()[0] for w in why if w.split()[0] in arm.server_args]
    return [src.server_arg(arm, k) for k in keys]


def _visible(exp: ExperimentSpec, arm: ArmSpec, host: Host, src: armchecks.Sources) -> tuple[str | None, str]:
    """The arm's CUDA_VISIBLE_DEVICES on `host` and where it came from: the experiment's env (the env file, read
    last), else the host's launch environment (specab_node_env, the engine build's env)."""
    key = "CUDA_VISIBLE_DEVICES"
    if arm.env.get(key) is not None:
        return str(arm.env[key]), src.env(arm, key) or f"env.{key}"
    value = host.launch_env(host.engine_build(arm.engine)).get(key)
    return (None, "") if value is None else (str(value), f"the launch environment of {host.name} (inventory)")


def model_limit(host: Host, node: Node, model_path: str) -> armchecks.Limit | None:
    """The model's own context length from its config.json on the node, or None (no such local directory)."""
    raw = node.read_from(model_path.rstrip("/") + "/config.json", 0)
    if raw is None:
        return None
    try:
        found = engines.context_of_config(json.loads(raw.decode()))
    except (ValueError, UnicodeDecodeError, AttributeError):
        return None
    if found is None:
        return None
    tokens, key = found
    return armchecks.Limit(tokens, f"{key} in {model_path}/config.json on {host.name}, the model's own: the launch "
                                   f"sets no {{key}}")


def context_problems(exp: ExperimentSpec, arms: list[ArmSpec], host: Host, node: Node) -> list[str]:
    """The arms without a context length of their own, against their model's (read once per model)."""
    key = armchecks.CONTEXT_ARG.get(exp.engine, armchecks.CONTEXT_ARG[engines.SGLANG])
    src = armchecks.Sources(exp)
    limits: dict[str, armchecks.Limit | None] = {}
    loaded: dict[str, list[dict[str, Any]]] = {}
    out = []
    for arm in arms:
        if armchecks.arg_limit(exp, arm, src) is not None:
            continue            # its own context length, checked with the experiment (armchecks.check_context)
        model = str(arm.server_args.get("model_path") or exp.model_path)
        if model not in limits:
            limits[model] = model_limit(host, node, model)
        limit = limits[model]
        if limit is None:
            continue
        limit = armchecks.Limit(limit.tokens, limit.source.replace("{key}", key))
        bad = armchecks.context_problem(arm, armchecks.longest_prompt(exp, arm, loaded),
                                        int(armchecks.bench_of(exp, arm)["output_len"]),
                                        src.bench(arm, "output_len"), limit, exp.engine)
        if bad:
            out.append(bad)
    return out


_FREE_PROBE = ("import os, shutil, sys\n"
               "p = os.path.expanduser(sys.argv[1])\n"
               "while not os.path.exists(p) and os.path.dirname(p) != p:\n"
               "    p = os.path.dirname(p)\n"
               "print(shutil.disk_usage(p).free)\n")


def disk_problem(host: Host, node: Node) -> str | None:
    python = str(host.vars.get("specab_python", "python3"))
    rc, out, _ = node.run([python, "-c", _FREE_PROBE, host.node_dir], timeout=PROBE_TIMEOUT_S)
    try:
        free_mb = int(out.strip().splitlines()[-1]) / 1e6 if rc == 0 else None
    except (ValueError, IndexError):
        free_mb = None
    if free_mb is not None and free_mb < NODE_MIN_FREE_MB:
        return (f"{host.name}: only {free_mb:.0f} MB free on the disk of its node directory {host.node_dir} "
                f"(specab_node_dir; a run's files need at least {NODE_MIN_FREE_MB} MB). Free some space there or "
                f"set specab_node_dir to a disk with room.")
    return None


def check_nodes(exp: ExperimentSpec, arms: list[ArmSpec], hosts: list[Host], multinode: bool,
                notice: Callable[[str], None]) -> None:
    """Refuse (PreflightError) an arm its node cannot run as asked; every host is asked read-only."""
    problems: list[str] = []
    for i, host in enumerate(hosts):
        try:
            node = open_node(host)
        except Exception as exc:           # the lease and the first run name an unreachable host
            notice(f"{host.name}: not checked before the first run ({type(exc).__name__}: {exc}).")
            continue
        try:
            problems += _check_host(exp, arms, host, node, len(hosts) if multinode else 1, i == 0, notice)
        except RemoteError as exc:
            notice(f"{host.name}: not checked before the first run ({exc}).")
        finally:
            node.close()
    if problems:
        raise PreflightError("\n".join(problems) + "\nEvery run would fail after its server started (or run "
                             "something other than what was asked). Fix the experiment or the inventory.")


def _check_host(exp: ExperimentSpec, arms: list[ArmSpec], host: Host, node: Node, hosts: int, head: bool,
                notice: Callable[[str], None]) -> list[str]:
    problems: list[str] = []
    gpus = read_gpus(host, node)
    if gpus is None:
        notice(f"{host.name}: GPUs not checked before the first run (`{shlex.join(host.smi_cmd)}` did not answer).")
    else:
        problems += gpu_problems(exp, arms, host, gpus, hosts)
    if head:        # the model is read where the server's HTTP side runs: the head of a multi-node server
        problems += context_problems(exp, arms, host, node)
    bad = disk_problem(host, node)
    return problems + ([bad] if bad else [])
