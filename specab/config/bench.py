"""One run's bench settings, resolved once on the controller, and the time the run queue's collect waits for it.

The layers, lowest first: specab's defaults (roles/specab, ``defaults.bench``), the ``specab_bench_*`` values as
Ansible resolves them (an inventory or an extra var may set them; the driver refuses an inventory that does,
``specab.driver.options.check_bench_vars``), the experiment's ``bench:``, and the arm's own bench settings
(``ArmSpec.bench``, e.g. a bench condition of the matrix such as concurrency). The lookup ``specab_bench_settings``
(plugins/lookup) is this resolution for the playbooks; the driver calls it here, so a value the driver derives
from a run's settings is the one the node runs.
"""
from __future__ import annotations

import posixpath
from collections.abc import Callable, Mapping
from typing import Any

from specab.config import defaults
from specab.config.yamlfile import ConfigError
from specab.vocab import contract

INTS = ("num_requests", "warmup_requests", "input_len", "output_len", "concurrency", "seed")
FLOATS = ("request_rate", "timeout_s", "temperature", "top_p")
# the sampling settings' allowed ranges (what SGLang and vLLM accept and the distribution check is meant for):
# temperature in [0, 2] (0: greedy), top_p in (0, 1]
SAMPLING_RANGES = {"temperature": ("[0, 2]", lambda v: 0.0 <= v <= 2.0),
                   "top_p": ("(0, 1]", lambda v: 0.0 < v <= 1.0)}
# what the client takes: the settings with a specab_bench_* default, and the two without one. Other keys of an
# experiment's bench (e.g. phase_timing, which decides the server's flags) are not bench settings of the run.
SETTINGS = (*defaults.BENCH_DEFAULTS, "model", "dataset")
# seconds the run queue's collect waits beyond the run's own bound (the sequencer's bookkeeping, the manifest's
# probes, packing the run directory)
QUEUE_WAIT_MARGIN_S = 300.0
# the highest arrival rate a schedule may ask (requests per second): arrivals less than a microsecond apart are no
# schedule the client can keep, only "all at once up to bench.concurrency"
MAX_REQUEST_RATE = 1e6


def rate_problem(rate: Any, *, zero_ok: bool) -> str | None:
    """What is wrong with an arrival rate (None when nothing), in words that name the bound it broke: not a number,
    not above 0 (where a schedule must have arrivals: `zero_ok` False; else below 0), or not below
    MAX_REQUEST_RATE."""
    number = isinstance(rate, (int, float)) and not isinstance(rate, bool) and rate == rate
    if not zero_ok and not (number and rate > 0):
        return "is not a rate of requests per second above 0"
    if not number:
        return "is not a number of requests per second"
    if rate < 0:
        return "is below 0"
    if rate >= MAX_REQUEST_RATE:
        return (f"is not below {MAX_REQUEST_RATE:g} requests per second, the highest rate a schedule may ask "
                f"(arrivals less than a microsecond apart are no schedule the client can keep)")
    return None


def given(variables: Mapping[str, Any], names: Mapping[str, str],
          render: Callable[[Any], Any] = lambda value: value) -> dict[str, Any]:
    """The values ``variables`` (Ansible's variables, an inventory host's) gives for ``names`` (setting ->
    ``specab_*`` variable, ``defaults.BENCH_DEFAULTS`` or ``defaults.TIMEOUT_DEFAULTS``), by setting name, each
    through ``render`` (a lookup plugin's templar: Ansible hands its variables over untemplated)."""
    return {key: render(variables[var]) for key, var in names.items() if var in variables}


def flag(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).strip().lower() in ("true", "yes", "on", "1"):
        return True
    if str(value).strip().lower() in ("false", "no", "off", "0"):
        return False
    raise ConfigError(f"bench.ignore_eos must be true or false, got {value!r}")


def sampling_problem(key: str, value: Any) -> str | None:
    """Why ``value`` is no valid bench.temperature / bench.top_p (None: it is): the key, the value and the range."""
    allowed, ok = SAMPLING_RANGES[key]
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if number and ok(float(value)):
        return None
    what = {"temperature": "the sampling temperature of every request (0: greedy)",
            "top_p": "the nucleus share of every request (1: the whole distribution)"}[key]
    return f"bench.{key} must be a number in {allowed}, {what}; got {value!r}"


def client_procs(value: Any) -> str | int:
    """bench.client_procs: ``auto`` or a whole number of client processes >= 1 (contract.client_procs)."""
    try:
        return contract.client_procs(value)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def resolve(base: Mapping[str, Any], experiment_bench: Mapping[str, Any] | None,
            arm_bench: Mapping[str, Any] | None, dataset_dir: str | None = None) -> dict[str, Any]:
    """``base`` (the specab_bench_* values by setting name) < the experiment's bench < the arm's; typed as the
    client takes them (counts int, the request rate, the timeout and the sampling settings float, ignore_eos bool,
    client_procs auto or int; a temperature or top_p out of range refused). ``dataset_dir``: the
    node directory the dataset is copied to; ``dataset`` then becomes the node path of the file there."""
    merged = dict(base)
    for layer in (experiment_bench, arm_bench):
        merged.update({k: v for k, v in dict(layer or {}).items() if v is not None})
    try:
        out = {k: v for k, v in defaults.bench(merged).items() if k in SETTINGS}
        out.update({key: int(out[key]) for key in INTS})
        out.update({key: float(out[key]) for key in FLOATS})
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"a bench setting has no usable value ({type(exc).__name__}: {exc}); counts must be "
                          f"integers, bench.request_rate, bench.timeout_s, bench.temperature and bench.top_p numbers") from exc
    out["api"] = str(out["api"])
    out["ignore_eos"] = flag(out["ignore_eos"])
    out["client_procs"] = client_procs(out["client_procs"])
    for key in SAMPLING_RANGES:
        bad = sampling_problem(key, out[key])
        if bad:
            raise ConfigError(bad)
    if out.get("model") is not None:
        out["model"] = str(out["model"])
    if out.get("dataset") is not None and dataset_dir:
        out["dataset"] = posixpath.join(str(dataset_dir), posixpath.basename(str(out["dataset"])))
    return out


def timeouts(base: Mapping[str, Any], experiment_timeouts: Mapping[str, Any] | None) -> dict[str, float]:
    """specab's timeouts < ``base`` (the specab_* timeout values by setting name) < the experiment's
    ``timeouts:``, in seconds."""
    merged = {**defaults.timeouts(None), **base,
              **{k: v for k, v in dict(experiment_timeouts or {}).items() if v is not None}}
    try:
        return {k: float(merged[k]) for k in defaults.TIMEOUT_DEFAULTS}
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"a timeout has no usable value ({type(exc).__name__}: {exc}); timeouts are seconds") \
            from exc


def queue_wait_s(bench: Mapping[str, Any], run_timeouts: Mapping[str, Any], scored_requests: int = 0) -> float:
    """Seconds the run queue's collect (playbooks/collect_run.yml) waits for one queued run before it gives up:
    the server's ready timeout, two stops and two waits for free GPUs (a leftover's before the run, the run's own
    after it), each of the run's requests, warm-up included, and each request its server scores after them
    (``scored_requests``: a baseline run at temperature > 0, specab/node/scoring.py) at its timeout, and
    QUEUE_WAIT_MARGIN_S. ``bench``: the run's resolved settings (``resolve``, with the arm's own), ``run_timeouts``:
    ``timeouts``."""
    return (float(run_timeouts["ready_s"]) + 2 * float(run_timeouts["stop_grace_s"])
            + 2 * float(run_timeouts["gpu_free_s"])
            + float(bench["timeout_s"]) * (int(bench["num_requests"]) + int(bench["warmup_requests"])
                                           + int(scored_requests))
            + QUEUE_WAIT_MARGIN_S)
