#!/usr/bin/env python3
"""The node lease: one experiment per node directory at a time.

    lease.py --spec-json TEXT|-   (a LeaseSpec: {node_dir, command, holder, stale_s, token}; how every caller runs it)
    lease.py --node-dir D take --holder JSON --stale-s S
    lease.py --node-dir D touch --token T
    lease.py --node-dir D hold --token T      (the holder was interrupted: its sequencer claims and starts nothing)
    lease.py --node-dir D release --token T
    lease.py --node-dir D show --stale-s S   (the holder, or null: the node is free; creates nothing)

An experiment's controller (driver.py) takes the lease of every node directory it uses before it touches
anything there (the first enqueue or stop), refreshes it while it runs (``touch``), and releases it on every
exit path. The lease is ``<node dir>/experiment.lease``, a JSON holder record
``{experiment_id, controller_host, controller_pid, started_at, started_at_iso, token}`` written by an
exclusive create (O_EXCL) under an flock of ``experiment.lease.lock``, so two controllers can never both
hold it. A second controller is refused (exit 1, ``"held": true`` and the holder in the JSON).

The lease file's modification time is the controller's one sign of life: its heartbeat (``touch``, every
``specab_lease_heartbeat_s``) refreshes it. A stale lease is broken with a notice: the holder gave no sign of life
for ``--stale-s`` seconds, or its controller ran on this very host and its pid is gone. The run queue's sequencer
reads the same file (``controller_gone``): it claims no further run once its experiment's controller is gone, and
stops at once when its controller puts the lease on hold (``hold``: ``hold_at`` in the record, ``on_hold``).

Imports only ``cli`` and ``osutil``: the driver sends it with them as a ``python -c`` program
(driver/nodeprogram.py) before the node tools are deployed. Prints one JSON object on stdout; exit 0 success, 1
refused or failed (``error``), 2 usage.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import sys
import time
from dataclasses import dataclass
from typing import Any, ContextManager, Dict, Optional, Sequence, cast

from specab.node import cli, osutil

LEASE_FILE = "experiment.lease"
LOCK_FILE = "experiment.lease.lock"
HOLDER_KEYS = ("experiment_id", "controller_host", "controller_pid", "started_at", "token")


COMMANDS = ("take", "touch", "hold", "release", "show")


class LeaseError(cli.ToolError):
    """Refused or failed; ``result`` goes into the JSON output."""


@dataclass
class LeaseSpec:
    """One call of the lease tool on one node directory."""
    node_dir: str
    command: str                                 # take | touch | hold | release | show
    holder: Optional[Dict[str, Any]] = None      # take: the holder record
    stale_s: Optional[float] = None              # take, show: specab_lease_stale_s
    token: Optional[str] = None                  # touch, hold, release: the holder's token


NEEDS = {"take": ("holder", "stale_s"), "show": ("stale_s",), "touch": ("token",), "hold": ("token",),
         "release": ("token",)}


def lease_path(node_dir: str) -> str:
    return os.path.join(node_dir, LEASE_FILE)


def locked(node_dir: str) -> ContextManager[None]:
    return osutil.flocked(os.path.join(node_dir, LOCK_FILE))


def read_holder(node_dir: str) -> Optional[Dict[str, Any]]:
    """The holder record, None when there is none; an unreadable record is returned as such."""
    try:
        with open(lease_path(node_dir)) as fh:
            text = fh.read()
    except FileNotFoundError:
        return None
    try:
        rec = json.loads(text)
    except ValueError:
        rec = None
    return rec if isinstance(rec, dict) else {"unreadable": text[:200]}


def last_sign_of_life(node_dir: str) -> float:
    """When the holder last gave a sign of life: the lease file's modification time (0.0 without a lease)."""
    try:
        return os.stat(lease_path(node_dir)).st_mtime
    except OSError:
        return 0.0


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stale_reason(node_dir: str, holder: Dict[str, Any], stale_s: float) -> Optional[str]:
    """Why the holder is dead, or None while it may be alive."""
    if "unreadable" in holder:
        return "the lease file is unreadable"
    age = time.time() - last_sign_of_life(node_dir)
    if stale_s > 0 and age > stale_s:
        return "no sign of life from its controller for %.0f s (more than %g s)" % (age, stale_s)
    pid = holder.get("controller_pid")
    if holder.get("controller_host") == socket.gethostname() and isinstance(pid, int) and not pid_alive(pid):
        return "its controller (pid %d on this host) is gone" % pid
    return None


def controller_gone(node_dir: str, experiment_id: str, since: float, stale_s: float) -> Optional[str]:
    """Why the controller of ``experiment_id`` is gone from this node (the sequencer claims no further run), or None.

    Gone: the lease names another experiment, or no sign of life came for ``stale_s`` seconds (0: never stale) from
    the lease's holder or, without a lease, since ``since`` (the sequencer's start)."""
    holder = read_holder(node_dir)
    if holder is not None and "unreadable" not in holder and holder.get("experiment_id") != experiment_id:
        return "the node lease is held by %s" % describe(holder)
    last = last_sign_of_life(node_dir) if holder is not None else since
    age = time.time() - last
    if stale_s > 0 and age > stale_s:
        return "no sign of the controller for %.0fs (more than %g s)" % (age, stale_s)
    return None


def describe(holder: Dict[str, Any]) -> str:
    return "experiment %s (controller %s pid %s, started at %s)" % (
        holder.get("experiment_id", "?"), holder.get("controller_host", "?"), holder.get("controller_pid", "?"),
        holder.get("started_at_iso") or holder.get("started_at", "?"))


def create_exclusive(path: str, rec: Dict[str, Any]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps(rec, indent=1) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def take(node_dir: str, holder: Dict[str, Any], stale_s: float) -> Dict[str, Any]:
    missing = [k for k in HOLDER_KEYS if k not in holder]
    if missing:
        raise LeaseError("the holder record lacks %s" % ", ".join(missing))
    out: Dict[str, Any] = {"node_dir": node_dir, "taken": True}
    with locked(node_dir):
        cur = read_holder(node_dir)
        if cur is not None and cur.get("token") == holder["token"]:
            os.utime(lease_path(node_dir), None)
            return dict(out, holder=cur, already=True)
        if cur is not None:
            why = stale_reason(node_dir, cur, stale_s)
            if why is None:
                raise LeaseError(
                    "node directory %s is in use by %s. One experiment per node at a time: wait for it to end "
                    "(or stop it), or use another node. A lease whose controller gave no sign of life for %g s "
                    "is broken by the next experiment; remove %s only if you are sure that controller is gone."
                    % (node_dir, describe(cur), stale_s, lease_path(node_dir)), {"held": True, "holder": cur})
            os.remove(lease_path(node_dir))
            out["broken"] = {"holder": cur, "reason": why,
                             "notice": "broke the stale lease of %s on %s: %s" % (describe(cur), node_dir, why)}
        create_exclusive(lease_path(node_dir), holder)
    return dict(out, holder=holder)


def ours(node_dir: str, token: str) -> Dict[str, Any]:
    """The lease record, while it still holds ``token`` (call under the lock); else LeaseError, ``lost``."""
    cur = read_holder(node_dir)
    if cur is None or cur.get("token") != token:
        raise LeaseError("the lease of %s is no longer ours: %s" % (
            node_dir, "held by " + describe(cur) if cur else "it was removed"), {"holder": cur, "lost": True})
    return cur


def touch(node_dir: str, token: str) -> Dict[str, Any]:
    with locked(node_dir):
        ours(node_dir, token)
        os.utime(lease_path(node_dir), None)
    return {"node_dir": node_dir, "touched": True}


def hold(node_dir: str, token: str) -> Dict[str, Any]:
    """The holder was interrupted: ``hold_at`` goes into its record (rewritten aside and renamed in, under the lock)."""
    with locked(node_dir):
        cur = ours(node_dir, token)
        rec = dict(cur, hold_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        tmp = lease_path(node_dir) + ".tmp"
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        create_exclusive(tmp, rec)
        os.replace(tmp, lease_path(node_dir))
    return {"node_dir": node_dir, "on_hold": True, "holder": rec}


def on_hold(node_dir: str, experiment_id: str) -> bool:
    """Whether the controller of ``experiment_id`` put its node lease on hold (``hold``)."""
    holder = read_holder(node_dir)
    return bool(holder and holder.get("experiment_id") == experiment_id and holder.get("hold_at"))


def release(node_dir: str, token: str) -> Dict[str, Any]:
    with locked(node_dir):
        cur = read_holder(node_dir)
        if cur is None or cur.get("token") != token:
            return {"node_dir": node_dir, "released": False, "holder": cur}
        os.remove(lease_path(node_dir))
    return {"node_dir": node_dir, "released": True}


def show(node_dir: str, stale_s: float) -> Dict[str, Any]:
    """The holder (None: the node is free), and why it is stale when it is (the next experiment breaks it)."""
    cur = read_holder(node_dir)
    out: Dict[str, Any] = {"node_dir": node_dir, "holder": cur}
    if cur is not None:
        out["describe"] = describe(cur)
        out["idle_s"] = round(time.time() - last_sign_of_life(node_dir), 1)
        out["stale"] = stale_reason(node_dir, cur, stale_s)
    return out


def parse_args(argv: Optional[Sequence[str]]) -> LeaseSpec:
    spec = cli.spec_from_argv(LeaseSpec, argv)
    if spec is None:
        p = argparse.ArgumentParser(prog="lease.py", description=__doc__.split("\n")[0])
        p.add_argument("--node-dir", required=True)
        sub = p.add_subparsers(dest="command", required=True)
        sp = sub.add_parser("take")
        sp.add_argument("--holder", required=True, type=json.loads,
                        help="JSON: {%s, started_at_iso}" % ", ".join(HOLDER_KEYS))
        sp.add_argument("--stale-s", type=float, required=True, help="specab_lease_stale_s")
        for name in ("touch", "hold", "release"):
            sub.add_parser(name).add_argument("--token", required=True)
        sub.add_parser("show").add_argument("--stale-s", type=float, required=True, help="specab_lease_stale_s")
        a = p.parse_args(argv)
        spec = LeaseSpec(node_dir=a.node_dir, command=a.command, holder=getattr(a, "holder", None),
                         stale_s=getattr(a, "stale_s", None), token=getattr(a, "token", None))
    if spec.command not in COMMANDS:
        raise cli.UsageError("command %r: one of %s" % (spec.command, ", ".join(COMMANDS)))
    missing = [k for k in NEEDS[spec.command] if getattr(spec, k) is None]
    if missing:
        raise cli.UsageError("%s needs %s" % (spec.command, ", ".join(missing)))
    if spec.holder is not None and not isinstance(spec.holder, dict):
        raise cli.UsageError("holder must be a JSON object")
    spec.node_dir = os.path.abspath(os.path.expanduser(spec.node_dir))
    return spec


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    a = parse_args(argv)
    try:
        if a.command != "show":        # a look creates nothing
            os.makedirs(a.node_dir, exist_ok=True)
        if a.command == "take":            # holder, stale_s and token: checked by parse_args
            return take(a.node_dir, cast(Dict[str, Any], a.holder), cast(float, a.stale_s))
        if a.command == "show":
            return show(a.node_dir, cast(float, a.stale_s))
        return {"touch": touch, "hold": hold, "release": release}[a.command](a.node_dir, cast(str, a.token))
    except OSError as exc:
        raise cli.ToolError("lease of %s: %s" % (a.node_dir, exc))


if __name__ == "__main__":
    sys.exit(cli.run_tool(main))
