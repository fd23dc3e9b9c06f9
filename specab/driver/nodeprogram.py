"""Node tools run where none is deployed yet: a ``python -c`` program that carries their modules.

The lease is taken and the preflight's port check runs before node_prepare ships anything (docs/decisions/0009):
the modules a tool needs travel in the program, compressed, and are made there under their package names, so they
import each other as they do on the node.
"""
from __future__ import annotations

import ast
import base64
import json
import zlib
from collections.abc import Sequence
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[2]


def module_source(name: str) -> tuple[str, bool, str]:
    """(name, is a package, source) of one module of this checkout's specab package."""
    path = PACKAGE_ROOT.joinpath(*name.split("."))
    if path.is_dir():
        return name, True, (path / "__init__.py").read_text()
    return name, False, path.with_suffix(".py").read_text()


def _is_module(name: str) -> bool:
    path = PACKAGE_ROOT.joinpath(*name.split("."))
    return path.is_dir() or path.with_suffix(".py").is_file()


def _imports(text: str) -> list[str]:
    """The modules of specab that a module's source imports (``from specab.x import y``: ``specab.x.y`` when that is
    a module, else ``specab.x``)."""
    out: list[str] = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("specab"):
            out += [f"{node.module}.{a.name}" if _is_module(f"{node.module}.{a.name}") else str(node.module)
                    for a in node.names]
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.startswith("specab")]
    return out


def modules_of(module: str) -> tuple[str, ...]:
    """``module`` and every module of specab it imports, transitively, each after its package and after what it
    imports: the order in which ``program`` makes them."""
    order: list[str] = []

    def visit(name: str) -> None:
        if name in order:
            return
        parent = name.rpartition(".")[0]
        if parent:
            visit(parent)
        for dep in _imports(module_source(name)[2]):
            if dep != name:
                visit(dep)
        order.append(name)
    visit(module)
    return tuple(order)


# the tools that run before anything is shipped (the node lease), and what each imports
TOOL_MODULES = {"lease": modules_of("specab.node.lease")}


def program(modules: Sequence[str], entry: str) -> str:
    """A ``python -c`` program that makes ``modules`` (packages before their modules) and then runs ``entry``, a
    statement that reaches them through ``sys.modules``."""
    payload = base64.b64encode(zlib.compress(json.dumps([module_source(m) for m in modules]).encode(), 9)).decode()
    return ("import base64, json, sys, types, zlib\n"
            f"src = json.loads(zlib.decompress(base64.b64decode('{payload}')))\n"
            "for name, package, text in src:\n"
            "    m = types.ModuleType(name); m.__file__ = '<specab>/' + name.replace('.', '/') + '.py'\n"
            "    if package:\n"
            "        m.__path__ = []\n"
            "    sys.modules[name] = m\n"
            "    parent, _, leaf = name.rpartition('.')\n"
            "    if parent:\n"
            "        setattr(sys.modules[parent], leaf, m)\n"
            "    exec(compile(text, m.__file__, 'exec'), m.__dict__)\n"
            f"{entry}\n")


def tool_program(tool: str) -> str:
    """``program`` that runs node tool ``tool`` (of ``TOOL_MODULES``) with the program's arguments, as
    ``bin/specab/node TOOL ARGS`` would: its JSON on stdout, its exit status. The driver and the node_lease role
    (its lookup ``specab_node_program``) run the lease so."""
    return program(TOOL_MODULES[tool], f"sys.exit(sys.modules['specab.node.cli'].run_tool("
                                       f"sys.modules['specab.node.{tool}'].main, sys.argv[1:]))")
