#!/usr/bin/env python3
"""One server across the loads of an instance (docs/decisions/0011): its runs' steps on the node.

    instance.py --spec-json '{"action": "check"|"take"|"reset"|"keep", ...}'

An **instance** is the runs of one arm and block that differ only in load; the first starts the server, each later
one continues it while it is ours and up, and the last stops it. What the node keeps between two of its runs is
server.json itself (the record of our server, ownership.py) with three more keys: ``instance`` (the instance's id),
``started_run_id`` (the run that started it) and ``log_offset`` (where the next run's part of the server's log
begins). The actions:

- ``check``: whether the run continues its instance's server: server.json names this instance, and its server is
  ours and alive. Anything else (no server, another instance's, a dead one) and the run starts its own.
- ``take``: the run continues it: server.json now names this run (its run_dir: stop.py ends this run's helpers), and
  the run's ``instance.json`` records which run's server it measures on.
- ``reset``: the engine's cache reset before this load (vocab/engines.py ``CACHE_RESETS``): the route read from the
  engine's own ``/openapi.json`` first (where it serves one), then asked until it says done (an engine refuses while
  requests run or wait); the answer in the run's ``cache_reset.json``. A reset that is not done fails the run.
- ``keep``: the run is over and its instance goes on: the server's log leaves the first run's directory (renamed
  within the node directory: the server keeps writing to it), and each run's directory gets its own part of it as
  its ``server.log``.

start.py records a run that starts its instance's server (``record_start``); ``release`` (called by stop.py after
every stop) gives the run server.json named last its part of the log, unless that run was kept, and removes the
instance's log. stdlib only, like every node tool.
"""
from __future__ import annotations

import os
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence, Tuple

from specab.node import cli, osutil, ownership
from specab.node.cli import ToolError
from specab.vocab import contract, engines

INSTANCE_LOG = "instance-server.log"     # in the node directory: the kept server's log after its first run
RUN_RECORD = "instance.json"             # in a run directory: the instance it ran in, and whose server it measured
RESET_RECORD = "cache_reset.json"        # in a run directory: the cache reset before its load
LOG_MODE = contract.PRIVATE_RUN_FILES["server.log"]
ACTIONS = ("check", "take", "reset", "keep")
# How long a cache reset is asked again while the engine refuses it (requests of the run before still running or
# waiting: after its benchmark, none should)
RESET_TIMEOUT_S = 60.0
# An engine's route list is read whole (vLLM 0.32's /openapi.json: ~200 kB; a list cut short is no list)
OPENAPI_MAX_BYTES = 16 << 20


@dataclass
class InstanceSpec:
    """One step of a run in an instance: which action, the node and run directories, the instance's id."""
    action: str = cli.arg("check | take | reset | keep", choices=ACTIONS)
    node_dir: str
    instance: str = cli.arg("the instance's id (the plan's: the seq of its first run)")
    run_dir: Optional[str] = cli.arg("the run's node directory (take, reset, keep)", default=None)
    run_id: Optional[str] = cli.arg("the run's id (take)", default=None)
    arm: Optional[str] = cli.arg("the run's arm (take)", default=None)
    url: Optional[str] = cli.arg("the server's base URL (reset)", default=None)
    engine: str = cli.arg("the engine kind whose cache reset is used (reset)", default=engines.SGLANG)
    timeout: float = cli.arg("seconds the reset is asked again while the engine refuses (reset)",
                             default=RESET_TIMEOUT_S)


def parse_args(argv: Optional[Sequence[str]]) -> InstanceSpec:
    return cli.parse_spec(InstanceSpec, argv, "instance.py", __doc__)


# --------------------------------------------------------------------------- continue or start

def continues(node_dir: str, instance: str) -> Tuple[bool, str]:
    """Whether a run of ``instance`` continues the kept server, and why (or why not)."""
    rec = ownership.load_record(node_dir)
    if rec is None:
        return False, "no server of ours runs (server.json absent): this run starts the instance's server"
    if str(rec.get("instance")) != str(instance):
        held = rec.get("instance")
        return False, ("the server of ours is %s, not this instance's %s: it is stopped and this run starts its own"
                       % ("instance %s's" % held if held is not None else "a run's own", instance))
    if not ownership.main_is_ours(rec):
        return False, ("instance %s's server (pid %s) is no longer running: this run starts its own"
                       % (instance, rec.get("pid")))
    if not rec.get("kept"):
        return False, ("instance %s's server was not handed over by run %s (it did not end its run): it is stopped "
                       "and this run starts its own" % (instance, rec.get("run_id")))
    return True, "instance %s's server (pid %s, started by run %s) is ours and up" % (
        instance, rec["pid"], rec.get("started_run_id"))


def take_over(node_dir: str, run_dir: str, run_id: str, arm: str, instance: str) -> Dict[str, Any]:
    """The run continues its instance's server: server.json names this run, its instance.json the server's start."""
    ok, why = continues(node_dir, instance)
    if not ok:
        raise ToolError("cannot continue instance %s: %s" % (instance, why))
    rec = ownership.load_record(node_dir) or {}
    previous = rec.get("run_id")
    rec.update(run_id=run_id, run_dir=os.path.abspath(run_dir), arm=arm, kept=False)
    osutil.write_json(os.path.join(node_dir, ownership.SERVER_JSON), rec)
    out = {"instance": str(instance), "continued": True, "started_run_id": rec.get("started_run_id"),
           "previous_run_id": previous, "pid": rec["pid"], "log": rec.get("log"),
           "log_offset": rec.get("log_offset"), "taken_at": round(time.time(), 4)}
    osutil.write_json(os.path.join(run_dir, RUN_RECORD), out)
    return out


def record_start(rec: Dict[str, Any], run_dir: str, run_id: str, instance: str) -> Dict[str, Any]:
    """A run that starts its instance's server (start.py): its server record (``rec``, server.json's) names the
    instance, and the run's instance.json says it measures on its own start."""
    rec.update(instance=str(instance), started_run_id=run_id, log_offset=0, kept=False)
    out = {"instance": str(instance), "continued": False, "started_run_id": run_id, "pid": rec["pid"],
           "log": rec.get("log"), "log_offset": 0, "taken_at": round(time.time(), 4)}
    osutil.write_json(os.path.join(run_dir, RUN_RECORD), out)
    return out


# --------------------------------------------------------------------------- the server's log, one part per run

def _copy_part(log: str, start: int, end: int, dest: str) -> None:
    """Bytes [start, end) of ``log`` into ``dest`` (the run's server.log, private as the engine's log is)."""
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, LOG_MODE)
    os.fchmod(fd, LOG_MODE)
    with os.fdopen(fd, "wb") as out, open(log, "rb") as src:
        src.seek(start)
        left = max(0, end - start)
        while left > 0:
            chunk = src.read(min(left, 1 << 20))
            if not chunk:
                break
            out.write(chunk)
            left -= len(chunk)


def _line_end(log: str) -> int:
    """The log's size up to its last complete line (a line being written belongs to the next part)."""
    size = os.path.getsize(log)
    with open(log, "rb") as fh:
        fh.seek(max(0, size - 65536))
        tail = fh.read()
    cut = tail.rfind(b"\n")
    return size if cut < 0 and size <= 65536 else size - len(tail) + cut + 1


def keep(node_dir: str, run_dir: str, instance: str) -> Dict[str, Any]:
    """The run is over and its instance goes on: its part of the server's log becomes its server.log."""
    rec = ownership.load_record(node_dir)
    if rec is None or str(rec.get("instance")) != str(instance) or not ownership.main_is_ours(rec):
        raise ToolError("instance %s has no server of ours up to keep (server.json: %s)"
                        % (instance, "absent" if rec is None else "pid %s, instance %s" % (rec.get("pid"),
                                                                                         rec.get("instance"))))
    log = str(rec.get("log") or "")
    own = os.path.join(os.path.abspath(run_dir), "server.log")
    shared = os.path.join(node_dir, INSTANCE_LOG)
    if os.path.abspath(log) == own:           # the first run: the server writes on into the renamed file
        os.replace(own, shared)
        log = shared
    start = int(rec.get("log_offset") or 0)
    end = _line_end(log)
    _copy_part(log, start, end, own)
    rec.update(log=log, log_offset=end, kept=True)     # the run server.json names has its part
    osutil.write_json(os.path.join(node_dir, ownership.SERVER_JSON), rec)
    return {"instance": str(instance), "kept": True, "pid": rec["pid"], "log": log, "part": [start, end]}


def release(node_dir: str, rec: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """After the stop of an instance's server: the run server.json named last gets the rest of the log as its
    server.log, and the instance's log is removed. None where the server was no kept instance's."""
    if rec is None or rec.get("instance") is None:
        return None
    log = os.path.join(node_dir, INSTANCE_LOG)
    if os.path.abspath(str(rec.get("log") or "")) != log or not os.path.exists(log):
        return None
    run_dir = str(rec.get("run_dir") or "")
    start = int(rec.get("log_offset") or 0)
    end = os.path.getsize(log)
    if os.path.isdir(run_dir) and not rec.get("kept"):     # a kept run has its part: the rest is nobody's
        _copy_part(log, start, end, os.path.join(run_dir, "server.log"))
    os.remove(log)
    return {"instance": str(rec["instance"]), "run_id": rec.get("run_id"), "part": [start, end]}


# --------------------------------------------------------------------------- the cache reset

def _request(url: str, method: str, timeout: float, limit: int = 65536) -> Tuple[Optional[int], str]:
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read(limit).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(limit).decode("utf-8", "replace")
    except (urllib.error.URLError, OSError) as exc:
        return None, "%s: %s" % (type(exc).__name__, getattr(exc, "reason", exc))


def served_routes(base: str, timeout: float = 10.0) -> Tuple[Optional[Dict[str, Any]], str]:
    """The engine's routes from its own /openapi.json, and where they came from (None: it serves no such list)."""
    status, body = _request(base + "/openapi.json", "GET", timeout, limit=OPENAPI_MAX_BYTES)
    if status != 200:
        return None, "no route list (/openapi.json: %s)" % (status if status is not None else body)
    routes = engines.routes_of_openapi(body)
    return routes, "/openapi.json" if routes is not None else "no route list (/openapi.json is not one)"


def reset_cache(url: str, engine: str, timeout: float, interval: float = 0.2) -> Dict[str, Any]:
    """Reset the engine's cache (CACHE_RESETS of ``engine``), asking again while it refuses, up to ``timeout``."""
    reset = engines.CACHE_RESETS.get(engine)
    if reset is None:
        raise ToolError("specab knows no cache reset of engine %r (known: %s)" % (engine, ", ".join(
            engines.CACHE_RESETS)))
    base = url.rstrip("/")
    t0 = time.time()
    routes, source = served_routes(base)
    out: Dict[str, Any] = {"engine": engine, "method": reset.method, "path": reset.path, "routes": source,
                           "attempts": 0, "refused": 0, "status": None, "answer": None, "at": round(t0, 4)}
    if routes is not None and reset.method not in routes.get(reset.path, []):
        out["elapsed_s"] = round(time.time() - t0, 4)
        raise ToolError("the engine does not serve %s %s (its /openapi.json lists %d routes, not this one)%s: the "
                        "cache cannot be reset before this load" % (
                            reset.method, reset.path, len(routes), "; " + reset.why_env if reset.why_env else ""),
                        out)
    deadline = time.monotonic() + timeout
    while True:
        status, body = _request(base + reset.path, reset.method, 30.0)
        out.update(attempts=out["attempts"] + 1, status=status, answer=body.strip()[:300])
        if status is not None and engines.cache_reset_done(reset, status, body):
            out.update(ok=True, elapsed_s=round(time.time() - t0, 4))
            return out
        if status is None or status == 404 or time.monotonic() > deadline:
            break
        out["refused"] += 1           # requests still ran or waited: asked again
        time.sleep(interval)
    out["elapsed_s"] = round(time.time() - t0, 4)
    absent = "; " + reset.why_env if status == 404 and reset.why_env else ""
    raise ToolError("the cache reset %s %s was not done after %d attempt(s) in %.1fs: %s%s" % (
        reset.method, reset.path, out["attempts"], out["elapsed_s"],
        "HTTP %s %s" % (status, out["answer"]) if status is not None else body, absent), out)


# --------------------------------------------------------------------------- the tool

def run(a: InstanceSpec) -> Dict[str, Any]:
    node_dir = os.path.abspath(os.path.expanduser(a.node_dir))
    if a.action == "check":
        ok, why = continues(node_dir, a.instance)
        return {"instance": str(a.instance), "continues": ok, "why": why}
    if not a.run_dir:
        raise cli.UsageError("instance %s needs run_dir" % a.action)
    if a.action == "take":
        if not a.run_id:
            raise cli.UsageError("instance take needs run_id")
        return take_over(node_dir, a.run_dir, a.run_id, a.arm or a.run_id, a.instance)
    if a.action == "keep":
        return keep(node_dir, a.run_dir, a.instance)
    if a.action == "reset":
        if not a.url:
            raise cli.UsageError("instance reset needs url")
        return cli.recorded(os.path.join(a.run_dir, RESET_RECORD), lambda: reset_cache(a.url, a.engine, a.timeout))
    raise cli.UsageError("unknown action %r (one of %s)" % (a.action, ", ".join(ACTIONS)))


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(cli.run_tool(main))
