"""The experiment's ``validity:`` section: the rules the output checks judge a speculative arm by.

Checked when the experiment is loaded, before any node is touched; the analysis (specab/analysis/validity.py) reads
the stored section over these defaults. The measurements behind ``greedy_min_match`` are in
docs/validation/validity.md; the rules themselves in docs/analysis.md ("Output validity").
"""
from __future__ import annotations

from typing import Any

import yaml

from specab.config.yamlfile import ConfigError, check_unknown, key_line
from specab.vocab import engines

# greedy_min_match: the share of the baseline's tokens a request must agree on before its first difference to pass
# (an identical output always passes); length_window: MLPerf's output-length window; loop_ngram / loop_share: an
# output whose n-grams repeat an earlier one at this share or more loops
DEFAULTS: dict[str, Any] = {"greedy_min_match": 0.5, "length_window": 0.10, "loop_ngram": 4, "loop_share": 0.5}
_RANGES: dict[str, tuple[str, Any]] = {
    "greedy_min_match": ("a share in [0, 1] (0: any divergence passes, 1: only identical outputs)",
                         lambda v: 0.0 <= v <= 1.0),
    "length_window": ("a share in (0, 1] (0.10: each arm's mean output length within +-10 % of its baseline's)",
                      lambda v: 0.0 < v <= 1.0),
    "loop_ngram": ("an integer of at least 2 (the n-gram length the loop detector counts)",
                   lambda v: isinstance(v, int) and v >= 2),
    "loop_share": ("a share in (0, 1] (an output whose n-grams repeat at this share or more loops)",
                   lambda v: 0.0 < v <= 1.0),
}


def check_section(section: Any, where: str, root: yaml.Node | None, path: tuple[Any, ...]) -> dict[str, Any]:
    """The ``validity:`` mapping as written, refused with the key, the value and the allowed range when wrong."""
    if section is None:
        return {}
    if not isinstance(section, dict):
        raise ConfigError(f"{where}{key_line(root, path)}: validity must be a mapping of "
                          f"{', '.join(DEFAULTS)}.")
    check_unknown(section.keys(), set(DEFAULTS), where, root, path, "validity")
    for k, v in section.items():
        what, ok = _RANGES[k]
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not ok(v):
            raise ConfigError(f"{where}{key_line(root, path + (k,))}: validity.{k} must be {what}, got {v!r}.")
    return dict(section)


def check_cost_only(arm: dict[str, Any], speculative: bool, where: str, root: yaml.Node | None,
                    path: tuple[Any, ...]) -> None:
    """``cost_only: true`` declares an arm a cost measurement (its outputs are not the target's, e.g. forced
    acceptance): a speculative arm's, never a baseline's."""
    if "cost_only" not in arm:
        return
    value = arm["cost_only"]
    if not isinstance(value, bool):
        raise ConfigError(f"{where}{key_line(root, path + ('cost_only',))}: cost_only must be true or false, "
                          f"got {value!r}.")
    if value and not speculative:
        raise ConfigError(f"{where}{key_line(root, path + ('cost_only',))}: cost_only is for a speculative arm "
                          f"whose outputs are not the target's (a cost measurement); arm {arm.get('name')!r} does "
                          f"not speculate, so it is a baseline: remove cost_only.")


def arm_notices(raw_arms: list[dict[str, Any]], arms: list[Any]) -> list[str]:
    """What the plan says of arms whose outputs will not be the target's: a declared cost measurement, or settings
    that force or relax acceptance on an arm that is not declared so (its report will say NOT VALID)."""
    declared = {str(a.get("name")) for a in raw_arms if isinstance(a, dict) and a.get("cost_only") is True}
    out = []
    for arm in arms:
        if arm.is_baseline:
            continue
        why = engines.output_departures(arm.server_args, arm.env)
        if arm.name in declared:
            out.append(f"arm {arm.name}: cost only: its outputs are not the target's"
                       + (f" ({'; '.join(why)})" if why else "") + "; it is measured for its cost and no speedup "
                       "is claimed for it.")
        elif why:
            out.append(f"arm {arm.name}: its outputs will not be the target's ({'; '.join(why)}): the report will "
                       f"mark it NOT VALID. Declare it cost_only: true for a cost measurement, or remove the setting.")
    return out
