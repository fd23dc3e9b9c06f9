"""Benchmark datasets: a JSONL file of prompts, read by the controller (checked before any node is touched) and by
the benchmark client on the node (stdlib only, Python 3.8 syntax, like every node tool).

One JSON object per line: ``{"prompt": "text"}`` or OpenAI-style ``{"messages": [{"role": "user", "content":
"text"}, ...]}``, each with an optional ``"category": "name"`` (per-category results in the report). Blank lines are
skipped. Requests draw records with the run's seed (``sample``), so every arm and every run of an experiment sends
the same prompts in the same order, as the seeded word list does.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import re
from typing import Any, Dict, List, Optional

ROLES = ("system", "user", "assistant")


class DatasetError(Exception):
    """A dataset file that cannot be used; the message names the file (and the line) and what to do."""


def sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return "sha256:" + h.hexdigest()


def _record(obj: Any, where: str) -> Dict[str, Any]:
    if not isinstance(obj, dict):
        raise DatasetError("%s: a record must be a JSON object with \"prompt\" or \"messages\", got %s"
                           % (where, type(obj).__name__))
    has_prompt, has_messages = "prompt" in obj, "messages" in obj
    if has_prompt == has_messages:
        raise DatasetError("%s: a record needs exactly one of \"prompt\" (text) or \"messages\" (a chat), got keys %s"
                           % (where, ", ".join(sorted(obj)) or "none"))
    out = {}  # type: Dict[str, Any]
    if has_prompt:
        if not isinstance(obj["prompt"], str) or not obj["prompt"].strip():
            raise DatasetError("%s: \"prompt\" must be non-empty text" % where)
        out["prompt"] = obj["prompt"]
    else:
        msgs = obj["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise DatasetError("%s: \"messages\" must be a non-empty list of {\"role\", \"content\"}" % where)
        for j, m in enumerate(msgs):
            if (not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str)):
                raise DatasetError("%s: messages[%d] must be {\"role\": one of %s, \"content\": text}, got %s"
                                   % (where, j, "/".join(ROLES), json.dumps(m)[:120]))
        out["messages"] = [{"role": m["role"], "content": m["content"]} for m in msgs]
    cat = obj.get("category")
    if cat is not None:
        if not isinstance(cat, str) or not cat.strip():
            raise DatasetError("%s: \"category\" must be non-empty text when given, got %s" % (where, json.dumps(cat)))
        out["category"] = cat
    return out


def load(path: str) -> List[Dict[str, Any]]:
    """Every record of a JSONL dataset, checked; DatasetError names the file and line of the first problem."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise DatasetError("%s: cannot read the dataset (%s). bench.dataset names a JSONL file on the controller "
                           "(relative to the experiment file)." % (path, exc.strerror or exc))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise DatasetError("%s:%d: not UTF-8 text (%s). Save the file as UTF-8 JSONL." % (path, line, exc.reason))
    records = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise DatasetError("%s:%d: not a JSON object (%s). Each line is one record: {\"prompt\": \"...\"} or "
                               "{\"messages\": [...]}, with an optional \"category\"." % (path, n, exc))
        records.append(_record(obj, "%s:%d" % (path, n)))
    if not records:
        raise DatasetError("%s: the dataset has no records. Add one JSON object per line: {\"prompt\": \"...\"} or "
                           "{\"messages\": [...]}." % path)
    return records


# a built-in dataset's file as the controller writes it (specab/config/builtin_data.py): <name>@<package>-<version>.jsonl
_BUILTIN_FILE = re.compile(r"^(?P<name>[a-z0-9_]+)@(?P<package>[A-Za-z0-9_.-]+?)-(?P<version>\d[A-Za-z0-9_.+]*)\.jsonl$")


def builtin_of(path: str) -> Optional[Dict[str, str]]:
    """The built-in dataset a file was made from, by its name: {name, package, version}; None for any other file."""
    m = _BUILTIN_FILE.match(os.path.basename(path))
    return m.groupdict() if m else None


def needs_chat(records: List[Dict[str, Any]]) -> bool:
    """Whether any record is a chat (only bench.api chat sends messages, so the engine applies the chat template)."""
    return any("messages" in r for r in records)


def sample(records: List[Dict[str, Any]], seed: int, kind: str, count: int) -> List[Dict[str, Any]]:
    """``count`` records drawn for ``kind`` (warmup | measure) with the seed: a seeded shuffle walked in order and
    started again when used up, so a run sends each record once before repeating one."""
    order = list(range(len(records)))
    random.Random("dataset:%d:%s" % (seed, kind)).shuffle(order)
    return [records[order[i % len(order)]] for i in range(count)]


def categories(records: List[Dict[str, Any]]) -> Optional[List[str]]:
    cats = sorted({r["category"] for r in records if "category" in r})
    return cats or None
