"""/proc read: a process's stat (state, parent, group, session, start time), command line, user, environment,
its descendants, and its description for messages (stdlib only)."""
from __future__ import annotations

import contextlib
import os
import pwd
from typing import Any, Dict, List, Optional

from specab.vocab.contract import redact_text


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
    return [st for st in map(proc_stat, list_pids()) if st is not None]


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
    with contextlib.suppress(OSError):
        with open("%s/%d/status" % (PROC, pid)) as fh:
            for line in fh:
                if line.startswith("Uid:"):
                    uid = int(line.split()[1])
                    try:
                        return pwd.getpwuid(uid).pw_name
                    except KeyError:
                        return "uid %d" % uid
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


def pid_session(pid: int) -> Optional[int]:
    try:
        return os.getsid(pid)
    except OSError:
        return None
