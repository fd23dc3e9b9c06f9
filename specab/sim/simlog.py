"""SGLang's log line format: ``[YYYY-mm-dd HH:MM:SS<prefix>] message`` on stderr.

The prefix is `` TP{rank}`` when TP > 1 (SGLang's ``configure_logger``), empty for the main
process. Lines are written whole with one ``write`` so concurrent processes do not interleave.
"""
from __future__ import annotations

import os
import sys
import time
from typing import TextIO


def sglang_prefix(tp_rank: int | None, tp_size: int) -> str:
    return f" TP{tp_rank}" if tp_rank is not None and tp_size > 1 else ""


class SimLogger:
    def __init__(self, prefix: str = "", stream: TextIO | None = None):
        self.prefix = prefix
        self.stream = stream

    def line(self, message: str) -> str:
        return f"[{time.strftime('%Y-%m-%d %H:%M:%S')}{self.prefix}] {message}"

    def info(self, message: str) -> None:
        self.raw(self.line(message))

    warning = info
    error = info

    def raw(self, text: str) -> None:
        data = (text if text.endswith("\n") else text + "\n").encode()
        if self.stream is not None:
            self.stream.write(data.decode())
            self.stream.flush()
            return
        try:
            os.write(sys.stderr.fileno(), data)
        except OSError:
            pass
