"""The python -c program that runs a node tool where none is deployed yet (the node lease, taken before node_prepare
ships anything): specab/driver/nodeprogram.py of this checkout, the driver's own, loaded by path (it is stdlib only):
the program carries the node modules found beside it, so what reaches the node is this checkout's whatever specab the
Python running Ansible can import (docs/architecture.md, "The map", on controller-side plugins).
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from ansible.errors import AnsibleError
from ansible.plugins.lookup import LookupBase

DOCUMENTATION = """
name: specab_node_program
short_description: the python -c program that carries a node tool and the modules it imports
description:
  - Returns the program text of specab/driver/nodeprogram.py tool_program for the tool named by the one term
    (lease); run it as C(python -c PROGRAM --spec-json -).
"""

RETURN = """
_raw:
  description: one program text
  type: list
  elements: str
"""

NODEPROGRAM = Path(__file__).resolve().parents[3] / "specab" / "driver" / "nodeprogram.py"
MODULE = "specab_node_program_nodeprogram"


def _nodeprogram():
    if MODULE not in sys.modules:
        spec = importlib.util.spec_from_file_location(MODULE, NODEPROGRAM)
        if spec is None or spec.loader is None:
            raise AnsibleError("specab_node_program: cannot load %s" % NODEPROGRAM)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[MODULE] = module
    return sys.modules[MODULE]


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        nodeprogram = _nodeprogram()
        if len(terms) != 1 or terms[0] not in nodeprogram.TOOL_MODULES:
            raise AnsibleError("specab_node_program takes one tool name, one of %s"
                               % ", ".join(nodeprogram.TOOL_MODULES))
        return [nodeprogram.tool_program(terms[0])]
