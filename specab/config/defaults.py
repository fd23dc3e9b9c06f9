"""specab's defaults, one source for Ansible and Python: ``roles/specab/defaults/main.yml``.

Every play loads that role first, the roles and playbooks default from its ``specab_*`` values, and the
driver reads the same file here (plain YAML values only, no Jinja). An experiment's ``bench:`` and
``timeouts:`` sections override the bench and timeout values, exactly as the playbooks do
(``specab_experiment.bench.num_requests | default(specab_bench_num_requests)``).
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Mapping

from specab.config.yamlfile import REPO_ROOT, ConfigError, load_yaml

DEFAULTS_FILE = REPO_ROOT / "roles" / "specab" / "defaults" / "main.yml"
PREFIX = "specab_"

# experiment key -> the defaults file's variable
# each variable spelled out: a reader of the defaults file names what it reads (tests/unit/test_architecture.py)
BENCH_DEFAULTS = {"api": "specab_bench_api", "num_requests": "specab_bench_num_requests",
                  "warmup_requests": "specab_bench_warmup_requests", "input_len": "specab_bench_input_len",
                  "output_len": "specab_bench_output_len", "concurrency": "specab_bench_concurrency",
                  "seed": "specab_bench_seed", "timeout_s": "specab_bench_timeout_s",
                  "ignore_eos": "specab_bench_ignore_eos", "request_rate": "specab_bench_request_rate",
                  "client_procs": "specab_bench_client_procs", "temperature": "specab_bench_temperature",
                  "top_p": "specab_bench_top_p"}
TIMEOUT_DEFAULTS = {"ready_s": "specab_ready_timeout_s", "stop_grace_s": "specab_stop_grace_s",
                    "gpu_free_s": "specab_gpu_free_timeout_s"}


@functools.lru_cache(maxsize=None)
def load(path: Path = DEFAULTS_FILE) -> dict[str, Any]:
    """The defaults file as a mapping ``specab_<name>: value`` (checked: plain values, no Jinja)."""
    data, _ = load_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: specab's defaults must be a mapping of specab_* names to values.")
    for k, v in data.items():
        if not str(k).startswith(PREFIX):
            raise ConfigError(f"{path}: {k!r} does not start with {PREFIX!r}.")
        if isinstance(v, str) and ("{{" in v or "{%" in v):
            raise ConfigError(f"{path}: {k} is a Jinja expression; this file holds plain values only "
                              f"(specab/config/defaults.py reads it).")
    return dict(data)


def get(name: str) -> Any:
    """One default by its variable name, with or without the ``specab_`` prefix."""
    key = name if name.startswith(PREFIX) else PREFIX + name
    values = load()
    if key not in values:
        raise KeyError(f"{key} is not in {DEFAULTS_FILE}")
    return values[key]


def bench(settings: Mapping[str, Any] | None) -> dict[str, Any]:
    """An experiment's bench section with the defaults filled in (what the node runs)."""
    out = {k: get(var) for k, var in BENCH_DEFAULTS.items()}
    out.update({k: v for k, v in (settings or {}).items() if v is not None})
    return out


def timeouts(settings: Mapping[str, Any] | None) -> dict[str, Any]:
    """An experiment's timeouts section with the defaults filled in."""
    out = {k: get(var) for k, var in TIMEOUT_DEFAULTS.items()}
    out.update({k: v for k, v in (settings or {}).items() if v is not None})
    return out
