"""Render the launch script and env file locally, exactly as the roles deploy them.

Same templates (`templates/launch_server.sh.j2`, `templates/nccl.env.j2`), same Jinja settings as
Ansible's template module (trim_blocks, no lstrip_blocks, no trailing newline kept) and the same
`quote` filter (shlex.quote), so `driver.py plan` shows what will run before any GPU is touched.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from specab.config import launch
from specab.config.inventory import Host
from specab.config.spec import ArmSpec
from specab.config.yamlfile import REPO_ROOT

TEMPLATES = REPO_ROOT / "templates"
LAUNCH_TEMPLATE = "launch_server.sh.j2"
ENV_TEMPLATE = "nccl.env.j2"


class RenderError(Exception):
    """A template could not be rendered (missing file or variable)."""


@dataclass(frozen=True)
class Rendered:
    launch_sh: str
    env_file: str


def _quote(value: Any) -> str:
    return shlex.quote(str(value))


def environment(template_dir: Path = TEMPLATES) -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(template_dir)), trim_blocks=True,
                             lstrip_blocks=False, keep_trailing_newline=False,
                             undefined=jinja2.StrictUndefined, autoescape=False)
    env.filters["quote"] = _quote
    return env


def render_arm(arm: ArmSpec, host: Host, run_id: str | None = None,
               template_dir: Path = TEMPLATES, experiment_engine: str | None = None) -> Rendered:
    """The launch script and env file of `arm` on `host` (node variables from the inventory; the engine
    build the arm names, from the host's `specab_engines`; `experiment_engine`: the experiment's own
    `engine:` where it names one, which wins over the host's `specab_engine`)."""
    env = environment(template_dir)
    build = host.engine_build(arm.engine)      # as roles/server_start picks it (server_start_engine)
    ctx = launch.template_context(arm.to_extravar(), engine_cmd=build.cmd, node_env=host.launch_env(build),
                                  engine=launch.engine_kind(experiment_engine, host.vars.get("specab_engine")),
                                  run_id=run_id)
    try:
        launch_sh = env.get_template(LAUNCH_TEMPLATE).render(ctx)
        envfile = env.get_template(ENV_TEMPLATE).render(ctx)
    except jinja2.TemplateNotFound as exc:
        raise RenderError(f"template {exc.name} not found in {template_dir}") from None
    except jinja2.UndefinedError as exc:
        raise RenderError(f"rendering the templates for arm {arm.name}: {exc}") from None
    return Rendered(launch_sh=launch_sh, env_file=envfile)
