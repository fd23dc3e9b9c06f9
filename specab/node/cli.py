"""What every node tool shares: its entry point (``run_tool``: one JSON object on stdout, exit 0/1/2), its errors,
its diagnostics on stderr, and its typed spec read from ``--spec-json`` or from flags derived from the spec dataclass.

The node tools are shipped as the package ``specab.node`` (with the shared vocabulary ``specab.vocab``) into
``{{ specab_node_dir }}/bin/`` on a GPU node that has Python but not specab: stdlib only, Python >= 3.8.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import typing
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Type, TypeVar

from specab.node.osutil import write_json


# This package's folder: ``<node_dir>/bin/specab/node`` on a node (node_prepare ships the package under bin/), the
# checkout's specab/node on the controller. ``python3 <NODE_PACKAGE> TOOL ARGS`` runs a tool (__main__.py).
NODE_PACKAGE = os.path.dirname(os.path.abspath(__file__))


# The folder that holds the specab package (what ``sys.path`` needs for ``import specab.node``).
PACKAGE_ROOT = os.path.dirname(os.path.dirname(NODE_PACKAGE))


def tool_argv(python: str, tool: str) -> List[str]:
    """The argv prefix that runs the node tool ``tool`` of this package with ``python``."""
    return [python, NODE_PACKAGE, tool]


class ToolError(Exception):
    """A failure the user must act on: printed as ``{"error": message, ...}``, exit status 1.

    ``result`` carries whatever the tool measured before failing (signals sent, GPU tables, ...),
    so the JSON a role registers still holds the evidence.
    """

    def __init__(self, message: str, result: Optional[Dict[str, Any]] = None) -> None:
        super().__init__(message)
        self.message = message
        self.result = dict(result or {})


class UsageError(Exception):
    """Bad usage found after argument parsing: exit status 2, like argparse."""


def log(msg: str) -> None:
    """Human-readable diagnostics go to stderr (stdout holds exactly one JSON object)."""
    sys.stderr.write(msg.rstrip("\n") + "\n")
    sys.stderr.flush()


def emit(obj: Dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def recorded(path: Optional[str], work: Callable[[], Dict[str, Any]]) -> Dict[str, Any]:
    """Run ``work`` and, when ``path`` is given, also write its outcome there: the result with
    ``ok: true``, or the ToolError's partial result with ``ok: false`` and the error (re-raised)."""
    try:
        out = work()
    except ToolError as exc:
        if path:
            write_json(path, dict(exc.result, ok=False, error=exc.message))
        raise
    if path:
        write_json(path, dict(out, ok=True))
    return out


class Verbatim(dict):
    """A tool result printed unchanged with exit 0, whatever its ``ok`` says: a record of something
    that failed (``sequence.py wait`` prints a failed run's done.json), not a failure of the tool."""


def run_tool(main: Callable[[Optional[Sequence[str]]], Dict[str, Any]],
             argv: Optional[Sequence[str]] = None) -> int:
    """Run a tool's ``main``: print its JSON, map ToolError to exit 1 (argparse exits 2 itself)."""
    try:
        result = main(argv)
    except UsageError as exc:
        emit({"ok": False, "error": "usage: %s" % exc})
        log("usage error: %s" % exc)
        return 2
    except ToolError as exc:
        out = dict(exc.result)
        out["ok"] = False
        out["error"] = exc.message
        emit(out)
        log("error: " + exc.message)
        return 1
    if isinstance(result, Verbatim):
        emit(dict(result))
        return 0
    result.setdefault("ok", True)
    emit(result)
    return 0 if result.get("ok") else 1


SPEC_FLAG = "--spec-json"


S = TypeVar("S")


def spec_json(argv: Optional[Sequence[str]]) -> Optional[Dict[str, Any]]:
    """The JSON object of ``TOOL --spec-json TEXT`` (``--spec-json -``: read from stdin, where no other process can
    see it), or None when ``argv`` holds the tool's flags instead."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] != SPEC_FLAG:
        return None
    if len(args) != 2:
        raise UsageError("%s takes one argument, the spec as a JSON object (or - to read it from stdin), and no "
                         "other flag" % SPEC_FLAG)
    text = sys.stdin.read() if args[1] == "-" else args[1]
    try:
        obj = json.loads(text)
    except ValueError as exc:
        raise UsageError("%s: the spec is not JSON (%s)" % (SPEC_FLAG, exc))
    if not isinstance(obj, dict):
        raise UsageError("%s: the spec must be a JSON object, got %s" % (SPEC_FLAG, type(obj).__name__))
    return obj


def spec_of(cls: Type[S], obj: Dict[str, Any]) -> S:
    """The spec dataclass ``cls`` from a JSON object whose keys are its field names: an unknown key or a missing
    required field is a usage error (exit 2), so the Ansible module (plugins/modules/specab_node.py), the driver and
    the run queue build the same spec."""
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    unknown = sorted(set(obj) - {f.name for f in fields})
    missing = [f.name for f in fields if f.name not in obj and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if unknown or missing:
        raise UsageError("%s: a %s takes the keys %s; %s" % (
            SPEC_FLAG, cls.__name__, ", ".join(f.name for f in fields),
            "; ".join(["unknown: " + ", ".join(unknown)] * bool(unknown)
                      + ["missing: " + ", ".join(missing)] * bool(missing))))
    return cls(**obj)


def spec_from_argv(cls: Type[S], argv: Optional[Sequence[str]]) -> Optional[S]:
    """The tool's typed spec given whole as one JSON object (``spec_json``, ``spec_of``), or None when ``argv`` holds
    the tool's flags instead."""
    obj = spec_json(argv)
    return None if obj is None else spec_of(cls, obj)


def json_list_type(flag: str) -> Callable[[str], List[str]]:
    """The argparse type of ``flag``, an argv given as a JSON list (``'["nvidia-smi"]'``): bad → exit 2."""
    def json_list(text: str) -> List[str]:
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError("%s must be a JSON list of strings, e.g. '[\"nvidia-smi\"]' (%s)"
                                             % (flag, exc))
        if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
            raise argparse.ArgumentTypeError("%s must be a non-empty JSON list of strings, got %r" % (flag, text))
        return value
    return json_list


def arg(help: Optional[str] = None, **flag: Any) -> Any:
    """A spec field with its flag's ``help`` and argparse keywords (``choices``, ``metavar``, ``action``, ``type``) in
    its metadata, for ``spec_flags``; ``default`` and ``default_factory`` are the field's."""
    default = flag.pop("default", dataclasses.MISSING)
    factory = flag.pop("default_factory", dataclasses.MISSING)
    return dataclasses.field(default=default, default_factory=factory, metadata=dict(flag, help=help))


def spec_flags(parser: argparse.ArgumentParser, cls: type, skip: Iterable[str] = ()) -> argparse.ArgumentParser:
    """Add one flag per field of the spec dataclass ``cls`` (but ``skip``): ``--field-name``, required where the field
    has no default, else the field's default; the field's metadata (``arg``) passed to argparse as given. Without
    ``action``, ``type`` or ``choices`` there, the type follows the annotation (``Optional[X]`` as ``X``): a bool is a
    switch (store_true), an int or float converted, a list a JSON list (``json_list_type``), anything else a string.
    """
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        flag = "--" + f.name.replace("_", "-")
        kw = dict(f.metadata)
        hint = hints[f.name]
        if typing.get_origin(hint) is typing.Union:
            hint = next(h for h in typing.get_args(hint) if h is not type(None))
        if not {"action", "type", "choices"} & set(kw):
            if hint is bool:
                kw["action"] = "store_true"
            elif hint in (int, float):
                kw["type"] = hint
            elif typing.get_origin(hint) is list:
                kw["type"] = json_list_type(flag)
        if f.default is not dataclasses.MISSING:
            kw["default"] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            kw["default"] = f.default_factory()
        else:
            kw["required"] = True
        parser.add_argument(flag, **kw)
    return parser


def spec_parser(cls: type, prog: str, doc: Optional[str]) -> argparse.ArgumentParser:
    """The tool's parser: the first line of its module ``doc`` as description, one flag per spec field."""
    return spec_flags(argparse.ArgumentParser(prog=prog, description=(doc or "").split("\n")[0]), cls)


def parse_spec(cls: Type[S], argv: Optional[Sequence[str]], prog: str, doc: Optional[str]) -> S:
    """The tool's spec from ``--spec-json`` (``spec_from_argv``) or from its flags (``spec_parser``)."""
    spec = spec_from_argv(cls, argv)
    return spec if spec is not None else cls(**vars(spec_parser(cls, prog, doc).parse_args(argv)))
