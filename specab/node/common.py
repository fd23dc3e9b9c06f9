"""Shared helpers of the node tools (stdlib only, Python >= 3.8).

The node tools are shipped as the package ``specab.node`` (with the shared vocabulary ``specab.vocab``) into
``{{ specab_node_dir }}/bin/`` on a GPU node that has Python but not specab, so this module imports nothing
outside the standard library and that package.

Contents, one concern per section: tool entry point and errors, secret redaction, nvidia-smi
(always under a timeout), /proc process inspection, listening-port lookup, server.json records,
env files.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import fcntl
import io
import json
import os
import pwd
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import typing
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Type, TypeVar

from specab.vocab import contract

# This package's folder: ``<node_dir>/bin/specab/node`` on a node (node_prepare ships the package under bin/), the
# checkout's specab/node on the controller. ``python3 <NODE_PACKAGE> TOOL ARGS`` runs a tool (__main__.py).
NODE_PACKAGE = os.path.dirname(os.path.abspath(__file__))
# The folder that holds the specab package (what ``sys.path`` needs for ``import specab.node``).
PACKAGE_ROOT = os.path.dirname(os.path.dirname(NODE_PACKAGE))


def tool_argv(python: str, tool: str) -> List[str]:
    """The argv prefix that runs the node tool ``tool`` of this package with ``python``."""
    return [python, NODE_PACKAGE, tool]

# ---------------------------------------------------------------------------------------------
# Tool entry point and errors
# ---------------------------------------------------------------------------------------------


class ToolError(Exception):
    """A failure the user must act on: printed as ``{"error": message, ...}``, exit status 1.

    ``result`` carries whatever the tool measured before failing (signals sent, GPU tables, ...),
    so the JSON a role registers still holds the evidence.
    """

    def __init__(self, message: str, result: Optional[Dict[str, Any]] = None) -> None:
        super().__init__(message)
        self.message = message
        self.result = dict(result or {})


class UsageError(Exception):
    """Bad usage found after argument parsing: exit status 2, like argparse."""


def log(msg: str) -> None:
    """Human-readable diagnostics go to stderr (stdout holds exactly one JSON object)."""
    sys.stderr.write(msg.rstrip("\n") + "\n")
    sys.stderr.flush()


def emit(obj: Dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def write_text(path: str, text: str, mode: int = 0o644) -> None:
    """Write ``text`` to ``path`` atomically (temp file + rename), with ``mode`` whatever the umask."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = "%s.tmp.%d" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def write_json(path: str, obj: Dict[str, Any], mode: int = 0o644) -> None:
    """Write ``obj`` to ``path`` atomically (write_text)."""
    write_text(path, json.dumps(obj, indent=2, default=str) + "\n", mode)


def read_json(path: str) -> Any:
    with open(path) as fh:
        return json.load(fh)


@contextlib.contextmanager
def flocked(path: str) -> Iterator[None]:
    """An exclusive flock of ``path`` (created 0600) held for the block: one process at a time."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def recorded(path: Optional[str], work: Callable[[], Dict[str, Any]]) -> Dict[str, Any]:
    """Run ``work`` and, when ``path`` is given, also write its outcome there: the result with
    ``ok: true``, or the ToolError's partial result with ``ok: false`` and the error (re-raised)."""
    try:
        out = work()
    except ToolError as exc:
        if path:
            write_json(path, dict(exc.result, ok=False, error=exc.message))
        raise
    if path:
        write_json(path, dict(out, ok=True))
    return out


class Verbatim(dict):
    """A tool result printed unchanged with exit 0, whatever its ``ok`` says: a record of something
    that failed (``sequence.py wait`` prints a failed run's done.json), not a failure of the tool."""


def run_tool(main: Callable[[Optional[Sequence[str]]], Dict[str, Any]],
             argv: Optional[Sequence[str]] = None) -> int:
    """Run a tool's ``main``: print its JSON, map ToolError to exit 1 (argparse exits 2 itself)."""
    try:
        result = main(argv)
    except UsageError as exc:
        emit({"ok": False, "error": "usage: %s" % exc})
        log("usage error: %s" % exc)
        return 2
    except ToolError as exc:
        out = dict(exc.result)
        out["ok"] = False
        out["error"] = exc.message
        emit(out)
        log("error: " + exc.message)
        return 1
    if isinstance(result, Verbatim):
        emit(dict(result))
        return 0
    result.setdefault("ok", True)
    emit(result)
    return 0 if result.get("ok") else 1


SPEC_FLAG = "--spec-json"
S = TypeVar("S")


def spec_json(argv: Optional[Sequence[str]]) -> Optional[Dict[str, Any]]:
    """The JSON object of ``TOOL --spec-json TEXT`` (``--spec-json -``: read from stdin, where no other process can
    see it), or None when ``argv`` holds the tool's flags instead."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] != SPEC_FLAG:
        return None
    if len(args) != 2:
        raise UsageError("%s takes one argument, the spec as a JSON object (or - to read it from stdin), and no "
                         "other flag" % SPEC_FLAG)
    text = sys.stdin.read() if args[1] == "-" else args[1]
    try:
        obj = json.loads(text)
    except ValueError as exc:
        raise UsageError("%s: the spec is not JSON (%s)" % (SPEC_FLAG, exc))
    if not isinstance(obj, dict):
        raise UsageError("%s: the spec must be a JSON object, got %s" % (SPEC_FLAG, type(obj).__name__))
    return obj


def spec_of(cls: Type[S], obj: Dict[str, Any]) -> S:
    """The spec dataclass ``cls`` from a JSON object whose keys are its field names: an unknown key or a missing
    required field is a usage error (exit 2), so the Ansible module (plugins/modules/specab_node.py), the driver and
    the run queue build the same spec."""
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    unknown = sorted(set(obj) - {f.name for f in fields})
    missing = [f.name for f in fields if f.name not in obj and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if unknown or missing:
        raise UsageError("%s: a %s takes the keys %s; %s" % (
            SPEC_FLAG, cls.__name__, ", ".join(f.name for f in fields),
            "; ".join(["unknown: " + ", ".join(unknown)] * bool(unknown)
                      + ["missing: " + ", ".join(missing)] * bool(missing))))
    return cls(**obj)


def spec_from_argv(cls: Type[S], argv: Optional[Sequence[str]]) -> Optional[S]:
    """The tool's typed spec given whole as one JSON object (``spec_json``, ``spec_of``), or None when ``argv`` holds
    the tool's flags instead."""
    obj = spec_json(argv)
    return None if obj is None else spec_of(cls, obj)


def json_list_type(flag: str) -> Callable[[str], List[str]]:
    """The argparse type of ``flag``, an argv given as a JSON list (``'["nvidia-smi"]'``): bad → exit 2."""
    def json_list(text: str) -> List[str]:
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError("%s must be a JSON list of strings, e.g. '[\"nvidia-smi\"]' (%s)"
                                             % (flag, exc))
        if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
            raise argparse.ArgumentTypeError("%s must be a non-empty JSON list of strings, got %r" % (flag, text))
        return value
    return json_list


def arg(help: Optional[str] = None, **flag: Any) -> Any:
    """A spec field with its flag's ``help`` and argparse keywords (``choices``, ``metavar``, ``action``, ``type``) in
    its metadata, for ``spec_flags``; ``default`` and ``default_factory`` are the field's."""
    default = flag.pop("default", dataclasses.MISSING)
    factory = flag.pop("default_factory", dataclasses.MISSING)
    return dataclasses.field(default=default, default_factory=factory, metadata=dict(flag, help=help))


def spec_flags(parser: argparse.ArgumentParser, cls: type, skip: Iterable[str] = ()) -> argparse.ArgumentParser:
    """Add one flag per field of the spec dataclass ``cls`` (but ``skip``): ``--field-name``, required where the field
    has no default, else the field's default; the field's metadata (``arg``) passed to argparse as given. Without
    ``action``, ``type`` or ``choices`` there, the type follows the annotation (``Optional[X]`` as ``X``): a bool is a
    switch (store_true), an int or float converted, a list a JSON list (``json_list_type``), anything else a string.
    """
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        flag = "--" + f.name.replace("_", "-")
        kw = dict(f.metadata)
        hint = hints[f.name]
        if typing.get_origin(hint) is typing.Union:
            hint = next(h for h in typing.get_args(hint) if h is not type(None))
        if not {"action", "type", "choices"} & set(kw):
            if hint is bool:
                kw["action"] = "store_true"
            elif hint in (int, float):
                kw["type"] = hint
            elif typing.get_origin(hint) is list:
                kw["type"] = json_list_type(flag)
        if f.default is not dataclasses.MISSING:
            kw["default"] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            kw["default"] = f.default_factory()
        else:
            kw["required"] = True
        parser.add_argument(flag, **kw)
    return parser


def spec_parser(cls: type, prog: str, doc: Optional[str]) -> argparse.ArgumentParser:
    """The tool's parser: the first line of its module ``doc`` as description, one flag per spec field."""
    return spec_flags(argparse.ArgumentParser(prog=prog, description=(doc or "").split("\n")[0]), cls)


def parse_spec(cls: Type[S], argv: Optional[Sequence[str]], prog: str, doc: Optional[str]) -> S:
    """The tool's spec from ``--spec-json`` (``spec_from_argv``) or from its flags (``spec_parser``)."""
    spec = spec_from_argv(cls, argv)
    return spec if spec is not None else cls(**vars(spec_parser(cls, prog, doc).parse_args(argv)))


def now_iso(t: Optional[float] = None) -> str:
    t = time.time() if t is None else t
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + ".%03dZ" % int((t % 1) * 1000)


# ---------------------------------------------------------------------------------------------
# Secret redaction
# ---------------------------------------------------------------------------------------------

# The one secret rule (specab/vocab/contract.py), re-exported for the node tools.
REDACTED = contract.REDACTED
is_secret_name = contract.is_secret_name
redact_mapping = contract.redact_mapping
redact_value = contract.redact_value
redact_text = contract.redact_text
redact_argv = contract.redact_argv


# ---------------------------------------------------------------------------------------------
# nvidia-smi (always under a timeout: a wedged driver makes it hang, even in D state)
# ---------------------------------------------------------------------------------------------

DEFAULT_SMI_TIMEOUT = 10.0


class SmiError(ToolError):
    """nvidia-smi failed, hung, or is missing."""


class SmiFieldError(SmiError):
    """nvidia-smi rejected a query field (older/newer driver): ``Field "x" is not a valid field``."""


def run_command(argv: Sequence[str], timeout: float) -> Tuple[int, str, str]:
    """Run ``argv`` in its own session with a hard timeout; never block on a stuck child.

    ``subprocess.run(timeout=...)`` waits for the killed child, which never returns when the child
    is in uninterruptible sleep (nvidia-smi on a wedged GPU): here the child is abandoned after
    SIGKILL plus a short wait. Raises ``subprocess.TimeoutExpired`` on timeout.
    """
    proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True, close_fds=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            proc.communicate(timeout=2.0)
        except subprocess.TimeoutExpired:
            pass  # stuck in D state: leave it, we cannot do better
        raise
    return proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


def smi_call(smi: Sequence[str], args: Sequence[str], timeout: float = DEFAULT_SMI_TIMEOUT) -> str:
    """Run nvidia-smi (the node's argv ``smi``) with ``args``; return stdout or raise SmiError."""
    argv = list(smi) + list(args)
    shown = " ".join(shlex.quote(a) for a in argv)
    try:
        rc, out, err = run_command(argv, timeout)
    except subprocess.TimeoutExpired:
        raise SmiError("nvidia-smi did not answer within %g s: %s (the GPU driver may be wedged: check "
                       "`dmesg` for Xid errors; the node is unhealthy until nvidia-smi answers)"
                       % (timeout, shown))
    except OSError as exc:
        raise SmiError("cannot run nvidia-smi (%s): %s; set specab_smi_cmd to the node's nvidia-smi"
                       % (shown, exc))
    if rc != 0:
        text = (err.strip() or out.strip() or "(no output)").splitlines()
        msg = "; ".join(text[-3:])
        if "is not a valid field" in msg:
            raise SmiFieldError("nvidia-smi rejected a query field (rc %d): %s [%s]" % (rc, msg, shown))
        raise SmiError("nvidia-smi failed (rc %d): %s [%s]" % (rc, msg, shown))
    return out


def parse_smi_csv(text: str, fields: Sequence[str]) -> List[Dict[str, Any]]:
    """Parse ``--format=csv,noheader[,nounits]`` output; columns are mapped by position.

    (Header names differ from query names, e.g. ``clocks.sm`` → ``clocks.current.sm [MHz]``.)
    """
    rows: List[Dict[str, Any]] = []
    for rec in csv.reader(io.StringIO(text), skipinitialspace=True):
        if not rec or all(not c.strip() for c in rec):
            continue
        if len(rec) > len(fields):  # a comma inside the last free-text field: join the tail
            rec = rec[:len(fields) - 1] + [", ".join(rec[len(fields) - 1:])]
        if len(rec) != len(fields):
            raise SmiError("unexpected nvidia-smi output: %d columns for %d fields in %r"
                           % (len(rec), len(fields), ", ".join(rec)))
        rows.append({f: contract.smi_value(c) for f, c in zip(fields, rec)})
    return rows


REASONS_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")


def query_gpus(smi: Sequence[str], fields: Sequence[str],
               timeout: float = DEFAULT_SMI_TIMEOUT) -> List[Dict[str, Any]]:
    """``--query-gpu`` rows keyed by the requested field names.

    ``clocks_event_reasons.active`` falls back to its old name ``clocks_throttle_reasons.active``
    on drivers that reject it (the row keeps the requested name).
    """
    fields = list(fields)
    try:
        out = smi_call(smi, ["--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"], timeout)
    except SmiFieldError:
        if REASONS_FIELDS[0] not in fields:
            raise
        alt = [REASONS_FIELDS[1] if f == REASONS_FIELDS[0] else f for f in fields]
        out = smi_call(smi, ["--query-gpu=" + ",".join(alt), "--format=csv,noheader,nounits"], timeout)
    return parse_smi_csv(out, fields)


APP_FIELDS = ("pid", "process_name", "used_memory", "gpu_uuid")


def query_compute_apps(smi: Sequence[str], timeout: float = DEFAULT_SMI_TIMEOUT) -> List[Dict[str, Any]]:
    """``--query-compute-apps`` rows (idle GPUs: empty output, rc 0)."""
    out = smi_call(smi, ["--query-compute-apps=" + ",".join(APP_FIELDS), "--format=csv,noheader,nounits"],
                   timeout)
    rows = parse_smi_csv(out, APP_FIELDS)
    # process_name is free text: keep it a string even when it looks numeric
    for r in rows:
        if r["process_name"] is not None:
            r["process_name"] = str(r["process_name"])
    return rows


def select_gpus(spec: str, available: Iterable[int]) -> List[int]:
    """``all`` or a comma list (``0,1``) → sorted GPU indices; unknown indices are an error."""
    avail = sorted(set(available))
    if spec.strip().lower() == "all":
        return avail
    try:
        wanted = sorted({int(x) for x in spec.split(",") if x.strip() != ""})
    except ValueError:
        raise UsageError("--gpus must be 'all' or a comma list of GPU indices such as 0,1; got %r" % spec)
    missing = [i for i in wanted if i not in avail]
    if missing:
        raise ToolError("GPU index %s not present on this node (nvidia-smi lists %s); fix specab_gpu_indices"
                        % (",".join(map(str, missing)), ",".join(map(str, avail)) or "no GPU"))
    return wanted


# ---------------------------------------------------------------------------------------------
# /proc process inspection
# ---------------------------------------------------------------------------------------------

# Where the process files are read (stat, cmdline, comm, status, environ, task/): /proc; a test points it at a
# tree of real processes' files (tests/unit/test_real_sglang_0517.py).
PROC = "/proc"

class ProcStat(object):
    __slots__ = ("pid", "comm", "state", "ppid", "pgrp", "session", "starttime")

    def __init__(self, pid: int, comm: str, state: str, ppid: int, pgrp: int, session: int,
                 starttime: int) -> None:
        self.pid, self.comm, self.state = pid, comm, state
        self.ppid, self.pgrp, self.session, self.starttime = ppid, pgrp, session, starttime

    @property
    def alive(self) -> bool:
        """Running or sleeping. A zombie counts as gone only once all its threads have exited: on a
        real GPU (H200, driver 580) a killed multi-threaded CUDA process shows its thread-group
        leader as 'Z' while its other threads still tear down the context and hold the memory
        (nvidia-smi lists it, name '[No data]', for another ~0.1-0.3 s; docs/validation/h200.md)."""
        if self.state not in ("Z", "X", "x"):
            return True
        return _threads_still_exiting(self.pid)


def _threads_still_exiting(pid: int) -> bool:
    """True when a zombie leader ``pid`` still has a thread that is not dead (/proc/PID/task)."""
    try:
        tids = os.listdir("%s/%d/task" % (PROC, pid))
    except OSError:
        return False
    for tid in tids:
        try:
            with open("%s/%d/task/%s/stat" % (PROC, pid, tid)) as fh:
                text = fh.read()
        except OSError:
            continue
        if text[text.rindex(")") + 2:].split()[0] not in ("Z", "X", "x"):
            return True
    return False


def parse_proc_stat(pid: int, text: str) -> ProcStat:
    """Parse ``/proc/PID/stat``; comm may hold spaces and parentheses, so split at the last ')'."""
    lpar, rpar = text.index("("), text.rindex(")")
    comm = text[lpar + 1:rpar]
    rest = text[rpar + 2:].split()
    # rest[0]=state (field 3), rest[1]=ppid, rest[2]=pgrp, rest[3]=session, rest[19]=starttime (field 22)
    return ProcStat(pid, comm, rest[0], int(rest[1]), int(rest[2]), int(rest[3]), int(rest[19]))


def proc_stat(pid: int) -> Optional[ProcStat]:
    try:
        with open("%s/%d/stat" % (PROC, pid)) as fh:
            return parse_proc_stat(pid, fh.read())
    except (OSError, ValueError, IndexError):
        return None


def list_pids() -> List[int]:
    return [int(d) for d in os.listdir(PROC) if d.isdigit()]


def all_stats() -> List[ProcStat]:
    out = []
    for pid in list_pids():
        st = proc_stat(pid)
        if st is not None:
            out.append(st)
    return out


def is_alive(pid: int) -> bool:
    st = proc_stat(pid)
    return st is not None and st.alive


def descendants(root: int, stats: Optional[List[ProcStat]] = None) -> List[int]:
    """Alive descendants of ``root`` (walk of ppid links), breadth first."""
    stats = all_stats() if stats is None else stats
    children: Dict[int, List[int]] = {}
    alive = set()
    for st in stats:
        children.setdefault(st.ppid, []).append(st.pid)
        if st.alive:
            alive.add(st.pid)
    out, queue, seen = [], [root], {root}
    while queue:
        p = queue.pop(0)
        for c in children.get(p, []):
            if c not in seen:
                seen.add(c)
                queue.append(c)
                if c in alive:
                    out.append(c)
    return out


def proc_cmdline(pid: int) -> str:
    """``/proc/PID/cmdline`` joined with spaces (a setproctitle title shows here), else ``[comm]``."""
    try:
        with open("%s/%d/cmdline" % (PROC, pid), "rb") as fh:
            raw = fh.read()
    except OSError:
        raw = b""
    parts = [p.decode("utf-8", "replace") for p in raw.split(b"\0") if p]
    text = " ".join(parts).strip()
    if text:
        return text
    comm = proc_comm(pid)
    return "[%s]" % comm if comm else "?"


def proc_comm(pid: int) -> str:
    try:
        with open("%s/%d/comm" % (PROC, pid)) as fh:
            return fh.read().strip()
    except OSError:
        return ""


def proc_user(pid: int) -> str:
    """The real user of ``pid`` (``/proc/PID/status`` Uid → passwd name; the uid if unknown)."""
    try:
        with open("%s/%d/status" % (PROC, pid)) as fh:
            for line in fh:
                if line.startswith("Uid:"):
                    uid = int(line.split()[1])
                    try:
                        return pwd.getpwuid(uid).pw_name
                    except KeyError:
                        return "uid %d" % uid
    except OSError:
        pass
    return "unknown"


def proc_environ(pid: int) -> Dict[str, str]:
    """``/proc/PID/environ`` (the exec-time environment). Raises OSError when unreadable."""
    with open("%s/%d/environ" % (PROC, pid), "rb") as fh:
        raw = fh.read()
    env: Dict[str, str] = {}
    for item in raw.split(b"\0"):
        if b"=" in item:
            k, v = item.split(b"=", 1)
            env[k.decode("utf-8", "replace")] = v.decode("utf-8", "replace")
    return env


def describe_process(pid: int, limit: int = 200) -> Dict[str, Any]:
    """PID, user and command of a process, for messages that name it."""
    st = proc_stat(pid)
    cmd = proc_cmdline(pid)
    if len(cmd) > limit:
        cmd = cmd[:limit - 1] + "…"
    return {"pid": pid, "user": proc_user(pid), "command": redact_text(cmd),
            "comm": proc_comm(pid), "visible": st is not None,
            "session": st.session if st else None, "pgrp": st.pgrp if st else None}


def describe_text(pid: int) -> str:
    d = describe_process(pid)
    if not d["visible"]:
        return "PID %d (not visible in this PID namespace; user and command unknown)" % pid
    return "PID %d, user %s, command %r" % (pid, d["user"], d["command"])


def display_name(pid: int, limit: int = 60) -> str:
    """A short name for messages: the command line with the program's directory dropped
    (``/very/long/venv/bin/python -m sglang.launch_server`` → ``python -m sglang.launch_server``), so the part
    that says what the process is survives the cut whatever the install path's length."""
    cmd = redact_text(proc_cmdline(pid))
    head, sep, rest = cmd.partition(" ")
    if head.startswith("/"):
        cmd = os.path.basename(head) + sep + rest
    return cmd if len(cmd) <= limit else cmd[:limit - 1] + "…"


# ---------------------------------------------------------------------------------------------
# server.json: the only proof that a process is ours
# ---------------------------------------------------------------------------------------------

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


def pid_session(pid: int) -> Optional[int]:
    try:
        return os.getsid(pid)
    except OSError:
        return None


# ---------------------------------------------------------------------------------------------
# Listening sockets: who holds a port
# ---------------------------------------------------------------------------------------------

def _parse_proc_net(text: str, port: int) -> List[Tuple[str, int]]:
    """(local address hex, inode) of LISTEN sockets on ``port`` in /proc/net/tcp{,6} text."""
    out = []
    for line in text.splitlines()[1:]:
        cols = line.split()
        if len(cols) < 10:
            continue
        local, state, inode = cols[1], cols[3], cols[9]
        try:
            lport = int(local.rsplit(":", 1)[1], 16)
        except (IndexError, ValueError):
            continue
        if state == "0A" and lport == port:
            out.append((local.rsplit(":", 1)[0], int(inode)))
    return out


def listening_inodes(port: int) -> List[int]:
    inodes = []
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as fh:
                inodes += [ino for _, ino in _parse_proc_net(fh.read(), port)]
        except OSError:
            continue
    return inodes


def socket_owners(inodes: Iterable[int]) -> List[int]:
    """PIDs holding a file descriptor on one of the socket inodes (needs root for other users)."""
    wanted = {"socket:[%d]" % i for i in inodes}
    owners = []
    if not wanted:
        return owners
    for pid in list_pids():
        fd_dir = "/proc/%d/fd" % pid
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(os.path.join(fd_dir, fd)) in wanted:
                    owners.append(pid)
                    break
            except OSError:
                continue
    return owners


def port_holders(port: int) -> List[Dict[str, Any]]:
    return [describe_process(p) for p in socket_owners(listening_inodes(port))]


def port_bindable(host: str, port: int) -> Optional[str]:
    """None when ``host:port`` can be bound now, else the OS error text."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
        return None
    except OSError as exc:
        return str(exc)
    finally:
        s.close()


# ---------------------------------------------------------------------------------------------
# Env files (KEY=VALUE lines, shell-quoted values)
# ---------------------------------------------------------------------------------------------

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


_ENV_FILE_WORDS = {"export", "set", "-a", "+a"}


def parse_env_text(text: str, where: str = "env file") -> Dict[str, str]:
    """``KEY=VALUE`` assignments (optionally ``export KEY=VALUE``), values shell-quoted, ``#`` comments.

    The whole text is tokenised as the shell would (a quoted value may span lines: a newline in a
    value is kept literally); ``set -a`` / ``set +a`` are allowed; any other word is refused.
    """
    lexer = shlex.shlex(text, posix=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    env: Dict[str, str] = {}
    try:
        while True:
            line = lexer.lineno
            tok = lexer.get_token()
            if tok is None or tok == lexer.eof:
                break
            if "=" in tok and _NAME_RE.match(tok.split("=", 1)[0]):
                k, v = tok.split("=", 1)
                env[k] = v
            elif tok not in _ENV_FILE_WORDS:
                raise ToolError("%s line %d: unexpected word %r (only KEY=VALUE assignments, export and "
                                "set -a/+a are allowed)" % (where, line, redact_text(tok)[:80]))
    except ValueError as exc:
        raise ToolError("%s line %d is not valid shell (%s)" % (where, lexer.lineno, exc))
    return env


def parse_env_file(path: str) -> Dict[str, str]:
    try:
        with open(path) as fh:
            text = fh.read()
    except OSError as exc:
        raise ToolError("cannot read the env file %s: %s" % (path, exc))
    return parse_env_text(text, path)


# ---------------------------------------------------------------------------------------------
# Polling
# ---------------------------------------------------------------------------------------------

def poll_until(cond: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Call ``cond`` every ``interval`` s until it is true (True) or ``timeout`` passes (False)."""
    deadline = time.monotonic() + timeout
    while True:
        if cond():
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(interval, left))


# ---------------------------------------------------------------------------------------------
# helpers.json: a run's helper processes, ours by pid and start time
# ---------------------------------------------------------------------------------------------

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
    try:
        os.unlink(os.path.join(run_dir, HELPERS_JSON))
    except FileNotFoundError:
        pass


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
    try:
        rec = read_json(os.path.join(run_dir, HELPERS_JSON))
    except (OSError, ValueError):
        return []
    entries = rec.get("helpers") if isinstance(rec, dict) else None
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


def live_helpers(run_dir: str) -> List[Dict[str, Any]]:
    """The recorded helpers of the run in ``run_dir`` that still run (none without a readable record)."""
    return [e for e in recorded_helpers(run_dir) if helper_is_ours(e)]


# ---------------------------------------------------------------------------------------------
# sequencer.json: the node-side run queue's live process (sequence.py serve), also ours
# ---------------------------------------------------------------------------------------------

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
    if st is not None and st.pgrp == pid and st.session == pid:
        send(signal.SIGKILL, "pgid", pid, "grace period of %gs expired" % grace)
    else:
        send(signal.SIGKILL, "pid", pid, "grace period of %gs expired" % grace)
    if not poll_until(lambda: not sequencer_alive(rec), kill_wait, 0.05):
        raise ToolError("the sequencer (pid %d) survived SIGKILL for %gs (uninterruptible sleep?): %s"
                        % (pid, kill_wait, describe_text(pid)), {"sequencer": out})
    out["kill_to_gone_s"] = round(time.time() - t_kill, 4)
    return out
