"""What an experiment run is asked to do: options, the validated plan (``prepare``), the executor choice.

Nothing here touches a node: ``prepare`` validates the experiment file, the inventory, the matrix and every
arm against the engine's rules and makes the plan.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

from specab.config import armchecks, correctness, defaults, instances, search as searchcfg, slo as slocfg, validity
from specab.config.inventory import Host, Inventory, default_inventory, load_inventory
from specab.config.matrix import Axis, build_arms, parse_matrix
from specab.config.plan import Order, PlannedRun, make_plan
from specab.config.spec import ArmSpec, ExperimentSpec, load_experiment
from specab.config.yamlfile import ConfigError
from specab.driver import preflight

EXIT_OK, EXIT_FAILED_RUNS, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
# --require-valid: every run ended ok, but a speculative arm's outputs are not its baseline's
EXIT_NOT_VALID = 3
# The reader of our output went away (`driver.py plan | head`): the shell's status of a process SIGPIPE ended
# (128 + 13), said without a word, as `cat` and `grep` end there.
EXIT_BROKEN_PIPE = 141

Executor = Literal["auto", "queue", "per-run"]
Design = Literal["cost", "sequential"]


class ExperimentError(Exception):
    """The experiment cannot start or continue (what, where, what to do)."""


@dataclass
class Options:
    """The driver's options, read once from its command line (cli._options) and stored with the experiment as one
    record (`to_json`: the store's experiment.options), which a resume reads back (`from_json`)."""
    experiment_file: str | None = None
    inventory_file: str | None = None
    matrix: list[str] = field(default_factory=list)
    repeats: int = 3
    seed: int = 1
    order: Order = "interleaved"
    runs_dir: str | None = None
    verbose: bool = False
    skip_invalid: bool = False
    target_ci: float | None = None          # relative half-width, e.g. 0.02
    max_repeats: int | None = None
    max_runs: int | None = None         # refuse a plan of more runs (the CLI's --max-runs, default 100)
    design: Design = "cost"                 # with --target-ci: the design by cost, or the sequential rule
    max_requests: int = 400                 # the most measured requests per run the design by cost may choose
    retry_failed: bool = False
    run_timeout_s: int | None = None
    argv: list[str] = field(default_factory=list)
    fleet: bool = False                     # independent blocks per host at once (specab/driver/fleet.py)
    executor: Executor = "auto"             # auto: the run queue on one host, per-run otherwise
    force_changed: bool = False             # --resume although the experiment's fingerprint changed
    search: str | None = None               # --search AXIS[=LO..HI]: the capacity search (config/search.py)
    search_tol: float | None = None         # --search-tol: its tolerance (default search.DEFAULT_TOL)
    slo: list[str] = field(default_factory=list)   # --slo TERM:pQ=TARGET, over the experiment's slo:
    correctness: bool = False               # the deterministic pass after the measured blocks (config/correctness.py)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "argv"}       # (the command line is stored apart)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> "Options":
        """The stored record (a key of another specab's Options left out)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in doc.items() if k in names})


@dataclass
class Prepared:
    experiment: ExperimentSpec
    inventory: Inventory
    arms: list[ArmSpec]
    notices: list[str]
    plan: list[PlannedRun]
    slo: slocfg.Slo | None = None           # the experiment's slo: with --slo over it
    search: searchcfg.Search | None = None  # --search: the capacity search (arms: block 1's probes)
    axes: list[Axis] = field(default_factory=list)      # the matrix, for the search's later probe arms
    engine_flags: list[preflight.EngineFlags] = field(default_factory=list)    # what the nodes listed (spelling)
    # probe arms a search planned after block 1 (a resume rebuilds them from the store): run like the others, not
    # part of the fingerprint, which is the experiment's and its first block's
    more_arms: list[ArmSpec] = field(default_factory=list)
    # the deterministic pass's arms (--correctness; empty without it): run after the measured blocks, never measured
    det_arms: list[ArmSpec] = field(default_factory=list)
    # one server per run or per instance (config/instances.py): the groups of arms that share a server in a block
    server: instances.ServerChoice = field(default_factory=lambda: instances.ServerChoice(instances.PER_RUN))

    @property
    def all_arms(self) -> list[ArmSpec]:
        """The measured arms, then the deterministic pass's: every arm a run of the plan may name."""
        return self.arms + self.det_arms

    @property
    def groups(self) -> dict[str, str]:
        """arm -> its group of arms that differ only in load (one server per instance); empty: one per run."""
        return self.server.groups if self.server.per_instance else {}

    @property
    def min_requests_per_run(self) -> int:
        """The fewest measured requests per run the design by cost may choose: the most requests in flight any arm's
        runs keep (bench.concurrency, per arm under a concurrency axis), since a run with fewer never reaches its
        load, and never below the design's own floor of 2."""
        base = int(self.experiment.bench_settings["concurrency"])
        return max([2, base] + [int(a.bench.get("concurrency", base)) for a in self.arms])


def prepare(opts: Options) -> Prepared:
    """Validate the experiment, inventory and matrix and make the plan. Touches nothing."""
    exp = load_experiment(opts.experiment_file)
    inv = load_inventory(opts.inventory_file or default_inventory(exp.engine))
    armset = build_arms(exp, parse_matrix(opts.matrix, exp.engine), skip_invalid=opts.skip_invalid)
    if opts.repeats < 1:
        raise ConfigError(f"--repeats must be at least 1, got {opts.repeats}.")
    if opts.max_repeats is not None and opts.max_repeats < opts.repeats:
        raise ConfigError(f"--max-repeats {opts.max_repeats} is below --repeats {opts.repeats}: --repeats blocks always "
                          f"run and --max-repeats caps the blocks --target-ci may add. Give --max-repeats >= "
                          f"{opts.repeats}, or fewer --repeats.")
    if opts.max_repeats is not None and opts.target_ci is None and opts.search is None:
        raise ConfigError(f"--max-repeats caps the blocks --target-ci adds; without --target-ci the experiment runs "
                          f"--repeats {opts.repeats} blocks. Drop --max-repeats or add --target-ci.")
    if opts.target_ci is not None and opts.order == "blocked":
        raise ConfigError("--target-ci adds interleaved blocks; it cannot be combined with --order blocked.")
    if opts.design not in ("cost", "sequential"):
        raise ConfigError(f"--design must be cost or sequential, got {opts.design!r}.")
    if opts.max_requests < 1:
        raise ConfigError(f"--max-requests must be at least 1, got {opts.max_requests}.")
    check_executor(opts.executor, inv, opts.fleet)
    host_notices = check_hosts(inv, opts.fleet)
    check_engines(armset.arms, inv)
    check_bench_vars(inv)
    axes = parse_matrix(opts.matrix, exp.engine)
    slo = slocfg.resolve(slocfg.check_section(exp.raw.get("slo"), str(exp.path), None, ("slo",)),
                         slocfg.parse_cli(opts.slo))
    search = prepare_search(opts, exp, axes, slo)
    arms = armset.arms if search is None else searchcfg.probe_arms(exp, axes, search, search.ladder())
    blocks = 1 if search else opts.repeats
    server = instances.choose(exp, arms, inv, opts.order)
    plan = make_plan([a.name for a in arms], blocks, opts.seed, opts.order, burn_in=exp.burn_in,
                     burn_in_blocks=burn_in_blocks(opts, inv), groups=server.groups if server.per_instance else None)
    det = correctness.derive(exp, armset.arms) if opts.correctness else correctness.DeterministicPass()
    if opts.target_ci is None:      # with --target-ci the pass follows the design's last block (RunContext)
        plan += correctness.plan_block(det.names, plan, opts.seed, opts.order)
    if opts.max_runs is not None and len(plan) > opts.max_runs:
        burned = sum(r.burn_in for r in plan)
        passed = len(det.arms) if det.arms and opts.target_ci is None else 0
        raise ConfigError(f"{len(arms)} arms x {blocks} blocks"
                          + (f" + {burned} burn-in" if burned else "")
                          + (f" + {passed} deterministic-pass" if passed else "") + f" = {len(plan)} runs, above --max-runs "
                          f"{opts.max_runs} (a real run costs a server start, ~1 GPU-minute on a GPU node). "
                          f"Narrow the matrix, or pass --max-runs {len(plan)} to run them all (`driver.py plan` "
                          f"shows the plan and its expected GPU-minutes first).")
    checked = check_arms(exp, armset.arms)
    return Prepared(experiment=exp, inventory=inv, arms=arms,
                    notices=exp.warnings + armset.notices + checked + host_notices
                    + preflight.bind_warnings(arms) + validity.arm_notices(exp.arms, arms)
                    + det.notices + instances.notices(exp, server, plan), plan=plan, det_arms=det.arms, slo=slo,
                    search=search, axes=axes, server=server)


def check_arms(exp: ExperimentSpec, arms: list[ArmSpec]) -> list[str]:
    """The arms' checks that the experiment alone decides (specab/config/armchecks.py); returns their notices."""
    armchecks.check_experiment(exp)
    notices = armchecks.check_models(exp, arms) + armchecks.check_queueing(exp, arms)
    armchecks.check_context(exp, arms)
    return notices


SEARCH_EXTRA_BLOCKS = 3       # a search's default cap: --repeats bracketed blocks and this many more to get them


def search_blocks(opts: Options) -> tuple[int, int]:
    """(the bracketed blocks a search wants: --repeats; the blocks it may run: --max-repeats, by default --repeats
    + SEARCH_EXTRA_BLOCKS)."""
    return opts.repeats, opts.max_repeats or opts.repeats + SEARCH_EXTRA_BLOCKS


def prepare_search(opts: Options, exp: ExperimentSpec, axes: list[Axis], slo: slocfg.Slo | None
                   ) -> searchcfg.Search | None:
    """--search checked against the experiment and the other options (ConfigError before anything runs)."""
    if opts.search is None:
        if opts.search_tol is not None:
            raise ConfigError("--search-tol is the tolerance of a capacity search: add --search request_rate (or "
                              "concurrency), or drop it.")
        return None
    search = searchcfg.check(searchcfg.parse(opts.search, opts.search_tol), slo is not None, exp, axes)
    for bad, why in ((opts.target_ci is not None, "--target-ci (the search adds its own blocks)"),
                     (opts.fleet, "--fleet (its blocks run at once; the search decides each block after the last)"),
                     (opts.order == "blocked", "--order blocked (every probe is an interleaved run)"),
                     (opts.correctness, "--correctness (run the deterministic pass as an experiment at one load)")):
        if bad:
            raise ConfigError(f"--search cannot be combined with {why}.")
    return search


# The specab_bench_* variables that are an experiment's bench.<key> defaults (roles/specab). The driver's design,
# its stored config and its fingerprint (resume, history matching) read the experiment and specab's defaults
# file, never the inventory: one set in the inventory would make the node run values none of them knows.
# specab_bench_python and specab_bench_sample_interval_s say how the node runs the client and samples the GPUs,
# not what is measured: the inventory sets them.
BENCH_KEY_VARS = {**{var: key for key, var in defaults.BENCH_DEFAULTS.items()},
                  "specab_bench_phase_timing": "phase_timing",
                  "specab_bench_correctness_requests": "correctness_requests"}


def check_bench_vars(inventory: Inventory) -> None:
    """No host of the inventory (its host vars or the vars of a group it is in) sets a bench setting."""
    problems = [f"host {host.name} sets {var} (set bench.{BENCH_KEY_VARS[var]} in the experiment file instead)"
                for host in inventory.hosts for var in sorted(host.vars) if var in BENCH_KEY_VARS]
    if problems:
        raise ConfigError(f"{inventory.path}: " + "; ".join(problems) + ". The driver's design, its stored config "
                          f"and its fingerprint read the experiment, so a bench setting in the inventory would run "
                          f"values they do not know. Remove it from the inventory and set bench.<key> in the "
                          f"experiment file (ansible-playbook playbooks/ab_test.yml, without the driver, honours it).")


def check_hosts(inventory: Inventory, fleet: bool) -> list[str]:
    """Several hosts: two that are one machine (both reached with the local connection, or at one address and SSH
    port) would start two servers on one port and one set of GPUs at once: refused. Distinct hosts without --fleet or
    a multi-node server run every run on each host at once (lockstep): said in a notice."""
    hosts = inventory.hosts
    if len(hosts) < 2:
        return []
    seen: dict[tuple[str, Any], str] = {}
    for h in hosts:
        key = ("local", None) if h.is_local else (h.address, h.port)
        if key in seen:
            how = "both reached with ansible_connection: local" if h.is_local else f"both at {h.address}:{h.port}"
            raise ConfigError(f"{inventory.path}: hosts {seen[key]} and {h.name} are one machine ({how}): each run "
                              f"would start a server on each at once, on one port and one set of GPUs. Keep one of "
                              f"them in gpu_nodes.")
        seen[key] = h.name
    if fleet or is_multinode(hosts):
        return []
    return [f"every run runs on each of the {len(hosts)} hosts of gpu_nodes at once ({', '.join(h.name for h in hosts)}:"
            f" lockstep, each host's results under <run dir>/<host>/): --fleet gives each host its own blocks instead, "
            f"an inventory of one host runs on that host alone."]


def check_engines(arms: list[ArmSpec], inventory: Inventory) -> None:
    """Every engine build an arm names (`--matrix engine=...`) is declared for every host (`specab_engines`)."""
    wanted = sorted({a.engine for a in arms if a.engine is not None})
    problems = []
    for host in inventory.hosts:
        declared = host.engine_builds
        missing = [w for w in wanted if w not in declared]
        if missing:
            have = ", ".join(declared) or "none"
            problems.append(f"host {host.name} declares no engine build {', '.join(missing)} "
                            f"(its specab_engines: {have})")
    if problems:
        raise ConfigError(f"{inventory.path}: --matrix engine: " + "; ".join(problems) + ". Declare the builds "
                          f"under specab_engines (e.g. sglang-0.5.9: {{python: /opt/sgl059/bin/python}}) or "
                          f"use the names the inventory declares.")


def burn_in_blocks(opts: Options, inventory: Inventory) -> int:
    """The blocks a burn-in goes before: the first block of every host with --fleet (each host is a node of its own
    that starts cold), else block 1."""
    return len(inventory.hosts) if opts.fleet and not is_multinode(inventory.hosts) else 1


def is_multinode(hosts: list[Host]) -> bool:
    """Whether the inventory places ONE server over all its hosts (specab_multinode: true)."""
    return any(bool(h.vars.get("specab_multinode")) for h in hosts)


def choose_executor(asked: str, multinode: bool, n_hosts: int) -> str:
    """`queue` (the node's sequencer runs the runs back to back, docs/architecture.md "Run queue") for one
    host; `per-run` (one arm.yml per run) for a multi-node server or several hosts running each run."""
    if asked == "per-run" or multinode or n_hosts != 1:
        return "per-run"
    return "queue"


def check_executor(asked: str, inventory: Inventory, fleet: bool) -> None:
    """Refuse `--executor queue` where it cannot apply (before anything runs)."""
    if asked != "queue" or (fleet and not is_multinode(inventory.hosts)):
        return
    n = len(inventory.hosts)
    if is_multinode(inventory.hosts) or n != 1:
        what = "places one server over several hosts" if is_multinode(inventory.hosts) else f"runs every run on {n} hosts"
        raise ConfigError(f"{inventory.path}: --executor queue runs the runs of one host, but this inventory {what}. "
                          f"Use --executor per-run (the default here), or --fleet for one queue per host.")
