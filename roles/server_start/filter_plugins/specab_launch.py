"""The launch template's context for roles/server_start, from specab.config.launch: the function `driver.py plan`
renders the same templates with (specab/driver/render.py).

    {{ arm | specab_launch_context(engine_cmd=..., node_env=..., engine=..., run_id=...) }}
    {{ experiment_engine | specab_engine_kind(host_engine) }}
    {{ arm | specab_holds_secret(node_env) }}
"""
from __future__ import annotations

import json
from typing import Any, Callable

from specab.config import launch
from specab.vocab import contract


def _plain(value: Any) -> Any:
    """Ansible's templated containers and tagged strings as plain JSON values."""
    return json.loads(json.dumps(value, default=str))


def launch_context(arm: Any, engine_cmd: Any, node_env: Any, engine: str, run_id: str | None = None) -> dict[str, Any]:
    return launch.template_context(_plain(arm), engine_cmd=_plain(engine_cmd), node_env=_plain(node_env),
                                   engine=str(engine), run_id=str(run_id) if run_id else None)


def engine_kind(experiment_engine: Any, host_engine: Any = None) -> str:
    return launch.engine_kind(str(experiment_engine) if experiment_engine else None,
                              str(host_engine) if host_engine else None)


def holds_secret(*values: Any) -> bool:
    """Whether any value (the arm, the node env) holds a secret-named key with a value (specab.vocab.contract's
    rule): the files rendered from it are then shown by no --diff, whatever stdout callback prints the run."""
    return any(contract.redact_mapping(v) != v for v in map(_plain, values))


class FilterModule:
    def filters(self) -> dict[str, Callable[..., Any]]:
        return {"specab_launch_context": launch_context, "specab_engine_kind": engine_kind,
                "specab_holds_secret": holds_secret}
