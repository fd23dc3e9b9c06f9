#!/usr/bin/env python3
"""The node-side run queue's command line: the controller's commands (ensure, reset, wait, finish, stage) and
``serve``, the sequencer process itself (sequencer.py), which runs queued runs back to back in one process.

    sequence.py --spec-json TEXT|-   ({"command": C, ...the fields of SPECS[C]}: how enqueue.yml and collect_run.yml
                                      run it, through the specab_node module)
    sequence.py --node-dir D ensure --experiment-id X --idle-timeout S --lease-s S [--smi JSON]
                --gpus G --gpu-free-timeout S --gpu-free-threshold-mib M --stop-grace S
    sequence.py --node-dir D reset --experiment-id X --stop-grace S --gpu-free-timeout S
    sequence.py --node-dir D wait --run-id R --timeout S [--pack TAR [--also R2 ...]]
    sequence.py --node-dir D finish --experiment-id X
    sequence.py --node-dir D stage --experiment-id X [--finish] < batch.json   (a batch of runs)
    sequence.py --node-dir D serve --experiment-id X ...     (what ensure spawns)

The controller writes each run's directory (launch.sh, nccl.env, args.json), then its queue entry
``queue/<seq:06d>-<run_id>.json`` (``stage``: a whole batch from one JSON document, staging.py); the
sequencer claims the lowest-seq entry of its experiment and runs it with the node tools' logic
called in-process (no interpreter start per step): start → ready (polled every 50 ms) → env verify →
bench (client and GPU sampler as processes, started ahead and released at once) → stop → GPUs free →
manifest → done.json (runsteps.py), then the next entry.
A failure in any phase is recorded and the run is still stopped, its GPUs verified free, its
manifest and done.json written; GPUs that cannot be verified free halt the sequencer. Phases are
appended to ``runs/<run_id>/phases.jsonl`` as they begin. Contract: docs/architecture.md and
specab/node/README.md. stdlib only, like every node tool; imports its siblings.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import itertools
import json
import os
import subprocess
import sys
import tarfile
import time
import traceback
from dataclasses import asdict, dataclass, fields
from typing import Any, Callable, ContextManager, Dict, List, Optional, Sequence, Tuple, Type

from specab.node import cli, osutil, ownership, staging
from specab.node.cli import ToolError, UsageError
from specab.node.runqueue import (END_PREFIX, ENSURE_LOCK, ENTRY_RE, ID_RE, POLL_S,
                                  SEQUENCER_LOG, SERVE_LOCK, STAGING_DIR, Entry, log_tail,
                                  make_queue_dir, queue_dir, queued_names)
from specab.node.sequencer import Sequencer, ServeSpec


@dataclass
class ResetSpec:
    """Stop the sequencer of ours and empty the queue (a new driver session or a resume)."""
    node_dir: str
    experiment_id: str
    stop_grace: float
    gpu_free_timeout: float


@dataclass
class WaitSpec:
    """Until one run has its done.json; then, with ``pack``, its directory (and the done ``also`` runs) packed."""
    node_dir: str
    run_id: str
    timeout: float
    pack: Optional[str] = cli.arg("once the run is done, pack its directory into this tar (mode 0600, members "
                                     "<run id>/...) for the controller", default=None, metavar="TAR")
    also: List[str] = cli.arg("with --pack: also pack these later runs (queue order) that are done by then, up to "
                                 "the first one that is not (one fetch for every finished run)",
                                 default_factory=list, action="append", metavar="RUN_ID")


@dataclass
class FinishSpec:
    """No more runs will come for this experiment (the END marker)."""
    node_dir: str
    experiment_id: str


@dataclass
class StageSpec:
    """A batch of runs (staging.py's document: the JSON object, or its text read from stdin by the flags)."""
    node_dir: str
    experiment_id: str
    batch: Any
    finish: bool = cli.arg("then write the END marker, as `finish` does: these are the experiment's last runs",
                              default=False)


STAGE_HELP = ("read a batch of runs (JSON, specab/node/README.md) on stdin: write their run directories, then queue "
              "their entries in run order")
Spec = Any      # one of SPECS' dataclasses
# each command's spec; ensure takes the sequencer's own (it spawns `serve` with it)
SPECS: Dict[str, Type[Any]] = {"ensure": ServeSpec, "serve": ServeSpec, "reset": ResetSpec, "wait": WaitSpec,
                               "finish": FinishSpec, "stage": StageSpec}

# ---------------------------------------------------------------------------------------------
# The controller's commands
# ---------------------------------------------------------------------------------------------

def ensure_lock(node_dir: str) -> ContextManager[None]:
    """ensure/reset of one node directory, one at a time."""
    return osutil.flocked(os.path.join(node_dir, ENSURE_LOCK))


def live_record(node_dir: str) -> Optional[Dict[str, Any]]:
    rec = ownership.load_sequencer(node_dir)
    return rec if ownership.sequencer_alive(rec) else None


def spawn(a: ServeSpec) -> Dict[str, Any]:
    argv = cli.tool_argv(sys.executable, "sequence") + [
        cli.SPEC_FLAG, json.dumps(dict(asdict(a), command="serve"))]
    log_path = os.path.join(a.node_dir, SEQUENCER_LOG)
    with open(log_path, "ab") as logf:
        proc = subprocess.Popen(argv, cwd=a.node_dir, stdin=subprocess.DEVNULL, stdout=logf,
                                stderr=subprocess.STDOUT, close_fds=True, start_new_session=True)
    deadline = time.monotonic() + a.stop_grace + a.gpu_free_timeout + 60
    while True:
        rec = None
        with contextlib.suppress(ToolError):  # being written
            rec = ownership.load_sequencer(a.node_dir)
        if rec and rec.get("pid") == proc.pid:
            if rec.get("state") in ("halted", "exited"):
                raise ToolError("the sequencer for %s stopped at startup (%s): %s. Log tail of %s:\n%s"
                                % (a.experiment_id, rec.get("state"), rec.get("error") or rec.get("reason"),
                                   log_path, log_tail(log_path)), {"sequencer": rec})
            if rec.get("startup"):
                return rec
        if proc.poll() is not None:
            raise ToolError("the sequencer exited at once (status %s) without a record. Log tail of %s:\n%s"
                            % (proc.returncode, log_path, log_tail(log_path)))
        if time.monotonic() > deadline:
            raise ToolError("the sequencer (pid %d) did not finish its startup (stop leftovers, GPUs free) "
                            "within %.0fs. Log tail of %s:\n%s" % (proc.pid, a.stop_grace + a.gpu_free_timeout + 60,
                                                                  log_path, log_tail(log_path)))
        time.sleep(POLL_S / 2)


def cmd_ensure(a: ServeSpec) -> Dict[str, Any]:
    make_queue_dir(a.node_dir)
    with ensure_lock(a.node_dir):
        # runs will come: an END marker of an earlier session of this experiment no longer holds
        with contextlib.suppress(OSError):
            os.remove(os.path.join(queue_dir(a.node_dir), END_PREFIX + a.experiment_id))
        rec = live_record(a.node_dir)
        replaced = None
        if rec is not None and rec.get("experiment_id") == a.experiment_id and rec.get("state") in ("running", "idle"):
            return dict(rec, ensured="running")
        if rec is not None:
            # ours (recorded in sequencer.json) but for another experiment, or on its way out
            replaced = ownership.stop_sequencer(a.node_dir, a.stop_grace + a.gpu_free_timeout + 30)
        rec = spawn(a)
        out = dict(rec, ensured="started")
        if replaced is not None:
            out["replaced"] = replaced
        return out


def cmd_reset(a: ResetSpec) -> Dict[str, Any]:
    make_queue_dir(a.node_dir)
    with ensure_lock(a.node_dir):
        stopped = ownership.stop_sequencer(a.node_dir, a.stop_grace + a.gpu_free_timeout + 30)
        removed = []
        qdir = queue_dir(a.node_dir)
        staged = os.path.join(qdir, STAGING_DIR)      # `stage` writes entries here, then renames them in
        for d, prefix in ((qdir, ""), (staged, STAGING_DIR + "/")):
            try:
                names = sorted(os.listdir(d))
            except OSError:
                continue
            for name in names:
                if ENTRY_RE.match(name) or name.startswith(END_PREFIX) or name.endswith(".refused"):
                    with contextlib.suppress(OSError):
                        os.remove(os.path.join(d, name))
                        removed.append(prefix + name)
        return {"experiment_id": a.experiment_id, "sequencer": stopped, "removed": removed}


def write_end_marker(node_dir: str, experiment_id: str) -> str:
    path = os.path.join(make_queue_dir(node_dir), END_PREFIX + experiment_id)
    osutil.write_text(path, "%s\n" % osutil.now_iso(), 0o644)
    return path


def cmd_finish(a: FinishSpec) -> Dict[str, Any]:
    path = write_end_marker(a.node_dir, a.experiment_id)
    rec = ownership.load_sequencer(a.node_dir)
    return {"end_marker": path, "sequencer": rec if ownership.sequencer_alive(rec) else None}


def cmd_stage(a: StageSpec) -> Dict[str, Any]:
    """A batch of runs from one JSON document on stdin (staging.py): their run directories, then their
    entries renamed into queue/ in run order."""
    text = a.batch if isinstance(a.batch, str) else json.dumps(a.batch)
    runs = staging.parse(text, a.node_dir, a.experiment_id,
                         lambda data, name: Entry(data, a.node_dir, name))
    qdir = make_queue_dir(a.node_dir)
    out = dict(staging.stage(runs, qdir, os.path.join(qdir, STAGING_DIR)), experiment_id=a.experiment_id)
    if a.finish:                         # the last runs: no more will come (what `finish` does, after them)
        out["end_marker"] = write_end_marker(a.node_dir, a.experiment_id)
    return out


def pack_runs(node_dir: str, run_ids: Sequence[str], dest: str) -> None:
    """Pack finished runs' directories into the tar `dest`, each under its run id (``<run id>/...``; mode 0600:
    it holds the runs' env files), written aside and renamed into place, for the controller to fetch
    (collect_run.yml: one node call fewer per run, one fetch for every run that was done)."""
    tmp = "%s.%d.tmp" % (dest, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh, tarfile.open(fileobj=fh, mode="w") as tar:
            for run_id in run_ids:
                tar.add(os.path.join(node_dir, "runs", run_id), arcname=run_id)
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def finished_after(node_dir: str, run_ids: Sequence[str]) -> List[str]:
    """The leading runs of `run_ids` (queue order) that have their done.json now: the sequencer wrote nothing
    more into their directories (done.json is a run's last file); stops at the first one without it."""
    return list(itertools.takewhile(lambda run_id: os.path.isfile(os.path.join(node_dir, "runs", run_id, "done.json")),
                                    run_ids))


def cmd_wait(a: WaitSpec) -> Dict[str, Any]:
    for run_id in a.also:
        if not ENTRY_RE.match("000000-%s.json" % run_id):
            raise UsageError("--also %r is not a run id (<seq>-<arm>)" % run_id)
    result = wait_done(a)
    if a.pack:
        ids = [a.run_id] + finished_after(a.node_dir, [r for r in a.also if r != a.run_id])
        try:
            pack_runs(a.node_dir, ids, a.pack)
        except OSError as exc:
            raise ToolError("run %s is done but its directory could not be packed into %s: %s"
                            % (a.run_id, a.pack, exc), {"run_id": a.run_id})
    return result


def wait_done(a: WaitSpec) -> Dict[str, Any]:
    """Until run a.run_id has its done.json (returned verbatim); a ToolError naming the cause when the sequencer
    is gone or halted without it, the entry was refused or never queued, or a.timeout passes."""
    if not ENTRY_RE.match("000000-%s.json" % a.run_id):
        raise UsageError("--run-id %r is not a run id (<seq>-<arm>)" % a.run_id)
    run_dir = os.path.join(a.node_dir, "runs", a.run_id)
    done = os.path.join(run_dir, "done.json")
    log_path = os.path.join(a.node_dir, SEQUENCER_LOG)
    deadline = time.monotonic() + a.timeout
    missing_entry = 0
    next_check = 0.0

    def phase() -> str:
        try:
            with open(os.path.join(run_dir, "phases.jsonl")) as fh:
                lines = [l for l in fh.read().splitlines() if l.strip()]
            return json.loads(lines[-1]).get("phase", "?") if lines else "not claimed yet"
        except (OSError, ValueError):
            return "not claimed yet"

    while True:
        res = osutil.json_or_none(done)
        if res is not None:
            return cli.Verbatim(res)
        if time.monotonic() >= next_check:
            next_check = time.monotonic() + 0.5
            try:
                rec = ownership.load_sequencer(a.node_dir)
            except ToolError as exc:
                raise ToolError("run %s: %s" % (a.run_id, exc.message))
            alive = ownership.sequencer_alive(rec)
            if not alive or (rec or {}).get("state") in ("halted", "exited"):
                time.sleep(POLL_S)
                res = osutil.json_or_none(done)
                if res is not None:
                    return cli.Verbatim(res)
                if rec is None:
                    why = "no sequencer was started on this node (no %s)" % ownership.SEQUENCER_JSON
                else:
                    why = "the sequencer (pid %s, experiment %s) is %s%s" % (
                        rec.get("pid"), rec.get("experiment_id"),
                        rec.get("state") if alive or rec.get("state") in ("halted", "exited")
                        else "gone (it died without recording why: killed?)",
                        ": %s" % (rec.get("error") or rec.get("reason")) if (rec.get("error") or rec.get("reason"))
                        else "")
                raise ToolError("run %s has no done.json (last phase: %s): %s. Last lines of %s:\n%s\n"
                                "Stop what is left with stop.py (it stops the server of ours), then reset the queue "
                                "and enqueue the run again (driver resume)"
                                % (a.run_id, phase(), why, log_path, log_tail(log_path)),
                                {"run_id": a.run_id, "sequencer": rec})
            queued = any(ENTRY_RE.match(n) and n.endswith("-%s.json" % a.run_id) for n in queued_names(a.node_dir))
            claimed = os.path.exists(os.path.join(run_dir, "queue_entry.json"))
            missing_entry = 0 if (queued or claimed) else missing_entry + 1
            refused = [n for n in os.listdir(queue_dir(a.node_dir)) if n.endswith("-%s.json.refused" % a.run_id)] \
                if os.path.isdir(queue_dir(a.node_dir)) else []
            if missing_entry >= 2 and refused:
                raise ToolError("run %s: the sequencer refused its queue entry %s (malformed, or its run directory "
                                "is missing); the reason is in %s:\n%s" % (a.run_id, refused[0], log_path,
                                                                           log_tail(log_path)),
                                {"run_id": a.run_id, "sequencer": rec})
            if missing_entry >= 2:
                raise ToolError("run %s is neither queued (%s) nor claimed (%s): it was never enqueued, or a reset "
                                "removed it; enqueue it again" % (a.run_id, queue_dir(a.node_dir), run_dir),
                                {"run_id": a.run_id, "sequencer": rec})
        if time.monotonic() >= deadline:
            raise ToolError("run %s is not done after %gs (phase %s); raise the wait timeout if the run is just "
                            "long, or look at %s and %s" % (a.run_id, a.timeout, phase(),
                                                            os.path.join(run_dir, "server.log"), log_path),
                            {"run_id": a.run_id})
        time.sleep(POLL_S)


def cmd_serve(a: ServeSpec) -> Dict[str, Any]:
    make_queue_dir(a.node_dir)
    fd = os.open(os.path.join(a.node_dir, SERVE_LOCK), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        rec = None
        with contextlib.suppress(ToolError):
            rec = ownership.load_sequencer(a.node_dir)
        raise ToolError("another sequencer holds %s (recorded: pid %s, experiment %s); use `sequence.py ensure` "
                        "(it replaces it) or `stop.py` to stop it" % (os.path.join(a.node_dir, SERVE_LOCK),
                                                                      (rec or {}).get("pid"),
                                                                      (rec or {}).get("experiment_id")))
    cli.log("sequencer %d for %s started in %s" % (os.getpid(), a.experiment_id, a.node_dir))
    seq = Sequencer(a)
    try:
        rc = seq.serve()
    except Exception as exc:   # a bug: say so in sequencer.json, so that `wait` can tell the driver
        cli.log(traceback.format_exc())
        seq.save(state="halted", error="internal error of the sequencer: %s: %s (traceback in %s)"
                 % (type(exc).__name__, exc, os.path.join(a.node_dir, SEQUENCER_LOG)))
        rc = 1
    cli.log("sequencer %d: %s" % (os.getpid(), seq.record.get("state")))
    out = dict(seq.record)
    if rc != 0:
        raise ToolError(str(seq.record.get("error")), out)
    return out


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------

def parse_args(argv: Optional[Sequence[str]]) -> Tuple[str, Spec]:
    """(command, its spec): from ``--spec-json`` (the object's ``command`` picks the dataclass) or the flags."""
    obj = cli.spec_json(argv)
    if obj is not None:
        command = obj.pop("command", None)
        if command not in SPECS:
            raise UsageError("%s: the spec's \"command\" must be one of %s, got %r"
                             % (cli.SPEC_FLAG, ", ".join(SPECS), command))
        return command, checked(cli.spec_of(SPECS[command], obj))
    p = argparse.ArgumentParser(prog="sequence.py", description=__doc__.split("\n")[0])
    p.add_argument("--node-dir", required=True)
    sub = p.add_subparsers(dest="command", required=True)
    for name, cls in SPECS.items():     # --node-dir comes before the command; stage's batch on stdin
        sp = sub.add_parser(name, help=STAGE_HELP) if name == "stage" else sub.add_parser(name)
        cli.spec_flags(sp, cls, skip=("node_dir", "batch"))
    a = p.parse_args(argv)
    if a.command == "stage":
        a.batch = sys.stdin.read()
    cls = SPECS[a.command]
    return a.command, checked(cls(**{f.name: getattr(a, f.name) for f in fields(cls)}))


def checked(spec: Spec) -> Spec:
    """The spec with its node directory absolute; a malformed experiment id is a usage error."""
    spec.node_dir = os.path.abspath(os.path.expanduser(spec.node_dir))
    experiment_id = getattr(spec, "experiment_id", None)
    if experiment_id is not None and not ID_RE.match(str(experiment_id)):
        raise UsageError("experiment_id must match [A-Za-z0-9][A-Za-z0-9._-]*, got %r" % experiment_id)
    return spec


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    command, a = parse_args(argv)
    os.makedirs(a.node_dir, exist_ok=True)
    commands: Dict[str, Callable[[Any], Dict[str, Any]]] = {
        "ensure": cmd_ensure, "reset": cmd_reset, "wait": cmd_wait, "finish": cmd_finish, "serve": cmd_serve,
        "stage": cmd_stage}
    return commands[command](a)


if __name__ == "__main__":
    sys.exit(cli.run_tool(main))
