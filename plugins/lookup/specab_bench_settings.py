"""The bench settings of one run, resolved on the controller in Python: roles/specab's ``specab_bench_*`` values
(as Ansible resolves them: the inventory or an extra var may set them), the experiment's ``bench:`` over them, the
arm's own bench settings over both (a bench condition of the matrix, e.g. concurrency), and
``specab.config.defaults.bench`` (the driver's reader of the same defaults file) for anything still missing: the
resolution of ``specab.config.bench.resolve``, which the driver calls itself. The bench role and a multi-node
rank's sampler take them whole, so no playbook resolves a bench default in Jinja.

    query('specab_bench_settings', specab_experiment.bench, specab_arm.bench, dataset_dir=DIR) | first

``dataset_dir``: where node_prepare copies the experiment's dataset; ``dataset`` then becomes the node path of the
file there (its base name), as the client reads it.
"""
from __future__ import annotations

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

from specab.config import bench, defaults
from specab.config.yamlfile import ConfigError

DOCUMENTATION = """
name: specab_bench_settings
short_description: one run's bench settings, resolved in Python from roles/specab, the experiment and the arm
description:
  - Returns one mapping with every bench setting; counts are integers, the request rate and the timeout floats,
    ignore_eos a bool (what the client takes).
options:
  _terms:
    description: The experiment's bench section, then the arm's bench settings (each may be empty or null).
    required: true
  dataset_dir:
    description: The node directory holding the experiment's dataset (node_prepare copies it there).
    type: str
"""

RETURN = """
_raw:
  description: one mapping of the resolved bench settings
  type: list
  elements: dict
"""


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        if len(terms) not in (1, 2):
            raise AnsibleLookupError("specab_bench_settings takes the experiment's bench and, optionally, the arm's")
        variables = variables or {}
        base = bench.given(variables, defaults.BENCH_DEFAULTS, self._templar.template)
        try:
            return [bench.resolve(base, terms[0], terms[1] if len(terms) > 1 else None, kwargs.get("dataset_dir"))]
        except ConfigError as exc:
            raise AnsibleLookupError(f"specab_bench_settings: {exc}") from exc
