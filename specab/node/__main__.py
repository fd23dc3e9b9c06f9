"""Runs one node tool: ``python3 <root>/specab/node TOOL ARGS...``.

On a node the root is ``<node_dir>/bin``, where the node_prepare role ships the package; on the controller it is
the checkout (``python -m specab.node TOOL ARGS...`` runs the same where specab is importable). TOOL is a module of
this package that runs as ``__main__`` (``tools()``: its file has the ``if __name__ == "__main__":`` block; ``MODULES``
names a module called otherwise): the files are the one list of the tools. It runs as ``__main__`` with ARGS, as
``python -m specab.node.TOOL ARGS...`` would. Running the folder puts the root, not the folder, on
``sys.path``, so every tool imports its siblings as ``specab.node.X`` and nothing of the folder shadows a top-level
module. stdlib only.
"""
import os
import runpy
import sys

# a tool whose module is named otherwise (the bench tool is the bench step, which RunSteps also imports)
MODULES = {"bench": "benchstep"}
MAIN_BLOCK = '\nif __name__ == "__main__":'


def tools() -> dict:
    """{tool: module} of every module of this package that runs as ``__main__``."""
    here = os.path.dirname(os.path.abspath(__file__))
    names = {m: t for t, m in MODULES.items()}
    out = {}
    for f in sorted(os.listdir(here)):
        if f.endswith(".py") and f != "__main__.py":
            with open(os.path.join(here, f)) as fh:
                if MAIN_BLOCK in fh.read():
                    out[names.get(f[:-3], f[:-3])] = f[:-3]
    return out


def main() -> None:
    if not __package__:         # run as a folder: sys.path[0] is this folder, the root is two folders up
        sys.path[0] = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    known = tools()
    if len(sys.argv) < 2 or sys.argv[1] not in known:
        sys.stderr.write("usage: python3 <root>/specab/node TOOL [ARGS...] with TOOL one of: %s\n"
                         % ", ".join(sorted(known)))
        sys.exit(2)
    runpy.run_module("specab.node." + known[sys.argv.pop(1)], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
