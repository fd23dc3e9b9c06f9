"""Node tools run where none is deployed yet: a ``python -c`` program that carries their modules.

The lease is taken and the preflight's port check runs before node_prepare ships anything (docs/decisions/0009):
the modules a tool needs travel in the program, compressed, and are made there under their package names, so they
import each other as they do on the node.
"""
from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Sequence
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
# the tools that run before anything is shipped (the node lease), and what each imports, packages first
TOOL_MODULES = {"lease": ("specab", "specab.vocab", "specab.vocab.contract", "specab.node", "specab.node.common",
                          "specab.node.lease")}


def module_source(name: str) -> tuple[str, bool, str]:
    """(name, is a package, source) of one module of this checkout's specab package."""
    path = PACKAGE_ROOT.joinpath(*name.split("."))
    if path.is_dir():
        return name, True, (path / "__init__.py").read_text()
    return name, False, path.with_suffix(".py").read_text()


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
    return program(TOOL_MODULES[tool], f"sys.exit(sys.modules['specab.node.common'].run_tool("
                                       f"sys.modules['specab.node.{tool}'].main, sys.argv[1:]))")
