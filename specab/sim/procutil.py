"""Process helpers for the simulated node: parent-death signal, process titles, liveness by /proc.

Stdlib only (setproctitle is imported lazily), so the light worker processes stay light.
"""
from __future__ import annotations

import ctypes
import os
import signal
from pathlib import Path
from typing import Optional

PR_SET_PDEATHSIG = 1


def set_parent_death_signal(sig: int = signal.SIGKILL) -> None:
    """``prctl(PR_SET_PDEATHSIG, sig)`` like SGLang's ``kill_itself_when_parent_died``."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(err)}")


PR_SET_NAME = 15


def set_title(title: str) -> None:
    """Set the process title visible to ps and pgrep -f (setproctitle rewrites argv).

    Without the setproctitle package (e.g. a GPU machine's Python) only the kernel's 15-character
    ``comm`` is set through ``prctl(PR_SET_NAME)``: ``ps -o comm`` shows it, ``pgrep -f`` does not.
    """
    try:
        import setproctitle  # lazy: only processes that retitle themselves pay for it
    except ImportError:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_NAME, ctypes.c_char_p(title.encode()[:15]), 0, 0, 0)
        return
    setproctitle.setproctitle(title)


def proc_start_ticks(pid: int) -> Optional[int]:
    """Start time of ``pid`` in clock ticks since boot (field 22 of /proc/PID/stat), None if gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    rest = raw[raw.rfind(")") + 2:].split()
    # rest[0] is field 3 (state); field 22 is rest[19]
    return int(rest[19])


def is_alive(pid: int, start_ticks: Optional[int] = None) -> bool:
    """True while ``pid`` runs (zombies count as dead) and is the same process (start time matches)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    rest = raw[raw.rfind(")") + 2:].split()
    if rest[0] in ("Z", "X"):
        return False
    return start_ticks is None or int(rest[19]) == start_ticks
