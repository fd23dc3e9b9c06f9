"""Seconds the run queue's collect waits for one queued run, computed in Python on the controller
(``specab.config.bench.queue_wait_s``) from the run's bench settings and timeouts, as the driver computes the
``specab_queue_wait_s`` it passes to playbooks/collect_run.yml: this lookup is that playbook's default for a call
by hand. roles/specab's ``specab_bench_*`` and timeout values as Ansible resolves them are the lowest layer.

    lookup('specab_queue_wait_s', specab_experiment.bench, specab_arm.bench, timeouts=specab_experiment.timeouts)
"""
from __future__ import annotations

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

from specab.config import bench, defaults
from specab.config.yamlfile import ConfigError

DOCUMENTATION = """
name: specab_queue_wait_s
short_description: seconds the run queue's collect waits for one run, from its bench settings and timeouts
description:
  - Returns one float, specab.config.bench.queue_wait_s of the run's resolved bench settings and timeouts.
options:
  _terms:
    description: The experiment's bench section, then the arm's bench settings (each may be empty or null).
    required: true
  timeouts:
    description: The experiment's timeouts section (may be empty or null).
    type: dict
"""

RETURN = """
_raw:
  description: the seconds to wait
  type: list
  elements: float
"""


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        if len(terms) not in (1, 2):
            raise AnsibleLookupError("specab_queue_wait_s takes the experiment's bench and, optionally, the arm's")
        variables = variables or {}
        bench_base = bench.given(variables, defaults.BENCH_DEFAULTS, self._templar.template)
        timeout_base = bench.given(variables, defaults.TIMEOUT_DEFAULTS, self._templar.template)
        try:
            settings = bench.resolve(bench_base, terms[0], terms[1] if len(terms) > 1 else None)
            return [bench.queue_wait_s(settings, bench.timeouts(timeout_base, kwargs.get("timeouts")))]
        except ConfigError as exc:
            raise AnsibleLookupError(f"specab_queue_wait_s: {exc}") from exc
