"""Stores of real runs kept as fixtures: ``<dir>/results.sqlite.xz``, the driver's SQLite store packed with xz.

A store is mostly per-request arrays (streamed chunk times, output token ids) that xz packs 10-20x; packed, the
H200 stores take ~0.9 MB of the working tree instead of ~12 MB, which keeps a device call (the tree and the SGLang
bundle, 64 MiB in all) possible. Tests never open a fixture in place: ``copy_store`` writes a private copy (the
analysis may add a -wal beside it, tests plant faults in it).
"""
from __future__ import annotations

import lzma
import shutil
from pathlib import Path

STORE = "results.sqlite"


def copy_store(src: Path, dest: Path) -> Path:
    """``dest`` (created) with ``src``'s store in it as ``results.sqlite``; ``src`` holds it packed or plain."""
    dest.mkdir(parents=True, exist_ok=True)
    packed = src / f"{STORE}.xz"
    if packed.is_file():
        with lzma.open(packed) as f, open(dest / STORE, "wb") as out:
            shutil.copyfileobj(f, out)
    else:
        shutil.copy(src / STORE, dest / STORE)
    return dest
