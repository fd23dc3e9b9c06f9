"""YAML files with positions: every error names the file, the line and column, and what to do."""
from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]


class ConfigError(Exception):
    """A malformed experiment file, inventory or command-line value (what, where, what to do)."""


def load_yaml(path: Path) -> tuple[Any, yaml.Node | None]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found. Pass an existing file (-e/--experiment, -i/--inventory).") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        what = " ".join(str(x) for x in (exc.context, exc.problem) if x)
        raise ConfigError(f"{where}: YAML error: {what}. Fix the YAML syntax at that line and column.") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: YAML error: {exc}") from None
    duplicates = duplicate_keys(node)
    if duplicates:
        raise ConfigError("\n".join(
            f"{path}:{second.line + 1}:{second.column + 1}: duplicate key '{key}' (first at {path}:{first.line + 1}:"
            f"{first.column + 1}): YAML keeps only the last value, so the first would be silently ignored. Keep one "
            f"of the two lines." for key, first, second in duplicates))
    return data, node


def duplicate_keys(root: yaml.Node | None) -> list[tuple[str, yaml.Mark, yaml.Mark]]:
    """Every key given twice in one mapping of the document (key, first position, second position), in file
    order. Merge keys (`<<`) are not keys of their own mapping."""
    found: list[tuple[str, yaml.Mark, yaml.Mark]] = []
    seen_nodes: set[int] = set()
    stack = [root] if root is not None else []
    while stack:
        node = stack.pop()
        if id(node) in seen_nodes:        # an alias: the node it names is walked once
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first: dict[str, yaml.Mark] = {}
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                    if key.value in first:
                        found.append((key.value, first[key.value], key.start_mark))
                    else:
                        first[key.value] = key.start_mark
                stack.append(value)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
    return sorted(found, key=lambda d: (d[2].line, d[2].column))


def node_at(node: yaml.Node | None, keys: tuple[Any, ...]) -> yaml.Node | None:
    for key in keys:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if k.value == key:
                    node = v
                    break
            else:
                return node
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
        else:
            return node
    return node


def key_line(root: yaml.Node | None, keys: tuple[Any, ...]) -> str:
    """`:line:col` of the key at `keys` (the last element being a mapping key), best effort."""
    parent = node_at(root, keys[:-1])
    if isinstance(parent, yaml.MappingNode):
        for k, _ in parent.value:
            if k.value == keys[-1]:
                return f":{k.start_mark.line + 1}:{k.start_mark.column + 1}"
    node = node_at(root, keys)
    if node is not None:
        return f":{node.start_mark.line + 1}:{node.start_mark.column + 1}"
    return ""


def key_position(root: yaml.Node | None, name: str) -> str:
    """`:line:col` of the first mapping key `name` anywhere in the document (file order), or ""."""
    stack = [root] if root is not None else []
    best: yaml.Mark | None = None
    while stack:
        node = stack.pop()
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode) and k.value == name and (
                        best is None or (k.start_mark.line, k.start_mark.column) < (best.line, best.column)):
                    best = k.start_mark
                stack.append(v)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
    return f":{best.line + 1}:{best.column + 1}" if best is not None else ""


def check_unknown(keys: Any, allowed: set[str], where: str, root: yaml.Node | None, path: tuple[Any, ...],
             what: str) -> None:
    bad = [k for k in keys if k not in allowed]
    if bad:
        msgs = []
        for k in bad:
            close = difflib.get_close_matches(str(k), sorted(allowed), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            msgs.append(f"{where}{key_line(root, path + (k,))}: unknown key '{k}' in {what}{hint}")
        raise ConfigError("\n".join(msgs) + f"\nAllowed keys in {what}: {', '.join(sorted(allowed))}.")


