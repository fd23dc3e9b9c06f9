"""Checks of the resolved arms that the experiment alone decides, made before any node is touched.

Each refusal names the setting, the limit and where each came from (the file's line, the matrix, the arm); each
notice says what will run where it is not what the experiment's common settings say.
"""
from __future__ import annotations

from specab.config.spec import ArmSpec, ExperimentSpec
from specab.config.yamlfile import ConfigError, key_position, load_yaml


def _where(exp: ExperimentSpec, key: str) -> str:
    """`file:line:col` of the first `key` in the experiment file (the file alone where it is not found)."""
    try:
        _, root = load_yaml(exp.path)
    except ConfigError:
        return str(exp.path)
    return f"{exp.path}{key_position(root, key)}"


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
        raise ConfigError(f"{_where(exp, 'model_path')}: " + "\n".join(problems) + "\nGive the baseline arm the same "
                          "server_args.model_path (or set specab_experiment.model_path for every arm), or compare "
                          "the other model in an experiment of its own.")
    return notices
