"""Load and validate the experiment file and the inventory before any node is touched.

Every error is a `ConfigError` naming the file, the line and column where known, what was wrong
and what to do. The experiment file format and the resolved-arm rule are pinned in
docs/architecture.md ("Experiment file").
"""
from __future__ import annotations

import copy
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import yaml

from specab.config import engine_args

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_EXPERIMENT = REPO_ROOT / "experiments" / "default.yml"
DEFAULT_INVENTORY = REPO_ROOT / "inventory" / "local.yml"

EXPERIMENT_KEYS = {"name", "description", "model_path", "server_args", "env", "arms", "bench", "timeouts"}
ARM_KEYS = {"name", "description", "server_args", "env"}
BENCH_KEYS = {"api", "num_requests", "warmup_requests", "input_len", "output_len", "concurrency",
              "seed", "timeout_s", "model", "max_tokens", "dataset"}
TIMEOUT_KEYS = {"ready_s", "stop_grace_s", "gpu_free_s", "bench_s", "run_s", "envcheck_s", "smi_s"}
BENCH_APIS = {"generate", "completions", "chat"}
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
ARM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")   # as the server_start role requires
EXPERIMENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
INVENTORY_GROUP_KEYS = {"hosts", "vars", "children"}
SECRET_NAME = re.compile(r"(^HF_TOKEN$|_TOKEN$|_KEY$|_SECRET$|PASSWORD)", re.IGNORECASE)
REDACTED = "<redacted>"


class ConfigError(Exception):
    """A malformed experiment file, inventory or command-line value (what, where, what to do)."""


def is_secret_name(name: str) -> bool:
    """True for variables whose values must never be logged or stored (issue 6, item 18)."""
    return bool(SECRET_NAME.search(name))


def redact_env(env: dict[str, Any]) -> dict[str, Any]:
    """A copy of `env` with secret values replaced by `<redacted>`."""
    return {k: (REDACTED if is_secret_name(k) and v is not None else v) for k, v in env.items()}


# --------------------------------------------------------------------------- YAML with positions

def _load_yaml(path: Path) -> tuple[Any, yaml.Node | None]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found. Pass an existing file (-e/--experiment, -i/--inventory).") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        what = " ".join(str(x) for x in (exc.context, exc.problem) if x)
        raise ConfigError(f"{where}: YAML error: {what}. Fix the YAML syntax at that line and column.") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: YAML error: {exc}") from None
    return data, node


def _node_at(node: yaml.Node | None, keys: tuple[Any, ...]) -> yaml.Node | None:
    for key in keys:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if k.value == key:
                    node = v
                    break
            else:
                return node
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
        else:
            return node
    return node


def _key_line(root: yaml.Node | None, keys: tuple[Any, ...]) -> str:
    """`:line:col` of the key at `keys` (the last element being a mapping key), best effort."""
    parent = _node_at(root, keys[:-1])
    if isinstance(parent, yaml.MappingNode):
        for k, _ in parent.value:
            if k.value == keys[-1]:
                return f":{k.start_mark.line + 1}:{k.start_mark.column + 1}"
    node = _node_at(root, keys)
    if node is not None:
        return f":{node.start_mark.line + 1}:{node.start_mark.column + 1}"
    return ""


# --------------------------------------------------------------------------- experiment

@dataclass(frozen=True)
class Arm:
    """A resolved arm: what every per-arm role receives as `specab_arm`."""
    name: str
    server_args: dict[str, Any]
    env: dict[str, Any]
    is_baseline: bool
    baseline: str                       # name of the baseline arm this arm is compared with
    matrix: dict[str, Any] = field(default_factory=dict)   # matrix values that made it, if any

    def to_extravar(self) -> dict[str, Any]:
        return {"name": self.name, "server_args": dict(self.server_args), "env": dict(self.env)}

    def to_json(self, redact: bool = True) -> dict[str, Any]:
        return {"name": self.name, "server_args": dict(self.server_args),
                "env": redact_env(self.env) if redact else dict(self.env),
                "is_baseline": self.is_baseline, "baseline": self.baseline, "matrix": dict(self.matrix)}


@dataclass(frozen=True)
class Experiment:
    """A validated experiment file."""
    path: Path
    name: str
    model_path: str
    server_args: dict[str, Any]
    env: dict[str, Any]
    arms: list[dict[str, Any]]          # raw arm overlays as written in the file
    bench: dict[str, Any]
    timeouts: dict[str, Any]
    raw: dict[str, Any]                 # the `specab_experiment` mapping as loaded
    warnings: list[str] = field(default_factory=list)

    def as_extravar(self) -> dict[str, Any]:
        """The experiment dict passed to the playbook as `specab_experiment`."""
        return copy.deepcopy(self.raw)


def _is_spec(server_args: dict[str, Any]) -> bool:
    return server_args.get("speculative_algorithm") not in (None, False, "")


def overlay(common: dict[str, Any], arm: dict[str, Any] | None) -> dict[str, Any]:
    """`common | arm`, where `null` in the arm removes a common key (the contract)."""
    out = dict(common)
    for k, v in (arm or {}).items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def resolve_arm(exp: Experiment, arm: dict[str, Any], baseline: str = "baseline",
                matrix: dict[str, Any] | None = None) -> Arm:
    """Resolve one arm overlay of the experiment per the contract (arm wins; model_path added)."""
    server_args = overlay(exp.server_args, arm.get("server_args"))
    server_args["model_path"] = exp.model_path
    env = overlay(exp.env, arm.get("env"))
    spec = _is_spec(server_args)
    return Arm(name=str(arm["name"]), server_args=server_args, env=env, is_baseline=not spec,
               baseline=baseline if spec else str(arm["name"]), matrix=dict(matrix or {}))


def _check_value(value: Any, where: str) -> None:
    """Refuse values that cannot be passed literally (item 16): newlines, NUL, nested mappings."""
    if isinstance(value, dict):
        raise ConfigError(f"{where}: a mapping is not a valid value; use a scalar or a list.")
    if isinstance(value, list):
        for i, item in enumerate(value):
            if isinstance(item, (dict, list)):
                raise ConfigError(f"{where}[{i}]: nested values are not allowed; use scalars.")
            _check_value(item, f"{where}[{i}]")
        return
    if isinstance(value, str) and ("\n" in value or "\r" in value or "\x00" in value):
        raise ConfigError(f"{where}: the value contains a newline or NUL character, which cannot be passed "
                          f"to the engine literally. Remove it.")


def _check_server_args(args: Any, where: str, root: yaml.Node | None, path: tuple[Any, ...],
                       warnings: list[str]) -> dict[str, Any]:
    if args is None:
        return {}
    if not isinstance(args, dict):
        raise ConfigError(f"{where}{_key_line(root, path)}: server_args must be a mapping of SGLang argument "
                          f"names to values, got {type(args).__name__}.")
    for k, v in args.items():
        if not isinstance(k, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", k):
            raise ConfigError(f"{where}{_key_line(root, path + (k,))}: server_args key {k!r} is not a valid "
                              f"argument name (lowercase letters, digits and '_').")
        if not engine_args.is_known(k):
            warnings.append(engine_args.unknown_message(k, f"{where}{_key_line(root, path + (k,))}")
                            + " (passed through; the node's engine --help is the final check)")
        _check_value(v, f"{where}{_key_line(root, path + (k,))}: server_args.{k}")
    return dict(args)


def _check_env(env: Any, where: str, root: yaml.Node | None, path: tuple[Any, ...]) -> dict[str, Any]:
    if env is None:
        return {}
    if not isinstance(env, dict):
        raise ConfigError(f"{where}{_key_line(root, path)}: env must be a mapping NAME: value.")
    for k, v in env.items():
        if not isinstance(k, str) or not ENV_NAME.match(k):
            raise ConfigError(f"{where}{_key_line(root, path + (k,))}: {k!r} is not a valid environment "
                              f"variable name (letters, digits, '_', not starting with a digit).")
        if isinstance(v, (dict, list)):
            raise ConfigError(f"{where}{_key_line(root, path + (k,))}: env.{k} must be a scalar.")
        _check_value(v, f"{where}{_key_line(root, path + (k,))}: env.{k}")
    return dict(env)


def _unknown(keys: Any, allowed: set[str], where: str, root: yaml.Node | None, path: tuple[Any, ...],
             what: str) -> None:
    bad = [k for k in keys if k not in allowed]
    if bad:
        import difflib
        msgs = []
        for k in bad:
            close = difflib.get_close_matches(str(k), sorted(allowed), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            msgs.append(f"{where}{_key_line(root, path + (k,))}: unknown key '{k}' in {what}{hint}")
        raise ConfigError("\n".join(msgs) + f"\nAllowed keys in {what}: {', '.join(sorted(allowed))}.")


def load_experiment(path: str | os.PathLike[str] | None = None) -> Experiment:
    """Load and validate an experiment file (default: experiments/default.yml)."""
    p = Path(path) if path else DEFAULT_EXPERIMENT
    data, root = _load_yaml(p)
    where = str(p)
    if not isinstance(data, dict) or "specab_experiment" not in data:
        raise ConfigError(f"{where}: the file must have one top-level key 'specab_experiment' "
                          f"(see experiments/default.yml).")
    _unknown(data.keys(), {"specab_experiment"}, where, root, (), "the top level")
    exp = data["specab_experiment"]
    base = ("specab_experiment",)
    if not isinstance(exp, dict):
        raise ConfigError(f"{where}{_key_line(root, base)}: specab_experiment must be a mapping.")
    _unknown(exp.keys(), EXPERIMENT_KEYS, where, root, base, "specab_experiment")
    for req in ("name", "model_path", "arms"):
        if req not in exp or exp[req] in (None, "", []):
            raise ConfigError(f"{where}{_key_line(root, base)}: specab_experiment.{req} is required.")
    name = str(exp["name"])
    if not EXPERIMENT_NAME.match(name):
        raise ConfigError(f"{where}{_key_line(root, base + ('name',))}: experiment name {name!r} may only "
                          f"contain letters, digits, '.', '_' and '-'.")
    _check_value(exp["model_path"], f"{where}{_key_line(root, base + ('model_path',))}: model_path")
    warnings: list[str] = []
    server_args = _check_server_args(exp.get("server_args"), where, root, base + ("server_args",), warnings)
    if _is_spec(server_args):
        raise ConfigError(f"{where}{_key_line(root, base + ('server_args',))}: speculative_algorithm belongs in "
                          f"an arm's server_args, not in the common server_args (the baseline arm must not "
                          f"speculate).")
    env = _check_env(exp.get("env"), where, root, base + ("env",))
    arms = exp["arms"]
    if not isinstance(arms, list):
        raise ConfigError(f"{where}{_key_line(root, base + ('arms',))}: arms must be a list.")
    seen: set[str] = set()
    for i, arm in enumerate(arms):
        apath = base + ("arms", i)
        if not isinstance(arm, dict) or "name" not in arm:
            raise ConfigError(f"{where}{_key_line(root, apath)}: arms[{i}] must be a mapping with a 'name'.")
        _unknown(arm.keys(), ARM_KEYS, where, root, apath, f"arms[{i}]")
        aname = str(arm["name"])
        if not ARM_NAME.match(aname):
            raise ConfigError(f"{where}{_key_line(root, apath + ('name',))}: arm name {aname!r} may only contain "
                              f"letters, digits and . _ - (at most 64 characters)")
        if aname in seen:
            raise ConfigError(f"{where}{_key_line(root, apath + ('name',))}: duplicate arm name '{aname}'.")
        seen.add(aname)
        _check_server_args(arm.get("server_args"), where, root, apath + ("server_args",), warnings)
        _check_env(arm.get("env"), where, root, apath + ("env",))
    bench = exp.get("bench") or {}
    if not isinstance(bench, dict):
        raise ConfigError(f"{where}{_key_line(root, base + ('bench',))}: bench must be a mapping.")
    _unknown(bench.keys(), BENCH_KEYS, where, root, base + ("bench",), "bench")
    if "api" in bench and bench["api"] not in BENCH_APIS:
        raise ConfigError(f"{where}{_key_line(root, base + ('bench', 'api'))}: bench.api must be one of "
                          f"{', '.join(sorted(BENCH_APIS))}, got {bench['api']!r}.")
    for k in ("num_requests", "warmup_requests", "input_len", "output_len", "concurrency", "seed"):
        if k in bench and (not isinstance(bench[k], int) or isinstance(bench[k], bool) or bench[k] < 0):
            raise ConfigError(f"{where}{_key_line(root, base + ('bench', k))}: bench.{k} must be a "
                              f"non-negative integer, got {bench[k]!r}.")
    timeouts = exp.get("timeouts") or {}
    if not isinstance(timeouts, dict):
        raise ConfigError(f"{where}{_key_line(root, base + ('timeouts',))}: timeouts must be a mapping.")
    _unknown(timeouts.keys(), TIMEOUT_KEYS, where, root, base + ("timeouts",), "timeouts")
    for k, v in timeouts.items():
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0:
            raise ConfigError(f"{where}{_key_line(root, base + ('timeouts', k))}: timeouts.{k} must be a "
                              f"positive number of seconds, got {v!r}.")
    return Experiment(path=p.resolve(), name=name, model_path=str(exp["model_path"]), server_args=server_args,
                      env=env, arms=[dict(a) for a in arms], bench=dict(bench), timeouts=dict(timeouts),
                      raw=copy.deepcopy(exp), warnings=warnings)


# --------------------------------------------------------------------------- inventory

@dataclass(frozen=True)
class Host:
    """One inventory host of group `gpu_nodes`, with its variables rendered for controller-side use."""
    name: str
    vars: dict[str, Any]

    @property
    def connection(self) -> str:
        return str(self.vars.get("ansible_connection", "ssh"))

    @property
    def is_local(self) -> bool:
        return self.connection == "local"

    @property
    def address(self) -> str:
        return str(self.vars.get("ansible_host", self.name))

    @property
    def port(self) -> int:
        return int(self.vars.get("ansible_port", self.vars.get("ansible_ssh_port", 22)))

    @property
    def user(self) -> str | None:
        u = self.vars.get("ansible_user", self.vars.get("ansible_ssh_user"))
        return str(u) if u else None

    @property
    def key_file(self) -> str | None:
        k = self.vars.get("ansible_ssh_private_key_file", self.vars.get("ansible_private_key_file"))
        return str(k) if k else None

    @property
    def node_dir(self) -> str:
        return str(self.vars.get("specab_node_dir", "~/specab"))

    @property
    def smi_cmd(self) -> list[str]:
        cmd = self.vars.get("specab_smi_cmd", ["nvidia-smi"])
        return [str(c) for c in (cmd if isinstance(cmd, list) else [cmd])]

    @property
    def node_env(self) -> dict[str, str]:
        env = self.vars.get("specab_node_env") or {}
        return {str(k): str(v) for k, v in env.items()}

    @property
    def ssh_options(self) -> dict[str, str]:
        """`-o Key=Value` options from ansible_ssh_common_args / ansible_ssh_extra_args."""
        import shlex
        opts: dict[str, str] = {}
        for var in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
            words = shlex.split(str(self.vars.get(var) or ""))
            for i, w in enumerate(words):
                val = None
                if w == "-o" and i + 1 < len(words):
                    val = words[i + 1]
                elif w.startswith("-o") and len(w) > 2:
                    val = w[2:]
                if val and "=" in val:
                    k, v = val.split("=", 1)
                    opts[k.strip().lower()] = v.strip()
        return opts


@dataclass(frozen=True)
class Inventory:
    path: Path
    hosts: list[Host]


def _render_vars(hostname: str, raw: dict[str, Any], controller_python: str,
                 inventory_file: Path) -> dict[str, Any]:
    import json
    import shlex
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    # the few Ansible filters an inventory commonly uses for paths
    env.filters.update({"dirname": os.path.dirname, "basename": os.path.basename,
                        "expanduser": os.path.expanduser, "realpath": os.path.realpath,
                        "quote": lambda v: shlex.quote(str(v)), "to_json": json.dumps,
                        "bool": lambda v: str(v).lower() in ("1", "true", "yes", "on")})
    ctx: dict[str, Any] = dict(raw)
    ctx.update({"inventory_hostname": hostname, "inventory_hostname_short": hostname.split(".")[0],
                "ansible_playbook_python": controller_python,
                "inventory_dir": str(inventory_file.resolve().parent),
                "inventory_file": str(inventory_file.resolve()),
                "playbook_dir": str(REPO_ROOT / "playbooks")})

    def render(value: Any, depth: int = 0) -> Any:
        if isinstance(value, str) and ("{{" in value or "{%" in value) and depth < 5:
            try:
                out = env.from_string(value).render(ctx)
            except jinja2.TemplateError:
                return value            # leave what only Ansible can resolve (facts etc.)
            return render(out, depth + 1)
        if isinstance(value, list):
            return [render(v, depth) for v in value]
        if isinstance(value, dict):
            return {k: render(v, depth) for k, v in value.items()}
        return value

    return {k: render(v) for k, v in raw.items()}


def load_inventory(path: str | os.PathLike[str] | None = None, group: str = "gpu_nodes",
                   controller_python: str | None = None) -> Inventory:
    """Load a YAML inventory; hosts of `group` (and its children) with merged, rendered variables."""
    p = Path(path) if path else DEFAULT_INVENTORY
    if p.is_dir() or p.suffix not in (".yml", ".yaml"):
        raise ConfigError(f"{p}: specab reads YAML inventories (a .yml file with groups, hosts, vars).")
    data, root = _load_yaml(p)
    where = str(p)
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"{where}: an inventory must be a mapping of groups (e.g. 'all:' with 'children:').")
    groups: dict[str, dict[str, Any]] = {}

    def walk(name: str, body: Any, path: tuple[Any, ...]) -> None:
        if body is None:
            body = {}
        if not isinstance(body, dict):
            raise ConfigError(f"{where}{_key_line(root, path)}: group '{name}' must be a mapping with hosts, "
                              f"vars or children.")
        _unknown(body.keys(), INVENTORY_GROUP_KEYS, where, root, path, f"group '{name}'")
        g = groups.setdefault(name, {"hosts": {}, "vars": {}, "children": []})
        for h, hv in (body.get("hosts") or {}).items():
            if hv is not None and not isinstance(hv, dict):
                raise ConfigError(f"{where}{_key_line(root, path + ('hosts', h))}: host '{h}' must map to "
                                  f"a mapping of variables.")
            g["hosts"].setdefault(str(h), {}).update(hv or {})
        if body.get("vars") is not None and not isinstance(body.get("vars"), dict):
            raise ConfigError(f"{where}{_key_line(root, path + ('vars',))}: vars of group '{name}' must be a mapping.")
        g["vars"].update(body.get("vars") or {})
        for child, cbody in (body.get("children") or {}).items():
            g["children"].append(str(child))
            walk(str(child), cbody, path + ("children", child))

    for gname, gbody in data.items():
        walk(str(gname), gbody, (gname,))
    if group not in groups:
        raise ConfigError(f"{where}: no group '{group}'. Put the GPU nodes in a group named '{group}'.")

    parents: dict[str, list[str]] = {}
    for gname, g in groups.items():
        for child in g["children"]:
            parents.setdefault(child, []).append(gname)

    def members(gname: str, seen: set[str]) -> list[str]:
        if gname in seen:
            return []
        seen.add(gname)
        out = list(groups[gname]["hosts"].keys())
        for child in groups[gname]["children"]:
            out += [h for h in members(child, seen) if h not in out]
        return out

    def ancestry(gname: str, seen: set[str]) -> list[str]:
        """Groups from the most general to `gname`."""
        if gname in seen:
            return []
        seen.add(gname)
        out: list[str] = []
        for parent in parents.get(gname, []):
            out += [x for x in ancestry(parent, seen) if x not in out]
        return out + [gname]

    python = controller_python or sys.executable
    hosts: list[Host] = []
    for hname in members(group, set()):
        merged: dict[str, Any] = {}
        if "all" in groups:
            merged.update(groups["all"]["vars"])
        host_groups = [g for g, body in groups.items() if hname in body["hosts"]]
        order: list[str] = []
        for g in host_groups:
            order += [x for x in ancestry(g, set()) if x not in order]
        for g in order:
            merged.update(groups[g]["vars"])
        for g in host_groups:
            merged.update(groups[g]["hosts"][hname])
        hosts.append(Host(name=hname, vars=_render_vars(hname, merged, python, p)))
    if not hosts:
        raise ConfigError(f"{where}: group '{group}' has no hosts.")
    return Inventory(path=p.resolve(), hosts=hosts)
