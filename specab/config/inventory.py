"""Load and validate the inventory (group `gpu_nodes`) before any node is touched."""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2

from specab.config.yamlfile import REPO_ROOT, ConfigError, check_unknown, key_line, load_yaml

DEFAULT_INVENTORY = REPO_ROOT / "inventory" / "local.yml"
INVENTORY_GROUP_KEYS = {"hosts", "vars", "children"}


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
    data, root = load_yaml(p)
    where = str(p)
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"{where}: an inventory must be a mapping of groups (e.g. 'all:' with 'children:').")
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
