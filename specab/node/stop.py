#!/usr/bin/env python3
"""Stop the server recorded in server.json: SIGTERM → grace → SIGKILL → sweep orphans.

    stop.py --node-dir D --smi '["nvidia-smi"]' --grace S [--force-foreign] [--out F]

"Ours" is only what server.json recorded at start (pid, process group, session): nothing is
ever killed by name. Steps: SIGTERM to the recorded process group (and to processes of our session
outside it); poll until the group and the session are gone (no fixed sleep); after the grace period SIGKILL the group and every process
left in our session; then sweep: GPU compute processes whose session id is ours (workers that
left the group, renamed via prctl, or orphaned) and any process still in our session/group are
SIGKILLed. GPU compute processes that are not ours are reported and left alone unless
``--force-foreign``. Every signal is recorded with its time. Idempotent: with nothing recorded
the answer is ``{"was_running": false}``. On success server.json becomes last_server.json.

The engine's own shutdown is recorded (``shutdown``), both SGLang styles (engines-2026.md A7; the lines
and which version uses which style: engines.py): 0.5.23 drains, sends ShutdownReq to its schedulers, kills
its children only and exits normally; 0.5.9 and 0.5.17 drain and SIGKILL their whole tree, themselves
included (status -9; 0.5.17 logs ``kill_process_tree called: parent_pid=P, include_parent=True``). From
the server log written during this stop (the drain begun and done, ShutdownReq, children the engine saw
crash, its kill_process_tree call), which processes were gone before any SIGKILL of ours, and the main
process's exit status where this process is its parent (the run queue's sequencer started it; a per-run
stop.py is not, and says so).

A live sequencer of ours (``sequence.py serve``, recorded in sequencer.json with its pid and start
time) is stopped FIRST (SIGTERM, poll, SIGKILL after ``--sequencer-grace``): it would otherwise
start the next queued run right after this stop. On SIGTERM it stops its own server and marks its
run interrupted; the server stop that follows then usually finds nothing left. The output then
has a ``sequencer`` key (absent when no sequencer.json exists).

The recorded run's helpers (its run directory's helpers.json: the bench tool, its client and its GPU sampler, a
non-head rank's GPU sampler) are ended before its server (``helpers_ended``): they are in none of the server's
sessions, and after the driver's Ctrl-C cancels a per-run playbook nothing else ends them; a client would go on
sending requests to the stopping server. Each is ours only while its pid runs with the recorded start time and
its tool in its command line. The run queue's sequencer ends its own helpers (its stop passes
``helpers=False``).
"""
from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from specab.node import cli, instance, nvsmi, osutil, ownership, procfs
from specab.node.cli import ToolError
from specab.vocab import engines


@dataclass
class StopSpec:
    """One stop of the server (and sequencer) of ours recorded in a node directory."""
    node_dir: str
    smi: List[str] = cli.arg('nvidia-smi argv as a JSON list, e.g. \'["nvidia-smi"]\'')
    grace: float = cli.arg("seconds between SIGTERM and SIGKILL (timeouts.stop_grace_s)")
    kill_wait: float = cli.arg("seconds to wait for processes to vanish after SIGKILL", default=15.0)
    force_foreign: bool = cli.arg("also kill GPU compute processes that are NOT ours (never the default)",
                                     default=False)
    smi_timeout: float = nvsmi.DEFAULT_SMI_TIMEOUT
    out: Optional[str] = cli.arg("also write the JSON result to this file (stop.json)", default=None)
    sequencer_grace: Optional[float] = cli.arg(
        "seconds between SIGTERM and SIGKILL for a live sequencer (default: --grace + 90: it first stops its server "
        "and waits for free GPUs)", default=None)


def parse_args(argv: Optional[Sequence[str]]) -> StopSpec:
    return cli.parse_spec(StopSpec, argv, "stop.py", __doc__)


class Stopper(object):
    """One stop: keeps the signal log and the clock. ``rec`` None: nothing of ours is recorded."""

    def __init__(self, rec: Optional[Dict[str, Any]]) -> None:
        self.rec = rec
        self.pid, self.pgid, self.sid = ownership.record_ids(rec) if rec is not None else (None, None, None)
        self.t0 = time.time()
        self.signals: List[Dict[str, Any]] = []

    def rel(self) -> float:
        return round(time.time() - self.t0, 4)

    def send(self, sig: int, target: str, ident: int, why: str) -> bool:
        """Send ``sig`` to a group (``target='pgid'``) or a process; log it; False if nothing was there."""
        entry = ownership.send_signal(sig, target, ident, why, self.t0)
        self.signals.append(entry)
        return bool(entry["delivered"])

    def remaining(self) -> List[procfs.ProcStat]:
        return ownership.members(self.rec) if self.rec is not None else []

    def wait_gone(self, timeout: float) -> bool:
        return osutil.poll_until(lambda: not self.remaining(), timeout, 0.05)

    def owns_session(self, sid: Optional[int]) -> bool:
        return (self.rec is not None and sid is not None and sid == self.sid
                and ownership.session_is_ours(self.rec))


def sweep_gpu(st: Stopper, smi: Sequence[str], timeout: float, force_foreign: bool) -> Dict[str, Any]:
    """Kill GPU compute processes of our session; report (or, when forced, kill) foreign ones."""
    apps = nvsmi.query_compute_apps(smi, timeout)
    orphans, foreign = [], []
    for app in apps:
        pid = app.get("pid")
        if not isinstance(pid, int) or pid <= 1 or pid == os.getpid():
            continue
        sid = procfs.pid_session(pid)
        info = dict(app, session=sid)
        if st.owns_session(sid):
            orphans.append(info)
            st.send(signal.SIGKILL, "pid", pid, "GPU compute process in our session %d (orphan)" % st.sid)
        else:
            d = procfs.describe_process(pid)
            info.update(user=d["user"], command=d["command"], visible=d["visible"])
            foreign.append(info)
            if force_foreign and d["visible"]:
                st.send(signal.SIGKILL, "pid", pid, "foreign GPU compute process (--force-foreign)")
    return {"gpu_orphans": orphans, "gpu_foreign": foreign, "compute_apps_seen": len(apps)}


def sweep_leftovers(rec: Optional[Dict[str, Any]], st: Stopper) -> List[int]:
    """SIGKILL every process still alive in the session/group of a record; return their pids."""
    if rec is None:
        return []
    left = ownership.members(rec)
    for p in left:
        st.send(signal.SIGKILL, "pid", p.pid, "still in our session %d / group %d" % (p.session, p.pgrp))
    return [p.pid for p in left]


def log_size(rec: Dict[str, Any]) -> Optional[int]:
    try:
        return os.path.getsize(str(rec.get("log")))
    except (OSError, TypeError):
        return None


def log_since(rec: Dict[str, Any], offset: Optional[int], limit: int = 1 << 20) -> str:
    """What the server log gained since ``offset`` (at most ``limit`` bytes)."""
    if offset is None:
        return ""
    try:
        with open(str(rec.get("log")), "rb") as fh:
            fh.seek(offset)
            return fh.read(limit).decode("utf-8", "replace")
    except (OSError, TypeError):
        return ""


def main_exit(pid: Optional[int]) -> Dict[str, Any]:
    """The main process's exit status when this process is its parent (and it has exited), else why not."""
    if pid is None:
        return {"observable": False, "why": "no pid recorded"}
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return {"observable": False, "why": "the server is not a child of this process (start.py launched it "
                                            "and exited), so its exit status cannot be read"}
    except OSError as exc:
        return {"observable": False, "why": "waitpid: %s" % exc}
    if done != pid:
        return {"observable": False, "why": "the main process has not exited"}
    if os.WIFSIGNALED(status):
        return {"observable": True, "signal": os.WTERMSIG(status), "status": -os.WTERMSIG(status)}
    return {"observable": True, "code": os.WEXITSTATUS(status), "status": os.WEXITSTATUS(status)}


def shutdown_record(text: str, initially: List[procfs.ProcStat], pid: Optional[int], escalated: bool,
                    exit_info: Dict[str, Any]) -> Dict[str, Any]:
    """How the engine shut itself down, from the log it wrote during this stop (engines.shutdown_marks) and
    the main process's exit (``exit_info``, from ``main_exit``): the style and its evidence."""
    marks = engines.shutdown_marks(text)
    children = [p.pid for p in initially if p.pid != pid]
    out: Dict[str, Any] = {"style": engines.shutdown_style(marks, exit_info, escalated, pid)}
    out.update(marks)
    out.update(children=children, children_gone_before_our_kill=not escalated, main_exit=exit_info)
    return out


# How long a run's helpers get to exit on SIGTERM (the client and the bench tool die at once, the sampler ends its
# loop) before SIGKILL.
HELPER_GRACE_S = 5.0
# The order they are ended in: the bench tool first (it would react to its client's end: a last GPU sample, its
# sampler told to stop), then its client, then the samplers.
HELPER_ORDER = ("bench", "loadgen", "gpusample")


def end_helpers(rec: Optional[Dict[str, Any]], st: Stopper, kill_wait: float) -> Tuple[List[Dict[str, Any]], str]:
    """End the helpers recorded in the run directory of ``rec`` (server.json's ``run_dir``) that still run:
    SIGTERM, their exit polled for, SIGKILL after HELPER_GRACE_S; their record goes once none runs. Returns the
    helpers signalled (tool, pid) and, when some survived SIGKILL, what they are ('' when none did): the caller
    stops the server first and fails after (the record is kept for a retry)."""
    run_dir = rec.get("run_dir") if rec is not None else None
    if not isinstance(run_dir, str) or not run_dir:
        return [], ""
    found = sorted(ownership.live_helpers(run_dir),
                   key=lambda e: HELPER_ORDER.index(e["tool"]) if e["tool"] in HELPER_ORDER else len(HELPER_ORDER))
    ended = [{"tool": e["tool"], "pid": e["pid"]} for e in found]
    for e in found:
        st.send(signal.SIGTERM, "pid", int(e["pid"]), "the run's %s (%s)" % (e["tool"], ownership.HELPERS_JSON))

    def running() -> List[Dict[str, Any]]:
        return [e for e in found if ownership.helper_is_ours(e)]
    if not osutil.poll_until(lambda: not running(), HELPER_GRACE_S, 0.05):
        for e in running():
            st.send(signal.SIGKILL, "pid", int(e["pid"]), "the run's %s survived SIGTERM for %gs"
                    % (e["tool"], HELPER_GRACE_S))
        if not osutil.poll_until(lambda: not running(), kill_wait, 0.05):
            return ended, ("the run's helpers survived SIGKILL for %gs (uninterruptible sleep?): %s; %s is kept so "
                           "stop can be retried" % (kill_wait, "; ".join(procfs.describe_text(int(e["pid"]))
                                                                         for e in running()), ownership.HELPERS_JSON))
    ownership.forget_helpers(run_dir)
    return ended, ""


def idle_stop(a: StopSpec, node_dir: str, helpers: bool = True) -> Dict[str, Any]:
    """Nothing recorded: the previous server's run's helpers and the survivors of its session (still ours) ended
    and, only with --force-foreign, the GPU compute processes."""
    last = ownership.load_record(node_dir, ownership.LAST_SERVER_JSON)
    st = Stopper(last)
    out: Dict[str, Any] = {"was_running": False}
    ended, helpers_left = end_helpers(last, st, a.kill_wait) if helpers else ([], "")
    if ended:
        out["helpers_ended"] = ended
    killed = sweep_leftovers(last, st)
    if killed:
        out["leftovers_killed"] = killed
    if a.force_foreign:
        try:
            out.update(sweep_gpu(st, a.smi, a.smi_timeout, True))
        except nvsmi.SmiError as exc:
            raise ToolError(exc.message, dict(out, signals=st.signals))
    out["signals"] = st.signals
    if killed and not st.wait_gone(a.kill_wait):
        raise ToolError("processes of the previous server's session %d survived SIGKILL: %s"
                        % (st.sid, "; ".join(procfs.describe_text(p.pid) for p in st.remaining())), out)
    if helpers_left:
        raise ToolError(helpers_left, out)
    return out


def stop(a: StopSpec, stop_sequencer: bool = True,
         on_gone: Optional[Callable[[], None]] = None, helpers: bool = True) -> Dict[str, Any]:
    """The whole stop: a live sequencer of ours first (unless ``stop_sequencer`` is false: the
    sequencer itself stopping its own server), then the run's helpers (unless ``helpers`` is false: the
    sequencer's own, ended by it), then the server recorded in server.json.
    ``on_gone`` is called once the recorded group and session are empty, before the GPU sweep
    (the sequencer starts its GPU-free wait there; server.json still names our session)."""
    node_dir = os.path.abspath(os.path.expanduser(a.node_dir))
    seq = None
    if stop_sequencer:
        grace = a.sequencer_grace if a.sequencer_grace is not None else a.grace + 90.0
        seq = ownership.stop_sequencer(node_dir, grace, a.kill_wait)
    try:
        out = stop_server(a, on_gone, helpers)
    except ToolError as exc:
        if seq is not None:
            exc.result["sequencer"] = seq
        raise
    if seq is not None:
        out["sequencer"] = seq
    return out


def stop_server(a: StopSpec, on_gone: Optional[Callable[[], None]] = None,
                helpers: bool = True) -> Dict[str, Any]:
    node_dir = os.path.abspath(os.path.expanduser(a.node_dir))
    rec = ownership.load_record(node_dir)
    if rec is None:
        return idle_stop(a, node_dir, helpers)

    st = Stopper(rec)
    out = {"was_running": ownership.main_is_ours(rec), "pid": st.pid, "pgid": st.pgid, "sid": st.sid,
           "run_id": rec.get("run_id"), "arm": rec.get("arm"), "escalated": False, "grace_s": a.grace}
    # before the server: a client must not go on sending requests to a server that drains
    out["helpers_ended"], helpers_left = end_helpers(rec, st, a.kill_wait) if helpers else ([], "")
    initially = st.remaining()
    out["processes_at_start"] = [{"pid": p.pid, "name": procfs.display_name(p.pid)} for p in initially]
    log_offset = log_size(rec)
    if initially:
        out["was_running"] = True
        st.send(signal.SIGTERM, "pgid", st.pgid, "stop: terminate the server's process group")
        for p in initially:
            if p.pgrp != st.pgid:  # ours (same session) but outside the group: the group signal misses it
                st.send(signal.SIGTERM, "pid", p.pid, "in our session %d but in group %d" % (st.sid, p.pgrp))
        if st.wait_gone(a.grace):
            out["term_to_gone_s"] = st.rel()
        else:
            out["escalated"] = True
            survivors = st.remaining()
            out["survivors_after_grace"] = [{"pid": p.pid, "name": procfs.display_name(p.pid)}
                                            for p in survivors]
            t_kill = time.time()
            st.send(signal.SIGKILL, "pgid", st.pgid, "grace period of %gs expired" % a.grace)
            for p in st.remaining():
                if p.pgrp != st.pgid:
                    st.send(signal.SIGKILL, "pid", p.pid, "in our session %d but another group" % st.sid)
            if not st.wait_gone(a.kill_wait):
                left = st.remaining()
                out["signals"] = st.signals
                raise ToolError("processes of our server survived SIGKILL for %gs (uninterruptible sleep?): %s; "
                                "server.json is kept so stop can be retried"
                                % (a.kill_wait, "; ".join(procfs.describe_text(p.pid) for p in left)), out)
            out["kill_to_gone_s"] = round(time.time() - t_kill, 4)
        out["shutdown"] = shutdown_record(log_since(rec, log_offset), initially, st.pid, out["escalated"],
                                          main_exit(st.pid))
    if on_gone is not None:
        on_gone()

    # Sweep: GPU compute processes of our session, then anything left in the session/group.
    try:
        out.update(sweep_gpu(st, a.smi, a.smi_timeout, a.force_foreign))
    except nvsmi.SmiError as exc:
        out["signals"] = st.signals
        raise ToolError("%s. The server's processes are gone, but GPU orphans could not be checked; "
                        "server.json is kept" % exc.message, out)
    out["leftovers_killed"] = sweep_leftovers(rec, st)
    if out["gpu_orphans"] or out["leftovers_killed"]:
        if not st.wait_gone(a.kill_wait):
            out["signals"] = st.signals
            raise ToolError("orphaned processes of our session survived SIGKILL: %s"
                            % "; ".join(procfs.describe_text(p.pid) for p in st.remaining()), out)
    out["signals"] = st.signals
    out["total_s"] = st.rel()
    out["stopped_at"] = time.time()

    last = dict(rec)
    last["stopped_at"] = out["stopped_at"]
    last["stop"] = {k: out.get(k) for k in ("escalated", "term_to_gone_s", "kill_to_gone_s", "total_s", "shutdown")}
    osutil.write_json(os.path.join(node_dir, ownership.LAST_SERVER_JSON), last)
    os.remove(os.path.join(node_dir, ownership.SERVER_JSON))
    released = instance.release(node_dir, rec)     # an instance's server: the last run's part of its log
    if released is not None:
        out["instance_log"] = released
    if helpers_left:       # the server is stopped all the same; a retry finds them through last_server.json
        raise ToolError(helpers_left, out)
    if out["gpu_foreign"] and not a.force_foreign:
        cli.log("note: GPU compute processes that are not ours were left alone: %s"
                   % "; ".join("PID %s user %s %r" % (f["pid"], f.get("user"), f.get("command"))
                               for f in out["gpu_foreign"]))
    return out


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    a = parse_args(argv)
    return cli.recorded(a.out, lambda: stop(a))


if __name__ == "__main__":
    sys.exit(cli.run_tool(main))
