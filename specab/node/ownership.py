"""What is ours: the records that prove a process is ours, by pid and start time (``server.json`` of the server
start.py started, ``helpers.json`` of a run's helper processes, ``sequencer.json`` of the run queue's process), and
the signals sent only to them. Nothing is ever matched or killed by name (stdlib only)."""
from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from specab.node.cli import ToolError, log
from specab.node.osutil import json_or_none, poll_until, read_json, write_json
from specab.node.procfs import ProcStat, all_stats, describe_text, proc_cmdline, proc_stat
from specab.vocab import contract


SERVER_JSON = "server.json"


LAST_SERVER_JSON = "last_server.json"


def load_record(node_dir: str, name: str = SERVER_JSON) -> Optional[Dict[str, Any]]:
    path = os.path.join(node_dir, name)
    if not os.path.exists(path):
        return None
    try:
        rec = read_json(path)
    except FileNotFoundError:
        return None        # removed between the check and the read (stop.py renaming it): no record
    except (OSError, ValueError) as exc:
        raise ToolError("%s is unreadable (%s); inspect it, stop the server by hand if one runs, then "
                        "remove the file" % (path, exc))
    if not isinstance(rec, dict) or not isinstance(rec.get("pid"), int):
        raise ToolError("%s does not record a server pid; inspect it and remove it" % path)
    for key in ("pid", "pgid", "sid"):
        v = rec.get(key)
        if v is not None and (not isinstance(v, int) or v <= 1):
            raise ToolError("%s records %s=%r, which can never be a server of ours; inspect it and remove it"
                            % (path, key, v))
    return rec


def record_ids(rec: Dict[str, Any]) -> Tuple[int, int, int]:
    pid = int(rec["pid"])
    return pid, int(rec.get("pgid") or pid), int(rec.get("sid") or rec.get("pgid") or pid)


def main_is_ours(rec: Dict[str, Any]) -> bool:
    """The recorded main pid is alive and is the very process we started (start time matches)."""
    pid = int(rec["pid"])
    st = proc_stat(pid)
    if st is None or not st.alive:
        return False
    want = rec.get("starttime")
    return want is None or int(want) == st.starttime


def session_is_ours(rec: Dict[str, Any]) -> bool:
    """False when the recorded session id now belongs to an unrelated, newer session leader.

    Linux keeps a pid allocated while any process uses it as pgid/sid, so a live member of our
    session cannot share its sid with a foreign session; only after every member is gone can
    the number be reused, by a new leader whose start time differs from ours.
    """
    _, _, sid = record_ids(rec)
    leader = proc_stat(sid)
    if leader is None or leader.session != sid:
        return True
    want = rec.get("starttime")
    return want is None or int(want) == leader.starttime


def members(rec: Dict[str, Any], stats: Optional[List[ProcStat]] = None) -> List[ProcStat]:
    """Alive processes of our recorded session or process group (plus the main pid if ours)."""
    if not session_is_ours(rec):
        return []
    pid, pgid, sid = record_ids(rec)
    stats = all_stats() if stats is None else stats
    me = os.getpid()
    out = []
    for st in stats:
        if st.pid == me or not st.alive:
            continue
        if st.session == sid or st.pgrp == pgid or (st.pid == pid and main_is_ours(rec)):
            out.append(st)
    return out


# The helper processes a run starts besides its server (the bench step's client and GPU sampler, the bench tool
# itself, a non-head rank's GPU sampler) are in no session of the server's: when the process that owns them is cut
# off (the per-run playbook cancelled by the driver's Ctrl-C), only this record lets the stop end them. A helper is
# ours while its pid is alive with the recorded start time and its command line names its tool.
HELPERS_JSON = contract.HELPERS_JSON


def record_helpers(run_dir: str, helpers: Sequence[Tuple[str, int]]) -> None:
    """Record ``(tool, pid)`` of each helper of the run in ``run_dir``/helpers.json (replacing the record)."""
    entries = []
    for tool, pid in helpers:
        st = proc_stat(pid)
        if st is not None:
            entries.append({"tool": tool, "pid": pid, "starttime": st.starttime})
    write_json(os.path.join(run_dir, HELPERS_JSON), {"helpers": entries})


def forget_helpers(run_dir: str) -> None:
    """The run's helpers are gone: their record goes (a run directory keeps no stale pids)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(run_dir, HELPERS_JSON))


def helper_is_ours(entry: Dict[str, Any]) -> bool:
    """The recorded helper still runs: its pid alive with the recorded start time, its tool in its command line."""
    try:
        pid, starttime, tool = int(entry["pid"]), int(entry["starttime"]), str(entry["tool"])
    except (KeyError, TypeError, ValueError):
        return False
    st = proc_stat(pid)
    return (pid > 1 and st is not None and st.alive and st.starttime == starttime
            and tool in proc_cmdline(pid).split())


def recorded_helpers(run_dir: str) -> List[Dict[str, Any]]:
    """The helpers recorded for the run in ``run_dir``, running or not (none without a readable record)."""
    rec = json_or_none(os.path.join(run_dir, HELPERS_JSON))
    entries = rec.get("helpers") if isinstance(rec, dict) else None
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


def live_helpers(run_dir: str) -> List[Dict[str, Any]]:
    """The recorded helpers of the run in ``run_dir`` that still run (none without a readable record)."""
    return [e for e in recorded_helpers(run_dir) if helper_is_ours(e)]


SEQUENCER_JSON = "sequencer.json"


def load_sequencer(node_dir: str) -> Optional[Dict[str, Any]]:
    """The sequencer record of ``node_dir`` (None when there is none); refuses a malformed one."""
    path = os.path.join(node_dir, SEQUENCER_JSON)
    if not os.path.exists(path):
        return None
    try:
        rec = read_json(path)
    except (OSError, ValueError) as exc:
        raise ToolError("%s is unreadable (%s); inspect it, stop the sequencer by hand if one runs "
                        "(its pid is in sequencer.log), then remove the file" % (path, exc))
    if not isinstance(rec, dict) or not isinstance(rec.get("pid"), int) or rec["pid"] <= 1:
        raise ToolError("%s does not record a sequencer pid; inspect it and remove it" % path)
    return rec


def sequencer_alive(rec: Optional[Dict[str, Any]]) -> bool:
    """The recorded sequencer pid is alive and is the very process recorded (start time matches)."""
    if not rec or not isinstance(rec.get("pid"), int) or rec["pid"] <= 1:
        return False
    st = proc_stat(int(rec["pid"]))
    if st is None or not st.alive:
        return False
    want = rec.get("starttime")
    return want is not None and int(want) == st.starttime


def send_signal(sig: int, target: str, ident: int, why: str, t0: float, what: str = "") -> Dict[str, Any]:
    """Send ``sig`` to a group (``target='pgid'``) or a process and log it; the signal log entry
    (``delivered`` false with a ``note`` when nothing was there). Never kill(0/-1/1)."""
    if ident is None or ident <= 1:
        raise AssertionError("refusing to signal %s %r" % (target, ident))
    entry: Dict[str, Any] = {"signal": signal.Signals(sig).name, "target": target, "id": ident, "why": why,
                             "t": round(time.time(), 4), "t_rel_s": round(time.time() - t0, 4)}
    try:
        if target == "pgid":
            os.killpg(ident, sig)
        else:
            os.kill(ident, sig)
        entry["delivered"] = True
    except ProcessLookupError:
        entry["delivered"] = False
        entry["note"] = "no such process/group"
    except PermissionError as exc:
        entry["delivered"] = False
        entry["note"] = "permission denied: %s" % exc
    log("%s -> %s%s %d (%s)%s" % (entry["signal"], what, target, ident, why,
                                  "" if entry["delivered"] else " [%s]" % entry["note"]))
    return entry


def stop_sequencer(node_dir: str, grace: float, kill_wait: float = 15.0) -> Optional[Dict[str, Any]]:
    """Stop the live sequencer recorded in ``node_dir``/sequencer.json: SIGTERM, poll every 50 ms,
    SIGKILL (its process group when it leads one, else the pid) after ``grace`` seconds.

    None when no record exists; ``{"was_running": false, ...}`` when the recorded process is gone
    (or is not the recorded one any more: pid reuse). The caller is never signalled itself.
    On SIGTERM the sequencer stops its own server and marks its run interrupted before it exits.
    """
    rec = load_sequencer(node_dir)
    if rec is None:
        return None
    out: Dict[str, Any] = {"was_running": False, "pid": rec.get("pid"),
                           "experiment_id": rec.get("experiment_id"), "run_id": rec.get("run_id"),
                           "state": rec.get("state"), "signals": []}
    pid = int(rec["pid"])
    if pid == os.getpid() or not sequencer_alive(rec):
        return out
    out["was_running"] = True
    t0 = time.time()

    def send(sig: int, target: str, ident: int, why: str) -> None:
        out["signals"].append(send_signal(sig, target, ident, why, t0, "sequencer "))

    send(signal.SIGTERM, "pid", pid, "stop the sequencer first (it stops its server and records the run)")
    if poll_until(lambda: not sequencer_alive(rec), grace, 0.05):
        out["term_to_gone_s"] = round(time.time() - t0, 4)
        out["escalated"] = False
        return out
    out["escalated"] = True
    st = proc_stat(pid)
    t_kill = time.time()
    leads_group = st is not None and st.pgrp == pid and st.session == pid
    send(signal.SIGKILL, "pgid" if leads_group else "pid", pid, "grace period of %gs expired" % grace)
    if not poll_until(lambda: not sequencer_alive(rec), kill_wait, 0.05):
        raise ToolError("the sequencer (pid %d) survived SIGKILL for %gs (uninterruptible sleep?): %s"
                        % (pid, kill_wait, describe_text(pid)), {"sequencer": out})
    out["kill_to_gone_s"] = round(time.time() - t_kill, 4)
    return out
