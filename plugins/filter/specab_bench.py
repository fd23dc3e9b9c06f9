"""The bench settings of one run, resolved by the controller's config code (specab.config.defaults.bench): the
experiment's ``bench:``, the arm's own bench settings over it (a bench condition of the matrix, e.g. concurrency),
roles/specab's defaults under both. The bench role and the multi-node sampler take them whole, so no playbook
resolves a bench default again in Jinja.

    specab_experiment.bench | specab_bench_settings(specab_arm.bench, node_dir ~ '/datasets')

The optional second argument is where node_prepare copies the experiment's dataset: ``dataset`` becomes the node
path of the file there (its base name), as the client reads it.
"""
from __future__ import annotations

import posixpath
from typing import Any, Dict, Mapping, Optional

from ansible.errors import AnsibleFilterError

from specab.config import defaults
from specab.config.yamlfile import ConfigError

DOCUMENTATION = """
name: specab_bench_settings
short_description: one run's bench settings, resolved by specab.config.defaults.bench
description:
  - The experiment's bench section, the arm's bench settings over it, roles/specab's defaults for what neither gives.
  - Counts are integers, the request rate and the timeout floats, ignore_eos a bool (what the client takes).
positional: arm_bench, dataset_dir
options:
  _input:
    description: The experiment's bench section (may be empty or null).
    type: dict
    required: true
  arm_bench:
    description: The arm's own bench settings (may be empty or null).
    type: dict
  dataset_dir:
    description: The node directory holding the experiment's dataset (node_prepare copies it there).
    type: str
"""

INTS = ("num_requests", "warmup_requests", "input_len", "output_len", "concurrency", "seed")
FLOATS = ("request_rate", "timeout_s")


def _flag(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).strip().lower() in ("true", "yes", "on", "1"):
        return True
    if str(value).strip().lower() in ("false", "no", "off", "0"):
        return False
    raise AnsibleFilterError(f"bench.ignore_eos must be true or false, got {value!r}")


def bench_settings(experiment_bench: Optional[Mapping[str, Any]], arm_bench: Optional[Mapping[str, Any]] = None,
                   dataset_dir: Optional[str] = None) -> Dict[str, Any]:
    given = dict(experiment_bench or {})
    given.update({k: v for k, v in (arm_bench or {}).items() if v is not None})
    try:
        out = defaults.bench(given)
        for key in INTS:
            out[key] = int(out[key])
        for key in FLOATS:
            out[key] = float(out[key])
    except (ConfigError, KeyError, TypeError, ValueError) as exc:
        raise AnsibleFilterError(f"specab_bench_settings: {type(exc).__name__}: {exc}") from exc
    out["api"] = str(out["api"])
    out["ignore_eos"] = _flag(out["ignore_eos"])
    if out.get("model") is not None:
        out["model"] = str(out["model"])
    if out.get("dataset") is not None and dataset_dir:
        out["dataset"] = posixpath.join(str(dataset_dir), posixpath.basename(str(out["dataset"])))
    return out


class FilterModule:
    def filters(self) -> Dict[str, Any]:
        return {"specab_bench_settings": bench_settings}
