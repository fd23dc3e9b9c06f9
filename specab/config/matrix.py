"""The `--matrix` grammar and SGLang's speculative-decoding rules.

Grammar (one `key=values` per `--matrix` option; several options form a product):

    steps=1,2,3          speculative_num_steps          (alias)
    topk=1,4             speculative_eagle_topk         (alias)
    draft_tokens=4,8     speculative_num_draft_tokens   (alias)
    steps=1..4           an inclusive integer range
    mem_fraction_static=0.85,0.88   any SGLang server argument by its field name
    env.NCCL_PROTO=LL,Simple        an environment variable
    engine=sglang-0.5.9,sglang-0.5.23   an engine build the inventory declares (`specab_engines`)
    concurrency=1,8,32   requests in flight of the benchmark (bench.concurrency), a positive integer each
    request_rate=2,4,8   measured requests per second at seeded arrival times (bench.request_rate), positive

Arms: speculative keys (`steps`, `topk`, `draft_tokens`, `speculative_*`) make one EAGLE-3 arm per
combination, built on the experiment's first speculative arm (which supplies the algorithm and
the draft model path). Other keys (engine args, env, the engine build) are conditions applied to every
arm, baseline included, so each condition has its own baseline (an engine build's arms are compared
with the baseline of the same build; their names end in the build's name, e.g. `baseline-sglang-0.5.9`). Without speculative keys, the
experiment's own speculative arms are used. The baseline is always part of the experiment.
Every combination is checked against SGLang's rules before anything runs.

On a vLLM experiment (`engine: vllm`) the speculative arm is written as vLLM's `speculative_config` mapping;
`steps` sets its `num_speculative_tokens` (arms `<method>-s<N>`, e.g. `draft_model-s2`); `topk` and
`draft_tokens` have no vLLM knob and are refused with what to do instead; other keys are vLLM argument
names (checked against the node's `vllm --help` before any launch).
"""
from __future__ import annotations

import dataclasses
import itertools
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from specab.config import bench, engine_args
from specab.config.spec import ENV_NAME, ArmSpec, ExperimentSpec, overlay, resolve_arm
from specab.vocab import engines

ALIASES = {"steps": "speculative_num_steps", "topk": "speculative_eagle_topk",
           "draft_tokens": "speculative_num_draft_tokens"}
SHORT = {v: k for k, v in ALIASES.items()}
STEPS, TOPK, DRAFT = ALIASES["steps"], ALIASES["topk"], ALIASES["draft_tokens"]
TRIPLE = (STEPS, TOPK, DRAFT)
INT_KEYS = set(TRIPLE) | {"tp_size", "pp_size", "dp_size", "ep_size", "max_running_requests",
                          "max_total_tokens", "chunked_prefill_size", "max_prefill_tokens", "page_size",
                          "cuda_graph_max_bs", "decode_log_interval", "stream_interval", "port",
                          "num_continuous_decode_steps", "context_length", "random_seed"}
ENGINE = "engine"       # the matrix key of the engine build (a name of the inventory's `specab_engines`)
CONCURRENCY = "concurrency"     # the matrix key of the benchmark's requests in flight (bench.concurrency)
RATE = "request_rate"           # the matrix key of the benchmark's arrival rate (bench.request_rate)
BENCH_AXES = {CONCURRENCY, RATE}    # matrix keys that are bench settings, applied per arm (ArmSpec.bench)
ENGINE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,39}$")   # it ends arm names (directory names)

RULE_ALL_OR_NONE = "all of steps/topk/draft_tokens or none"
RULE_TOPK1 = "topk=1 => draft_tokens = steps+1"
RULE_MAX_DRAFT = "draft_tokens <= steps*topk+1"
RULE_DRAFT_PATH = "EAGLE-3 needs a draft model path (speculative_draft_model_path)"
RULE_POSITIVE = "steps, topk and draft_tokens are positive integers"


class MatrixError(ValueError):
    """A malformed matrix or refused combinations; the message lists every problem."""


@dataclass(frozen=True)
class Axis:
    """One `--matrix` option: a canonical key and its values."""
    key: str            # server-arg field name, or "env.NAME"
    label: str          # as the user wrote it (for arm names and messages)
    values: tuple[Any, ...]

    @property
    def is_env(self) -> bool:
        return self.key.startswith("env.")

    @property
    def is_engine(self) -> bool:
        return self.key == ENGINE

    @property
    def is_bench(self) -> bool:
        return self.key in BENCH_AXES

    @property
    def is_spec(self) -> bool:
        return not self.is_env and self.key.startswith("speculative_")


@dataclass
class ArmSet:
    arms: list[ArmSpec]
    notices: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)


def _parse_int(token: str, label: str) -> int:
    try:
        return int(token)
    except ValueError:
        raise MatrixError(f"--matrix {label}: {token!r} is not an integer.") from None


def _parse_values(key: str, label: str, text: str) -> tuple[Any, ...]:
    if text.strip() == "":
        raise MatrixError(f"--matrix {label}=: no values. Write {label}=1,2,3 or a range {label}=1..4.")
    values: list[Any] = []
    for token in text.split(","):
        token = token.strip()
        if token == "":
            raise MatrixError(f"--matrix {label}={text}: an empty value between commas.")
        if "\n" in token or "\r" in token or "\x00" in token:
            raise MatrixError(f"--matrix {label}: a value contains a newline or NUL; it cannot be passed literally.")
        m = re.fullmatch(r"(-?\d*)\.\.(-?\d*)", token)
        if m:
            lo, hi = m.groups()
            if lo == "" or hi == "":
                raise MatrixError(f"--matrix {label}={token}: a range needs both ends, e.g. {label}=1..4.")
            a, b = int(lo), int(hi)
            if a > b:
                raise MatrixError(f"--matrix {label}={token}: the range is empty (start > end).")
            values.extend(range(a, b + 1))
            continue
        if key.startswith("env."):
            values.append(token)
        elif key == ENGINE:
            if not ENGINE_NAME.match(token):
                raise MatrixError(f"--matrix {label}: {token!r} is not an engine build name (letters, digits, "
                                  f"'.', '_', '-', at most 40; as the inventory's specab_engines names them).")
            values.append(token)
        elif key == CONCURRENCY:
            try:
                values.append(int(token))
            except ValueError:
                raise MatrixError(f"--matrix {label}: {token!r} is not a whole number of requests in flight; write "
                                  f"positive integers, e.g. {label}=1,8,32.") from None
        elif key == RATE:
            try:
                rate = float(token)
            except ValueError:
                rate = float("nan")
            bad = bench.rate_problem(rate, zero_ok=False)
            if bad:
                raise MatrixError(f"--matrix {label}: {token!r} {bad}; write positive numbers below "
                                  f"{bench.MAX_REQUEST_RATE:g}, e.g. {label}=2,4,8 (a closed loop is "
                                  f"bench.request_rate 0, without this axis).")
            values.append(int(rate) if rate.is_integer() else rate)
        elif key in INT_KEYS:
            values.append(_parse_int(token, label))
        else:
            try:
                v = yaml.safe_load(token)
            except yaml.YAMLError:
                v = token
            values.append(token if isinstance(v, (dict, list)) or v is None else v)
    if key == CONCURRENCY:
        bad = [v for v in values if v < 1]
        if bad:
            raise MatrixError(f"--matrix {label}: {bad[0]} requests in flight cannot measure anything; every value "
                              f"must be at least 1, e.g. {label}=1,8,32.")
    if key in TRIPLE:
        bad = [v for v in values if v < 1]
        if bad:
            raise MatrixError(f"--matrix {label}: {bad[0]} is not allowed ({RULE_POSITIVE}).")
    dup = sorted({str(v) for v in values if values.count(v) > 1})
    if dup:
        raise MatrixError(f"--matrix {label}: value {dup[0]} is listed twice.")
    return tuple(values)


def parse_matrix(specs: list[str], engine: str = engines.SGLANG) -> list[Axis]:
    """Parse `--matrix` options; refuse malformed ones, unknown keys and duplicate keys. `engine` is the
    experiment's engine kind: its argument names are the ones known (vLLM's are checked by its --help)."""
    axes: list[Axis] = []
    errors: list[str] = []
    seen: dict[str, str] = {}
    for spec in specs:
        if "=" not in spec:
            errors.append(f"--matrix {spec}: expected key=values (e.g. steps=1,2,3).")
            continue
        label, text = spec.split("=", 1)
        label = label.strip()
        if label.startswith("env."):
            name = label[4:]
            if not ENV_NAME.match(name):
                errors.append(f"--matrix {label}: {name!r} is not a valid environment variable name.")
                continue
            key = label
        elif label in (ENGINE, CONCURRENCY, RATE):
            key = label
        elif label == "model_path":
            errors.append("--matrix model_path: the target model is fixed per experiment; use another "
                          "experiment file.")
            continue
        elif engine == engines.VLLM:
            key = ALIASES.get(label, label)
            problem = _vllm_key_problem(label, key)
            if problem:
                errors.append(problem)
                continue
        else:
            key = ALIASES.get(label, label)
            if not engine_args.is_known(key):
                close = engine_args.suggest(label) + [a for a in ALIASES if a.startswith(label[:3])]
                hint = f" Did you mean {', '.join(dict.fromkeys(close))}?" if close else ""
                errors.append(f"--matrix {label}: unknown key '{label}'. Use steps, topk, draft_tokens, an SGLang "
                              f"server argument by its field name, env.NAME, or engine.{hint}")
                continue
        if key in seen:
            errors.append(f"--matrix {label}: duplicate key (already given as --matrix {seen[key]}=...). "
                          f"List all values in one option: {label}=a,b,c.")
            continue
        try:
            values = _parse_values(key, label, text)
        except MatrixError as exc:
            errors.append(str(exc))
            continue
        seen[key] = label
        axes.append(Axis(key=key, label=label, values=values))
    if errors:
        raise MatrixError("invalid --matrix:\n  " + "\n  ".join(errors))
    return axes


def check_spec(server_args: dict[str, Any], where: str) -> tuple[dict[str, Any], list[str], list[str]]:
    """Apply SGLang's speculative rules to resolved server args.

    Returns (adjusted args, notices, refusals); each refusal names the rule that refused it.
    """
    args = dict(server_args)
    notices: list[str] = []
    refusals: list[str] = []
    algo = args.get("speculative_algorithm")
    present = [k for k in TRIPLE if args.get(k) is not None]
    if algo in (None, False, ""):
        if present:
            refusals.append(f"{where}: {', '.join(SHORT[k] for k in present)} set without "
                            f"speculative_algorithm (a baseline arm must not carry speculative args).")
        return args, notices, refusals
    if str(algo).upper() not in engines.SGLANG_EAGLE_FAMILY:
        return args, notices, refusals
    if str(algo).upper() == "EAGLE3" and not args.get("speculative_draft_model_path"):
        refusals.append(f"{where}: refused by rule '{RULE_DRAFT_PATH}': set speculative_draft_model_path in the "
                        f"experiment's EAGLE-3 arm or pass --matrix speculative_draft_model_path=/path.")
    if not present:
        notices.append(f"{where}: steps/topk/draft_tokens unset: the engine chooses them automatically.")
        return args, notices, refusals
    if len(present) != 3:
        missing = [SHORT[k] for k in TRIPLE if k not in present]
        refusals.append(f"{where}: refused by rule '{RULE_ALL_OR_NONE}': {', '.join(missing)} missing "
                        f"(add --matrix {missing[0]}=... or set it in the experiment's EAGLE-3 arm).")
        return args, notices, refusals
    try:
        steps, topk, draft = (int(args[k]) for k in TRIPLE)
    except (TypeError, ValueError):
        refusals.append(f"{where}: refused by rule '{RULE_POSITIVE}': got "
                        f"{', '.join(f'{SHORT[k]}={args[k]!r}' for k in TRIPLE)}.")
        return args, notices, refusals
    if min(steps, topk, draft) < 1:
        refusals.append(f"{where}: refused by rule '{RULE_POSITIVE}': steps={steps}, topk={topk}, "
                        f"draft_tokens={draft}.")
        return args, notices, refusals
    if topk == 1 and draft != steps + 1:
        notices.append(f"{where}: draft_tokens adjusted {draft} -> {steps + 1} (rule '{RULE_TOPK1}', as SGLang "
                       f"does: 'speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
                       f"speculative_eagle_topk == 1').")
        draft = steps + 1
        args[DRAFT] = draft
    if draft > steps * topk + 1:
        refusals.append(f"{where}: refused by rule '{RULE_MAX_DRAFT}': draft_tokens={draft} > "
                        f"{steps}*{topk}+1 = {steps * topk + 1}.")
    return args, notices, refusals


MAX_NAME = 64     # the roles accept arm names matching [A-Za-z0-9][A-Za-z0-9._-]{0,63}


def _vllm_key_problem(label: str, key: str) -> str | None:
    """Why a --matrix key cannot vary a vLLM experiment, or None."""
    if key in engines.VLLM_NO_KNOB:
        return f"--matrix {label}: {engines.VLLM_NO_KNOB[key]}."
    if key.startswith("speculative_") and key != STEPS:
        return (f"--matrix {label}: a vLLM experiment varies its speculative arm through steps "
                f"(num_speculative_tokens); set method and draft model in the arm's speculative_config.")
    if not re.fullmatch(r"[a-z][a-z0-9_]*", key):
        return (f"--matrix {label}: not a vLLM argument name (lowercase letters, digits and '_', as "
                f"`vllm serve --help` lists them with '_' for '-'), steps, env.NAME or engine.")
    return None


def check_vllm_spec(server_args: dict[str, Any], where: str) -> tuple[dict[str, Any], list[str], list[str]]:
    """vLLM's rules for one arm (engines.check_vllm_spec_config): (args, notices, refusals)."""
    cfg = server_args.get("speculative_config")
    if cfg is None:
        return dict(server_args), [], []
    try:
        engines.vllm_spell(server_args)
    except engines.NoSpelling as exc:
        return dict(server_args), [], [f"{where}: refused by vLLM's rules: {exc}."]
    return dict(server_args), [], []


def _fmt(v: Any) -> str:
    s = "true" if v is True else "false" if v is False else str(v)
    return re.sub(r"[^A-Za-z0-9._-]", "_", s)


def _fit(name: str) -> str:
    """Arm names are directory names and role inputs: at most 64 characters."""
    if len(name) <= MAX_NAME:
        return name
    import hashlib
    digest = hashlib.sha1(name.encode()).hexdigest()[:8]
    return name[:MAX_NAME - 9].rstrip("-_.") + "-" + digest


def _spec_name(args: dict[str, Any]) -> str:
    view = engines.speculative_view(args)
    algo = (view.algorithm or "spec").lower()
    if isinstance(args.get("speculative_config"), dict):
        return f"{algo}-s{view.steps}" if view.steps is not None else algo
    if all(args.get(k) is not None for k in TRIPLE):
        return f"{algo}-s{args[STEPS]}-k{args[TOPK]}-d{args[DRAFT]}"
    return algo


def _suffix(combo: dict[Axis, Any]) -> str:
    """The condition's part of an arm name: `label-value` per axis; an engine build by its name alone
    (`eagle3-s2-k1-d3-sglang-0.5.9`), so the arms of one build read as a family; the requests in flight last as
    `c<N>` (`eagle3-s2-k1-d3-c8`), so one configuration's loads differ only in their ending."""
    parts = [f"{ax.label[4:] if ax.is_env else ax.label}-{_fmt(v)}" for ax, v in combo.items()
             if not ax.is_engine and not ax.is_bench]
    parts += [_fmt(v) for ax, v in combo.items() if ax.is_engine]
    parts += [f"c{v}" for ax, v in combo.items() if ax.key == CONCURRENCY]
    parts += [f"r{v}" for ax, v in combo.items() if ax.key == RATE]
    return "-".join(parts)


def _is_spec_arm(arm: dict[str, Any]) -> bool:
    return engines.speculative_view(arm.get("server_args") or {}).algorithm is not None


_ADJUSTED = re.compile(r"^(?P<where>.*): draft_tokens adjusted (?P<old>\d+) -> (?P<new>\d+) (?P<why>\(rule .*)$")


def _grouped(notices: list[str]) -> list[str]:
    """The same draft_tokens adjustment for many combinations said once, with the combinations it applies to."""
    hits = [(n, m) for n in notices if (m := _ADJUSTED.match(n))]
    if len(hits) <= 3:
        return notices
    wheres = [m.group("where").removeprefix("combination ") for _, m in hits]
    shown = ", ".join(wheres[:6]) + (f", ... ({len(wheres)} in all)" if len(wheres) > 6 else "")
    first = hits[0][1]
    one = f"{len(wheres)} combinations ({shown}): draft_tokens adjusted to steps+1 {first.group('why')}"
    grouped = {n for n, _ in hits}
    return [n for n in notices if n not in grouped] + [one]


def _check_bench_axes(exp: ExperimentSpec, axes: list[Axis]) -> None:
    """A bench axis the experiment's bench settings cannot honour, refused before anything runs."""
    requests = int(exp.bench_settings["num_requests"])
    for ax in axes:
        if ax.key != CONCURRENCY:
            continue
        over = [v for v in ax.values if v > requests]
        if over:
            raise MatrixError(f"--matrix {ax.label}={','.join(map(str, ax.values))}: {over[0]} requests in flight "
                              f"need at least {over[0]} measured requests per run, but bench.num_requests is "
                              f"{requests} in {exp.path}; at most {requests} could be in flight at once. Set "
                              f"bench.num_requests to {max(over)} or more (a few times the largest load gives each "
                              f"run more than one wave), or drop {', '.join(map(str, over))}.")


# (name, overlay server_args, overlay env, matrix values) of one speculative configuration
SpecConfig = tuple[str, dict[str, Any], dict[str, Any], dict[str, Any]]


def _spec_configs(exp: ExperimentSpec, spec_axes: list[Axis], baseline: dict[str, Any]) -> list[SpecConfig]:
    """The configurations compared with the baseline: one per combination of the speculative axes (the file's first
    speculative arm as their template), else every arm of the file but the baseline (a second non-speculative arm
    too: kept as its own arm, compared with the baseline)."""
    if not spec_axes:
        return [(str(arm["name"]), dict(arm.get("server_args") or {}), dict(arm.get("env") or {}), {})
                for arm in exp.arms if arm is not baseline]
    vllm = exp.engine == engines.VLLM
    template = next((arm for arm in exp.arms if _is_spec_arm(arm)), None)
    if template is None and vllm:
        raise MatrixError(f"--matrix {', '.join(a.label for a in spec_axes)}: {exp.path} has no speculative arm "
                          f"to vary; add one with server_args.speculative_config (method, model, "
                          f"num_speculative_tokens).")
    template = template or {"name": "eagle3", "server_args": {"speculative_algorithm": "EAGLE3"}}
    specs: list[SpecConfig] = []
    for values in itertools.product(*(a.values for a in spec_axes)):
        sargs = dict(template.get("server_args") or {})
        if not vllm and not sargs.get("speculative_algorithm"):
            sargs["speculative_algorithm"] = "EAGLE3"
        mvals: dict[str, Any] = {}
        for ax, v in zip(spec_axes, values):
            if vllm:        # steps: the only speculative axis on vLLM (_vllm_key_problem)
                sargs["speculative_config"] = {**sargs["speculative_config"], "num_speculative_tokens": v}
            else:
                sargs[ax.key] = v
            mvals[ax.label] = v
        specs.append(("", sargs, dict(template.get("env") or {}), mvals))
    return specs


@dataclass
class _Built:
    """The arms built so far, with the notices and refusals of their checks: an arm identical to an earlier one is
    run once (a notice), a repeated name is numbered."""
    arms: list[ArmSpec] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    names: set[str] = field(default_factory=set)
    signatures: dict[str, str] = field(default_factory=dict)

    def add(self, arm: ArmSpec) -> None:
        sig = repr((sorted(arm.server_args.items(), key=str), sorted(arm.env.items(), key=str), arm.engine,
                    sorted(arm.bench.items())))
        if sig in self.signatures:
            self.notices.append(f"{arm.name}: identical to arm {self.signatures[sig]} after SGLang's adjustments; "
                                f"run once.")
            return
        name = arm.name
        i = 2
        while name in self.names:
            name = f"{arm.name}-{i}"
            i += 1
        if name != arm.name:
            arm = dataclasses.replace(arm, name=name, baseline=name if arm.is_baseline else arm.baseline)
        self.names.add(name)
        self.signatures[sig] = name
        self.arms.append(arm)


def _add_condition(exp: ExperimentSpec, cond: dict[Axis, Any], specs: list[SpecConfig],
                   baseline_overlay: dict[str, Any], file_baseline: dict[str, Any] | None, built: _Built) -> None:
    """The arms of one combination of the condition axes: its baseline, then each speculative configuration."""
    check = check_vllm_spec if exp.engine == engines.VLLM else check_spec
    suffix = _suffix(cond)
    cond_args = {ax.key: v for ax, v in cond.items() if not ax.is_env and not ax.is_engine and not ax.is_bench}
    cond_bench = {ax.key: v for ax, v in cond.items() if ax.is_bench}
    cond_env = {ax.key[4:]: v for ax, v in cond.items() if ax.is_env}
    engine = next((str(v) for ax, v in cond.items() if ax.is_engine), None)
    cond_vals = {ax.label: v for ax, v in cond.items()}
    bname = "baseline" if not suffix else f"baseline-{suffix}"
    if not suffix and file_baseline is not None:
        bname = str(file_baseline["name"])
    bname = _fit(bname)
    b = resolve_arm(exp, {"name": bname,
                          "server_args": overlay(baseline_overlay.get("server_args") or {}, cond_args),
                          "env": overlay(baseline_overlay.get("env") or {}, cond_env)},
                    matrix=cond_vals)
    b = dataclasses.replace(b, engine=engine, bench=dict(cond_bench))
    _, b_notices, b_refused = check(b.server_args, f"arm {bname}")
    built.notices += b_notices
    built.refused += b_refused
    built.add(b)
    for name, sargs, senv, mvals in specs:
        merged = overlay(sargs, cond_args)
        resolved = resolve_arm(exp, {"name": name or "spec", "server_args": merged,
                                     "env": overlay(senv, cond_env)}, baseline=bname,
                               matrix={**mvals, **cond_vals})
        where = f"arm {name}" if name else "combination " + ", ".join(f"{k}={v}" for k, v in mvals.items())
        adjusted, n, r = check(resolved.server_args, where)
        built.notices += n
        if r:
            built.refused += r
            continue
        aname = name or _spec_name(adjusted)
        if suffix:
            aname = f"{aname}-{suffix}"
        aname = _fit(aname)
        built.add(ArmSpec(name=aname, server_args=adjusted, env=resolved.env, is_baseline=False, baseline=bname,
                          matrix=resolved.matrix, phase_timing=resolved.phase_timing, engine=engine,
                          bench=dict(cond_bench)))


def _checked(built: _Built, skip_invalid: bool, spec_axes: bool, specs: bool) -> ArmSet:
    """The arm set, or a MatrixError when what was built cannot run or compares nothing."""
    arms, refused = built.arms, built.refused
    notices = _grouped(built.notices)
    timed = [a.name for a in arms if a.phase_timing]
    if timed and len(timed) < len(arms):
        notices.append(f"the harness adds --enable-metrics and SGLANG_ENABLE_METRICS_DEVICE_TIMER=1 to "
                       f"{', '.join(timed)} (bench.phase_timing auto: the per-phase breakdown of speculative arms), "
                       f"not to {', '.join(a.name for a in arms if not a.phase_timing)}; bench.phase_timing: true "
                       f"adds them to every arm, false to none.")
    typed = sorted({f"arm {a.name}: {p}" for a in arms for k, v in a.server_args.items()
                    if (p := engine_args.type_problem(k, v))})
    if typed:       # a value the engine's argparse would refuse: every run of the arm would fail at its launch
        raise MatrixError("refused before anything runs:\n  " + "\n  ".join(typed))
    if refused and not skip_invalid:
        raise MatrixError("refused before anything runs:\n  " + "\n  ".join(refused)
                          + "\nRemove those values, or pass --skip-invalid to run only the valid combinations.")
    if refused:
        notices += [f"skipped: {r}" for r in refused]
    if not any(not a.is_baseline for a in arms) and (spec_axes or refused):
        raise MatrixError("every speculative combination was refused; nothing to compare with the baseline."
                          + (" (--skip-invalid skipped: " + "; ".join(refused) + ")" if refused else ""))
    alone = [a.name for a in arms if a.is_baseline and not any(b.baseline == a.name and not b.is_baseline
                                                                for b in arms)]
    if refused and alone and specs:
        raise MatrixError(f"--skip-invalid would leave baseline arm(s) {', '.join(alone)} with no arm to compare "
                          f"with (an A/B with only its A). Skipped: " + "; ".join(refused)
                          + ". Fix or remove those values instead.")
    return ArmSet(arms=arms, notices=notices, refused=refused)


def build_arms(exp: ExperimentSpec, axes: list[Axis], skip_invalid: bool = False) -> ArmSet:
    """Arms of the experiment for this matrix (the experiment's own arms when `axes` is empty)."""
    _check_bench_axes(exp, axes)
    spec_axes = [a for a in axes if a.is_spec]
    cond_axes = [a for a in axes if not a.is_spec]
    file_baseline = next((a for a in exp.arms if not _is_spec_arm(a)), None)
    baseline_overlay = file_baseline if file_baseline is not None else {"name": "baseline"}
    specs = _spec_configs(exp, spec_axes, baseline_overlay)
    built = _Built()
    for vals in itertools.product(*(a.values for a in cond_axes)):
        _add_condition(exp, dict(zip(cond_axes, vals)), specs, baseline_overlay, file_baseline, built)
    return _checked(built, skip_invalid, bool(spec_axes), bool(specs))
