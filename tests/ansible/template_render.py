"""Render the top-level templates with plain Jinja2 exactly as documented in their headers."""
from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import jinja2

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"


def render(name: str, **ctx: Any) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), trim_blocks=True,
                             lstrip_blocks=False, keep_trailing_newline=False, undefined=jinja2.StrictUndefined)
    env.filters["quote"] = lambda v: shlex.quote(str(v))
    return env.get_template(name).render(**ctx)
