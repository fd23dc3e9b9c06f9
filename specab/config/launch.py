"""The launch template's context: the variables templates/launch_server.sh.j2 and nccl.env.j2 are rendered with,
built by one function for `driver.py plan` (specab/driver/render.py) and for Ansible (roles/server_start, through
its filter plugin specab_launch), so the two cannot disagree on what a run launches.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

DEFAULT_ENGINE_KIND = "sglang"


def engine_kind(experiment_engine: str | None, host_engine: str | None) -> str:
    """The engine kind a launch script is written for: the experiment's `engine:` where it names one, else the
    host's `specab_engine`, else sglang (on vllm, model_path renders as --model)."""
    return str(experiment_engine or host_engine or DEFAULT_ENGINE_KIND)


def _without_nulls(values: Mapping[str, Any] | None) -> dict[str, Any]:
    return {str(k): v for k, v in (values or {}).items() if v is not None}


def template_context(arm: Mapping[str, Any], *, engine_cmd: Sequence[Any], node_env: Mapping[str, Any] | None,
                     engine: str, run_id: str | None = None) -> dict[str, Any]:
    """The templates' variables for one run of `arm` ({name, server_args, env}; null args and env dropped, as
    a null in an arm removes a key): the engine's argv prefix and the env exported before the env file, both of
    the arm's engine build, and the engine kind (`engine_kind`). `server_start_render_arm` carries the arm past
    an extra var `specab_arm`, which would win over a task variable of that name in Ansible."""
    resolved = {"name": str(arm["name"]), "server_args": _without_nulls(arm.get("server_args")),
                "env": _without_nulls(arm.get("env"))}
    ctx: dict[str, Any] = {"specab_arm": resolved, "server_start_render_arm": resolved,
                           "specab_engine_cmd": [str(c) for c in engine_cmd], "specab_node_env": dict(node_env or {}),
                           "specab_engine": engine}
    if run_id:
        ctx["specab_run_id"] = run_id
    return ctx
