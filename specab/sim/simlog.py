"""SGLang's log line format: ``[YYYY-mm-dd HH:MM:SS<prefix>] message`` on stderr.

The prefix is `` TP{rank}`` when TP > 1 (SGLang's ``configure_logger``), empty for the main
process. Lines are written whole with one ``write`` so concurrent processes do not interleave.
"""
from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import TextIO


def sglang_prefix(tp_rank: int | None, tp_size: int) -> str:
    return f" TP{tp_rank}" if tp_rank is not None and tp_size > 1 else ""


LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}


class SimLogger:
    """SGLang's logger: ``--log-level warning`` hides the info lines (batch lines, load phases)."""

    def __init__(self, prefix: str = "", stream: TextIO | None = None, level: str = "info"):
        self.prefix = prefix
        self.stream = stream
        self.level = LEVELS.get(str(level).lower(), 20)

    def line(self, message: str) -> str:
        return f"[{time.strftime('%Y-%m-%d %H:%M:%S')}{self.prefix}] {message}"

    def info(self, message: str) -> None:
        if self.level <= 20:
            self.raw(self.line(message))

    def warning(self, message: str) -> None:
        if self.level <= 30:
            self.raw(self.line(message))

    def error(self, message: str) -> None:
        if self.level <= 40:
            self.raw(self.line(message))

    def raw(self, text: str) -> None:
        data = (text if text.endswith("\n") else text + "\n").encode()
        if self.stream is not None:
            self.stream.write(data.decode())
            self.stream.flush()
            return
        with contextlib.suppress(OSError):
            os.write(sys.stderr.fileno(), data)
