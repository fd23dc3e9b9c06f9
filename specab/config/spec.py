"""Load and validate the experiment file (the experiment spec) before any node is touched.

Every error is a `ConfigError` naming the file, the line and column where known, what was wrong
and what to do. The experiment file format and the resolved-arm rule are pinned in
docs/architecture.md ("Experiment file").
"""
from __future__ import annotations

import copy
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from specab.config import bench as benchcfg, defaults, engine_args
from specab.config.yamlfile import REPO_ROOT, ConfigError, check_unknown, key_line, load_yaml
from specab.config import builtin_data, slo, validity
from specab.vocab import dataset, engines
from specab.vocab.contract import redact_env

DEFAULT_EXPERIMENT = REPO_ROOT / "experiments" / "default.yml"

EXPERIMENT_KEYS = {"name", "description", "engine", "model_path", "server_args", "env", "arms", "bench", "timeouts",
                   "validity", "design", "slo"}
ARM_KEYS = {"name", "description", "server_args", "env", "cost_only"}
BENCH_KEYS = {"api", "num_requests", "warmup_requests", "input_len", "output_len", "concurrency",
              "seed", "timeout_s", "model", "max_tokens", "dataset", "phase_timing", "ignore_eos", "request_rate",
              "client_procs", "allow_queueing", "correctness_requests", "temperature", "top_p"}
PHASE_TIMING_VALUES = ("auto", True, False)
# what phase timing sets on an arm (the 2026 engines reference A5): the server's /metrics and, in SGLang
# 0.5.23, the device timer that splits forward time into eagle_draft / eagle_draft_extend / target_verify
PHASE_TIMING_ARGS = {"enable_metrics": True}
PHASE_TIMING_ENV = {"SGLANG_ENABLE_METRICS_DEVICE_TIMER": "1"}
TIMEOUT_KEYS = {"ready_s", "stop_grace_s", "gpu_free_s"}
DESIGN_KEYS = {"burn_in", "server"}
# design.burn_in: unmeasured server starts (each with its benchmark) before block 1 on every host. 0 by default: the
# one node measured through the driver (an H100, SGLang 0.5.17) showed no first-instance effect, and a start costs
# a model load; the H200's first starts were slow on one of two machines, which the doctor's instance-trend rule
# names with the burn-in to set (docs/decisions/0014-burn-in-default-from-the-instance-spread.md).
BURN_IN_DEFAULT = 0
# design.server: one server start per run, or per instance (the runs of one arm and block that differ only in load,
# docs/decisions/0011-one-server-across-a-load-sweep.md); unset: config/instances.py's default
SERVER_MODES = ("per-run", "per-instance")
BENCH_APIS = {"generate", "completions", "chat"}
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
ARM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")   # as the server_start role requires
EXPERIMENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# the matrix value that marks an arm of the deterministic pass (--correctness, specab/config/correctness.py): the
# name of the measured arm it checks
DETERMINISTIC_OF = "deterministic_of"


# --------------------------------------------------------------------------- experiment

@dataclass(frozen=True)
class ArmSpec:
    """A resolved arm: what every per-arm role receives as `specab_arm`."""
    name: str
    server_args: dict[str, Any]
    env: dict[str, Any]
    is_baseline: bool
    baseline: str                       # name of the baseline arm this arm is compared with
    matrix: dict[str, Any] = field(default_factory=dict)   # matrix values that made it, if any
    # server_args in the node engine's spelling (specab/vocab/engines.py spell_args), set by the driver once
    # the node's `--help` is known; None: launch with the experiment's names
    node_args: dict[str, Any] | None = None
    phase_timing: bool = False          # bench.phase_timing put --enable-metrics and the device timer on it
    # the engine build the arm runs on: a name of the inventory's `specab_engines` (the `engine` matrix
    # axis); None: the node's `specab_engine_cmd`
    engine: str | None = None
    # the `--help` flag-set fingerprint of that build (specab/vocab/engines.py), set by the driver's
    # preflight once the node's engine listed its flags; recorded in each run's manifest
    engine_flags_fingerprint: str | None = None
    # bench settings of this arm's runs over the experiment's `bench:` (a bench condition of the matrix, e.g.
    # {"concurrency": 8}); empty: the experiment's bench as it is
    bench: dict[str, Any] = field(default_factory=dict)

    @property
    def deterministic_of(self) -> str | None:
        """The measured arm this arm checks in the deterministic pass (--correctness); None: a measured arm."""
        value = self.matrix.get(DETERMINISTIC_OF)
        return str(value) if value else None

    def to_extravar(self) -> dict[str, Any]:
        args = self.server_args if self.node_args is None else self.node_args
        out: dict[str, Any] = {"name": self.name, "server_args": dict(args), "env": dict(self.env)}
        if self.bench:
            out["bench"] = dict(self.bench)
        if self.engine is not None:
            out["engine"] = self.engine
        if self.engine_flags_fingerprint is not None:
            out["engine_flags_fingerprint"] = self.engine_flags_fingerprint
        return out

    def to_json(self) -> dict[str, Any]:
        """The arm as stored and printed: secret-named env vars and server args (``api_key``) redacted."""
        return {"name": self.name, "server_args": redact_env(self.server_args), "env": redact_env(self.env),
                "is_baseline": self.is_baseline, "baseline": self.baseline, "matrix": dict(self.matrix),
                "phase_timing": self.phase_timing,
                **({"engine": self.engine} if self.engine is not None else {}),
                **({"bench": dict(self.bench)} if self.bench else {})}


@dataclass(frozen=True)
class ExperimentSpec:
    """A validated experiment file."""
    path: Path
    name: str
    model_path: str
    server_args: dict[str, Any]
    env: dict[str, Any]
    arms: list[dict[str, Any]]          # raw arm overlays as written in the file
    bench: dict[str, Any]
    timeouts: dict[str, Any]
    raw: dict[str, Any]                 # the `specab_experiment` mapping as loaded
    warnings: list[str] = field(default_factory=list)
    design: dict[str, Any] = field(default_factory=dict)   # the `design:` section as written

    @property
    def burn_in(self) -> int:
        """design.burn_in: unmeasured server starts and benchmarks before block 1 (on every host of a fleet)."""
        return int(self.design.get("burn_in", BURN_IN_DEFAULT))

    @property
    def server(self) -> str | None:
        """design.server as written (per-run | per-instance), None where the experiment leaves it to the default."""
        value = self.design.get("server")
        return None if value is None else str(value)

    def as_extravar(self) -> dict[str, Any]:
        """The experiment dict passed to the playbook as `specab_experiment`."""
        return copy.deepcopy(self.raw)

    @property
    def engine(self) -> str:
        """The engine kind the experiment is written for (`engine:`, default sglang)."""
        return str(self.raw.get("engine") or "sglang")

    @property
    def bench_settings(self) -> dict[str, Any]:
        """`bench` with specab's defaults filled in (roles/specab): what the node runs."""
        return defaults.bench(self.bench)

    @property
    def timeout_settings(self) -> dict[str, Any]:
        """`timeouts` with specab's defaults filled in (roles/specab)."""
        return defaults.timeouts(self.timeouts)


def _is_spec(server_args: dict[str, Any]) -> bool:
    """SGLang's speculative_algorithm or vLLM's speculative_config (engines.speculative_view)."""
    return engines.speculative_view(server_args).algorithm is not None


def overlay(common: dict[str, Any], arm: dict[str, Any] | None) -> dict[str, Any]:
    """`common | arm`, where `null` in the arm removes a common key (the contract)."""
    out = dict(common)
    for k, v in (arm or {}).items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def resolve_arm(exp: ExperimentSpec, arm: dict[str, Any], baseline: str = "baseline",
                matrix: dict[str, Any] | None = None) -> ArmSpec:
    """Resolve one arm overlay of the experiment per the contract (arm wins; model_path added: the arm's own
    `server_args.model_path` where it gives one, an override that runs and is recorded as given, else the
    experiment's model)."""
    server_args = overlay(exp.server_args, arm.get("server_args"))
    server_args["model_path"] = str(server_args.get("model_path") or exp.model_path)
    env = overlay(exp.env, arm.get("env"))
    spec = _is_spec(server_args)
    timing = phase_timing_on(exp, spec)
    if timing:      # added last; the experiment's and the arm's own values win (false stays, null removes)
        given_args = {**exp.server_args, **(arm.get("server_args") or {})}
        given_env = {**exp.env, **(arm.get("env") or {})}
        server_args.update({k: v for k, v in PHASE_TIMING_ARGS.items() if k not in given_args})
        env.update({k: v for k, v in PHASE_TIMING_ENV.items() if k not in given_env})
    return ArmSpec(name=str(arm["name"]), server_args=server_args, env=env, is_baseline=not spec,
               baseline=baseline if spec else str(arm["name"]), matrix=dict(matrix or {}), phase_timing=timing)


def phase_timing_on(exp: ExperimentSpec, speculative: bool) -> bool:
    """bench.phase_timing (default roles/specab specab_bench_phase_timing): auto = speculative arms only."""
    if exp.engine != engines.SGLANG:
        return False        # SGLang's forward-time categories and profiler: vLLM has no such metrics
    mode = exp.bench.get("phase_timing", defaults.get("specab_bench_phase_timing"))
    return speculative if mode == "auto" else bool(mode)


def _check_value(value: Any, where: str) -> None:
    """Refuse values that cannot be passed literally: newlines, NUL, nested mappings."""
    if isinstance(value, dict):
        raise ConfigError(f"{where}: a mapping is not a valid value; use a scalar or a list.")
    if isinstance(value, list):
        for i, item in enumerate(value):
            if isinstance(item, (dict, list)):
                raise ConfigError(f"{where}[{i}]: nested values are not allowed; use scalars.")
            _check_value(item, f"{where}[{i}]")
        return
    if isinstance(value, str) and ("\n" in value or "\r" in value or "\x00" in value):
        raise ConfigError(f"{where}: the value contains a newline or NUL character, which cannot be passed "
                          f"to the engine literally. Remove it.")


def _check_dataset(bench: dict[str, Any], exp_path: Path, where: str, root: yaml.Node | None,
                   base: tuple[Any, ...]) -> str:
    """bench.dataset read and checked on the controller (every line), before any node is touched; returns its
    absolute path (a relative one is relative to the experiment file)."""
    value = bench["dataset"]
    at = f"{where}{key_line(root, base + ('bench', 'dataset'))}"
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{at}: bench.dataset must be the path of a JSONL file or a built-in name "
                          f"({', '.join(builtin_data.BUILTINS)}), got {value!r}.")
    if builtin_data.is_builtin(value):          # the package's dataset as a JSONL file on the controller
        try:
            path = builtin_data.materialize(value)
        except builtin_data.BuiltinError as exc:
            raise ConfigError(f"{at}: {exc}") from None
    else:
        path = Path(value).expanduser()
    if not path.is_absolute():
        path = exp_path.resolve().parent / path
    try:
        records = dataset.load(str(path))
    except dataset.DatasetError as exc:
        raise ConfigError(f"{at}: bench.dataset: {exc}") from None
    api = bench.get("api", defaults.get("bench_api"))
    if dataset.needs_chat(records) and api != "chat":
        first = next(i for i, r in enumerate(records) if "messages" in r)
        raise ConfigError(f"{at}: bench.dataset {path} holds chat records (\"messages\", the first is record "
                          f"{first + 1}) but bench.api is {api}: only the chat API sends messages, so the engine "
                          f"applies the model's chat template. Set bench.api: chat, or use \"prompt\" records.")
    return str(path)


def _check_sampling(bench: dict[str, Any], where: str, root: yaml.Node | None, base: tuple[Any, ...]) -> None:
    """bench.temperature in [0, 2] and bench.top_p in (0, 1], refused with the key's line before any node is touched."""
    for key in benchcfg.SAMPLING_RANGES:
        bad = benchcfg.sampling_problem(key, bench[key]) if key in bench else None
        if bad:
            raise ConfigError(f"{where}{key_line(root, base + ('bench', key))}: {bad}.")


def _check_server_args(args: Any, where: str, root: yaml.Node | None, path: tuple[Any, ...],
                       warnings: list[str], engine: str = "sglang") -> dict[str, Any]:
    if args is None:
        return {}
    if not isinstance(args, dict):
        raise ConfigError(f"{where}{key_line(root, path)}: server_args must be a mapping of SGLang argument "
                          f"names to values, got {type(args).__name__}.")
    for k, v in args.items():
        if not isinstance(k, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", k):
            raise ConfigError(f"{where}{key_line(root, path + (k,))}: server_args key {k!r} is not a valid "
                              f"argument name (lowercase letters, digits and '_').")
        if engine == "vllm":
            if k == "speculative_config" and isinstance(v, dict):
                # vLLM takes it as one JSON argument (rendered by the template): checked by the engine knowledge
                try:
                    engines.check_vllm_spec_config(v)
                except engines.NoSpelling as exc:
                    raise ConfigError(f"{where}{key_line(root, path + (k,))}: server_args.{k}: {exc}") from None
                continue
            if isinstance(v, dict):
                # vLLM's JSON-valued arguments (--override-generation-config, --hf-overrides, ...): one JSON word,
                # rendered by the template; the node's `vllm --help` and vLLM's own parser check the rest
                for sub, item in v.items():
                    _check_value(item, f"{where}{key_line(root, path + (k, sub))}: server_args.{k}.{sub}")
                continue
        elif not engine_args.is_known(k):
            warnings.append(engine_args.unknown_message(k, f"{where}{key_line(root, path + (k,))}")
                            + " (passed through; the node's engine --help is the final check)")
        _check_value(v, f"{where}{key_line(root, path + (k,))}: server_args.{k}")
        if k == "port" and v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 65535):
            raise ConfigError(f"{where}{key_line(root, path + (k,))}: server_args.port must be a TCP port number "
                              f"1-65535, got {v!r}.")
        bad = engine_args.type_problem(k, v)
        if bad:
            raise ConfigError(f"{where}{key_line(root, path + (k,))}: server_args.{bad}.")
    return dict(args)


def _check_env(env: Any, where: str, root: yaml.Node | None, path: tuple[Any, ...]) -> dict[str, Any]:
    if env is None:
        return {}
    if not isinstance(env, dict):
        raise ConfigError(f"{where}{key_line(root, path)}: env must be a mapping NAME: value.")
    for k, v in env.items():
        if not isinstance(k, str) or not ENV_NAME.match(k):
            raise ConfigError(f"{where}{key_line(root, path + (k,))}: {k!r} is not a valid environment "
                              f"variable name (letters, digits, '_', not starting with a digit).")
        if isinstance(v, (dict, list)):
            raise ConfigError(f"{where}{key_line(root, path + (k,))}: env.{k} must be a scalar.")
        _check_value(v, f"{where}{key_line(root, path + (k,))}: env.{k}")
    return dict(env)


def _check_design(design: Any, where: str, root: yaml.Node | None, base: tuple[Any, ...]) -> dict[str, Any]:
    """The `design:` section: how the experiment runs its blocks, beyond the command line's --repeats and --order."""
    if design is None:
        return {}
    if not isinstance(design, dict):
        raise ConfigError(f"{where}{key_line(root, base + ('design',))}: design must be a mapping (e.g. "
                          f"design: {{burn_in: 1, server: per-instance}}).")
    check_unknown(design.keys(), DESIGN_KEYS, where, root, base + ("design",), "design")
    burn_in = design.get("burn_in", BURN_IN_DEFAULT)
    if not isinstance(burn_in, int) or isinstance(burn_in, bool) or burn_in < 0:
        raise ConfigError(f"{where}{key_line(root, base + ('design', 'burn_in'))}: design.burn_in must be a whole "
                          f"number of unmeasured server starts before block 1 (0: none, 1: one start and benchmark "
                          f"that is not analysed), got {burn_in!r}.")
    server = design.get("server")
    if "server" in design and server not in SERVER_MODES:
        raise ConfigError(f"{where}{key_line(root, base + ('design', 'server'))}: design.server must be per-run (every "
                          f"run starts its own server) or per-instance (the runs of one arm and block that differ "
                          f"only in load share one server start, its cache reset between the loads), got {server!r}.")
    return dict(design)


def _check_arms(arms: Any, where: str, root: yaml.Node | None, base: tuple[Any, ...], warnings: list[str],
                engine: str) -> None:
    """Each arm: a mapping with a unique, well-formed name, known keys, checked server args and env."""
    if not isinstance(arms, list):
        raise ConfigError(f"{where}{key_line(root, base + ('arms',))}: arms must be a list.")
    seen: set[str] = set()
    for i, arm in enumerate(arms):
        apath = base + ("arms", i)
        if not isinstance(arm, dict) or "name" not in arm:
            raise ConfigError(f"{where}{key_line(root, apath)}: arms[{i}] must be a mapping with a 'name'.")
        check_unknown(arm.keys(), ARM_KEYS, where, root, apath, f"arms[{i}]")
        aname = str(arm["name"])
        if not ARM_NAME.match(aname):
            raise ConfigError(f"{where}{key_line(root, apath + ('name',))}: arm name {aname!r} may only contain "
                              f"letters, digits and . _ - (at most 64 characters)")
        if aname in seen:
            raise ConfigError(f"{where}{key_line(root, apath + ('name',))}: duplicate arm name '{aname}'.")
        seen.add(aname)
        arm_args = _check_server_args(arm.get("server_args"), where, root, apath + ("server_args",), warnings, engine)
        _check_env(arm.get("env"), where, root, apath + ("env",))
        validity.check_cost_only(arm, _is_spec(arm_args), where, root, apath)


def _check_bench(exp: dict[str, Any], p: Path, where: str, root: yaml.Node | None,
                 base: tuple[Any, ...]) -> dict[str, Any]:
    """The experiment's bench section, checked (its dataset resolved to an absolute path, also in `exp`)."""
    bench = exp.get("bench") or {}
    if not isinstance(bench, dict):
        raise ConfigError(f"{where}{key_line(root, base + ('bench',))}: bench must be a mapping.")
    check_unknown(bench.keys(), BENCH_KEYS, where, root, base + ("bench",), "bench")
    if "api" in bench and bench["api"] not in BENCH_APIS:
        raise ConfigError(f"{where}{key_line(root, base + ('bench', 'api'))}: bench.api must be one of "
                          f"{', '.join(sorted(BENCH_APIS))}, got {bench['api']!r}.")
    if "max_tokens" in bench:
        # one length setting, not two that could disagree: the client asks each request for output_len tokens
        raise ConfigError(f"{where}{key_line(root, base + ('bench', 'max_tokens'))}: bench.max_tokens is not a "
                          f"setting: the tokens each request asks for are bench.output_len (sent as max_new_tokens / "
                          f"max_tokens). Move the value to bench.output_len and remove bench.max_tokens.")
    if "phase_timing" in bench and bench["phase_timing"] not in PHASE_TIMING_VALUES:
        raise ConfigError(f"{where}{key_line(root, base + ('bench', 'phase_timing'))}: bench.phase_timing must be "
                          f"auto, true or false, got {bench['phase_timing']!r}.")
    if "ignore_eos" in bench and not isinstance(bench["ignore_eos"], bool):
        raise ConfigError(f"{where}{key_line(root, base + ('bench', 'ignore_eos'))}: bench.ignore_eos must be true "
                          f"(every answer runs to output_len) or false (answers end where the model ends them), "
                          f"got {bench['ignore_eos']!r}.")
    rate = bench.get("request_rate")
    if rate is not None and benchcfg.rate_problem(rate, zero_ok=True):
        raise ConfigError(f"{where}{key_line(root, base + ('bench', 'request_rate'))}: bench.request_rate must be a "
                          f"number of requests per second (0: each as soon as one in flight ends) below "
                          f"{benchcfg.MAX_REQUEST_RATE:g}, got {rate!r}: it {benchcfg.rate_problem(rate, zero_ok=True)}.")
    _check_sampling(bench, where, root, base)
    if bench.get("client_procs") is not None:
        try:
            benchcfg.client_procs(bench["client_procs"])
        except ConfigError as exc:
            raise ConfigError(f"{where}{key_line(root, base + ('bench', 'client_procs'))}: {exc}.") from None
    if bench.get("dataset") is not None:
        bench = exp["bench"] = dict(bench, dataset=_check_dataset(bench, p, where, root, base))
    for k in ("num_requests", "warmup_requests", "input_len", "output_len", "concurrency", "seed",
              "correctness_requests"):
        least = 0 if k in ("warmup_requests", "seed") else 1      # a run measures at least one request of a token
        if k in bench and (not isinstance(bench[k], int) or isinstance(bench[k], bool) or bench[k] < least):
            raise ConfigError(f"{where}{key_line(root, base + ('bench', k))}: bench.{k} must be an integer of at "
                              f"least {least}, got {bench[k]!r}.")
    return bench


def _check_timeouts(timeouts: Any, where: str, root: yaml.Node | None, base: tuple[Any, ...]) -> dict[str, Any]:
    """The timeouts section: known keys, each a positive number of seconds."""
    if not isinstance(timeouts, dict):
        raise ConfigError(f"{where}{key_line(root, base + ('timeouts',))}: timeouts must be a mapping.")
    check_unknown(timeouts.keys(), TIMEOUT_KEYS, where, root, base + ("timeouts",), "timeouts")
    for k, v in timeouts.items():
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0:
            raise ConfigError(f"{where}{key_line(root, base + ('timeouts', k))}: timeouts.{k} must be a "
                              f"positive number of seconds, got {v!r}.")
    return timeouts


def load_experiment(path: str | os.PathLike[str] | None = None) -> ExperimentSpec:
    """Load and validate an experiment file (default: experiments/default.yml)."""
    p = Path(path) if path else DEFAULT_EXPERIMENT
    data, root = load_yaml(p)
    where = str(p)
    if isinstance(data, dict) and "specab_experiment" not in data and ("all" in data or "gpu_nodes" in data):
        raise ConfigError(f"{where}: this is an inventory (top-level '{'all' if 'all' in data else 'gpu_nodes'}'), "
                          f"given as the experiment: were -e and -i swapped? -e EXPERIMENT.yml -i INVENTORY.yml.")
    if not isinstance(data, dict) or "specab_experiment" not in data:
        raise ConfigError(f"{where}: the file must have one top-level key 'specab_experiment' "
                          f"(see experiments/default.yml).")
    check_unknown(data.keys(), {"specab_experiment"}, where, root, (), "the top level")
    exp = data["specab_experiment"]
    base = ("specab_experiment",)
    if not isinstance(exp, dict):
        raise ConfigError(f"{where}{key_line(root, base)}: specab_experiment must be a mapping.")
    check_unknown(exp.keys(), EXPERIMENT_KEYS, where, root, base, "specab_experiment")
    engine = exp.get("engine", "sglang")
    if engine not in engines.ENGINES:
        raise ConfigError(f"{where}{key_line(root, base + ('engine',))}: engine {engine!r} is not one of "
                          f"{', '.join(engines.ENGINES)}.")
    for req in ("name", "model_path", "arms"):
        if req not in exp or exp[req] in (None, "", []):
            raise ConfigError(f"{where}{key_line(root, base)}: specab_experiment.{req} is required.")
    name = str(exp["name"])
    if not EXPERIMENT_NAME.match(name):
        raise ConfigError(f"{where}{key_line(root, base + ('name',))}: experiment name {name!r} may only "
                          f"contain letters, digits, '.', '_' and '-'.")
    _check_value(exp["model_path"], f"{where}{key_line(root, base + ('model_path',))}: model_path")
    warnings: list[str] = []
    server_args = _check_server_args(exp.get("server_args"), where, root, base + ("server_args",), warnings, engine)
    if _is_spec(server_args):
        raise ConfigError(f"{where}{key_line(root, base + ('server_args',))}: speculative_algorithm belongs in "
                          f"an arm's server_args, not in the common server_args (the baseline arm must not "
                          f"speculate).")
    env = _check_env(exp.get("env"), where, root, base + ("env",))
    arms = exp["arms"]
    _check_arms(arms, where, root, base, warnings, engine)
    bench = _check_bench(exp, p, where, root, base)
    validity.check_section(exp.get("validity"), where, root, base + ("validity",))
    slo.check_section(exp.get("slo"), where, root, base + ("slo",))
    timeouts = _check_timeouts(exp.get("timeouts") or {}, where, root, base)
    design = _check_design(exp.get("design"), where, root, base)
    return ExperimentSpec(path=p.resolve(), name=name, model_path=str(exp["model_path"]), server_args=server_args,
                      env=env, arms=[dict(a) for a in arms], bench=dict(bench), timeouts=dict(timeouts),
                      raw=copy.deepcopy(exp), warnings=warnings, design=design)
