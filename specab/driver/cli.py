"""The command line: `python driver.py [run] --matrix steps=1,2,3`, `plan`, `status`, `export`,
`--resume`, plus the subcommands other modules register (`parse-log`, `model`, `report`, `diff`).

Exit codes: 0 all runs ok, 1 some run failed, 2 bad input (refused before any node is touched),
130 interrupted (finished runs kept; resume with --resume), 141 the reader of the output went away (`| head`).
"""
from __future__ import annotations

import argparse
import csv
import difflib
import json
import os
import sys
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, TextIO

from specab.analysis.evidence import logparse
from specab.analysis.measures import specmodel
from specab.analysis.cost import design, economics, history, search as searchdesign
from specab.analysis.render import provenance, report
from specab.config import correctness, instances
from specab.config.fingerprint import fingerprint, fingerprint_doc
from specab.config.inventory import load_inventory
from specab.config.matrix import MatrixError
from specab.config.plan import make_plan
from specab.config.yamlfile import ConfigError
from specab.driver import design_inputs, fleet, preflight, session
from specab.driver.lease import lease_states
from specab.driver.options import (EXIT_BROKEN_PIPE, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, ExperimentError, Options,
                                   prepare, search_blocks)
from specab.driver.remote import status_all
from specab.driver.render import render_arm
from specab.knowntruth import build as kt_build
from specab.results import store as st
from specab.results.locate import NotFound, default_runs_dir, locate
from specab.vocab import engines
from specab.vocab.contract import redact_env

COMMON_FORMS = """common forms (options go after the subcommand; `driver.py COMMAND --help` lists them):
  driver.py                                        run experiments/default.yml on the simulated node
  driver.py --matrix steps=1,2,3 --repeats 3       a matrix of EAGLE-3 arms, 3 interleaved blocks
  driver.py -e experiments/mine.yml -i inventory/mine.yml
  driver.py plan --matrix steps=1,2 --matrix topk=1,4  the plan and each launch script; touches nothing
  driver.py --resume EXPERIMENT_ID [--retry-failed] run what an interrupted experiment has not run
  driver.py status                                 GPUs, our servers and the node lease on every host
  driver.py report EXPERIMENT_ID | diff A B | export EXPERIMENT_ID -o results.csv --format csv
"""
MAX_RUNS = 100           # a plan above it is refused unless --max-runs says so: a typo like steps=1..50 costs hours
CONTRIBUTED = (logparse, specmodel, report, provenance, kt_build)   # each registers its subcommand


def _add_experiment_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("-e", "--experiment", metavar="FILE",
                   help="experiment file (default: experiments/default.yml)")
    p.add_argument("-i", "--inventory", metavar="FILE",
                   help="inventory (default: inventory/local.yml, the embedded simulated node; for an engine: vllm "
                        "experiment inventory/vllm-cpu.yml, a real vLLM on this CPU)")
    # an option's default is Options' (driver/options.py): an option not given is not in the namespace
    p.add_argument("--matrix", action="append", default=argparse.SUPPRESS, metavar="KEY=VALUES",
                   help="steps=1,2,3 | topk=1,4 | draft_tokens=4,8 | <server_arg>=a,b | env.NAME=a,b | "
                        "ranges 1..4; repeat the option for a product")
    p.add_argument("--repeats", type=int, default=argparse.SUPPRESS,
                   help=f"blocks: every arm runs once per block (default {Options.repeats})")
    p.add_argument("--max-runs", type=int, default=MAX_RUNS, metavar="N",
                   help=f"refuse a plan of more than N runs (default {MAX_RUNS}; each run restarts a server)")
    p.add_argument("--seed", type=int, default=argparse.SUPPRESS,
                   help=f"seed of the per-block random order (default {Options.seed})")
    p.add_argument("--order", choices=("interleaved", "blocked"), default=argparse.SUPPRESS,
                   help="interleaved (default): every block in a seeded random order; blocked: all repeats "
                        "of one arm, then the next (for comparison only)")
    p.add_argument("--skip-invalid", action="store_true",
                   help="run the valid matrix combinations and skip the refused ones (default: refuse all)")
    p.add_argument("--slo", action="append", default=[], metavar="TERM:pQ=TARGET",
                   help="a latency target over the experiment's slo: (repeatable): ttft_ms, tpot_ms, itl_ms (per "
                        "token) or e2e_s at a percentile, e.g. --slo ttft_ms:p95=200 --slo tpot_ms:p95=10")
    p.add_argument("--search", metavar="AXIS[=LO..HI]",
                   help="find each arm's highest load that meets the SLO: request_rate (default 1..32 req/s) or "
                        "concurrency (1..64 in flight); block 1 doubles the load from LO to HI, each later block "
                        "brackets every configuration again, narrower (--repeats: the bracketed blocks wanted, "
                        "--max-repeats: the most blocks; docs/analysis.md, SLO and capacity)")
    p.add_argument("--search-tol", metavar="PCT", type=_percent,
                   help="with --search: the tolerance the bracket narrows to, the grid's step (default 10%%)")
    p.add_argument("--gpu-hour-usd", type=float, metavar="USD",
                   help="price of one GPU-hour: the report gives the cost per million output tokens at the SLO")
    p.add_argument("--correctness", action="store_true",
                   help="after the measured blocks, run each speculative arm and its baseline once more in the "
                        "engine's deterministic mode (bench.correctness_requests requests each, not measured): any "
                        "difference of their outputs is an engine bug (docs/analysis.md, Output validity)")


def _add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs-dir", metavar="DIR", help="where experiment directories go (default: <repo>/runs)")
    p.add_argument("-v", "--verbose", action="store_true", help="stream the Ansible events")
    p.add_argument("--resume", metavar="EXPERIMENT_ID",
                   help="run only the missing runs of an experiment, in the planned order")
    p.add_argument("--retry-failed", action="store_true", help="with --resume: run failed runs again too")
    p.add_argument("--require-valid", action="store_true",
                   help="exit 3 when a speculative arm's outputs are not its baseline's (the report's Output "
                        "validity: NOT VALID; an arm declared cost_only is exempt), or differ in the deterministic "
                        "pass (--correctness: BUG)")
    p.add_argument("--force-changed", action="store_true",
                   help="with --resume: go on although the experiment's fingerprint changed (the report marks "
                        "the runs of each fingerprint)")
    p.add_argument("--target-ci", metavar="PCT", type=_percent,
                   help="add blocks until every speedup's 95%% CI half-width is within PCT (e.g. 2%%); by default "
                        "the design by cost chooses each block's requests per run and when to stop (--design)")
    p.add_argument("--max-repeats", type=int, help="upper bound on blocks with --target-ci (default: --repeats) or "
                                                   "--search (default: --repeats + 3)")
    _add_design_option(p)
    p.add_argument("--run-timeout", type=int, metavar="S", help="wall-clock limit of one run (its playbook, or its wait on the node's queue)")
    p.add_argument("--executor", choices=("auto", "queue", "per-run"), default=argparse.SUPPRESS,
                   help="how runs reach the node: queue = the node's sequencer runs queued runs back to back "
                        "(no Ansible between two runs; the default for one host and for each host of a fleet); "
                        "per-run = one arm.yml per run (the default for a multi-node server)")
    p.add_argument("--fleet", action="store_true",
                   help="every host of gpu_nodes runs its own whole blocks at the same time (block b on host "
                        "(b-1) mod hosts); the host is a blocking factor in the statistics (docs/scale.md)")


def _add_design_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--design", choices=("cost", "sequential"), default=argparse.SUPPRESS,
                   help="with --target-ci: cost (default) = one block at a time, the design by cost choosing each "
                        "block's requests per run and when to stop for the fewest GPU-minutes (docs/statistics.md); "
                        "sequential = the sequential rule: --repeats blocks at the experiment's requests per run, then one "
                        "more while the interval is wider than the target")
    p.add_argument("--max-requests", type=int, default=argparse.SUPPRESS, metavar="N",
                   help=f"with --target-ci and the design by cost: the most measured requests per run it may choose "
                        f"(default {Options.max_requests}; the experiment's bench.num_requests is always allowed)")


def _percent(text: str) -> float:
    t = text.strip()
    try:
        v = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a percentage like 2% or a fraction like 0.02") from None
    if not 0 < v < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be between 0% and 100%")
    return v


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="driver.py",
        description="specab: controlled A/B experiments for speculative decoding. Without a subcommand, "
                    "runs an experiment (the same as `run`).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=COMMON_FORMS)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    run = sub.add_parser("run", help="run an experiment (default)")
    _add_experiment_options(run)
    _add_run_options(run)
    run.set_defaults(func=cmd_run)
    plan = sub.add_parser("plan", help="print the plan and each arm's launch script and env file; touches nothing")
    _add_experiment_options(plan)
    plan.add_argument("--format", choices=("text", "json"), default="text")
    plan.add_argument("--target-ci", metavar="PCT", type=_percent,
                      help="also print the design by cost for this 95%% CI half-width of the speedup (e.g. 2%%) and "
                           "its expected GPU-minutes")
    plan.add_argument("--max-repeats", type=int, help="with --target-ci: the cap of blocks `run` would use")
    plan.add_argument("--fleet", action="store_true",
                      help="show which host of gpu_nodes each block runs on with `run --fleet`")
    _add_design_option(plan)
    plan.add_argument("--runs-dir", metavar="DIR",
                      help="with --target-ci: the runs directory whose history/<host>.jsonl gives the prior noise "
                           "(default: <repo>/runs)")
    plan.set_defaults(func=cmd_plan)
    status = sub.add_parser("status", help="GPUs, our servers and who holds the node lease, on every inventory "
                                           "host (parallel)")
    status.add_argument("-i", "--inventory", metavar="FILE")
    status.add_argument("--format", choices=("text", "json"), default="text")
    status.set_defaults(func=cmd_status)
    export = sub.add_parser("export", help="export an experiment's results")
    export.add_argument("experiment", help="experiment id (under --runs-dir) or directory")
    export.add_argument("--format", choices=("csv", "json"), default="json")
    export.add_argument("--table", choices=("requests", "runs", "arms", "plan", "phases", "gpu_samples",
                                                 "phase_metrics"),
                        default=None, help="one table (csv default: requests; json: that table alone as a "
                                           "list of rows instead of every table)")
    export.add_argument("--runs-dir", metavar="DIR")
    export.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    export.set_defaults(func=cmd_export)
    for mod in CONTRIBUTED:
        mod.register(sub)
    return parser


def _commands(parser: argparse.ArgumentParser) -> list[str]:
    """The parser's subcommands."""
    return next((list(a.choices) for a in parser._actions if isinstance(a, argparse._SubParsersAction)), [])


def _normalise_argv(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """`driver.py --matrix ...` means `driver.py run --matrix ...`."""
    if argv and argv[0] in ("-h", "--help"):
        return argv
    if not argv or argv[0] not in _commands(parser):
        return ["run", *argv]
    return argv


def usage_error(argv: list[str], parser: argparse.ArgumentParser) -> str | None:
    """A hint for the two common slips argparse only calls "unrecognized arguments": a misspelt subcommand
    (`driver.py rnu`) and a subcommand after its options (`driver.py --matrix steps=2 plan`)."""
    choices = _commands(parser)
    if not argv or argv[0] in choices or argv[0] in ("-h", "--help"):
        return None
    if not argv[0].startswith("-"):
        close = difflib.get_close_matches(argv[0], choices, n=1)
        hint = f" Did you mean `driver.py {close[0]}`?" if close else ""
        return (f"unknown command '{argv[0]}'.{hint} Commands: {', '.join(choices)} "
                f"(none: run an experiment, e.g. `driver.py --matrix steps=1,2`).")
    later = [a for i, a in enumerate(argv[1:], 1) if a in choices and a != "run" and not argv[i - 1].startswith("-")]
    if later:
        cmd = later[0]
        rest = [a for a in argv if a is not cmd]
        return (f"'{cmd}' is a command: it goes first, before its options: "
                f"`driver.py {cmd} {' '.join(rest)}`.")
    return None


# the command line's name of an Options field, where it differs
OPTION_NAMES = {"experiment_file": "experiment", "inventory_file": "inventory", "run_timeout_s": "run_timeout"}


def _options(args: argparse.Namespace, argv: list[str]) -> Options:
    """The command's options, read once into the typed record: what its command line gave, Options' defaults for
    the rest (`plan` refuses no plan for its size: it only shows it)."""
    given = {f.name: getattr(args, OPTION_NAMES.get(f.name, f.name)) for f in fields(Options)
             if hasattr(args, OPTION_NAMES.get(f.name, f.name))}
    return Options(**{**given, "max_runs": None if args.command == "plan" else given.get("max_runs"), "argv": argv})


# --------------------------------------------------------------------------- commands

def cmd_run(args: argparse.Namespace, out: TextIO) -> int:
    opts = _options(args, args._argv)
    if args.resume:
        if {"matrix", "repeats", "seed", "order"} & set(vars(args)):
            raise ConfigError("--resume continues the recorded plan: --matrix, --repeats, --seed and --order "
                              "come from the experiment's store and cannot be changed.")
        code, exp_dir = session.resume(args.resume, opts, out)
    else:
        code, exp_dir = session.start(opts, out)
    if args.require_valid and code == EXIT_OK:
        return session.require_valid(exp_dir, out)
    return code


def cmd_plan(args: argparse.Namespace, out: TextIO) -> int:
    opts = _options(args, args._argv)
    prepared = prepare(opts)
    host = prepared.inventory.hosts[0]
    # what the run will hash (the logical arms, before the engine's spelling): the key of the node's history
    exp_fp = fingerprint(fingerprint_doc(prepared.experiment, prepared.arms))
    # the spelling of each engine build the arms run on, when its flags are cached (plan touches no node)
    builds = preflight.builds_of(prepared.arms, host)
    cached = {b.name: preflight.cached_engine_flags(host, b) for b in builds}
    # what `run` refuses of the arms' arguments on a build whose flags are known, `plan` refuses alike
    preflight.refuse_flags([p for ef in cached.values() if ef
                            for p in preflight.unknown_flags(prepared.arms, ef, prepared.experiment.engine)])
    prepared = session.spelled(prepared, [ef for ef in cached.values() if ef])
    described = [preflight.describe_engine(cached[b.name], b) for b in builds]
    # with --target-ci the runs `run` starts with and those it is expected to add, in the design's own words
    burned = sum(r.burn_in for r in prepared.plan)
    det_names = {a.name for a in prepared.det_arms}
    passed = sum(r.arm in det_names for r in prepared.plan)
    runs, later, headline = list(prepared.plan), [], (f"{len(prepared.arms)} arms x {opts.repeats} blocks"
                                                      + (f" + {burned} burn-in" if burned else "")
                                                      + (f" + {passed} deterministic-pass runs" if passed else "")
                                                      + f" = {len(prepared.plan)} runs")
    cost_lines: list[str] = []
    runs_dir = Path(opts.runs_dir) if opts.runs_dir else default_runs_dir()
    inputs = design_inputs.design_inputs(prepared.experiment, prepared.arms, host, runs_dir, exp_fp) \
        if opts.target_ci is not None or burned or det_names or prepared.server.per_instance else None
    if opts.target_ci is not None and inputs is not None:
        first = session.first_block(prepared, opts, inputs)
        cost_lines, est = _cost_plan(prepared, opts, inputs, first)
        runs, later, headline = _target_ci_runs(prepared, opts, first, est)
    if prepared.search is not None:
        cost_lines, headline = _search_plan(prepared, opts, host, exp_fp)
    burn = _burn_in_plan(prepared, inputs, runs)
    det = _pass_plan(prepared, opts, inputs, [r for r, _ in later] or runs, list(cached.values()))
    later += [(r, "after the design's last block") for r in det["planned"] if opts.target_ci is not None]
    if args.format == "json":
        arms = []
        for arm in prepared.all_arms:
            r = render_arm(_display_arm(arm), host, experiment_engine=prepared.experiment.raw.get("engine"))
            arms.append({**arm.to_json(), "launch_sh": r.launch_sh, "env_file": r.env_file})
        json.dump({"engine": "; ".join(described), "seed": opts.seed, "order": opts.order, "repeats": opts.repeats, "notices": prepared.notices,
                   "hosts": [h.name for h in prepared.inventory.hosts],
                   "plan": [{**r.to_json(), **({"when": when} if opts.target_ci is not None else {})}
                            for r, when in [(r, "now") for r in runs] + later],
                   "design": cost_lines, "burn_in": burn, "instances": _instance_lines(prepared, inputs),
                   "deterministic_pass": {k: v for k, v in det.items() if k != "planned"}, "arms": arms}, out, indent=2)
        out.write("\n")
        return 0
    for n in prepared.notices:
        print(f"notice: {n}", file=out)
    if cost_lines:
        for line in cost_lines:
            print(line, file=out)
        print(file=out)
    print(f"experiment {prepared.experiment.name} ({prepared.experiment.path}), inventory "
          f"{prepared.inventory.path} (hosts: {', '.join(h.name for h in prepared.inventory.hosts)})", file=out)
    print(f"{headline}, order {opts.order}, seed {opts.seed}", file=out)
    for line in ([burn["line"]] if burn["runs"] else []) + det["lines"] + _instance_lines(prepared, inputs):
        print(line, file=out)
    print("\n".join(described) + "\n", file=out)
    _print_runs(prepared, opts, runs, later, det, out)
    _print_arms(prepared, host, out)
    return 0


def _print_runs(prepared: Any, opts: Options, runs: list[Any], later: list[tuple[Any, str]], det: dict[str, Any],
                out: TextIO) -> None:
    """The plan's run table: every run (with --fleet its host), or with --target-ci the runs `run` starts with and
    those the design is expected to add, with their measured requests; burn-in and deterministic-pass runs marked."""
    hosts = [h.name for h in prepared.inventory.hosts]
    host_of = {r.seq: h for h, rs in fleet.assign_blocks(prepared.plan, hosts).items() for r in rs} \
        if opts.fleet else {}
    mark = {r.seq: BURN_IN_MARK for r in prepared.plan if r.burn_in}
    mark.update({r.seq: PASS_MARK for r in det["planned"]})
    inst = prepared.server.per_instance
    if opts.target_ci is None:
        print(f"{'seq':>4}  {'block':>5}  " + (f"{'instance':>8}  " if inst else "") + "run_id"
              + ("  host (--fleet)" if host_of else ""), file=out)
        for r in prepared.plan:
            print(f"{r.seq:>4}  {r.block:>5}  " + (f"{_instance_cell(r):>8}  " if inst else "") + r.run_id
                  + (f"  {host_of[r.seq]}" if host_of else "") + (f"  {mark[r.seq]}" if r.seq in mark else ""),
                  file=out)
        return
    experiment_requests = int(prepared.experiment.bench_settings["num_requests"])
    print(f"{'seq':>4}  {'block':>5}  {'requests':>8}  {'run_id':<24}  when", file=out)
    for r, when in [(r, "now") for r in runs] + later:
        m = "?" if when.startswith("if") and opts.design == "cost" else \
            str(r.num_requests if r.num_requests is not None else experiment_requests)
        m = str(det["requests_per_run"]) if mark.get(r.seq) == PASS_MARK else m
        print(f"{r.seq:>4}  {r.block:>5}  {m:>8}  {r.run_id:<24}  {when}"
              + (f", {BURN_IN_MARK}" if r.burn_in else ""), file=out)


def _print_arms(prepared: Any, host: Any, out: TextIO) -> None:
    """Every arm's launch script and env file as the roles deploy them, the deterministic pass's arms too."""
    for arm in prepared.all_arms:
        rendered = render_arm(_display_arm(arm), host, run_id=None,
                              experiment_engine=prepared.experiment.raw.get("engine"))
        kind = "baseline" if arm.is_baseline else f"compared with {arm.baseline}"
        if arm.deterministic_of is not None:
            kind = f"the deterministic pass of {arm.deterministic_of}, " + kind
        if arm.engine is not None:
            kind += f", engine build {arm.engine}"
        print(f"\n=== arm {arm.name} ({kind}) on {host.name} ===", file=out)
        print("--- launch.sh ---", file=out)
        print(rendered.launch_sh, file=out)
        print("--- nccl.env (mode 0600) ---", file=out)
        print(rendered.env_file, file=out)


PASS_MARK = "deterministic pass: not measured"


def _pass_plan(prepared: Any, opts: Options, inputs: design_inputs.DesignInputs | None, before: list[Any],
               cached: list[preflight.EngineFlags | None]) -> dict[str, Any]:
    """The deterministic pass (--correctness) as `run` plans it: its runs (the plan's; with --target-ci one block
    after `before`, the blocks the design is expected to add), their expected GPU-minutes at the run cost `plan
    --target-ci` uses (the node's history, else the simulator profile; None where neither is known), and the plan's
    lines saying so, with what a cached flag set already shows of the build's deterministic mode."""
    names = [a.name for a in prepared.det_arms]
    planned = [r for r in prepared.plan if r.arm in names] or \
        correctness.plan_block(names, before, opts.seed, opts.order)
    n = correctness.requests_per_run(prepared.experiment)
    out: dict[str, Any] = {"arms": names, "runs": len(planned), "requests_per_run": n, "gpu_minutes": None,
                           "cost_source": None, "lines": [], "planned": planned}
    if not planned:
        return out
    cost = inputs.cost if inputs is not None else None
    if cost is not None:
        out["gpu_minutes"] = len(planned) * cost.gpu_s(n) / 60.0
        out["cost_source"] = cost.source
    gpu = (f", expected {out['gpu_minutes']:.1f} GPU-minutes (run cost of {cost.source}; the mode itself decodes "
           f"slower, ~18 % measured on SGLang 0.5.17)" if cost is not None
           else ", GPU-minutes not known before a run on this node")
    when = "after the design's last block" if opts.target_ci is not None else "after the measured blocks"
    out["lines"].append(f"deterministic pass (--correctness): {len(planned)} runs of {n} requests in the engine's "
                        f"deterministic mode, {when}: not measured; each speculative arm's outputs against its "
                        f"baseline's, where any difference is an engine bug{gpu}")
    for ef in cached:
        why = engines.sglang_deterministic_missing(ef.flags) \
            if ef is not None and ef.kind != engines.VLLM else None
        if why:
            out["lines"].append(f"notice: --correctness: the cached flag set of {ef.label} on {ef.host}: {why}; "
                                f"`run --correctness` refuses it unless the build changed")
    return out


BURN_IN_MARK = "burn-in: not measured"


def _burn_in_plan(prepared: Any, inputs: design_inputs.DesignInputs | None, runs: list[Any]
                  ) -> dict[str, Any]:
    """The burn-in runs of the plan (design.burn_in) and what they are expected to cost: their count, GPU-minutes at
    the run cost `plan --target-ci` uses (the node's history, else the simulator profile; None where neither is
    known) and the plan's line saying so."""
    burned = [r for r in runs if r.burn_in]
    out: dict[str, Any] = {"per_host": prepared.experiment.burn_in, "runs": len(burned), "gpu_minutes": None,
                           "cost_source": None, "line": ""}
    if not burned:
        return out
    cost = inputs.cost if inputs is not None else None
    if cost is not None:
        m = int(prepared.experiment.bench_settings["num_requests"])
        out["gpu_minutes"] = sum(cost.gpu_s(r.num_requests or m) for r in burned) / 60.0
        out["cost_source"] = cost.source
    before = "each host's first block" if len({r.block for r in burned}) > 1 else "block 1"
    gpu = (f", expected {out['gpu_minutes']:.1f} GPU-minutes (run cost of {cost.source})" if cost is not None
           else ", GPU-minutes not known before a run on this node")
    out["line"] = (f"burn-in (design.burn_in: {prepared.experiment.burn_in}): {len(burned)} unmeasured server "
                   f"start(s) and benchmark(s) before {before}, stored and not analysed{gpu}")
    return out


def _instance_cell(r: Any) -> str:
    """The plan table's instance of a run: `<first seq>.<position>`, or - for a run with a server of its own."""
    return "-" if r.instance is None else f"{r.instance}.{r.instance_pos}"


def _instance_lines(prepared: Any, inputs: design_inputs.DesignInputs | None) -> list[str]:
    """With one server per instance (docs/decisions/0011): the server starts the plan saves and their GPU-minutes at
    the node's run cost (`inputs`: its history of this fingerprint, else its simulator profile; a real node without
    history: not estimated)."""
    if not prepared.server.per_instance:
        return []
    n, continued = instances.describe(prepared.plan)
    cost = inputs.cost if inputs is not None else None
    saved = (f"{economics.instance_saving_s(cost, continued) / 60:.1f} GPU-minutes saved at the run cost of "
             f"{cost.source} (load {cost.load_s:.1f} s and a stop per start)" if cost is not None else
             f"the GPU-minutes saved are not estimated: no run cost is known for {prepared.inventory.hosts[0].name} "
             f"(no history of this experiment, not a simulated node)")
    return [f"one server per instance: {n} instances, {continued} of {len(prepared.plan)} runs continue their "
            f"instance's server ({continued} server starts saved): {saved}"]


def _cost_plan(prepared: Any, opts: Options, inputs: design_inputs.DesignInputs, first: economics.FirstBlock
               ) -> tuple[list[str], economics.PlanEstimate | None]:
    """What `run --target-ci` will do and its expected GPU-minutes, before anything runs (docs/statistics.md,
    "Design by cost"): the prior noise and run cost from the node's history, else the simulator profile; `first`:
    the design by cost's first block, the one `run` starts with. The estimate is None where no run cost is known."""
    host = prepared.inventory.hosts[0]
    target, cap = opts.target_ci, opts.max_repeats or opts.repeats
    requests = int(prepared.experiment.bench_settings["num_requests"])
    if inputs.cost is None:
        known = (f"its history has the noise ({inputs.prior.source}) but no measured run cost" if inputs.prior else
                 "no earlier experiment with this fingerprint is in its history")
        what = ("the design by cost: a first block of the experiment's "
                f"{requests} requests per run, then after every block the design chooses the next block's requests "
                "per run from the run cost and noise this experiment measured, and whether to stop"
                if opts.design == "cost" else
                f"the sequential design: {opts.repeats} blocks, then one more while the interval is wider")
        return [f"--target-ci {target:.1%}: no cost estimate for {host.name}: it is not a simulated node and {known}.",
                f"what `driver.py run --target-ci` will do: {what}, within --max-repeats {cap}."], None
    comps = inputs.prior or design.Components(design.DEFAULT_BETWEEN, 0.0, design.DEFAULT_BETWEEN_DF, 0.0,
                                              source="the default between-instance variance")
    est = economics.plan_estimate(inputs.cost, comps, target, arms=len(prepared.arms), requests=requests,
                                  max_blocks=cap, chosen=opts.design, measured_cost=inputs.cost_measured,
                                  max_requests=opts.max_requests, first=first, repeats=opts.repeats,
                                  min_requests=prepared.min_requests_per_run)
    return est.lines(target), est


def _search_plan(prepared: Any, opts: Options, host: Any, exp_fp: str) -> tuple[list[str], str]:
    """What `run --search` will do: its ladder, the probes it is expected to add, their expected GPU-minutes (the
    node's history or the simulator profile gives the run cost), and the plan's headline."""
    runs_dir = Path(opts.runs_dir) if opts.runs_dir else default_runs_dir()
    inputs = design_inputs.design_inputs(prepared.experiment, prepared.arms, host, runs_dir, exp_fp)
    least, most = search_blocks(opts)
    loads = prepared.search.ladder()
    arms_per_load = len(prepared.arms) // max(1, len(loads))
    lines = searchdesign.plan_lines(prepared.search, prepared.slo, families=arms_per_load,
                                    arms=arms_per_load, requests=int(prepared.experiment.bench_settings["num_requests"]),
                                    min_blocks=least, max_blocks=most, cost=inputs.cost)
    return lines, (f"--search: block 1 now ({len(prepared.plan)} runs: {len(loads)} loads x {arms_per_load} arms), "
                   f"then a block at a time until every configuration's capacity is bracketed")


def _target_ci_runs(prepared: Any, opts: Options, first: economics.FirstBlock, est: economics.PlanEstimate | None
                    ) -> tuple[list[Any], list[tuple[Any, str]], str]:
    """The runs `run --target-ci` starts with (session.first_runs: by cost one block at the first block's requests,
    sequential the --repeats blocks), the blocks it is expected to add after them (to the chosen design's planned
    restarts per arm, at its requests per run; with no estimate, every block up to --max-repeats, marked as added
    only if the design asks), each with its `when`, and the plan's headline in the same words."""
    arms = [a.name for a in prepared.arms]
    cap = opts.max_repeats or opts.repeats
    now = session.first_runs(prepared, opts, first)
    started = max(r.block for r in now)
    expected = min(max(est.expected.blocks, started), cap) if est is not None else cap
    who = "the design by cost" if opts.design == "cost" else "the sequential design"
    m_later = est.expected.requests if est is not None and opts.design == "cost" else None
    later: list[tuple[Any, str]] = []
    if expected > started:
        added = make_plan(arms, expected - started, opts.seed, opts.order, first_block=started + 1,
                          first_seq=len(now) + 1, num_requests=m_later, groups=prepared.groups)
        when = (f"expected ({who} decides after each block)" if est is not None
                else f"if {who} asks for it after the block before")
        later = [(r, when) for r in added]
    m_now = {r.num_requests for r in now}.pop() or int(prepared.experiment.bench_settings["num_requests"])
    burned = sum(r.burn_in for r in now)
    blocks_now = "block 1" if started == 1 else f"blocks 1-{started}"
    after = (f"{who} expects {expected} blocks = {expected * len(arms)} runs" if est is not None
             else f"no estimate of the blocks {who} adds")
    headline = (f"{len(arms)} arms: {blocks_now} now ({len(now) - burned} runs of {m_now} measured requests"
                f"{f', after {burned} burn-in runs' if burned else ''}), {after}, at most "
                f"--max-repeats {cap} blocks = {cap * len(arms)} runs")
    return now, later, headline


def _display_arm(arm: Any) -> Any:
    """The arm with secret values redacted, for printing."""
    return replace(arm, env=redact_env(arm.env), server_args=redact_env(arm.server_args),
                   node_args=None if arm.node_args is None else redact_env(arm.node_args))


def cmd_status(args: argparse.Namespace, out: TextIO) -> int:
    from rich.console import Console
    from rich.table import Table

    inv = load_inventory(args.inventory)
    rows = status_all(inv.hosts)
    leases = lease_states(inv.hosts)
    if args.format == "json":
        json.dump([{"host": r.host, "ok": r.ok, "error": r.error, "server_running": r.server_running,
                    "server": r.server, "gpus": [g.__dict__ for g in r.gpus],
                    "lease": {"holder": lz.holder, "stale": lz.stale, "idle_s": lz.idle_s, "error": lz.error}}
                   for r, lz in zip(rows, leases)], out, indent=2)
        out.write("\n")
        return 0 if all(r.ok for r in rows) else 1
    t = Table(title=f"specab status ({inv.path})")
    for col in ("host", "GPU", "memory used / total (MiB)", "compute processes", "our server", "arm / run"):
        t.add_column(col)
    for r in rows:
        if not r.ok:
            t.add_row(r.host, "-", "-", "-", "unreachable", r.error or "")
            continue
        srv, arm = "none", ""
        if r.server:
            srv = f"running (pid {r.server.get('pid')}, port {r.server.get('port')})" if r.server_running \
                else "not running (stale server.json)"
            arm = f"{r.server.get('arm', '?')} / {r.server.get('run_id', '?')}"
        for i, g in enumerate(r.gpus or [None]):
            if g is None:
                t.add_row(r.host, "-", "-", "-", srv, arm)
                continue
            t.add_row(r.host if i == 0 else "", g.index, f"{g.memory_used_mib} / {g.memory_total_mib}",
                      "; ".join(g.processes) or "none", srv if i == 0 else "", arm if i == 0 else "")
    console = Console(file=out, width=160, highlight=False)
    console.print(t)
    for lz in leases:          # one experiment per node: who holds each node, or that it is free
        console.print(lz.text(), markup=False, soft_wrap=True)
    return 0 if all(r.ok for r in rows) else 1


def cmd_export(args: argparse.Namespace, out: TextIO) -> int:
    exp_dir = locate(args.experiment, args.runs_dir)
    with st.Store.open(exp_dir) as s:
        dest: TextIO = open(args.output, "w", newline="") if args.output else out
        try:
            tables = {"requests": lambda: _request_rows(s), "runs": s.runs, "arms": s.arms, "plan": s.plan,
                      "phases": s.phases, "gpu_samples": s.gpu_samples, "phase_metrics": lambda: _phase_metric_rows(s)}
            if args.format == "json" and args.table:          # one table, as a JSON list of rows
                json.dump(tables[args.table](), dest, indent=1, default=str)
                dest.write("\n")
            elif args.format == "json":
                json.dump({"experiment": s.experiment(), "arms": s.arms(), "plan": s.plan(), "runs": s.runs(),
                           "phases": s.phases(), "requests": s.requests(include_warmup=True),
                           "gpu_samples": s.gpu_samples(), "manifests": s.manifests(),
                           "env_checks": s.env_checks(), "phase_metrics": _phase_metric_rows(s)},
                          dest, indent=1, default=str)
                dest.write("\n")
            else:
                rows = tables[args.table or "requests"]()
                if rows:
                    w = csv.DictWriter(dest, fieldnames=list(rows[0].keys()))
                    w.writeheader()
                    for r in rows:
                        w.writerow({k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in r.items()})
        finally:
            if args.output:
                dest.close()
    return 0


def _phase_metric_rows(s: st.Store) -> list[dict[str, Any]]:
    """One row per run with phase_metrics.json (docs/results.md): its /metrics deltas, flattened."""
    runs = {r["seq"]: r for r in s.runs()}
    out = []
    for seq, pm in sorted(s.phase_metrics().items()):
        r = runs.get(seq, {})
        row: dict[str, Any] = {"seq": seq, "run_id": r.get("run_id"), "arm": r.get("arm"), "block": r.get("block"),
                               "available": pm.get("available"), "reason": pm.get("reason"),
                               "window_s": pm.get("window_s"), "spec_verify_calls": pm.get("spec_verify_calls"),
                               "generation_tokens": pm.get("generation_tokens")}
        row.update({f"forward_s.{cat}": (pm.get("forward_s") or {}).get(cat)
                    for cat in ("eagle_draft", "eagle_draft_extend", "target_verify", "decode", "extend")})
        row.update({f"graph_passes.{mode}": (pm.get("graph_passes") or {}).get(mode)
                    for mode in ("decode_cuda_graph", "decode_none")})
        out.append(row)
    return out


def _request_rows(s: st.Store) -> list[dict[str, Any]]:
    runs = {r["seq"]: r for r in s.runs()}
    out = []
    for q in s.requests(include_warmup=True):
        r = runs.get(q["seq"], {})
        row = {"run_id": r.get("run_id"), "arm": r.get("arm"), "block": r.get("block"),
               "run_status": r.get("status")}
        row.update({k: v for k, v in q.items() if k not in ("chunk_t_s", "chunk_tokens", "extra")})
        out.append(row)
    return out


# --------------------------------------------------------------------------- main

def main(argv: list[str] | None = None, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    slip = usage_error(argv, parser)
    if slip:
        parser.print_usage(sys.stderr)
        print(f"driver.py: error: {slip}", file=sys.stderr)
        return EXIT_USAGE
    args = parser.parse_args(_normalise_argv(argv, parser))
    args._argv = argv
    if not getattr(args, "func", None):
        parser.print_help(out)
        return EXIT_USAGE
    try:
        return int(args.func(args, out) or 0)
    except (ConfigError, MatrixError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        print("Nothing was started.", file=sys.stderr)
        return EXIT_USAGE
    except (ExperimentError, NotFound, st.StoreError, history.HistoryError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:     # `driver.py plan | head`: the reader has gone; nothing to say to it
        if out is sys.stdout:   # the interpreter's last flush of stdout would fail again, and say so
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except (NotADirectoryError, FileExistsError) as exc:     # --runs-dir (or a folder above it) is a file
        print(f"error: {exc.filename or exc}: a file stands where a directory is needed. Give --runs-dir a "
              f"directory (or remove the file).", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:      # a file or directory the user named (export -o, --runs-dir ...)
        name = f"{exc.filename}: " if exc.filename else ""
        print(f"error: {name}{exc.strerror or exc}. Check that the path exists and is writable.", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
