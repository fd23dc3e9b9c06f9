"""Run one module's driver subcommand on its own (``python -m specab.<module> …``)."""
from __future__ import annotations

import argparse
from typing import Any, Callable, Sequence


def standalone_main(register: Callable[[Any], Any], argv: Sequence[str] | None = None) -> int:
    """Build a parser holding only the subcommands ``register`` adds, parse ``argv``, run it."""
    ap = argparse.ArgumentParser(prog="specab")
    sub = ap.add_subparsers(dest="command", required=True)
    register(sub)
    ns = ap.parse_args(argv)
    return ns.func(ns)
