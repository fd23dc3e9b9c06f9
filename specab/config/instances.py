"""One server across a load sweep (docs/decisions/0011-one-server-across-a-load-sweep.md): which arms share a server
start within a block, and whether the experiment may run so.

An arm's **server** is everything that decides the server it runs on: its server args, its env, its engine build and
its bench settings but the load (bench.concurrency, bench.request_rate: the matrix's bench axes). Arms with the same
server form a group; with ``design.server: per-instance`` the runs of a group in one block are one instance
(config/plan.py): one start, the loads in a seeded order, the engine's cache reset before each load after the first.
A bench setting other than the load (a dataset) keeps arms apart: its prompts would meet the previous load's cache.

Pure: reads the experiment, the arms and the inventory; touches no node.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from specab.config.inventory import Inventory
from specab.config.plan import Order
from specab.config.spec import SERVER_MODES, ArmSpec, ExperimentSpec
from specab.config.yamlfile import ConfigError
from specab.vocab import engines

# The bench conditions that are a load (the matrix's bench axes, config/matrix.py BENCH_AXES): arms that differ only
# in these share a server per instance.
LOAD_KEYS = frozenset({"concurrency", "request_rate"})
PER_RUN, PER_INSTANCE = SERVER_MODES
# design.server where the experiment does not say (docs/decisions/0011, "The default"): the measurement behind it
# is in that record.
DEFAULT_SERVER = PER_INSTANCE


def server_key(arm: ArmSpec) -> str:
    """What decides the server an arm runs on: equal keys, one server for both arms' loads."""
    bench = {k: v for k, v in arm.bench.items() if k not in LOAD_KEYS}
    return json.dumps({"server_args": arm.server_args, "env": arm.env, "engine": arm.engine, "bench": bench,
                       "phase_timing": arm.phase_timing}, sort_keys=True, default=str)


def load_groups(arms: list[ArmSpec]) -> dict[str, str]:
    """arm -> its group (the name of the group's first arm), for the groups of two or more arms that differ only in
    load; an arm alone in its group is left out (its runs start their own server)."""
    by_key: dict[str, list[str]] = {}
    for a in arms:
        by_key.setdefault(server_key(a), []).append(a.name)
    return {name: names[0] for names in by_key.values() if len(names) > 1 for name in names}


@dataclass(frozen=True)
class ServerChoice:
    """The experiment's server design: the mode it runs in, the groups it runs as instances (empty per run), why
    where it is not what the experiment or the default asked, and the plan's words."""
    mode: str
    groups: dict[str, str] = field(default_factory=dict)
    notices: list[str] = field(default_factory=list)

    @property
    def per_instance(self) -> bool:
        return self.mode == PER_INSTANCE and bool(self.groups)


def _refusal(exp: ExperimentSpec, arms: list[ArmSpec], inventory: Inventory, order: Order) -> str | None:
    """Why this experiment cannot run one server per instance, or None."""
    if order == "blocked":
        return ("--order blocked runs an arm's blocks one after another, so no block holds an arm's loads back to "
                "back; use --order interleaved (the default)")
    if any(bool(h.vars.get("specab_multinode")) for h in inventory.hosts):
        return "a server over several hosts (specab_multinode) is started and stopped by every rank per run"
    for a in arms:
        why = engines.cache_reset_refusal(exp.engine, a.env)
        if why is not None:
            return (f"the engine's cache cannot be reset between two loads: {why} (specab never sets it: an "
                    f"experiment that shares a server across loads on this engine sets it in its env)")
    return None


def choose(exp: ExperimentSpec, arms: list[ArmSpec], inventory: Inventory, order: Order) -> ServerChoice:
    """The server design of this experiment: design.server (or the default) where it can run; an explicit
    per-instance that cannot is refused (ConfigError, before anything runs), a default one falls back to per run
    with a notice. Without arms that differ only in load there is nothing to share: per run."""
    asked = exp.server
    mode = asked or DEFAULT_SERVER
    groups = load_groups(arms)
    if mode == PER_RUN or not groups:
        return ServerChoice(PER_RUN if not groups else mode)
    why = _refusal(exp, arms, inventory, order)
    if why is not None:
        if asked == PER_INSTANCE:
            raise ConfigError(f"{exp.path}: design.server: per-instance cannot run here: {why}. Remove what keeps "
                              f"it from running, or set design.server: per-run.")
        return ServerChoice(PER_RUN, notices=[f"one server per run (the default per-instance cannot run here: {why})"])
    return ServerChoice(PER_INSTANCE, groups)


def notices(exp: ExperimentSpec, choice: ServerChoice, plan: list[Any]) -> list[str]:
    """What the plan says of its servers: why a default per instance runs per run, or its instances."""
    if not choice.per_instance:
        return list(choice.notices)
    n, continued = describe(plan)
    return choice.notices + [
        f"one server per instance (design.server {exp.server or 'per-instance, the default'}): {n} instances of the "
        f"arms that differ only in load; {continued} of {len(plan)} runs continue the server an earlier load of their "
        f"block started, its cache reset before their load"]


def describe(plan: list[Any]) -> tuple[int, int]:
    """(instances, runs that continue an instance's server) of a plan: the server starts saved."""
    instances = {r.instance for r in plan if r.instance is not None}
    continued = sum(1 for r in plan if r.instance is not None and r.instance_pos > 1)
    return len(instances), continued
