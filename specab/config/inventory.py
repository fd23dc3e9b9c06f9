"""Load and validate the inventory (group `gpu_nodes`) before any node is touched."""
from __future__ import annotations

import difflib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from specab.config import defaults
from specab.config.yamlfile import REPO_ROOT, ConfigError, check_unknown, key_line, key_position, load_yaml

DEFAULT_INVENTORY = REPO_ROOT / "inventory" / "local.yml"
# without -i, an experiment runs on the node made for its engine kind: the embedded simulated SGLang node, or a
# real vLLM on this machine's CPU (scripts/install_vllm_cpu.sh)
DEFAULT_INVENTORIES = {"sglang": DEFAULT_INVENTORY, "vllm": REPO_ROOT / "inventory" / "vllm-cpu.yml"}


def default_inventory(engine: str) -> Path:
    """The inventory an experiment of engine kind `engine` uses when none is given."""
    return DEFAULT_INVENTORIES.get(engine, DEFAULT_INVENTORY)
INVENTORY_GROUP_KEYS = {"hosts", "vars", "children"}
NODE_GROUP = "gpu_nodes"     # the group whose hosts are the GPU nodes
DEFAULT_ENGINE_CMD = ["python3", "-m", "sglang.launch_server"]
ENGINE_BUILD_KEYS = {"python", "cmd", "env"}
# The specab_* variables an inventory may set, besides the defaults file's (roles/specab/defaults/main.yml): the
# node variables (docs/architecture.md "Node variables"), the multi-node ones (docs/scale.md), testinfra's ports, and
# the extra vars playbooks/ab_test.yml documents. Any other specab_* name is a misspelling: the roles would never
# read it (specab_nodedir left the node directory at its default, ~/specab).
NODE_VARS = frozenset({
    "specab_engine_cmd", "specab_engines", "specab_engine", "specab_smi_cmd", "specab_python", "specab_node_dir",
    "specab_node_env", "specab_gpu_indices", "specab_bench_python", "specab_multinode", "specab_dist_init_host",
    "specab_dist_init_port", "specab_check_ports", "specab_runs_dir", "specab_experiment_file",
})


@dataclass(frozen=True)
class EngineBuild:
    """One engine build of a node: what launches it and the environment it is launched with.

    An inventory declares builds as ``specab_engines: {NAME: {python: P} | {cmd: [argv...]}, env: {...}}``:
    ``python`` replaces the first word of ``specab_engine_cmd`` (another venv of the same engine), ``cmd``
    the whole argv prefix, ``env`` is exported by the launch script after ``specab_node_env`` (the
    simulator's ``SPECAB_SIM_SGLANG_VERSION`` makes two simulated builds of one interpreter).
    The unnamed build (``name`` None) is ``specab_engine_cmd`` itself."""
    name: str | None
    cmd: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()

    @property
    def python(self) -> str:
        return self.cmd[0]

    @property
    def env_dict(self) -> dict[str, str]:
        return dict(self.env)

    @property
    def label(self) -> str:
        return self.name or " ".join(self.cmd)


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
    def engine_cmd(self) -> list[str]:
        """`specab_engine_cmd`: the node's default engine argv prefix."""
        cmd = self.vars.get("specab_engine_cmd", DEFAULT_ENGINE_CMD)
        return [str(c) for c in (cmd if isinstance(cmd, list) else [cmd])]

    @property
    def engine_builds(self) -> dict[str, EngineBuild]:
        """The engine builds the inventory declares for this host (`specab_engines`), by name."""
        raw = self.vars.get("specab_engines") or {}
        out: dict[str, EngineBuild] = {}
        for name, body in raw.items():
            body = body or {}
            cmd = body.get("cmd") or ([body["python"]] + self.engine_cmd[1:] if body.get("python") else self.engine_cmd)
            out[str(name)] = EngineBuild(name=str(name), cmd=tuple(str(c) for c in cmd),
                                         env=tuple((str(k), str(v)) for k, v in (body.get("env") or {}).items()))
        return out

    def engine_build(self, name: str | None) -> EngineBuild:
        """The build an arm names (None: `specab_engine_cmd`); KeyError when the host does not declare it."""
        if name is None:
            return EngineBuild(name=None, cmd=tuple(self.engine_cmd))
        return self.engine_builds[name]

    def launch_env(self, build: EngineBuild) -> dict[str, Any]:
        """What the launch script exports before the env file: the node env, then the build's env
        (values as the inventory gives them: the template omits a null one)."""
        return {**(self.vars.get("specab_node_env") or {}), **build.env_dict}

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
    def lookup(plugin: str, *terms: str, default: str = "", **_: Any) -> str:
        # Ansible's env lookup (ansible.builtin.env: the variable, else `default`); other lookups are left to
        # Ansible (the value stays unrendered here)
        if plugin not in ("env", "ansible.builtin.env"):
            raise jinja2.TemplateError(f"lookup {plugin!r} is resolved by Ansible only")
        return ",".join(os.environ.get(t, default) for t in terms)
    env.globals["lookup"] = lookup
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


def _check_engines(host: Host, where: str) -> None:
    """`specab_engines` must map build names to {python | cmd, env}."""
    import re
    raw = host.vars.get("specab_engines")
    if raw is None:
        return
    what = f"{where}: host {host.name}: specab_engines"
    if not isinstance(raw, dict):
        raise ConfigError(f"{what} must map engine build names to {{python: P}} or {{cmd: [argv]}} (and env), "
                          f"e.g. sglang-0.5.9: {{python: /opt/sgl059/bin/python}}.")
    for name, body in raw.items():
        if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,39}$", str(name)):
            raise ConfigError(f"{what}: {name!r} is not a build name (letters, digits, '.', '_', '-', at most 40: "
                              f"it ends the names of the arms that run on it).")
        body = body or {}
        if not isinstance(body, dict):
            raise ConfigError(f"{what}.{name} must be a mapping with python or cmd, and env.")
        unknown = sorted(set(body) - ENGINE_BUILD_KEYS)
        if unknown:
            raise ConfigError(f"{what}.{name}: unknown key(s) {', '.join(map(str, unknown))}; use "
                              f"{', '.join(sorted(ENGINE_BUILD_KEYS))}.")
        if "python" in body and "cmd" in body:
            raise ConfigError(f"{what}.{name}: give python (replaces the first word of specab_engine_cmd) or cmd "
                              f"(the whole argv prefix), not both.")
        cmd = body.get("cmd")
        if cmd is not None and (not isinstance(cmd, list) or not cmd):
            raise ConfigError(f"{what}.{name}.cmd must be a non-empty list (the engine's argv prefix).")
        env = body.get("env")
        if env is not None and (not isinstance(env, dict) or not all(
                re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", str(k)) for k in env)):
            raise ConfigError(f"{what}.{name}.env must map environment variable names to values.")


def known_variables() -> frozenset[str]:
    """The specab_* names an inventory may set (NODE_VARS and the defaults file's)."""
    return NODE_VARS | frozenset(defaults.load())


def check_variables(groups: dict[str, dict[str, Any]], where: str, root: Any) -> None:
    """Refuse a specab_* variable that no role reads (a misspelt name), with the closest known names, in every
    group's vars and host vars alike: before any lease is taken or node touched."""
    known = known_variables()
    given = {str(k) for g in groups.values() for k in [*g["vars"], *(k for hv in g["hosts"].values() for k in hv)]}
    bad = sorted(k for k in given if k.startswith(defaults.PREFIX) and k not in known)
    if not bad:
        return
    lines = []
    for k in bad:
        close = difflib.get_close_matches(k, sorted(known), n=1)
        hint = f" (did you mean {' or '.join(close)}?)" if close else ""
        lines.append(f"{where}{key_position(root, k)}: unknown variable {k}{hint}")
    raise ConfigError("\n".join(lines) + f"\nspecab reads these specab_* variables from an inventory: "
                      f"{', '.join(sorted(NODE_VARS))} and the defaults of roles/specab/defaults/main.yml "
                      f"(docs/architecture.md \"Node variables\"). Fix the name; a variable of your own needs "
                      f"another prefix.")


def load_inventory(path: str | os.PathLike[str] | None = None) -> Inventory:
    """Load a YAML inventory; hosts of group `gpu_nodes` (and its children) with merged, rendered variables."""
    p = Path(path) if path else DEFAULT_INVENTORY
    if p.is_dir() or p.suffix not in (".yml", ".yaml"):
        raise ConfigError(f"{p}: specab reads YAML inventories (a .yml file with groups, hosts, vars).")
    data, root = load_yaml(p)
    where = str(p)
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"{where}: an inventory must be a mapping of groups (e.g. 'all:' with 'children:').")
    if "specab_experiment" in data:
        raise ConfigError(f"{where}: this is an experiment file (top-level 'specab_experiment'), given as the "
                          f"inventory: were -e and -i swapped? -e EXPERIMENT.yml -i INVENTORY.yml.")
    groups: dict[str, dict[str, Any]] = {}

    def walk(name: str, body: Any, path: tuple[Any, ...]) -> None:
        if body is None:
            body = {}
        if not isinstance(body, dict):
            raise ConfigError(f"{where}{key_line(root, path)}: group '{name}' must be a mapping with hosts, "
                              f"vars or children.")
        check_unknown(body.keys(), INVENTORY_GROUP_KEYS, where, root, path, f"group '{name}'")
        g = groups.setdefault(name, {"hosts": {}, "vars": {}, "children": []})
        for h, hv in (body.get("hosts") or {}).items():
            if hv is not None and not isinstance(hv, dict):
                raise ConfigError(f"{where}{key_line(root, path + ('hosts', h))}: host '{h}' must map to "
                                  f"a mapping of variables.")
            g["hosts"].setdefault(str(h), {}).update(hv or {})
        if body.get("vars") is not None and not isinstance(body.get("vars"), dict):
            raise ConfigError(f"{where}{key_line(root, path + ('vars',))}: vars of group '{name}' must be a mapping.")
        g["vars"].update(body.get("vars") or {})
        for child, cbody in (body.get("children") or {}).items():
            g["children"].append(str(child))
            walk(str(child), cbody, path + ("children", child))

    for gname, gbody in data.items():
        walk(str(gname), gbody, (gname,))
    if NODE_GROUP not in groups:
        raise ConfigError(f"{where}: no group '{NODE_GROUP}'. Put the GPU nodes in a group named '{NODE_GROUP}'.")

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

    check_variables(groups, where, root)
    hosts: list[Host] = []
    for hname in members(NODE_GROUP, set()):
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
        host = Host(name=hname, vars=_render_vars(hname, merged, sys.executable, p))
        _check_engines(host, where)
        hosts.append(host)
    if not hosts:
        raise ConfigError(f"{where}: group '{NODE_GROUP}' has no hosts.")
    return Inventory(path=p.resolve(), hosts=hosts)
