"""An experiment session: start a new experiment, resume an interrupted one, conclude (summary, report).

The session validates everything before touching a node (``options.prepare``, the engine-flag preflight),
creates the experiment directory and its store, and hands the planned runs to an executor:

* ``queue`` (one host, the default): runs queued to the node's sequencer (``queue_executor``);
* ``per-run``: one ``playbooks/arm.yml`` per run (``per_run``), also for a multi-node server;
* ``--fleet``: every host runs its own blocks at once, each host through one of the two above (``fleet``).

Results are stored as they arrive (``record``); the first SIGINT/SIGTERM stops the current run's server and
keeps every finished run; ``resume`` runs exactly what is missing.
"""
from __future__ import annotations

import dataclasses
import json
import subprocess
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Callable, Protocol, TextIO

import yaml

from specab.analysis.cost import design, economics, history
from specab.analysis.evidence.model import load_store
from specab.analysis.render.report import write_report
from specab.config import correctness, search as searchcfg
from specab.config.fingerprint import changes, fingerprint, fingerprint_doc
from specab.config.plan import PlannedRun, make_plan
from specab.config.spec import ExperimentSpec
from specab.config.yamlfile import REPO_ROOT
from specab.driver import keep, nodecheck, preflight
from specab.driver.context import InterruptedRun, MoreBlocks, RunContext
from specab.driver.design_inputs import DesignInputs, design_inputs
from specab.driver.fleet import run_fleet
from specab.driver.lease import LeaseError, NodeLeases
from specab.driver.options import (EXIT_FAILED_RUNS, EXIT_INTERRUPTED, EXIT_NOT_VALID, EXIT_OK, ExperimentError,
                                   Options, Prepared, is_multinode, prepare)
from specab.driver.per_run import PerRunExecutor
from specab.driver.progress import Progress, print_summary
from specab.driver.queue_executor import QueueExecutor
from specab.driver.record import PRIVATE_DIR_MODE, check_writable
from specab.driver.signals import Interrupt
from specab.driver.systematic import STOPPED, FailFast, SystematicFailure
from specab.results import store as st
from specab.results.locate import NotFound, default_runs_dir, locate
from specab.vocab.contract import REDACTED, redact_env, redact_mapping


class Executor(Protocol):
    """Runs planned runs of one RunContext; ``loop`` returns True when interrupted."""

    stops_node_on_interrupt: bool
    # the run to record the stop in when the caller stops the node (stops_node_on_interrupt False)
    interrupted: InterruptedRun | None

    def loop(self, todo: list[PlannedRun], cancel: Any, index: int, *, more: MoreBlocks | None = None,
             on_status: Callable[[str], None] | None = None) -> bool: ...

    def abort(self) -> None: ...


def make_executor(ctx: RunContext, signal_time: Callable[[], float | None]) -> Executor:
    """The executor ``ctx`` was configured for (``RunContext.executor``: "queue" or "per-run")."""
    if ctx.executor == "queue":
        return QueueExecutor(ctx, signal_time=signal_time)
    return PerRunExecutor(ctx, signal_time=signal_time)


def execute(ctx: RunContext, todo: list[PlannedRun], adopt: tuple[str, ...] = ()) -> int:
    """Run ``todo`` (and, with --target-ci, the blocks the statistics ask for) on one host set; a resume first
    records the runs the node finished with a done status in ``adopt`` that were never recorded (``keep.adopt``)."""
    done_before = len(ctx.store.plan()) - len(todo)
    interrupted = False
    stopped: SystematicFailure | None = None
    busy: tuple[st.StoreBusy, list[str]] | None = None
    # every arm failed at start-up for one cause: stop rather than play the rest into it
    fail_fast = FailFast.for_runs({pr.arm for pr in todo})
    with Interrupt() as intr:
        executor = make_executor(ctx, signal_time=lambda: intr.at)
        more = ctx.more_blocks if ctx.opts.target_ci is not None or ctx.p.search is not None else None
        try:
            try:
                if adopt and isinstance(executor, QueueExecutor):
                    todo = keep.adopt(executor, todo, done_before, adopt)
                    done_before = len(ctx.store.plan()) - len(todo)
                if not todo and more is not None:   # a design or search stopped between blocks: its next one
                    todo = more()
                interrupted = executor.loop(list(todo), intr.event, done_before, more=more,
                                            on_status=lambda status: fail_fast.observe(ctx.store, status))
            except SystematicFailure as exc:
                stopped = exc
                executor.abort()           # the queue's sequencer would go on with the queued runs
                ctx.store.set_experiment_status(STOPPED)
            except st.StoreBusy as exc:    # nothing more can be recorded: the node stops, what it finished is kept
                executor.abort()
                busy = (exc, keep.fetch_unrecorded(executor) if isinstance(executor, QueueExecutor) else [])
            except BaseException:
                executor.abort()
                ctx.store.set_experiment_status("interrupted")
                raise
        finally:
            if interrupted and not executor.stops_node_on_interrupt:
                ctx.progress.notice("interrupted: stopping the server of the current run (stop role) ...")
                err = ctx.stop_servers(executor.interrupted)
                if err:
                    ctx.progress.notice(f"WARNING: {err} Check the node with `python driver.py status`.")
            if interrupted:
                ctx.store.set_experiment_status("interrupted")
            ctx.progress.close()
    if interrupted:
        print(f"\nInterrupted. Finished runs are kept in {ctx.exp_dir}.\n"
              f"Resume with: {resume_command(ctx.exp_id, ctx.opts)}", file=ctx.out)
        return EXIT_INTERRUPTED
    if busy is not None:
        exc, kept = busy
        print(f"\nStopped: the store could not be written. {exc}\n"
              + (f"{len(kept)} run(s) the node finished were fetched into {ctx.exp_dir} but not recorded: "
                 f"{', '.join(kept)}.\n" if kept else "")
              + f"Every run recorded before is kept. Resume once the store is free: "
              f"{resume_command(ctx.exp_id, ctx.opts)} (it records the fetched runs and runs only the missing ones).",
              file=ctx.out)
        return EXIT_FAILED_RUNS
    if stopped is not None:
        print(stopped.message(ctx.exp_id, len(ctx.store.missing()), resume_command(ctx.exp_id, ctx.opts)),
              file=ctx.out)
        return EXIT_FAILED_RUNS
    ctx.store.set_experiment_status("finished")
    return EXIT_OK


def resume_command(exp_id: str, opts: Options, *extra: str) -> str:
    """The command that runs an experiment's missing runs."""
    return " ".join(["python driver.py --resume", exp_id, *extra]
                    + (["--runs-dir", str(opts.runs_dir)] if opts.runs_dir else []))


def _run(prepared: Prepared, opts: Options, exp_id: str, exp_dir: Path, store: st.Store, todo: list[PlannedRun],
         out: TextIO, progress: Progress, total: int, adopt: tuple[str, ...] = ()) -> int:
    # a resume counts what the store's runs spent already (a run started again replaces its row, so not its own)
    progress.start(exp_id, total, done=total - len(todo),
                   spent=store.spent_gpu_seconds(rerun={pr.seq for pr in todo}))
    burned = [pr.run_id for pr in todo if pr.burn_in]
    if burned:
        progress.notice(f"burn-in (design.burn_in): {', '.join(burned)} start a server and benchmark it before "
                        f"block 1, stored and not analysed")
    if opts.fleet:     # every host of gpu_nodes runs its own blocks at once (docs/scale.md)
        return run_fleet(prepared, opts, exp_id, exp_dir, todo, out, progress, total=total,
                         make_context=RunContext, make_executor=make_executor)
    return execute(RunContext(prepared, opts, exp_id, exp_dir, store, out, progress), todo, adopt=adopt)


def _git_sha() -> str | None:
    try:
        p = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                           timeout=5)
        return p.stdout.strip() or None if p.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def _specab_version() -> str | None:
    try:
        return version("specab")
    except PackageNotFoundError:
        return None


def _new_experiment_id(runs_dir: Path, name: str) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    exp_id = f"{name}-{stamp}"
    i = 2
    while (runs_dir / exp_id).exists():
        exp_id = f"{name}-{stamp}-{i}"
        i += 1
    return exp_id


def node_leases(prepared: Prepared, exp_id: str, out: TextIO) -> NodeLeases:
    """The leases of every host the experiment uses, taken now (before anything on a node is touched);
    another live experiment on one of them refuses this one (ExperimentError: exit 2, naming the holder)."""
    leases = NodeLeases(prepared.inventory.hosts, exp_id, notice=lambda n: print(f"notice: {n}", file=out))
    try:
        leases.take()
    except LeaseError as exc:
        raise ExperimentError(str(exc)) from None
    return leases


def check_nodes(prepared: Prepared, out: TextIO) -> list[preflight.EngineFlags]:
    """Read-only checks on the nodes that would otherwise fail every run, before the first one. Returns the
    engine flag sets the nodes reported (the arms are spelled for them)."""
    def notice(n: str) -> None:
        print(f"notice: {n}", file=out)
    hosts = prepared.inventory.hosts
    # the GPUs an arm takes, the context its prompts and answers need, the node directory's room: read-only
    nodecheck.check_nodes(prepared.experiment, prepared.arms, hosts, is_multinode(hosts), notice)
    # the node's engine lists its flags (read-only, cached per node and engine version): an unknown flag is
    # refused now rather than after a model load of minutes
    checked = preflight.check_engine_flags(prepared.arms, hosts, notice=notice,
                                           expected_kind=prepared.experiment.engine)
    # --correctness: a build without a deterministic mode is refused now, not after the measured blocks (the pass's
    # arms are the measured arms' with the mode on, on the same builds)
    preflight.check_deterministic(prepared.det_arms, checked, hosts, notice=notice)
    # a port another process holds fails every run at its start; a server over several
    # hosts binds its HTTP port on the head only
    preflight.check_ports(prepared.all_arms, hosts[:1] if is_multinode(hosts) else hosts, notice=notice)
    return checked


def spelled(prepared: Prepared, checked: list[preflight.EngineFlags]) -> Prepared:
    """The arms (the deterministic pass's and a search's later probes too) in the spelling of the engine builds the
    nodes reported, which a search spells its next probes in."""
    return dataclasses.replace(prepared, arms=preflight.spell_arms(prepared.arms, checked),
                               det_arms=preflight.spell_arms(prepared.det_arms, checked),
                               more_arms=preflight.spell_arms(prepared.more_arms, checked), engine_flags=checked)


def redacted_config(exp: ExperimentSpec) -> dict[str, Any]:
    """The experiment as stored: every secret-named key (env, server args, common or per arm) redacted."""
    return redact_mapping(exp.as_extravar())


def start(opts: Options, out: TextIO, progress: Progress | None = None) -> tuple[int, Path | None]:
    """Run a new experiment. Returns (exit code, experiment dir)."""
    prepared = prepare(opts)
    for n in prepared.notices:
        print(f"notice: {n}", file=out)
    runs_dir = Path(opts.runs_dir) if opts.runs_dir else default_runs_dir()
    check_writable(runs_dir)
    checked = check_nodes(prepared, out)
    exp_id = _new_experiment_id(runs_dir, prepared.experiment.name)
    with node_leases(prepared, exp_id, out):
        exp_dir = runs_dir / exp_id
        exp_dir.mkdir(parents=True, mode=PRIVATE_DIR_MODE)   # its runs' files may hold what a secret left
        code, store = _start(prepared, opts, exp_id, exp_dir, out, progress, checked)
    try:
        return conclude(code, store, exp_dir, out), exp_dir
    finally:
        store.close()


def _start(prepared: Prepared, opts: Options, exp_id: str, exp_dir: Path, out: TextIO,
           progress: Progress | None, checked: list[preflight.EngineFlags]) -> tuple[int, st.Store]:
    """Create the experiment's store and run its plan (the node leases held). Returns (exit code, store)."""
    store = st.Store.create(exp_dir / st.FILENAME)
    try:
        store.write_experiment(id=exp_id, name=prepared.experiment.name, seed=opts.seed, repeats=opts.repeats,
                               order_mode=opts.order, experiment_file=str(prepared.experiment.path),
                               inventory_file=str(prepared.inventory.path),
                               config=redacted_config(prepared.experiment), matrix=list(opts.matrix),
                               argv=list(opts.argv), hosts=[h.name for h in prepared.inventory.hosts],
                               specab_version=_specab_version(), git_sha=_git_sha(), options=opts.to_json())
        store.write_arms([a.to_json() for a in prepared.all_arms])
        doc = fingerprint_doc(prepared.experiment, prepared.arms)
        store.set_session_fingerprint(fingerprint(doc), doc)
        plan, first = first_plan(prepared, opts, store, fingerprint(doc))
        prepared = dataclasses.replace(prepared, plan=plan)
        store.write_plan([r.to_json() for r in plan], repeats=measured_blocks(plan, prepared))
        if prepared.search is not None:
            store.record_design_step(blocks=0, design="search", more=True, requests=None,
                                     reason=f"block 1, the ladder: {', '.join(f'{x:g}' for x in prepared.search.ladder())}"
                                            f" {prepared.search.unit} ({prepared.search.text()}; SLO "
                                            f"{prepared.slo.text() if prepared.slo else '-'})")
        progress = progress or Progress()
        if first is not None:       # the live projection: what the design expects the whole experiment to cost
            progress.projection(first.gpu_s, first.cost.gpus if first.cost else 1)
        # stored: the experiment's logical names; launched: the node engine's spelling
        prepared = spelled(prepared, checked)
        code = _run(prepared, opts, exp_id, exp_dir, store, list(prepared.plan), out, progress,
                    total=len(prepared.plan))
        return code, store
    except BaseException:
        store.close()
        raise


def measured_blocks(plan: list[PlannedRun], prepared: Prepared) -> int:
    """The measured blocks of a plan (the experiment's `repeats`): the deterministic pass's block is not one."""
    det = {a.name for a in prepared.det_arms}
    return max(r.block for r in plan if r.arm not in det)


def first_block(prepared: Prepared, opts: Options, inputs: DesignInputs) -> economics.FirstBlock:
    """The design by cost's first block for this experiment on its first host (economics.first_block), from the
    node's history or the simulator profile (`inputs`); `run` starts with it and `plan --target-ci` shows it."""
    return economics.first_block(inputs.prior, inputs.cost, float(opts.target_ci or 0), arms=len(prepared.arms),
                                 requests=int(prepared.experiment.bench_settings["num_requests"]),
                                 max_blocks=opts.max_repeats or opts.repeats, max_requests=opts.max_requests,
                                 min_requests=prepared.min_requests_per_run)


def first_runs(prepared: Prepared, opts: Options, first: economics.FirstBlock | None) -> list[PlannedRun]:
    """The runs an experiment starts with. With --target-ci and the design by cost (`first`): one block, at the
    requests per run the design chose (num_requests None where it made no design: the experiment's, whenever the
    run runs); the design adds the rest block by block (RunContext.more_blocks). Otherwise the --repeats blocks at
    the experiment's requests."""
    if first is None or opts.target_ci is None or opts.design != "cost":
        return list(prepared.plan)
    return make_plan([a.name for a in prepared.arms], 1, opts.seed, opts.order,
                     num_requests=first.requests if first.design is not None else None,
                     burn_in=prepared.experiment.burn_in, groups=prepared.groups)


def first_plan(prepared: Prepared, opts: Options, store: st.Store, fp: str
               ) -> tuple[list[PlannedRun], design.Design | None]:
    """The runs an experiment starts with (`first_runs`), each with its measured requests (stored per run), and the
    design by cost's plan when it made one; the design's first decision is stored."""
    if opts.target_ci is None or opts.design != "cost":
        return list(prepared.plan), None
    runs_dir = Path(opts.runs_dir) if opts.runs_dir else default_runs_dir()
    inputs = design_inputs(prepared.experiment, prepared.arms, prepared.inventory.hosts[0], runs_dir, fp)
    first = first_block(prepared, opts, inputs)
    store.record_design_step(blocks=0, design="cost", more=True, requests=first.requests,
                             reason=f"first block: {first.why}",
                             plan=first.design.to_dict() if first.design is not None else None)
    return first_runs(prepared, opts, first), first.design


def stored_experiment_file(row: dict[str, Any], exp_dir: Path, out: TextIO) -> str:
    """The experiment file to resume with: the recorded one, or, where it is gone, the configuration the store
    holds, written beside the store (it cannot stand in for a file whose secrets the store redacted)."""
    path = row["experiment_file"]
    if path and Path(path).is_file():
        return path
    config = row.get("config")
    if not isinstance(config, dict):
        raise ExperimentError(f"the experiment file {path} is gone and {exp_dir} holds no configuration to resume "
                              f"with; pass -e with the experiment file.")
    redacted = sorted(_redacted_keys(config))
    if redacted:
        raise ExperimentError(f"the experiment file {path} is gone, and the configuration stored in {exp_dir} has "
                              f"its secret values redacted ({', '.join(redacted)}): restore the file, or pass -e "
                              f"with one that holds them.")
    copy = exp_dir / "experiment.resumed.yml"
    copy.write_text(yaml.safe_dump({"specab_experiment": config}, sort_keys=False))
    print(f"the experiment file {path} is gone: resuming with the configuration stored with the experiment "
          f"({copy})", file=out)
    return str(copy)


def _redacted_keys(value: Any, where: str = "") -> list[str]:
    if isinstance(value, dict):
        return [k for key, v in value.items() for k in _redacted_keys(v, f"{where}.{key}" if where else str(key))]
    if isinstance(value, list):
        return [k for i, v in enumerate(value) for k in _redacted_keys(v, f"{where}[{i}]")]
    return [where] if value == REDACTED else []


def resume(exp_ref: str, opts: Options, out: TextIO, progress: Progress | None = None) -> tuple[int, Path]:
    """Run the missing runs of an experiment, in the planned order."""
    try:
        exp_dir = locate(exp_ref, opts.runs_dir)
    except NotFound as exc:
        raise ExperimentError(str(exc)) from None
    store = st.Store.open(exp_dir)
    try:
        row = store.experiment()
        experiment_file = opts.experiment_file or stored_experiment_file(row, exp_dir, out)
        ropts = resume_options(row, opts, experiment_file)
        prepared = prepare(ropts)
        forced = check_fingerprint(store, prepared, force=opts.force_changed, out=out)
        stored = {a["name"]: a for a in store.arms()}
        for arm in prepared.all_arms:
            s = stored.get(arm.name)
            now = arm.to_json()
            # (redact_env: experiments stored before server args were redacted hold them verbatim)
            if s is None or not forced and (redact_env(s["server_args"]) != now["server_args"]
                                            or redact_env(s["env"]) != now["env"]):
                raise ExperimentError(f"arm {arm.name}: the experiment file {ropts.experiment_file} no longer "
                                      f"resolves to the arm recorded in {store.path}; resuming would mix two "
                                      f"experiments. Restore the file or start a new experiment.")
        todo_rows = store.not_ok() if opts.retry_failed else store.missing()
        todo = [PlannedRun.from_row(r) for r in todo_rows]
        det_block = pass_not_planned(store, prepared, ropts, todo)
        todo += det_block
        print(f"resuming {row['id']}: {len(todo)} of {len(store.plan()) + len(det_block)} runs to do", file=out)
        designed = ropts.target_ci is not None or ropts.search is not None
        # a finished design or search allowed more blocks than it has (--max-repeats above its blocks): asked again
        finished = row.get("status") == "finished"
        raised = finished and designed and opts.max_repeats is not None and opts.max_repeats > int(row["repeats"])
        if not todo and ((finished and not raised) or not designed):
            return conclude(EXIT_OK, store, exp_dir, out), exp_dir
        if not todo:        # stopped between blocks, or allowed more: the design (or search) decides the next one
            why = (f"finished with {row['repeats']} blocks, now allowed {opts.max_repeats}" if raised
                   else f"{row.get('status')} between blocks")
            print(f"{row['id']} was {why}: the {'search' if ropts.search else 'design'} decides whether another "
                  f"block follows", file=out)
        checked = check_nodes(prepared, out)
        doc = fingerprint_doc(prepared.experiment, prepared.arms)       # the logical arms, as start() hashed them
        prepared = spelled(dataclasses.replace(prepared, more_arms=stored_probe_arms(prepared, store)), checked)
        with node_leases(prepared, row["id"], out):
            store.set_session_fingerprint(fingerprint(doc), doc, forced=forced)
            store.mark_running()
            store.write_plan([r.to_json() for r in det_block])
            code = _run(prepared, ropts, row["id"], exp_dir, store, todo, out, progress or Progress(),
                        total=len(store.plan()), adopt=keep.adoptable(row))
        return conclude(code, store, exp_dir, out), exp_dir
    finally:
        store.close()


def stored_search_options(argv: list[str]) -> dict[str, Any]:
    """--search, --search-tol and --slo as the experiment's command line gave them (a resume goes on searching), and
    under a search its "blocks": (--repeats, --max-repeats) as given, the bracketed blocks it wants and its cap (the
    store's repeats count the blocks planned so far); (None, None) without a search."""
    def values(flag: str) -> list[str]:
        return ([argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]
                + [a.split("=", 1)[1] for a in argv if a.startswith(flag + "=")])
    search, tol = values("--search"), values("--search-tol")
    repeats, cap = values("--repeats"), values("--max-repeats")
    blocks = (int(repeats[-1]) if repeats else Options().repeats, int(cap[-1]) if cap else None) if search \
        else (None, None)
    return {"search": search[-1] if search else None, "slo": values("--slo"), "blocks": blocks,
            "search_tol": float(tol[-1].rstrip("%")) / (100 if tol[-1].endswith("%") else 1) if tol else None}


def stored_probe_arms(prepared: Prepared, store: st.Store) -> list[Any]:
    """The probe arms a search stored after its first block, rebuilt from the experiment as it planned them."""
    if prepared.search is None:
        return []
    known = {a.name for a in prepared.arms}
    loads = {x for a in store.arms() if a["name"] not in known
             and (x := searchcfg.load_of(a, prepared.search.axis)) is not None}
    if not loads:
        return []
    return [a for a in searchcfg.probe_arms(prepared.experiment, prepared.axes, prepared.search, sorted(loads))
            if a.name not in known]


def planned_options(row: dict[str, Any]) -> Options:
    """The options the experiment started with: its stored record; of a store written before the record, its columns
    and the two switches its command line gave."""
    if row.get("options") is not None:
        return Options.from_json(row["options"])
    argv = row.get("argv") or []
    searched = stored_search_options(argv)
    least, most = searched.pop("blocks")
    return Options(matrix=list(row["matrix"]), seed=row["seed"], order=row["order_mode"], fleet="--fleet" in argv,
                   correctness="--correctness" in argv, repeats=least or Options().repeats, max_repeats=most,
                   **searched)


def resume_options(row: dict[str, Any], opts: Options, experiment_file: str) -> Options:
    """The options a resume runs under: the plan's (matrix, repeats, seed, order, --fleet, --correctness) as the
    experiment recorded them (its blocks so far: repeats), how to run it from this command. --correctness cannot be
    added to an experiment planned without it."""
    planned = planned_options(row)
    if opts.correctness and not planned.correctness:
        raise ExperimentError(f"experiment {row['id']} was planned without --correctness: its plan has no "
                              f"deterministic pass to resume. Resume without --correctness, or start a new "
                              f"experiment with it.")
    searching = planned.search is not None      # a search goes on with the blocks it wants and its cap
    return dataclasses.replace(opts, experiment_file=experiment_file,
                               inventory_file=opts.inventory_file or row["inventory_file"], matrix=planned.matrix,
                               repeats=planned.repeats if searching else row["repeats"], seed=planned.seed,
                               order=planned.order, skip_invalid=True, max_runs=None,
                               fleet=opts.fleet or planned.fleet, correctness=planned.correctness,
                               search=planned.search, search_tol=planned.search_tol, slo=list(planned.slo),
                               max_repeats=opts.max_repeats or (planned.max_repeats if searching else None))


def pass_not_planned(store: st.Store, prepared: Prepared, opts: Options, todo: list[PlannedRun]
                     ) -> list[PlannedRun]:
    """The deterministic pass's block for a resume to add, when the experiment has one (--correctness) that its plan
    does not hold yet: a --target-ci experiment plans it after the design's last block, and was stopped before that.
    With --target-ci and measured runs still to do, the design plans it when it stops (RunContext). The caller
    stores it once the nodes are checked."""
    names = [a.name for a in prepared.det_arms]
    planned = [PlannedRun.from_row(r) for r in store.plan()]
    if not names or any(r.arm in names for r in planned) or (opts.target_ci is not None and todo):
        return []
    return correctness.plan_block(names, planned, opts.seed, opts.order)


def check_fingerprint(store: st.Store, prepared: Prepared, *, force: bool, out: TextIO) -> bool:
    """Refuse a resume whose resolved experiment differs from the stored one (ExperimentError naming every
    change) unless ``force``; returns whether the fingerprint changed (and the resume goes on: forced)."""
    recorded = store.fingerprint()
    doc = fingerprint_doc(prepared.experiment, prepared.arms)
    if recorded is None:          # a store written before fingerprints: nothing to compare with
        print("notice: this experiment was stored without a fingerprint; the resumed runs are marked with "
              f"{fingerprint(doc)}", file=out)
        return False
    old_fp, old_doc = recorded
    if fingerprint(doc) == old_fp:
        return False
    what = changes(old_doc, doc) or ["(the fingerprint's content differs)"]
    if not force:
        raise ExperimentError(
            f"the experiment file {prepared.experiment.path} no longer resolves to the experiment recorded in "
            f"{store.path} (fingerprint {old_fp} -> {fingerprint(doc)}); resuming would mix runs that are not "
            f"comparable. Changed:\n  " + "\n  ".join(what) +
            "\nRestore the file, start a new experiment, or give --force-changed to resume anyway (the report "
            "then marks the runs of each fingerprint).")
    print(f"notice: --force-changed: resuming under fingerprint {fingerprint(doc)} (recorded {old_fp}); changed: "
          + "; ".join(what), file=out)
    return True


def record_history(store: st.Store, exp_dir: Path, out: TextIO) -> None:
    """Append what the experiment measured to its nodes' history (`<runs>/history/<host>.jsonl`), the next
    `plan --target-ci`'s prior for the same fingerprint. A failure costs the next plan its prior, not this
    experiment its exit status: it is said and the experiment concludes."""
    recorded = store.fingerprint()
    if recorded is None:
        return
    try:
        for p in history.record(exp_dir.parent, load_store(exp_dir, read_logs=False), recorded[0], recorded[1]):
            print(f"history: {p}", file=out)
    except Exception as exc:
        print(f"history not written: {type(exc).__name__}: {exc}", file=out)


def print_verdict_caveats(exp_dir: Path, store: st.Store, out: TextIO) -> None:
    """Beside the table's verdict: the verdict at each load when the experiment ran at several (speedups per user
    and in throughput, the crossover), every error-level finding of the report's doctor (a verdict it invalidates),
    the first warning, and a word when there is nothing to compare."""
    arms = store.arms()
    if arms and all(a["name"] == a["baseline"] for a in arms):
        print("nothing to compare: every arm is a baseline (no speculative arm), so there is no speedup to report.",
              file=out)
    try:
        data = json.loads((exp_dir / "report.json").read_text())
    except (OSError, ValueError):
        return
    for line in (data.get("verdicts") or {}).values():
        print(f"verdict: {line}", file=out)
    findings = data.get("findings") or []
    for line in (data.get("capacity") or {}).get("verdicts") or []:     # the iso-SLO ratios (SLO and capacity)
        print(f"capacity: {line}", file=out)
    loads = data.get("loads") or {}
    if len(loads.get("loads") or []) > 1:      # the verdict at each load, per configuration
        for fam in loads.get("families") or []:
            print(f"per load: {fam['verdict']}", file=out)
    errors = [f for f in findings if f.get("severity") == "error"]
    warnings = [f for f in findings if f.get("severity") == "warning"]
    for f in errors:
        print(f"DOCTOR ERROR {f['rule']}{' (' + f['arm'] + ')' if f.get('arm') else ''}: {f['message']}", file=out)
    if warnings:
        more = f" (+{len(warnings) - 1} more in the report)" if len(warnings) > 1 else ""
        print(f"doctor: {warnings[0]['rule']}: {warnings[0]['message'][:300]}{more}", file=out)


def require_valid(exp_dir: Path, out: TextIO) -> int:
    """--require-valid: EXIT_NOT_VALID when the report names a speculative arm (not declared cost_only) whose
    outputs are not its baseline's, or one whose deterministic pass (--correctness) differs (an engine bug), or
    when the report that would say so is missing."""
    try:
        val = json.loads((exp_dir / "report.json").read_text())["validity"]
        arms, passes = val["arms"], val.get("deterministic") or {}
    except (OSError, ValueError, KeyError, TypeError):
        print(f"--require-valid: no output validity in {exp_dir / 'report.json'}: the verdict cannot be checked "
              f"(run `driver.py report {exp_dir.name}`).", file=out)
        return EXIT_NOT_VALID
    bad = [f"{a}: {v.get('line')}" for a, v in arms.items() if v.get("status") == "NOT VALID" and not v.get("cost_only")]
    bad += [f"{a}: {d.get('line')}" for a, d in passes.items() if d.get("status") == "BUG"]
    for line in bad:
        print(f"--require-valid: {line}", file=out)
    return EXIT_NOT_VALID if bad else EXIT_OK


def conclude(code: int, store: st.Store, exp_dir: Path, out: TextIO) -> int:
    """Print the summary table; write the report when the experiment ran to its end."""
    failed = print_summary(store, out)
    print(f"\nexperiment directory: {exp_dir}", file=out)
    if code == EXIT_OK and not store.runs(status="ok"):
        # nothing measured: a report would be a page of empty tables
        print("no report: no run finished ok, so there is nothing to compare. The failures above say why; fix "
              "them and run again (or --resume with --retry-failed).", file=out)
        return EXIT_FAILED_RUNS
    if code == EXIT_OK:
        try:
            paths = write_report(exp_dir)
            print(f"report: {paths.get('markdown')} and {paths.get('html')}", file=out)
            print_verdict_caveats(exp_dir, store, out)
        except Exception as exc:    # a report bug must not lose the experiment's exit status
            print(f"report not written: {type(exc).__name__}: {exc}", file=out)
        record_history(store, exp_dir, out)
    if code != EXIT_OK:
        return code
    return EXIT_FAILED_RUNS if failed else EXIT_OK
