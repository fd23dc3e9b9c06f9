"""The results table of ab_test.yml's round, from specab.analysis (specab/analysis/render/abtable.py): the driver's
report's numbers and speedup rule for the round's run directories, and the doctor's top finding as its why.

    lookup('specab_ab_table', experiment_id=ID, exp_dir=DIR, host_suffix='' | '/HOST', arms=ARMS, baselines=MAP)

`arms` are the resolved arms in run order (playbook_check's `arms`: arm i ran as `<exp_dir>/<i+1:03d>-<name>`,
ab_test.yml's run ids), `baselines` maps each arm to the arm it is compared with. A lookup runs in the
controller's own process, where the run directories were collected.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleError
from ansible.plugins.lookup import LookupBase

from specab.analysis.render import abtable
from specab.analysis.evidence.model import AnalysisError

DOCUMENTATION = """
name: specab_ab_table
short_description: ab_test.yml's results table, computed by specab.analysis as the driver's report computes it
description:
  - Reads the round's run directories as one experiment of one block and returns its table.
options:
  experiment_id:
    description: The experiment id.
    type: str
    required: true
  exp_dir:
    description: The controller directory of the experiment's runs.
    type: str
    required: true
  host_suffix:
    description: C(/<host>) where each host of the round has its own run directories, else empty.
    type: str
    default: ""
  arms:
    description: The resolved arms C({name, server_args, env}) in run order.
    type: list
    elements: dict
    required: true
  baselines:
    description: Arm name to the name of the arm it is compared with (a baseline arm names itself).
    type: dict
    required: true
  experiment:
    description: The experiment mapping (C(specab_experiment)) whose C(validity) rules, C(bench) and arms'
      C(cost_only) the output checks read; empty for the defaults.
    type: dict
    default: {}
"""

RETURN = """
_raw:
  description: one mapping C({rows, lines}) (rows as in ab_table.json, lines as printed)
  type: list
  elements: dict
"""


def _plain(value: Any) -> Any:
    """Ansible's templated containers and tagged strings as plain JSON values."""
    return json.loads(json.dumps(value, default=str))


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        exp_dir = Path(self.get_option("exp_dir"))
        suffix = self.get_option("host_suffix").strip("/")
        baselines = _plain(self.get_option("baselines"))
        arms = [abtable.RoundArm(name=a["name"], server_args=a.get("server_args") or {}, env=a.get("env") or {},
                                 baseline=baselines.get(a["name"], a["name"]),
                                 run_dir=exp_dir / f"{i + 1:03d}-{a['name']}" / suffix)
                for i, a in enumerate(_plain(self.get_option("arms")))]
        try:
            tab = abtable.table(abtable.round_experiment(self.get_option("experiment_id"), arms,
                                                         _plain(self.get_option("experiment"))))
        except (AnalysisError, OSError, ValueError) as exc:
            raise AnsibleError(f"the round's results could not be analysed: {exc}") from exc
        return [{"rows": tab.to_json(), "lines": tab.lines(exp_dir)}]
