"""testinfra checks on the GPU nodes of an Ansible inventory.

Run:  pytest tests/infra --hosts=ansible://gpu_nodes --ansible-inventory=inventory/<inv>.yml

Each host's node variables (specab_smi_cmd, specab_node_dir, specab_node_env, ...) are resolved
by Ansible itself (`ansible <group> -m debug` with the tree callback), so templated values such as
"{{ ansible_playbook_python }}" come out exactly as the playbooks see them. Without --hosts (a
plain `pytest tests`) every check here is skipped: there is no node to check.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

PROBE = ("{{ {'smi': specab_smi_cmd, 'node_dir': specab_node_dir, 'env': specab_node_env | default({}),"
         " 'gpus': specab_gpu_indices | default('all'),"
         " 'threshold_mib': specab_gpu_free_threshold_mib | default(64),"
         " 'ports': specab_check_ports | default([])} | to_json }}")


@dataclass(frozen=True)
class NodeVars:
    """The node variables of one inventory host, resolved by Ansible."""

    name: str
    smi: list[str]
    node_dir: str
    env: dict[str, str] = field(default_factory=dict)
    gpus: Any = "all"
    threshold_mib: float = 64.0
    ports: list[int] = field(default_factory=list)


def _ansible_bin() -> str:
    local = Path(sys.executable).parent / "ansible"
    return str(local) if local.exists() else (shutil.which("ansible") or "ansible")


def resolve_node_vars(inventory: str, pattern: str) -> dict[str, NodeVars]:
    """Resolve every matching host's node variables with Ansible (runs on the controller only)."""
    with tempfile.TemporaryDirectory(prefix="specab-infra-") as tree:
        env = dict(os.environ, ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.builtin.tree",
                   ANSIBLE_CALLBACK_TREE_DIR=tree, ANSIBLE_NOCOLOR="1")
        env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
        proc = subprocess.run([_ansible_bin(), pattern, "-i", inventory, "-m", "ansible.builtin.debug",
                               "-a", "msg=" + PROBE], capture_output=True, text=True, env=env, timeout=120)
        found: dict[str, NodeVars] = {}
        for path in Path(tree).iterdir():
            result = json.loads(path.read_text())
            if result.get("failed"):
                raise RuntimeError(f"cannot resolve the node variables of {path.name} from {inventory}: "
                                   f"{result.get('msg')}")
            v = json.loads(result["msg"])
            found[path.name] = NodeVars(name=path.name, smi=[str(a) for a in v["smi"]], node_dir=v["node_dir"],
                                        env={k: str(x) for k, x in (v["env"] or {}).items()}, gpus=v["gpus"],
                                        threshold_mib=float(v["threshold_mib"]),
                                        ports=[int(p) for p in v["ports"]])
        if not found:
            raise RuntimeError(f"ansible found no host matching {pattern!r} in {inventory} "
                               f"(exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
        return found


@pytest.fixture(scope="session")
def _all_node_vars(request: pytest.FixtureRequest) -> dict[str, NodeVars]:
    hosts = request.config.option.hosts
    if not hosts:
        pytest.skip("testinfra node checks need --hosts=ansible://gpu_nodes --ansible-inventory=<inventory>")
    inventory = request.config.option.ansible_inventory or "inventory/local.yml"
    resolved: dict[str, NodeVars] = {}
    for spec in hosts.split(","):
        pattern = spec.split("://", 1)[1] if spec.startswith("ansible://") else spec
        resolved.update(resolve_node_vars(inventory, pattern or "all"))
    return resolved


@pytest.fixture
def node(host: Any, _all_node_vars: dict[str, NodeVars]) -> NodeVars:
    """The node variables of the host under test (skips without --hosts)."""
    name = getattr(host.backend, "host", None) or host.backend.get_hostname()
    if name not in _all_node_vars:
        pytest.skip(f"{name} has no specab node variables (not an ansible:// host of a specab inventory)")
    return _all_node_vars[name]
