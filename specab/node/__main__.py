"""Runs one node tool: ``python3 <root>/specab/node TOOL ARGS...``.

On a node the root is ``<node_dir>/bin``, where the node_prepare role ships the package; on the controller it is
the checkout (``python -m specab.node TOOL ARGS...`` runs the same where specab is importable). TOOL is a module of
this package with a command line (``TOOLS``; ``MODULES`` names a module called otherwise); it runs as ``__main__``
with ARGS, as ``python -m specab.node.TOOL ARGS...`` would. Running the folder puts the root, not the folder, on
``sys.path``, so every tool imports its siblings as ``specab.node.X`` and nothing of the folder shadows a top-level
module. stdlib only.
"""
import os
import runpy
import sys

TOOLS = ("bench", "envcheck", "gpufree", "gpusample", "instance", "lease", "loadgen", "manifest", "ranksampler", "ready",
         "sequence", "start", "stop", "tracesum")
# a tool whose module is named otherwise (the bench tool is the bench step, which RunSteps also imports)
MODULES = {"bench": "benchstep"}


def main() -> None:
    if not __package__:         # run as a folder: sys.path[0] is this folder, the root is two folders up
        sys.path[0] = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if len(sys.argv) < 2 or sys.argv[1] not in TOOLS:
        sys.stderr.write("usage: python3 <root>/specab/node TOOL [ARGS...] with TOOL one of: %s\n" % ", ".join(TOOLS))
        sys.exit(2)
    tool = sys.argv.pop(1)
    runpy.run_module("specab.node." + MODULES.get(tool, tool), run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
