"""A run's timeouts, resolved on the controller in Python (``specab.config.bench.timeouts``, which the driver
calls itself): roles/specab's ``specab_*`` timeout values as Ansible resolves them (an inventory or an extra var may
set them), the experiment's ``timeouts:`` over them, each in seconds. The roles take them whole, so no playbook
resolves a timeout default in Jinja.

    query('specab_timeouts', specab_experiment.timeouts) | first
"""
from __future__ import annotations

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

from specab.config import bench, defaults
from specab.config.yamlfile import ConfigError

DOCUMENTATION = """
name: specab_timeouts
short_description: a run's timeouts in seconds, resolved in Python from roles/specab and the experiment
description:
  - Returns one mapping ready_s, stop_grace_s, gpu_free_s (floats).
options:
  _terms:
    description: The experiment's timeouts section (may be empty or null).
    required: true
"""

RETURN = """
_raw:
  description: one mapping of the resolved timeouts
  type: list
  elements: dict
"""


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        if len(terms) != 1:
            raise AnsibleLookupError("specab_timeouts takes the experiment's timeouts section")
        base = bench.given(variables or {}, defaults.TIMEOUT_DEFAULTS, self._templar.template)
        try:
            return [bench.timeouts(base, terms[0])]
        except ConfigError as exc:
            raise AnsibleLookupError(f"specab_timeouts: {exc}") from exc
