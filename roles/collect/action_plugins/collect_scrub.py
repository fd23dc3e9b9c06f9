"""collect_scrub: the secret values of an experiment replaced by ``<redacted>`` in the run files collected on the
controller, and every file that held one made its owner's alone.

A run's files on the node hold its secrets by design (``launch.sh`` the engine's ``--api-key``, ``nccl.env`` the
arm's ``HF_TOKEN``, the engine's log its args); the controller's copy under ``runs/`` never does, whichever entry
point collected it (``ab_test.yml`` through this role, ``driver.py`` through this role or its own unpack, which
scrubs with the same rule: specab/driver/playbook.py ``scrub_tree``).

The values are those of the secret-named keys in ``sources`` (the experiment, the arm, the node env: any JSON-like
value) and of the secret-named variables of the controller's environment (on a local node, the engine inherits
them). Which names are secret is THE secret rule of ``specab/vocab/contract.py``, loaded from this checkout by path
(stdlib only; ansible-playbook's Python may have another specab installed, or none).

Runs on the controller only, in the controller's own process: nothing is sent to a node.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

CONTRACT = Path(__file__).resolve().parents[3] / "specab" / "vocab" / "contract.py"
CONTRACT_MODULE = "specab_redact_contract"      # the name plugins/callback/specab_redact.py loads it under


def load_contract() -> ModuleType:
    """specab/vocab/contract.py of this checkout under the callback's module name; the same loader as
    plugins/callback/specab_redact.py's ``load_contract`` (its docstring says why there are two)."""
    mod = sys.modules.get(CONTRACT_MODULE)
    if mod is None:
        spec = importlib.util.spec_from_file_location(CONTRACT_MODULE, CONTRACT)
        if spec is None or spec.loader is None:
            raise AnsibleActionFail(f"collect_scrub: cannot load the secret rule from {CONTRACT}")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[CONTRACT_MODULE] = mod
        try:
            spec.loader.exec_module(mod)
        except (OSError, SyntaxError, ImportError) as exc:    # no half-loaded rule is left for the next call
            del sys.modules[CONTRACT_MODULE]
            raise AnsibleActionFail(f"collect_scrub: cannot load the secret rule from {CONTRACT} ({exc}); the plugin runs "
                        f"from a specab checkout and needs its specab/vocab/contract.py") from exc
    return mod


def scrub_dir(root: Path, values: list[str], contract: ModuleType) -> list[str]:
    """Scrub every regular file under ``root``; returns the paths (relative) that held a secret. Those lose their
    group and other permission bits: a file that carried a secret on the node stays private here."""
    changed: list[str] = []
    for path in sorted(root.rglob("*")):
        if path.is_symlink() or not path.is_file():
            continue
        data = path.read_bytes()
        new = contract.scrub_bytes(data, values)
        if new != data:
            path.write_bytes(new)
            path.chmod(path.stat().st_mode & 0o700)
            changed.append(str(path.relative_to(root)))
    return changed


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("path", "sources"))
    _requires_connection = False

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        path = self._task.args.get("path")
        if not isinstance(path, str) or not path:
            raise AnsibleActionFail("collect_scrub: path (the collected run directory) is required")
        contract = load_contract()
        env = {k: v for k, v in os.environ.items() if contract.is_secret_name(k)}
        values = contract.scrub_values(contract.nested_secret_values([self._task.args.get("sources"), env]))
        root = Path(path)
        if not root.is_dir():
            raise AnsibleActionFail(f"collect_scrub: {path} is not a directory (nothing was collected there)")
        changed = scrub_dir(root, values, contract) if values else []
        result.update(changed=bool(changed), scrubbed=changed)
        return result
