"""The deterministic pass (`driver.py run --correctness`): the arms and runs it adds, pure.

In the engine's deterministic mode (SGLang's --enable-deterministic-inference, vLLM's VLLM_BATCH_INVARIANT=1;
specab/vocab/engines.py) a request's greedy output depends neither on its batch nor on speculation, so a speculative
arm whose outputs differ from its baseline's there has a bug, not numerics. The pass derives one arm from each
speculative arm that claims its baseline's outputs, and one from each of their baselines: the same arm with the mode
on, named ``<arm>-det``, marked by the matrix value ``deterministic_of: <arm>`` (how the store and the analysis tell
them apart), compared with its baseline's derived arm, ``bench.correctness_requests`` (default 4) measured requests
per run at most that many in flight, closed loop. Their runs form one block of their own after the measured blocks
(with --target-ci, after the design's last block): never in a measured block, never in the speedup statistics.

An arm whose outputs are not meant to be its baseline's (declared cost_only, forced or relaxed acceptance, another
model, tokenizer, dtype or decoding defaults: engines.output_departures / output_differences) gets no pass: a
difference there would be its settings, not a bug; the plan says so.
"""
from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field

from specab.config import defaults
from specab.config.plan import Order, PlannedRun, make_plan
from specab.config.spec import DETERMINISTIC_OF, ArmSpec, ExperimentSpec
from specab.config.yamlfile import ConfigError
from specab.vocab import engines

SUFFIX = "-det"
MAX_NAME = 64           # an arm name, as the roles require (spec.ARM_NAME)


@dataclass(frozen=True)
class DeterministicPass:
    """The arms of the deterministic pass and what the plan says of the measured arms it leaves out."""
    arms: list[ArmSpec] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    requests: int = 0

    @property
    def names(self) -> list[str]:
        return [a.name for a in self.arms]


def requests_per_run(exp: ExperimentSpec) -> int:
    """bench.correctness_requests, default roles/specab's specab_bench_correctness_requests (4)."""
    value = exp.bench.get("correctness_requests")
    return int(value if value is not None else defaults.get("specab_bench_correctness_requests"))


def det_name(name: str, taken: set[str]) -> str:
    """``<name>-det``, shortened with a hash of the name where that passes 64 characters; refused when an arm of
    the experiment already has it."""
    out = name + SUFFIX
    if len(out) > MAX_NAME:
        out = f"{name[:MAX_NAME - len(SUFFIX) - 9]}-{hashlib.sha1(name.encode()).hexdigest()[:8]}{SUFFIX}"
    if out in taken:
        raise ConfigError(f"--correctness names the deterministic-pass arm of {name} {out!r}, but the experiment "
                          f"already has an arm of that name: rename that arm, or run without --correctness.")
    return out


def _not_meant_equal(arm: ArmSpec, base: ArmSpec, cost_only: set[str]) -> list[str]:
    """Why an arm's outputs are not meant to be its baseline's (empty: they are)."""
    return ((["declared cost_only"] if arm.name in cost_only else [])
            + engines.output_departures(arm.server_args, arm.env)
            + engines.output_differences(arm.server_args, base.server_args))


def _det_arm(exp: ExperimentSpec, arm: ArmSpec, name: str, baseline: str, requests: int) -> ArmSpec:
    args, env = engines.deterministic_overlay(exp.engine)
    inflight = int(arm.bench.get("concurrency", exp.bench_settings["concurrency"]))
    return dataclasses.replace(
        arm, name=name, server_args={**arm.server_args, **args}, env={**arm.env, **env}, baseline=baseline,
        matrix={**arm.matrix, DETERMINISTIC_OF: arm.name},
        bench={**arm.bench, "num_requests": requests, "concurrency": min(inflight, requests), "request_rate": 0})


def derive(exp: ExperimentSpec, arms: list[ArmSpec]) -> DeterministicPass:
    """The deterministic pass of the measured ``arms``: every speculative arm that claims its baseline's outputs
    and each of their baselines, in the measured arms' order (baselines first)."""
    requests = requests_per_run(exp)
    cost_only = {str(a.get("name")) for a in exp.arms if a.get("cost_only") is True}
    by_name = {a.name: a for a in arms}
    checked, notices = [], []
    for arm in arms:
        if arm.is_baseline:
            continue
        why = _not_meant_equal(arm, by_name[arm.baseline], cost_only)
        if why:
            notices.append(f"arm {arm.name}: no deterministic pass (--correctness): its outputs are not meant to be "
                           f"its baseline's ({'; '.join(why)}).")
        else:
            checked.append(arm)
    bases = [by_name[b] for b in dict.fromkeys(a.baseline for a in checked)]
    taken = set(by_name)
    names: dict[str, str] = {}
    for arm in bases + checked:
        names[arm.name] = det_name(arm.name, taken)
        taken.add(names[arm.name])
    det = [_det_arm(exp, a, names[a.name], names[a.baseline], requests) for a in bases + checked]
    if not checked:
        notices.append("--correctness: no speculative arm claims its baseline's outputs, so there is no "
                       "deterministic pass to run.")
    return DeterministicPass(arms=det, notices=notices, requests=requests)


def plan_block(names: list[str], after: list[PlannedRun], seed: int, order: Order = "interleaved"
               ) -> list[PlannedRun]:
    """The pass's runs: one block after the last block of ``after`` (the plan so far), numbered on from it, the arms
    in that block's seeded order."""
    if not names:
        return []
    return make_plan(names, 1, seed, order, first_block=max((r.block for r in after), default=0) + 1,
                     first_seq=max((r.seq for r in after), default=0) + 1)
