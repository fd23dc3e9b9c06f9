"""Small OS helpers of the node tools: files written atomically, JSON read, an exclusive flock, the UTC timestamp
the tools record, a condition polled until a timeout (stdlib only)."""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from typing import Any, Callable, Dict, Iterator, Optional


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


def json_or_none(path: str) -> Any:
    """``path``'s JSON (UTF-8), or None where it cannot be read or is not JSON."""
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def flocked(path: str) -> Iterator[None]:
    """An exclusive flock of ``path`` (created 0600) held for the block: one process at a time."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def now_iso(t: Optional[float] = None) -> str:
    t = time.time() if t is None else t
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + ".%03dZ" % int((t % 1) * 1000)


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
