"""The bench settings of one run, resolved on the controller in Python: roles/specab's ``specab_bench_*`` values
(as Ansible resolves them: the inventory or an extra var may set them), the experiment's ``bench:`` over them, the
arm's own bench settings over both (a bench condition of the matrix, e.g. concurrency), and
``specab.config.defaults.bench`` (the driver's reader of the same defaults file) for anything still missing. The
bench role and a multi-node rank's sampler take them whole, so no playbook resolves a bench default in Jinja.

    query('specab_bench_settings', specab_experiment.bench, specab_arm.bench, dataset_dir=DIR) | first

``dataset_dir``: where node_prepare copies the experiment's dataset; ``dataset`` then becomes the node path of the
file there (its base name), as the client reads it.
"""
from __future__ import annotations

import posixpath
from typing import Any, Dict, Mapping, Optional

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

from specab.config import defaults
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

INTS = ("num_requests", "warmup_requests", "input_len", "output_len", "concurrency", "seed")
FLOATS = ("request_rate", "timeout_s")
# what the client takes: the settings with a specab_bench_* default, and the two without one. Other keys of an
# experiment's bench (e.g. phase_timing, which decides the server's flags) are not bench settings of the run.
SETTINGS = (*defaults.BENCH_DEFAULTS, "model", "dataset")


def _flag(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).strip().lower() in ("true", "yes", "on", "1"):
        return True
    if str(value).strip().lower() in ("false", "no", "off", "0"):
        return False
    raise AnsibleLookupError(f"specab_bench_settings: bench.ignore_eos must be true or false, got {value!r}")


def resolve(base: Mapping[str, Any], experiment_bench: Optional[Mapping[str, Any]],
            arm_bench: Optional[Mapping[str, Any]], dataset_dir: Optional[str]) -> Dict[str, Any]:
    """``base`` (the specab_bench_* values by setting name) < the experiment's bench < the arm's; typed."""
    given = dict(base)
    for layer in (experiment_bench, arm_bench):
        given.update({k: v for k, v in dict(layer or {}).items() if v is not None})
    try:
        out = {k: v for k, v in defaults.bench(given).items() if k in SETTINGS}
        for key in INTS:
            out[key] = int(out[key])
        for key in FLOATS:
            out[key] = float(out[key])
    except (ConfigError, KeyError, TypeError, ValueError) as exc:
        raise AnsibleLookupError(f"specab_bench_settings: {type(exc).__name__}: {exc}") from exc
    out["api"] = str(out["api"])
    out["ignore_eos"] = _flag(out["ignore_eos"])
    if out.get("model") is not None:
        out["model"] = str(out["model"])
    if out.get("dataset") is not None and dataset_dir:
        out["dataset"] = posixpath.join(str(dataset_dir), posixpath.basename(str(out["dataset"])))
    return out


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        if len(terms) not in (1, 2):
            raise AnsibleLookupError("specab_bench_settings takes the experiment's bench and, optionally, the arm's")
        variables = variables or {}
        base = {key: self._templar.template(variables[var]) for key, var in defaults.BENCH_DEFAULTS.items()
                if var in variables}
        return [resolve(base, terms[0], terms[1] if len(terms) > 1 else None, kwargs.get("dataset_dir"))]
