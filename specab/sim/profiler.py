"""The simulated ``/start_profile``: a small torch-profiler-style trace of the next N forward steps.

SGLang writes ``[{prefix}-]{profile_id}-TP-{rank}.trace.json.gz`` (Chrome trace JSON, gzipped) into the request's
``output_dir`` or ``$SGLANG_TORCH_PROFILER_DIR`` (default /tmp), profile_id = ``str(time.time())``
(the 2026 engines reference A6). Span names are the real ones: 0.5.23 ``step[DRAFT bs=N]``,
``draft``, ``draft_extend``, ``step[VERIFY bs=N]``, ``step[DECODE bs=N]``, ``step[EXTEND bs=N toks=T]``, each
as a ``user_annotation`` (CPU) and a ``gpu_user_annotation`` (device) event; 0.5.9 and 0.5.17 have no
DRAFT/VERIFY spans, a speculative cycle shows as ``step[DECODE bs=N]``. Durations follow the timing model.
"""
from __future__ import annotations

import gzip
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

DEFAULT_DIR = "/tmp"


class ProfileRequestError(ValueError):
    """A /start_profile body the simulated server refuses."""


@dataclass
class Profiler:
    """One profile in progress: collects step spans until ``num_steps`` steps were recorded."""
    path: Path
    num_steps: Optional[int]
    phase_spans: bool                       # 0.5.23: DRAFT/VERIFY/draft/draft_extend spans
    events: list[dict[str, Any]] = field(default_factory=list)
    steps: int = 0

    @classmethod
    def from_request(cls, body: Mapping[str, Any], env: Mapping[str, str], phase_spans: bool) -> "Profiler":
        num = body.get("num_steps")
        if num is not None and (isinstance(num, bool) or not isinstance(num, int) or num < 1):
            raise ProfileRequestError(f"num_steps must be a positive integer, got {num!r}")
        out = body.get("output_dir") or env.get("SGLANG_TORCH_PROFILER_DIR") or DEFAULT_DIR
        pid = str(body.get("profile_id") or time.time())
        prefix = body.get("profile_prefix")
        name = f"{prefix + '-' if prefix else ''}{pid}-TP-0.trace.json.gz"
        return cls(path=Path(out) / name, num_steps=num, phase_spans=phase_spans)

    def _span(self, name: str, start_s: float, dur_s: float) -> None:
        ts, dur = round(start_s * 1e6, 3), round(dur_s * 1e6, 3)
        self.events.append({"ph": "X", "cat": "user_annotation", "name": name, "pid": os.getpid(), "tid": 1,
                            "ts": ts, "dur": dur})
        self.events.append({"ph": "X", "cat": "gpu_user_annotation", "name": name, "pid": 0, "tid": 7,
                            "ts": ts + 5.0, "dur": max(0.0, dur - 5.0)})

    def record_decode(self, bs: int, start_s: float, wall_s: float, shares: Optional[Mapping[str, float]]) -> bool:
        """One decode step (``shares`` None) or speculative cycle; True when the profile is complete."""
        if shares is None or not self.phase_spans:
            self._span(f"step[DECODE bs={bs}]", start_s, wall_s)
        else:
            t = start_s
            draft = wall_s * shares["eagle_draft"]
            self._span(f"step[DRAFT bs={bs}]", t, draft)
            self._span("draft", t, draft)
            t += draft
            verify = wall_s * shares["target_verify"]
            self._span(f"step[VERIFY bs={bs}]", t, verify)
            t += verify
            self._span("draft_extend", t, wall_s * shares["eagle_draft_extend"])
        self.steps += 1
        return self.num_steps is not None and self.steps >= self.num_steps

    def record_extend(self, bs: int, tokens: int, start_s: float, wall_s: float) -> None:
        self._span(f"step[EXTEND bs={bs} toks={tokens}]", start_s, wall_s)

    def write(self) -> Path:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".part")
        with gzip.open(tmp, "wt", encoding="utf-8") as fh:
            json.dump({"schemaVersion": 1, "deviceProperties": [], "traceEvents": self.events}, fh)
        os.replace(tmp, self.path)
        return self.path
