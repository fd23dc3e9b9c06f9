"""Where experiments live: the default runs directory and finding an experiment by id or path."""
from __future__ import annotations

from pathlib import Path

from specab.config.yamlfile import REPO_ROOT
from specab.results.store import FILENAME


class NotFound(Exception):
    """No experiment under that id or path (what was looked at, what to give instead)."""


def default_runs_dir() -> Path:
    return REPO_ROOT / "runs"


def locate(exp_ref: str, runs_dir: str | None) -> Path:
    """An experiment directory from an id (under the runs dir) or a path."""
    p = Path(exp_ref)
    if p.is_file() and p.name == FILENAME:
        return p.parent
    if (p / FILENAME).exists():
        return p
    base = Path(runs_dir) if runs_dir else default_runs_dir()
    if (base / exp_ref / FILENAME).exists():
        return base / exp_ref
    looked = " or ".join(dict.fromkeys(str(d) for d in (p, base / exp_ref)))   # one path, when exp_ref is absolute
    raise NotFound(f"experiment {exp_ref!r} not found: no {FILENAME} in {looked}. "
                   f"Give the experiment id (a directory under {base}) or its path.")
