"""Checks of the resolved arms that the experiment alone decides, made before any node is touched.

Each refusal names the setting, the limit and where each came from (the file's line, the matrix, specab's
defaults); each notice says what will run where it is not what the experiment's common settings say. The checks
that need the node (its GPUs, the model's own config) are the driver's (`specab/driver/nodecheck.py`); they share
this module's words (`Limit`, `Prompt`, `context_problem`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specab.config import defaults
from specab.config.spec import ArmSpec, ExperimentSpec
from specab.config.yamlfile import ConfigError, key_line, load_yaml
from specab.vocab import dataset, engines

BASE = ("specab_experiment",)
# the engine's own cap of requests running at once, and the context length set on the command line, per engine kind
RUNNING_CAP = {engines.SGLANG: "max_running_requests", engines.VLLM: "max_num_seqs"}
CONTEXT_ARG = {engines.SGLANG: "context_length", engines.VLLM: "max_model_len"}


class Sources:
    """Where an arm's setting came from, in the words a refusal quotes: `exp.yml:12:5`, `--matrix k=v`, specab's
    default."""

    def __init__(self, exp: ExperimentSpec):
        self.exp = exp
        try:
            _, self.root = load_yaml(exp.path)
        except ConfigError:
            self.root = None

    def _at(self, path: tuple[Any, ...]) -> str:
        return f"{self.exp.path}{key_line(self.root, BASE + path)}"

    def _set_in(self, arm: ArmSpec, section: str, key: str, label: str) -> str | None:
        """Where the arm's `section` ("server_args" or "env") key was set: the matrix (as `label`), the arm, the
        experiment; None when none of them sets it."""
        if label in arm.matrix:
            return f"--matrix {label}={arm.matrix[label]}"
        for i, raw in enumerate(self.exp.arms):
            if raw.get("name") == arm.name and key in (raw.get(section) or {}):
                return f"arms[{i}].{section}.{key} at {self._at(('arms', i, section, key))}"
        if key in getattr(self.exp, section):
            return f"{section}.{key} at {self._at((section, key))}"
        return None

    def server_arg(self, arm: ArmSpec, key: str) -> str:
        return self._set_in(arm, "server_args", key, key) or f"server_args.{key}"

    def env(self, arm: ArmSpec, key: str) -> str | None:
        """Where the arm's environment variable `key` came from, or None when the experiment does not set it."""
        return self._set_in(arm, "env", key, f"env.{key}")

    def bench(self, arm: ArmSpec, key: str) -> str:
        if key in arm.bench:
            return f"--matrix {key}={arm.bench[key]}"
        if key in self.exp.bench:
            return f"bench.{key} at {self._at(('bench', key))}"
        return f"bench.{key} (specab's default, {defaults.DEFAULTS_FILE.relative_to(defaults.REPO_ROOT)})"


def bench_of(exp: ExperimentSpec, arm: ArmSpec) -> dict[str, Any]:
    """The bench settings the arm's runs use: the experiment's with specab's defaults, the arm's own over them."""
    return {**exp.bench_settings, **arm.bench}


def check_experiment(exp: ExperimentSpec) -> None:
    """Keys of the experiment whose meaning the arms' checks rely on."""
    src = Sources(exp)
    if "model_path" in exp.server_args:
        raise ConfigError(f"{src._at(('server_args', 'model_path'))}: server_args.model_path is "
                          f"specab_experiment.model_path for every arm: set the model there (an arm may give its own "
                          f"server_args.model_path).")
    allow = exp.bench.get("allow_queueing")
    if allow is not None and not isinstance(allow, bool):
        raise ConfigError(f"{src._at(('bench', 'allow_queueing'))}: bench.allow_queueing must be true (more requests "
                          f"in flight than the server runs at once: the rest wait in its queue) or false, got "
                          f"{allow!r}.")


def check_models(exp: ExperimentSpec, arms: list[ArmSpec]) -> list[str]:
    """An arm's own `server_args.model_path` runs and is recorded (plan, args.json, manifest, the store's arm row).
    A speculative arm must run the model of the baseline it is compared with: its speedup and accept length say
    what speculation does for one model, and over two models they would say nothing (ConfigError). A baseline-like
    arm on another model is an A/B of two models: said in a notice."""
    by_name = {a.name: a for a in arms}
    problems, notices = [], []
    for arm in arms:
        model = arm.server_args.get("model_path")
        base = by_name.get(arm.baseline)
        if base is None or base is arm or model == base.server_args.get("model_path"):
            if model != exp.model_path and arm.is_baseline:
                notices.append(f"arm {arm.name} runs model {model} (its server_args.model_path), not the "
                               f"experiment's {exp.model_path}.")
            continue
        if not arm.is_baseline:
            problems.append(f"arm {arm.name} speculates on model {model} but its baseline {base.name} runs "
                            f"{base.server_args.get('model_path')}: its speedup and accept length would compare two "
                            f"models, not speculation against plain decoding.")
        else:
            notices.append(f"arm {arm.name} runs model {model} (its server_args.model_path), compared with "
                           f"baseline {base.name} on {base.server_args.get('model_path')}: an A/B of two models.")
    if problems:
        raise ConfigError(f"{exp.path}: " + "\n".join(problems) + "\nGive the baseline arm the same "
                          "server_args.model_path (or set specab_experiment.model_path for every arm), or compare "
                          "the other model in an experiment of its own.")
    return notices


def check_queueing(exp: ExperimentSpec, arms: list[ArmSpec]) -> list[str]:
    """More requests in flight (bench.concurrency) than the arm's server runs at once (SGLang's
    max_running_requests, vLLM's max_num_seqs) measure a queue, not that load: refused, unless bench.allow_queueing
    says so (a notice then; the report's load label says what the server ran)."""
    cap_key = RUNNING_CAP.get(exp.engine, RUNNING_CAP[engines.SGLANG])
    src = Sources(exp)
    over = []
    for arm in arms:
        cap, conc = arm.server_args.get(cap_key), bench_of(exp, arm).get("concurrency")
        if isinstance(cap, int) and not isinstance(cap, bool) and isinstance(conc, int) and conc > cap:
            over.append((f"arm {arm.name}: {conc} requests in flight ({src.bench(arm, 'concurrency')}) but the server "
                         f"runs at most {cap} at once ({src.server_arg(arm, cap_key)})", conc - cap))
    if not over:
        return []
    if exp.bench.get("allow_queueing"):
        return [f"{line}: up to {queued} wait in its queue (bench.allow_queueing: true); the report's load label "
                f"says what the server ran." for line, queued in over]
    raise ConfigError("\n".join(line for line, _ in over) + f".\nThe rest would wait in the server's queue: each run "
                      f"would measure {cap_key} running requests and a queue, not the load asked. Lower "
                      f"bench.concurrency to the cap, raise server_args.{cap_key}, or set bench.allow_queueing: true "
                      f"to measure the queue on purpose.")


@dataclass(frozen=True)
class Limit:
    """An arm's context length: the most tokens (prompt and answer) one request may hold, and where it came from."""
    tokens: int
    source: str


@dataclass(frozen=True)
class Prompt:
    """The longest prompt an arm's runs send, as a lower bound of its tokens, and which prompt it is. A word (text
    between whitespace) is at least one token in every tokenizer these engines use."""
    tokens: int
    what: str


def _words(record: dict[str, Any]) -> int:
    if "messages" in record:
        return sum(len(str(m.get("content", "")).split()) for m in record["messages"])
    return len(str(record.get("prompt", "")).split())


def longest_prompt(exp: ExperimentSpec, arm: ArmSpec, loaded: dict[str, list[dict[str, Any]]]) -> Prompt:
    """The longest prompt the arm's runs send: of the dataset's records the client draws (warm-up and measured, as
    `specab.vocab.dataset.sample` draws them), else the seeded prompts of bench.input_len words. `loaded` caches
    the datasets read (by path)."""
    b = bench_of(exp, arm)
    path = b.get("dataset")
    if not path:
        return Prompt(int(b["input_len"]), f"bench.input_len {b['input_len']} words per seeded prompt")
    if path not in loaded:
        loaded[path] = dataset.load(str(path))
    records = loaded[path]
    sent = (dataset.sample(records, int(b["seed"]), "warmup", int(b["warmup_requests"]))
            + dataset.sample(records, int(b["seed"]), "measure", int(b["num_requests"])))
    longest = max(sent, key=_words)
    n = next(i for i, r in enumerate(records, 1) if r is longest)
    return Prompt(_words(longest), f"record {n} of bench.dataset {path}: {_words(longest)} words")


def context_problem(arm: ArmSpec, prompt: Prompt, output_len: int, output_src: str, limit: Limit,
                    engine: str) -> str | None:
    """Why the engine would not run the arm's requests as asked within `limit`, or None. SGLang refuses a prompt
    of the context length or more, and a prompt and answer above it; vLLM refuses the first and cuts the answer of
    the second to fit (an answer shorter than bench.output_len)."""
    if prompt.tokens >= limit.tokens:
        return (f"arm {arm.name}: the prompt has at least {prompt.tokens} tokens ({prompt.what}), not below the "
                f"context length of {limit.tokens} tokens ({limit.source}): the engine refuses it")
    total = prompt.tokens + output_len
    if total > limit.tokens:
        what = ("SGLang refuses the request" if engine != engines.VLLM
                else f"vLLM cuts the answer to {limit.tokens - prompt.tokens} tokens")
        return (f"arm {arm.name}: the prompt's at least {prompt.tokens} tokens ({prompt.what}) and the "
                f"{output_len} tokens asked ({output_src}) make {total}, above the context length of {limit.tokens} "
                f"tokens ({limit.source}): {what}")
    return None


CONTEXT_ADVICE = ("Lower bench.output_len or the prompts (bench.input_len, the dataset's records), or run a longer "
                  "context (server_args.{key}, where the model allows it).")


def arg_limit(exp: ExperimentSpec, arm: ArmSpec, src: Sources) -> Limit | None:
    """The context length the arm sets on the engine's command line (SGLang's context_length, vLLM's
    max_model_len), or None."""
    key = CONTEXT_ARG.get(exp.engine, CONTEXT_ARG[engines.SGLANG])
    value = arm.server_args.get(key)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return Limit(value, f"{src.server_arg(arm, key)}")
    return None


def check_context(exp: ExperimentSpec, arms: list[ArmSpec]) -> list[ArmSpec]:
    """Refuse an arm whose prompts and answers do not fit the context length it sets on the command line
    (ConfigError naming the prompt, the tokens asked and the limit with their sources). Returns the arms without
    such a setting: their limit is the model's own, read on the node (`specab/driver/nodecheck.py`)."""
    src = Sources(exp)
    loaded: dict[str, list[dict[str, Any]]] = {}
    problems, unknown = [], []
    for arm in arms:
        limit = arg_limit(exp, arm, src)
        if limit is None:
            unknown.append(arm)
            continue
        bad = context_problem(arm, longest_prompt(exp, arm, loaded), int(bench_of(exp, arm)["output_len"]),
                              src.bench(arm, "output_len"), limit, exp.engine)
        if bad:
            problems.append(bad)
    if problems:
        key = CONTEXT_ARG.get(exp.engine, CONTEXT_ARG[engines.SGLANG])
        raise ConfigError("\n".join(problems) + ".\n" + CONTEXT_ADVICE.format(key=key))
    return unknown
