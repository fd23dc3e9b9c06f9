"""The driver's interruption: the first SIGINT/SIGTERM sets a cancel event; handlers restored on exit."""
from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any


class Interrupt:
    """SIGINT/SIGTERM -> a cancel event (first signal); handlers restored on exit. Installed only in the
    main thread (a fleet's host threads share the main thread's)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signum: int | None = None
        self.at: float | None = None        # time of the first signal
        self._old: dict[int, Any] = {}

    def __enter__(self) -> "Interrupt":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if not self.event.is_set():
            self.signum = signum
            self.at = time.time()
            self.event.set()
            return
        # later signals: keep going, the server must still be stopped (no locks taken in a handler)
        os.write(2, b"\nspecab: still stopping the server of the current run; finished runs are safe.\n")

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
