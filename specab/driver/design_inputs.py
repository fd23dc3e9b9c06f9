"""What the design by cost starts from on a node (docs/statistics.md, "Design by cost"): the prior noise
and the expected run cost, before this experiment has measured its own.

* noise: the node's history of experiments with the same fingerprint or the same arm-baseline pairs
  (`analysis.cost.history.prior`), else, on a
  simulated node, its profile's noise (`economics.profile_components`), else none (the design starts from the
  default between-instance variance and the experiment's first block);
* run cost: the history's measured restart and request seconds (`history.run_cost`), else, on a simulated node,
  its profile at the node's time scale (`economics.profile_cost`), else none (a real node without history:
  the first block runs the experiment's requests per run, and from then on this experiment's own runs measure it).

`driver.py plan --target-ci` and `driver.py run --target-ci` take both from here, so the plan describes what the
run does. Reads only controller-side files (the history, the profile YAML); touches no node.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from specab.analysis.cost import design, economics, history
from specab.config.fingerprint import fingerprint_doc, pair_fingerprints
from specab.config.inventory import Host
from specab.config.spec import ArmSpec, ExperimentSpec
from specab.config.yamlfile import REPO_ROOT, ConfigError
from specab.vocab import engines

SIM_ENGINE = "specab.sim.launch_server"


@dataclass(frozen=True)
class DesignInputs:
    prior: design.Components | None        # the prior noise (history or profile), None: none known
    cost: design.RunCost | None            # the expected run cost (history or profile), None: none known
    cost_measured: bool = False            # the cost is the history's measurement (no dead-time guess in it)


def is_simulated(host: Host) -> bool:
    """Whether the host runs specab's simulated engine (its profile then models the node)."""
    return SIM_ENGINE in " ".join(map(str, host.vars.get("specab_engine_cmd") or []))


def simulator_profile(host: Host) -> tuple[dict[str, Any], float] | None:
    """(profile, time scale) of a simulated node (specab_node_env.SPECAB_SIM_PROFILE, SPECAB_SIM_TIME_SCALE); None
    for a real one. A profile that cannot be read is a ConfigError naming it."""
    if not is_simulated(host):
        return None
    ref = str(host.node_env.get("SPECAB_SIM_PROFILE") or "default")
    path = Path(ref) if ref.endswith((".yml", ".yaml")) else REPO_ROOT / "specab" / "sim" / "profiles" / f"{ref}.yml"
    try:
        profile = yaml.safe_load(path.read_text())
        scale = float(host.node_env.get("SPECAB_SIM_TIME_SCALE") or 1.0)
    except (OSError, yaml.YAMLError, ValueError) as exc:
        raise ConfigError(f"{host.name}: cannot read the simulator profile {ref!r} ({exc}); set "
                          f"specab_node_env.SPECAB_SIM_PROFILE to a name in specab/sim/profiles/ or a YAML path.")
    return profile, scale


def design_inputs(experiment: ExperimentSpec, arms: list[ArmSpec], host: Host, runs_dir: Path,
                  fingerprint: str) -> DesignInputs:
    """The prior noise and the expected run cost of `arms` on `host` (the first host: the history is per node)."""
    pairs = pair_fingerprints(fingerprint_doc(experiment, arms), {a.name: a.baseline for a in arms}).values()
    prior = history.prior(runs_dir, host.name, fingerprint, pairs)
    cost = history.run_cost(runs_dir, host.name, fingerprint, pairs)
    measured = cost is not None
    sim = simulator_profile(host)
    if sim is not None and (prior is None or cost is None):
        profile, scale = sim
        bench = experiment.bench_settings
        if cost is None:
            cost = design.mean_cost([economics.profile_cost(
                profile, speculative=not a.is_baseline, gpus=economics.gpus_of(a.server_args),
                output_len=int(bench["output_len"]), warmup=int(bench["warmup_requests"]), time_scale=scale)
                for a in arms])
        if prior is None:
            steps = max(engines.speculative_view(a.server_args).steps or 0 for a in arms)
            prior = economics.profile_components(profile, int(bench["output_len"]), spec_steps=steps)
    return DesignInputs(prior=prior, cost=cost, cost_measured=measured)
