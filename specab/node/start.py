#!/usr/bin/env python3
"""Start the engine's launch script detached, in its own session, and record it in server.json.

    start.py --node-dir D --run-dir R --script R/launch.sh --host H --port P [--run-id ID] [--arm NAME]

Refuses (exit 1) when server.json names a server of ours that is still alive (or processes of
its session survive), or when the port is taken (names the PID, user and command holding it).
Returns at once; readiness is ready.py's job. stdout+stderr of the server go to R/server.log.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

from specab.node import cli, instance, osutil, ownership, ports, procfs
from specab.node.cli import ToolError
from specab.vocab import contract

LOG_MODE = contract.PRIVATE_RUN_FILES["server.log"]


@dataclass
class StartSpec:
    """One engine start: the launch script of a run directory, the address it will listen on."""
    node_dir: str
    run_dir: str
    script: str = cli.arg("the launch script (executable)")
    host: str
    port: int
    run_id: Optional[str] = cli.arg("default: the run directory's name", default=None)
    arm: Optional[str] = cli.arg("default: the run id without its '<seq>-' prefix", default=None)
    log: Optional[str] = cli.arg("default: RUN_DIR/server.log", default=None)
    instance: Optional[str] = cli.arg("the instance this server serves (docs/decisions/0011): recorded in server.json "
                                      "and the run's instance.json (instance.py)", default=None)


def parse_args(argv: Optional[Sequence[str]]) -> StartSpec:
    return cli.parse_spec(StartSpec, argv, "start.py", __doc__)


def check_previous(node_dir: str) -> Optional[Dict[str, Any]]:
    """Refuse when a recorded server of ours still lives; return a stale record otherwise."""
    rec = ownership.load_record(node_dir)
    if rec is None:
        return None
    path = os.path.join(node_dir, ownership.SERVER_JSON)
    if ownership.main_is_ours(rec):
        raise ToolError("%s names a live server of ours (pid %s, run %s, port %s); stop it first "
                        "(stop.py --node-dir %s)" % (path, rec["pid"], rec.get("run_id"), rec.get("port"),
                                                     node_dir))
    alive = ownership.members(rec)
    if alive:
        listed = "; ".join(procfs.describe_text(st.pid) for st in alive[:5])
        raise ToolError("the server recorded in %s has exited but %d process(es) of its session are still "
                        "alive (%s); run stop.py --node-dir %s to sweep them" % (path, len(alive), listed,
                                                                                 node_dir))
    return rec


def check_port(host: str, port: int) -> None:
    holders = ports.port_holders(port)
    if holders:
        who = "; ".join("PID %d, user %s, command %r" % (h["pid"], h["user"], h["command"]) for h in holders)
        raise ToolError("port %d is already taken (LISTEN) by %s; stop that process or choose another "
                        "port (server_args.port)" % (port, who), {"port": port, "holders": holders})
    err = ports.port_bindable(host, port)
    if err is not None:
        raise ToolError("port %d on %s cannot be bound (%s) and no process visible here holds it "
                        "(another network namespace or a user whose /proc is hidden?); choose another "
                        "port" % (port, host, err), {"port": port, "holders": []})


def ports_refused(node_dir: str, endpoints: Sequence[Sequence[Any]]) -> List[str]:
    """Why each ``(host, port)`` cannot be bound by the next server (``check_port``'s message), for the
    controller's preflight. A port held by the server a record of ours names is not a problem: the run's
    stop step frees it before the start."""
    node_dir = os.path.abspath(os.path.expanduser(node_dir))
    ours: set = set()
    for name in (ownership.SERVER_JSON, ownership.LAST_SERVER_JSON):
        try:
            rec = ownership.load_record(node_dir, name)
        except ToolError:
            continue                 # an unreadable record is the stop step's concern
        if rec is not None:
            ours.add(int(rec["pid"]))
            ours.update(st.pid for st in ownership.members(rec))
    problems = []
    for host, port in endpoints:
        holders = ports.port_holders(int(port))
        if holders and all(h["pid"] in ours for h in holders):
            continue
        try:
            check_port(str(host), int(port))
        except ToolError as exc:
            problems.append(exc.message)
    return problems


def start(a: StartSpec) -> Dict[str, Any]:
    """Start the launch script in its own session; the server record (also written to server.json)."""
    node_dir = os.path.abspath(os.path.expanduser(a.node_dir))
    run_dir = os.path.abspath(os.path.expanduser(a.run_dir))
    script = os.path.abspath(os.path.expanduser(a.script))
    run_id = a.run_id or os.path.basename(run_dir.rstrip("/"))
    arm = a.arm or (run_id.split("-", 1)[1] if "-" in run_id and run_id.split("-", 1)[0].isdigit() else run_id)
    log_path = os.path.abspath(a.log) if a.log else os.path.join(run_dir, "server.log")

    if not os.path.isfile(script):
        raise ToolError("launch script %s does not exist; the start role must deploy it first" % script)
    if not os.access(script, os.X_OK):
        raise ToolError("launch script %s is not executable; deploy it with mode 0700" % script)
    os.makedirs(node_dir, exist_ok=True)
    os.makedirs(run_dir, exist_ok=True)

    stale = check_previous(node_dir)
    check_port(a.host, a.port)

    # The engine's log may print its args (a secret --api-key among them): its owner's alone, also when a log of
    # an earlier start is truncated here (O_CREAT's mode applies only to a new file).
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, LOG_MODE)
    os.fchmod(log_fd, LOG_MODE)
    with os.fdopen(log_fd, "wb") as logf:
        started = time.time()
        proc = subprocess.Popen([script], cwd=run_dir, stdin=subprocess.DEVNULL, stdout=logf,
                                stderr=subprocess.STDOUT, close_fds=True, start_new_session=True)
    st = procfs.proc_stat(proc.pid)
    rec: Dict[str, Any] = {
        "pid": proc.pid,
        "pgid": os.getpgid(proc.pid) if st is None else st.pgrp,
        "sid": os.getsid(proc.pid) if st is None else st.session,
        "starttime": st.starttime if st else None,
        "port": a.port,
        "host": a.host,
        "run_id": run_id,
        "arm": arm,
        "started_at": started,
        "started_at_iso": osutil.now_iso(started),
        "launch": script,
        "run_dir": run_dir,
        "log": log_path,
        "user": procfs.proc_user(os.getpid()),
    }
    if a.instance is not None:
        instance.record_start(rec, run_dir, run_id, a.instance)
    osutil.write_json(os.path.join(node_dir, ownership.SERVER_JSON), rec)
    cli.log("started %s: pid %d (session %d), log %s" % (script, proc.pid, rec["sid"], log_path))
    out = dict(rec)
    if stale is not None:
        out["replaced_stale_record"] = {k: stale.get(k) for k in ("pid", "run_id", "started_at_iso")}
    return out


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    return start(parse_args(argv))


if __name__ == "__main__":
    sys.exit(cli.run_tool(main))
