"""One experiment's execution state, shared by the executors: the store, the playbook runner, the progress
display, the resolved arms; recording a finished run; stopping the servers; more blocks on demand."""
from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from specab.analysis.evidence import model
from specab.analysis.measures import stats
from specab.analysis.cost import economics, search as searchdesign
from specab.analysis.cost.history import HistoryError
from specab.config import bench, correctness, instances, scoring, search as searchcfg
from specab.config.fingerprint import fingerprint, fingerprint_doc
from specab.config.inventory import Host
from specab.config.plan import PlannedRun, make_plan
from specab.config.spec import ArmSpec
from specab.config.yamlfile import REPO_ROOT, ConfigError
from specab.driver import preflight, record
from specab.driver.design_inputs import DesignInputs, design_inputs
from specab.driver.lease import active_holder
from specab.driver.options import (ExperimentError, Options, Prepared, choose_executor, is_multinode,
                                   search_blocks)
from specab.driver.playbook import PlaybookResult, PlaybookRunner, runner_ident, scrub_tree
from specab.driver.progress import Progress
from specab.driver.record import (INTERRUPTED_REASON, PhaseClock, ingest_run_dir, log_excerpt, node_run_dir,
                                  read_json, tail_file)
from specab.driver.remote import read_tail
from specab.results import store as st
from specab.vocab import phases
from specab.vocab.contract import load_phase, scrub_text, scrub_values, secret_values

ARM_PLAYBOOK = "playbooks/arm.yml"
MULTINODE_PLAYBOOK = "playbooks/multinode_arm.yml"   # one server over every host (docs/scale.md)
STOP_PLAYBOOK = "playbooks/stop.yml"


@dataclass(frozen=True)
class InterruptedRun:
    """A per-run run the user interrupted after its server had started: the stop after the interrupt is its
    teardown, recorded in its run directory as the run queue records it (RunContext.stop_servers)."""
    pr: PlannedRun
    run_dir: Path           # its controller directory
    phase: str | None       # the phase it was stored interrupted in (a display name); None: kept ok


def secrets_of(prepared: Prepared) -> list[str]:
    """Every secret value an experiment carries (env, server args, the nodes' env): scrubbed from the
    ansible-runner artifacts (the one secret rule: specab.vocab.contract)."""
    vals: list[str] = []
    for arm in prepared.all_arms:
        vals += secret_values(arm.env, arm.server_args)
    for h in prepared.inventory.hosts:
        vals += secret_values(h.node_env)
    return vals


MoreBlocks = Callable[[], list[PlannedRun]]


class NextBlocks:
    """The --target-ci hook of a run context: after every planned run, the block the design asks for, and the
    deterministic pass's (--correctness) after the design's last one; under --search, the search's next block."""

    p: Prepared
    arms: dict[str, ArmSpec]
    opts: Options
    store: st.Store
    progress: Progress
    exp_dir: Path
    fingerprint: str
    _design_inputs: DesignInputs | None

    def more_blocks(self) -> list[PlannedRun]:
        """The --target-ci hook, called when every planned run is done: the block the design asks for (design_block),
        else, once, the deterministic pass's block (--correctness), after the design's last block. Under --search the
        search decides (search_block)."""
        if self.p.search is not None:
            return self.search_block()
        if self.opts.target_ci is None:
            return []
        planned = [PlannedRun.from_row(r) for r in self.store.plan()]
        det = [a.name for a in self.p.det_arms]
        if any(r.arm in det for r in planned):
            return []           # the pass came after the design's last decision: nothing follows it
        new = self.design_block()
        if new or not det:
            return new
        block = correctness.plan_block(det, planned, self.store.experiment()["seed"], self.opts.order)
        self.store.write_plan([r.to_json() for r in block])
        self.progress.state.total = len(self.store.plan())
        self.progress.notice(f"--correctness: the deterministic pass, {len(block)} runs after the last block")
        return block

    def design_block(self) -> list[PlannedRun]:
        """Ask the design whether to add a block (and, by cost, with how many measured requests per run); the new
        block is planned and stored with them, the decision stored (store.design_steps) and said, and the progress
        display's total and projection updated."""
        exp_row = self.store.experiment()
        blocks = exp_row["repeats"]
        limit = self.opts.max_repeats or (self.opts.repeats if self.opts.design == "cost" else blocks)
        name = "design by cost" if self.opts.design == "cost" else "sequential design"
        if blocks >= limit:        # (the interval's widths, and whether the target was met, from the statistics)
            _, reason = decide_more_blocks(self.store, self.opts.target_ci, limit)
            self.progress.notice(f"--target-ci: {reason}.")
            self.store.record_design_step(blocks=blocks, design=self.opts.design, more=False, requests=None,
                                          reason=reason)
            return []
        requests = int(self.p.experiment.bench_settings["num_requests"])
        plan = None
        if self.opts.design == "cost":
            decision = self.decide_block(limit)
            more, reason, requests, plan = decision.more, decision.reason, decision.requests, decision.plan
            if decision.design != "cost":
                name = "design by cost (no run cost yet)"
        else:
            more, reason = decide_more_blocks(self.store, self.opts.target_ci, limit)
        self.store.record_design_step(blocks=blocks, design=self.opts.design, more=more,
                                      requests=requests if more else None, reason=reason,
                                      plan=plan.to_dict() if plan else None)
        said = f"next block: {requests} measured requests per run; " if more and self.opts.design == "cost" else ""
        self.progress.notice(f"--target-ci {self.opts.target_ci:.1%} ({name}): {said}{reason}")
        if more and plan is not None:       # what the design expects to spend from here to the verdict
            self.progress.projection(plan.gpu_s - plan.done_gpu_s, plan.cost.gpus if plan.cost else 1)
        if not more:
            return []
        last_seq = max(r["seq"] for r in self.store.plan())
        new = make_plan([a.name for a in self.p.arms], 1, exp_row["seed"], exp_row["order_mode"], first_block=blocks + 1,
                        first_seq=last_seq + 1, num_requests=requests if self.opts.design == "cost" else None,
                        groups=self.p.groups)
        self.store.write_plan([r.to_json() for r in new], repeats=blocks + 1)
        self.progress.state.total = len(self.store.plan())
        return new

    def search_block(self) -> list[PlannedRun]:
        """The capacity search's next block (specab.analysis.cost.search.next_block on the runs stored so far): its
        probe loads' arms added (stored, spelled for the node), the block planned in the seeded order and stored,
        the decision stored and said; [] when the search stops."""
        assert self.p.search is not None and self.p.slo is not None
        exp_row = self.store.experiment()
        least, most = search_blocks(self.opts)
        step = searchdesign.next_block(model.load_store(self.store.path, read_logs=False), self.p.search, self.p.slo,
                                       min_blocks=least, max_blocks=most)
        blocks = exp_row["repeats"]
        self.store.record_design_step(blocks=blocks, design="search", more=step.more, requests=None,
                                      reason=step.reason, plan=step.to_dict())
        self.progress.notice(f"--search: {step.reason}")
        if not step.more:
            return []
        arms = self.add_probe_arms(step.loads)
        last_seq = max(r["seq"] for r in self.store.plan())
        new = make_plan([a.name for a in arms], 1, exp_row["seed"], exp_row["order_mode"], first_block=blocks + 1,
                        first_seq=last_seq + 1,      # each arm's probe loads on one server, as block 1's
                        groups=instances.load_groups(arms) if self.p.server.per_instance else None)
        self.store.write_plan([r.to_json() for r in new], repeats=blocks + 1)
        self.progress.state.total = len(self.store.plan())
        return new

    def add_probe_arms(self, loads: list[float]) -> list[ArmSpec]:
        """The arms of these probe loads (config.search.probe_arms, spelled as the node's engine lists its flags);
        those not known yet are stored after the experiment's arms and run like them."""
        assert self.p.search is not None
        arms = preflight.spell_arms(searchcfg.probe_arms(self.p.experiment, self.p.axes, self.p.search, loads),
                                    self.p.engine_flags)
        new = [a for a in arms if a.name not in self.arms]
        if new:
            self.store.write_arms([a.to_json() for a in new], first_position=len(self.store.arms()) + 1)
        self.arms.update({a.name: a for a in new})
        return arms

    def decide_block(self, limit: int) -> economics.Decision:
        """The design by cost's decision on the experiment so far (specab.analysis.cost.economics.decide_block), with
        the node's history or the simulator profile as the prior and as the run cost until this experiment has
        measured its own (design_inputs)."""
        if self._design_inputs is None:
            try:
                self._design_inputs = design_inputs(self.p.experiment, self.p.arms, self.p.inventory.hosts[0],
                                                    self.exp_dir.parent, self.fingerprint)
            except (HistoryError, ConfigError) as exc:     # read fine at the start; the experiment goes on
                self.progress.notice(f"--target-ci: no prior ({exc}); the design goes on from this experiment's "
                                     f"own runs")
                self._design_inputs = DesignInputs(prior=None, cost=None)
        inputs = self._design_inputs
        exp = model.load_store(self.store.path, read_logs=False)
        return economics.decide_block(exp, float(self.opts.target_ci or 0), max_blocks=limit,
                                      keep_requests=int(self.p.experiment.bench_settings["num_requests"]),
                                      prior=inputs.prior, cost=inputs.cost, max_requests=self.opts.max_requests,
                                      min_requests=self.p.min_requests_per_run)


class RunContext(NextBlocks):
    """One experiment's execution state (new or resumed), for one host set (a fleet makes one per host)."""

    def __init__(self, prepared: Prepared, opts: Options, exp_id: str, exp_dir: Path, store: st.Store,
                 out: TextIO, progress: Progress, limit: str | None = None):
        self.p = prepared
        self.limit = limit          # ansible --limit: the fleet runs one host's blocks per RunContext
        multinode = is_multinode(prepared.inventory.hosts)
        if multinode and len(prepared.inventory.hosts) < 2:
            raise ExperimentError(f"{prepared.inventory.path}: specab_multinode is set but group gpu_nodes has "
                                  f"one host; a multi-node server needs at least two (docs/scale.md).")
        self.playbook = MULTINODE_PLAYBOOK if multinode else ARM_PLAYBOOK
        self.executor = choose_executor(opts.executor, multinode, len(prepared.inventory.hosts))
        # hosts whose results the run has: the head alone for a multi-node server (rank 0 serves and is
        # benchmarked; the other ranks' files are kept under <run dir>/node<r>-<host>/)
        self.result_hosts = prepared.inventory.hosts[:1] if multinode else prepared.inventory.hosts
        self.opts = opts
        self.exp_id = exp_id
        self.exp_dir = exp_dir
        self.store = store
        self.out = out
        self.progress = progress
        self.arms = {a.name: a for a in prepared.all_arms + prepared.more_arms}    # every arm a run names
        self.runner = PlaybookRunner(REPO_ROOT, prepared.inventory.path, exp_dir / ".runner",
                                     verbose=opts.verbose, stream=lambda s: progress.notice(s))
        self.secrets = secrets_of(prepared)
        self.fingerprint_doc = fingerprint_doc(prepared.experiment, prepared.arms)
        self.fingerprint = fingerprint(self.fingerprint_doc)
        self._design_inputs: DesignInputs | None = None

    # ------------------------------------------------------------------ a run's settings
    def bench_settings(self, pr: PlannedRun | None) -> dict[str, Any]:
        """The run's bench settings as its queue entry gives them to the node (specab.config.bench.resolve): its
        arm's own (``ArmSpec.bench``) over the experiment's over specab's defaults, and the measured requests the
        design chose for its block; without a run, the experiment's."""
        arm = self.arms.get(pr.arm) if pr is not None else None
        out = bench.resolve({}, self.p.experiment.bench, arm.bench if arm is not None else None)
        if pr is not None and pr.num_requests is not None:
            out["num_requests"] = int(pr.num_requests)
        return out

    def num_requests(self, pr: PlannedRun | None) -> int:
        """The run's measured requests: the design's choice for its block, else its arm's, else the experiment's."""
        return int(self.bench_settings(pr)["num_requests"])

    def score_spec(self, pr: PlannedRun) -> dict[str, Any]:
        """What a baseline run's server scores after its measured window at temperature > 0 (specab.config.scoring:
        its own outputs and the earlier runs of its arms on its host that no earlier run of it scored), as the bench
        step takes it: {engine, experiment_id, runs}; {} for any other run."""
        if pr.burn_in or not self.arms[pr.arm].is_baseline or float(self.bench_settings(pr)["temperature"]) <= 0:
            return {}
        hosts = [h.name for h in self.p.inventory.hosts]
        runs = [r for r in map(PlannedRun.from_row, self.store.plan()) if not r.burn_in]    # burn-ins: not analysed
        if self.limit is not None and len(hosts) > 1:     # a fleet: block b runs on hosts[(b - 1) % n] (fleet.py)
            runs = [r for r in runs if hosts[(r.block - 1) % len(hosts)] == self.limit]
        ids = scoring.assign(runs, {a.name: a.baseline for a in self.arms.values()}).get(pr.seq, [])
        return {"engine": self.p.experiment.engine, "experiment_id": self.exp_id, "runs": ids}

    def experiment_extravar(self, pr: PlannedRun | None = None) -> dict[str, Any]:
        """`specab_experiment` for the run's playbook: the experiment, its bench with the run's measured requests
        (the design by cost chooses them per block; the experiment's fingerprint stays the file's)."""
        doc = self.p.experiment.as_extravar()
        if pr is not None and pr.num_requests is not None:
            doc["bench"] = {**(doc.get("bench") or {}), "num_requests": int(pr.num_requests)}
        return doc

    # ------------------------------------------------------------------ one run
    def tail_handlers(self, clock: PhaseClock, enter_phases: bool = True, pr: PlannedRun | None = None
                      ) -> tuple[Callable[[str], None], Callable[[str], None]]:
        """Callbacks for the live tails of server.log (load phases) and bench.jsonl (request lines) of run `pr`.
        `enter_phases=False`: the phases come from elsewhere (the sequencer's phases.jsonl)."""
        bench_state = {"warm": 0, "measured": 0}
        warmups = int(self.bench_settings(pr)["warmup_requests"])

        load_order = ("loading", "loading weights", "capturing graphs", "ready")

        def on_log(line: str) -> None:
            self.progress.log_line(line)
            ph = load_phase(line)
            if ph not in ("loading weights", "capturing graphs", "ready"):
                return
            # the log only refines a load in progress (the roles' or the node's phases lead), forward only: with
            # TP > 1 the ranks' lines interleave
            cur = clock.current
            if cur not in load_order or load_order.index(ph) <= load_order.index(cur):
                return
            clock.enter(ph)

        def on_bench(line: str) -> None:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                return
            if rec.get("warmup"):
                bench_state["warm"] += 1
                if bench_state["warm"] >= warmups and enter_phases:
                    clock.enter("benchmarking")     # the measured requests start now
            else:
                bench_state["measured"] += 1
                if enter_phases:
                    clock.enter("benchmarking")
                n = self.num_requests(pr)
                self.progress.log_line(f"request {bench_state['measured']}" + (f" of {n}" if n else "")
                                       + f": {rec.get('decode_tok_s') or 0:.1f} tok/s")
        return on_log, on_bench

    def record_finish(self, pr: PlannedRun, result: PlaybookResult, run_dir: Path, started: float, *,
                      outcome: tuple[str, str | None, str | None], load_phases: dict[str, float] | None,
                      fetch_missing: bool = True) -> str:
        """Ingest the collected run directory and record the run's outcome (status, failed phase, reason)."""
        hosts = self.result_hosts
        if not result.ok and fetch_missing:
            # keep what the node produced (partial bench records, server log) when collect did not run
            for h in hosts:
                dest = run_dir if len(hosts) == 1 else run_dir / h.name
                record.fetch_missing(h, node_run_dir(h, pr.run_id), dest)
        # The node's run files may hold a secret verbatim (launch.sh and args.json carry a secret server arg
        # such as --api-key, the engine's log prints its args, nccl.env its env): the controller's copy and
        # the store never do.
        scrub_tree(run_dir, self.secrets)
        self.stamp_manifests(run_dir, pr)
        ingested = ingest_run_dir(self.store, pr.seq, run_dir, [h.name for h in hosts])
        planned = self.num_requests(pr)
        # partial: fewer answered measured requests than planned (a crash cuts the file short, or leaves
        # records of requests that failed after it)
        partial = planned > 0 and ingested["measured_ok"] < planned * len(hosts)
        log_tail = None
        for h in hosts:
            local = (run_dir if len(hosts) == 1 else run_dir / h.name) / "server.log"
            if local.exists():
                tail = tail_file(local)
            else:
                remote = read_tail(h, node_run_dir(h, pr.run_id) + "/server.log", lines=2000)
                tail = log_excerpt(remote) if remote else None
            if tail:
                log_tail = tail if len(hosts) == 1 else (log_tail or "") + f"== {h.name} ==\n{tail}\n"
        status, phase, reason = outcome
        if status == st.INTERRUPTED and planned > 0 and not partial and ingested["measured"] == ingested["measured_ok"]:
            # the benchmark had answered every measured request before the signal: the measurement is whole
            self.progress.notice(f"{pr.run_id}: its benchmark had finished before the interrupt: kept as ok")
            status, phase, reason = st.OK, None, None
        if status == st.FAILED and log_tail is None:
            log_tail = result.stdout_tail
        log_tail, reason = self.scrub_text(log_tail), self.scrub_text(reason)
        gpus = economics.gpus_of(self.arms[pr.arm].server_args) if pr.arm in self.arms else None
        gpu_seconds = self.store.finish_run(pr.seq, status=status, runner_status=result.status, runner_rc=result.rc,
                              failure_phase=phase if status != st.OK else None, failure_reason=reason,
                              log_tail=log_tail if status != st.OK else None, partial=partial,
                              summary=ingested.get("summary"),
                              load_phases=load_phases or ingested.get("ready"),
                              server_info=ingested.get("server_info"), stop=ingested.get("stop"),
                              gpu_free=ingested.get("gpu_free"),
                              gpus=gpus, server_seq=record.server_seq(run_dir, pr.seq))
        self.progress.run_finished(status, time.time() - started, reason, gpus=gpus, gpu_seconds=gpu_seconds)
        return status

    def stamp_manifests(self, run_dir: Path, pr: PlannedRun | None = None) -> None:
        """Every collected manifest.json of the run gets the experiment's fingerprint, the run's bench settings
        (its arm's bench condition, e.g. concurrency, and its measured requests: the design's for its block) and the
        timeouts (what `driver.py diff` compares next to
        the node's provenance)."""
        arm = self.arms.get(pr.arm) if pr is not None else None
        bench = {**self.fingerprint_doc["bench"], **(arm.bench if arm is not None else {}),
                 "num_requests": self.num_requests(pr)}
        for path in sorted(run_dir.rglob("manifest.json")):
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if not isinstance(data, dict):
                continue
            data.update(fingerprint=self.fingerprint, bench=bench, timeouts=self.fingerprint_doc["timeouts"])
            tmp = path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(data, indent=1) + "\n")
            os.replace(tmp, path)

    def scrub_text(self, text: str | None) -> str | None:
        """A text with the experiment's secret values replaced (a remote log tail, a failure message)."""
        if not text:
            return text
        return scrub_text(text, scrub_values(self.secrets))

    # ------------------------------------------------------------------ interruption
    def stop_servers(self, interrupted: InterruptedRun | None = None) -> str | None:
        """Stop our server on every node through the stop role; returns an error text or None. With
        ``interrupted`` the stop is that run's teardown: stop.yml records its stop, GPUs free and manifest in the
        node's run directory and they are fetched into its controller directory, as the run queue's are."""
        ident = runner_ident("stop")
        extravars: dict[str, Any] = {"specab_experiment": self.experiment_extravar()}
        holder = active_holder()
        if holder is not None:          # stop.yml stops under our node lease (else it takes the lease itself)
            extravars["specab_lease_holder"] = holder
        if interrupted is not None:
            extravars["specab_interrupted_run"] = self.interrupted_extravar(interrupted)
        try:
            res = self.runner.run(STOP_PLAYBOOK, extravars, ident, secrets=self.secrets, limit=self.limit)
        finally:
            # what the stop recorded, on every host it reached, even when it failed (the rest is what the node had
            # written by the interrupt, fetched before the stop), into the run's controller directory and onto its
            # row: the row was written before the stop, so it exists whatever becomes of the stop
            if interrupted is not None:
                self.record_teardown(interrupted)
        if not res.ok:
            f = res.failures[0] if res.failures else None
            return f"stopping failed: {f.message if f else res.status}"
        return None

    def record_teardown(self, run: InterruptedRun) -> None:
        """Fetch the interrupted run's TEARDOWN_FILES that stop.yml wrote on each host and add them to its stored
        row (its stop and GPUs-free records, its manifest), as the run queue's row has them."""
        for host, dest in self.run_dests(run.run_dir):
            record.fetch_missing(host, node_run_dir(host, run.pr.run_id), dest, only=record.TEARDOWN_FILES)
        scrub_tree(run.run_dir, self.secrets)
        self.stamp_manifests(run.run_dir, run.pr)
        record.ingest_teardown(self.store, run.pr.seq, run.run_dir, [h.name for h in self.result_hosts])

    def run_dests(self, run_dir: Path) -> list[tuple[Host, Path]]:
        """(host, controller directory) of a run's files on every host, as run_arm.yml lays them out
        (run_arm_dest): a single host's and a multi-node head's in the run directory, a multi-node rank r's in
        node<r>-<host>/, each host's of several own servers in <host>/."""
        hosts = self.p.inventory.hosts
        if self.playbook == MULTINODE_PLAYBOOK:
            return [(h, run_dir if r == 0 else run_dir / f"node{r}-{h.name}") for r, h in enumerate(hosts)]
        return [(h, run_dir if len(hosts) == 1 else run_dir / h.name) for h in hosts]

    def interrupted_extravar(self, run: InterruptedRun) -> dict[str, Any]:
        """stop.yml's ``specab_interrupted_run``: the run's id, its bench seed (the manifest's, the arm's own where
        it has one) and, per host, the engine's Python (the manifest's
        probes) and the manifest's extra keys, those of a failed run's manifest (run_arm.yml's rescue): the
        interrupted phase's task and ``"<headline>: <reason>"``; the stop adds its own timings."""
        arm = self.arms[run.pr.arm]
        multinode = self.playbook == MULTINODE_PLAYBOOK
        dests = self.run_dests(run.run_dir)
        hosts: dict[str, Any] = {}
        for rank, (h, dest) in enumerate(dests):
            ready = read_json(dest / "ready.json")
            extra: dict[str, Any] = {
                "experiment_id": self.exp_id, "run_id": run.pr.run_id, "arm": run.pr.arm,
                "time_to_ready_s": ready.get("elapsed_s") if isinstance(ready, dict) and ready.get("ready") else None}
            if run.phase is not None:
                extra.update(failed_task=phases.display_task(run.phase, run.pr.arm),
                             failure=f"{phases.INTERRUPTED.format(host=h.name)}: {INTERRUPTED_REASON}")
            if multinode:
                extra.update(node_rank=rank, nnodes=len(dests))
            hosts[h.name] = {"engine_python": h.engine_build(arm.engine).cmd[0], "extra": extra}
        return {"run_id": run.pr.run_id, "seed": self.bench_settings(run.pr)["seed"], "hosts": hosts}

def decide_more_blocks(store: st.Store, target_ci: float, max_repeats: int) -> tuple[bool, str]:
    """Whether another block is needed for the speedup's interval to reach ``target_ci``
    (specab.analysis.measures.stats)."""
    more, reason = stats.decide_more_blocks(model.load_store(store.path), target_ci, max_repeats)
    return bool(more), str(reason)
