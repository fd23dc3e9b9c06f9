"""``python -m specab.knowntruth build …``: the builder without the controller's dependencies (only torch,
safetensors and tokenizers), e.g. with a vLLM environment's interpreter. Same options as
``driver.py known-truth build``."""
from __future__ import annotations

import argparse
import sys

from specab.knowntruth import build


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specab.knowntruth")
    sub = ap.add_subparsers(dest="command", required=True)
    kt = build.register(sub)
    ns = ap.parse_args(["known-truth", *(sys.argv[1:] if argv is None else argv)])
    if not getattr(ns, "func", None):
        kt.print_help()
        return 2
    return int(ns.func(ns))


if __name__ == "__main__":
    sys.exit(main())
