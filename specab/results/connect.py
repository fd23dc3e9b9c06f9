"""Connections to a results store: the writer's bounded wait for a store another program holds, and reading a
store where it cannot be written (read-only media).

A store is a WAL database. A reader of one normally writes beside it (the -shm index), so on read-only media the
plain open fails; there it is read with SQLite's read-only modes instead. A writer that finds the store locked by
another program (a database browser with a transaction open) waits a bounded time (SPECAB_STORE_BUSY_S, default
60 s), then gets StoreBusy naming the programs that hold the file, never a traceback.
"""
from __future__ import annotations

import atexit
import os
import shutil
import sqlite3
import tempfile
import urllib.parse
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

BUSY_ENV = "SPECAB_STORE_BUSY_S"
DEFAULT_BUSY_S = 60.0


class StoreError(Exception):
    """The store file is missing, unreadable, or of another schema version."""


class StoreBusy(StoreError):
    """Another program held the store's write lock for longer than the bounded wait."""


class StoreReadOnly(StoreError):
    """The store lies where it cannot be written (read-only media) and a write was asked."""


def busy_wait_s() -> float:
    """How long a write waits for a store another program holds (SPECAB_STORE_BUSY_S, default 60 s)."""
    try:
        return max(0.0, float(os.environ.get(BUSY_ENV, DEFAULT_BUSY_S)))
    except ValueError:
        return DEFAULT_BUSY_S


def connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=busy_wait_s())
    conn.row_factory = sqlite3.Row
    return conn


def _uri(path: Path, query: str) -> str:
    return f"file:{urllib.parse.quote(str(path.resolve()))}?{query}"


def connect_read_only(path: Path) -> sqlite3.Connection:
    """A connection that only reads `path`, for a store on read-only media. `mode=ro` where SQLite can still read
    the WAL index; else, with no WAL content beside the file (a store closed cleanly), `immutable=1`; else a private
    copy of the file and its WAL (the copy recovers the WAL: nothing the store holds is left out)."""
    wal = Path(f"{path}-wal")
    try:
        conn = sqlite3.connect(_uri(path, "mode=ro"), uri=True)
        conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
    except sqlite3.OperationalError:
        if not wal.exists() or wal.stat().st_size == 0:
            conn = sqlite3.connect(_uri(path, "immutable=1"), uri=True)
        else:
            tmp = tempfile.mkdtemp(prefix="specab-store-")
            atexit.register(shutil.rmtree, tmp, True)
            copy = Path(tmp) / path.name
            shutil.copy(path, copy)
            shutil.copy(wal, f"{copy}-wal")
            conn = sqlite3.connect(copy)
    conn.row_factory = sqlite3.Row
    return conn


def cannot_open(exc: sqlite3.Error) -> bool:
    """Whether a first read failed because SQLite could not write beside the store (read-only media), not because
    the file is no SQLite database."""
    text = str(exc).lower()
    return "unable to open database file" in text or "readonly" in text or "read-only" in text


def holders(path: Path) -> list[str]:
    """The local processes other than this one with the store (or its -wal/-shm) open: `PID n (name)`."""
    targets = {str(path.resolve()), f"{path.resolve()}-wal", f"{path.resolve()}-shm"}
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc") if os.path.isdir("/proc") else []):
        if int(pid) == os.getpid():
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") in targets for fd in fds):
                name = Path(f"/proc/{pid}/comm").read_text().strip()
                found.append(f"PID {pid} ({name})")
        except OSError:
            continue
    return found


@contextmanager
def reported(path: Path) -> Iterator[None]:
    """A write's SQLite errors as the user must read them: the store locked by another program past the bounded
    wait (StoreBusy, naming the holders), or the store on read-only media (StoreReadOnly)."""
    try:
        yield
    except sqlite3.OperationalError as exc:
        text = str(exc).lower()
        if "locked" in text or "busy" in text:
            who = holders(path)
            raise StoreBusy(f"{path}: another program holds the store's write lock ("
                            f"{', '.join(who) if who else 'no local process found: another machine over a network share?'}"
                            f"); waited {busy_wait_s():g} s ({BUSY_ENV}). Close that program (a database browser keeps "
                            f"a transaction open while it edits), then resume.") from None
        if "readonly" in text or "read-only" in text:
            raise StoreReadOnly(f"{path}: the store cannot be written here (read-only media): reports and exports "
                                f"read it as it is; to run or resume the experiment, copy its directory to a "
                                f"writable place.") from None
        raise
