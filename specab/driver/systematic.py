"""Fail fast on systematic failures: when every arm's latest run failed at start-up with
the same cause (an env or engine problem that makes every server exit at start), the experiment stops: the
remaining runs are left not run (a ``--resume`` runs them once the cause is fixed), not played one by one
into the same failure.

One implementation for every executor: the executors report each finished run's status through their
``on_status`` callback; ``FailFast.observe`` reads the store's records of this session and raises
``SystematicFailure`` when the rule holds.
"""
from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from specab.results import store as st

# the display phases of a run before its benchmark: a failure there is a start-up failure
STARTUP_PHASES = frozenset({"preparing", "stopping", "waiting for GPUs", "starting", "loading", "loading weights",
                            "capturing graphs", "ready", "verifying env"})
# a failure reason's own words end where the log tail it quotes begins (per-run and queue paths alike)
_TAIL_MARK = re.compile(r"\.?\s*Log tail of |\n")
# what differs between two runs that failed for one reason: when, which process, which port, which run
_NORMALISE: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?"), "<time>"),
    (re.compile(r"\b\d{8}[T-]\d{6}\b"), "<time>"),
    (re.compile(r"\b\d\d:\d\d:\d\d(?:\.\d+)?\b"), "<time>"),
    (re.compile(r"(?i)\b(pid|pgid|process)( group)?\s*[:=#]?\s*\d+"), r"\1\2 <n>"),
    (re.compile(r"(?i)\bport\s*[:=]?\s*\d+"), "port <n>"),
    (re.compile(r"((?:\d{1,3}\.){3}\d{1,3}|localhost|\[[0-9a-fA-F:]+\]):\d{2,5}\b"), r"\1:<port>"),
    (re.compile(r"((?:\d{1,3}\.){3}\d{1,3}|localhost)(['\"],\s*)\d{2,5}\b"), r"\1\2<port>"),
    (re.compile(r"\b0x[0-9a-fA-F]{6,}\b"), "0x<addr>"),
    (re.compile(r"\b\d+(?:\.\d+)?\s?(?:ms|s|sec|seconds)\b"), "<t>"),
    # every other number: one cause met on GPU 3 and on GPU 7 (`GPU 15 does not exist`, `CUDA out of memory. Tried
    # to allocate 2.00 GiB. GPU 3 has ...`), with another rank, size or count, is still one cause
    (re.compile(r"\d+(?:\.\d+)?"), "<n>"),
    (re.compile(r"\s+"), " "),
)
MAX_CAUSE = 400
STOPPED = "stopped"          # the experiment's status after a systematic failure stopped it (resumable)


def startup_cause(reason: str | None, run_id: str = "", arm: str = "") -> str:
    """A failure reason reduced to what two runs hit by one systematic problem share, its cause: the text before
    the quoted log tail, with timestamps, pids, ports, durations, every other number (GPU indices, ranks, sizes) and
    the run's own id, arm and directory replaced by placeholders."""
    text = _TAIL_MARK.split(reason or "", maxsplit=1)[0]
    if run_id:
        text = text.replace(run_id, "<run>")
    if arm:
        text = re.sub(rf"(?<![\w.-]){re.escape(arm)}(?![\w.-])", "<arm>", text)
    text = re.sub(r"/runs/[^/\s'\"]+", "/runs/<run>", text)
    for pattern, repl in _NORMALISE:
        text = pattern.sub(repl, text)
    return text.strip()[:MAX_CAUSE]


class SystematicFailure(Exception):
    """Every arm failed at start-up for one cause: the experiment stops (the message says what to do)."""

    def __init__(self, cause: str, runs: list[str], arms: list[str]):
        self.cause, self.runs, self.arms = cause, runs, arms
        super().__init__(f"every arm ({', '.join(arms)}) failed at start-up with the same cause, {len(runs)} run(s) "
                         f"({', '.join(runs)}): {cause}")

    def message(self, exp_id: str, not_run: int, resume_hint: str) -> str:
        """What the user reads when the experiment stops."""
        return (f"\nStopped: every arm failed at start-up with the same cause; the {not_run} remaining run(s) were "
                f"not run (a systematic failure: each of them would fail the same way).\n"
                f"  cause: {self.cause}\n"
                f"  hit {len(self.runs)} run(s): {', '.join(self.runs)}\n"
                f"Fix the cause on the node or in the experiment (the FAILED lines below quote the log), then run the "
                f"rest with: {resume_hint} (add --retry-failed to run the failed ones again too).")


@dataclass
class FailFast:
    """The systematic-failure rule over the runs one session started (``since``) for ``arms``."""

    arms: frozenset[str]
    since: float
    min_runs: int = 2            # a one-arm experiment is not stopped by its first failure
    host: str | None = None      # a fleet judges each host on its own runs (one broken host, healthy others)

    @classmethod
    def for_runs(cls, arms: Iterable[str], host: str | None = None) -> "FailFast":
        return cls(arms=frozenset(arms), since=time.time(), host=host)

    def check(self, runs: list[dict[str, Any]]) -> SystematicFailure | None:
        """The stop when every arm's latest finished run of this session failed at start-up with one cause."""
        mine = [r for r in runs if r["arm"] in self.arms and r["started"] >= self.since
                and r["status"] in (st.OK, st.FAILED) and (self.host is None or r.get("host") == self.host)]
        latest = {r["arm"]: r for r in sorted(mine, key=lambda r: (r["finished"] or 0, r["seq"]))}
        if not self.arms or set(latest) != set(self.arms):
            return None
        causes = set()
        for r in latest.values():
            if r["status"] != st.FAILED or r["failure_phase"] not in STARTUP_PHASES:
                return None
            causes.add(startup_cause(r["failure_reason"], r["run_id"], r["arm"]))
        if len(causes) != 1 or not next(iter(causes)):
            return None
        [cause] = causes
        hit = [r["run_id"] for r in sorted(mine, key=lambda r: r["seq"]) if r["status"] == st.FAILED
               and r["failure_phase"] in STARTUP_PHASES
               and startup_cause(r["failure_reason"], r["run_id"], r["arm"]) == cause]
        if len(hit) < self.min_runs:
            return None
        return SystematicFailure(cause, hit, sorted(self.arms))

    def observe(self, store: st.Store, status: str) -> None:
        """An executor's ``on_status``: after a failed run, raise SystematicFailure when the rule holds."""
        if status != st.FAILED:
            return
        stop = self.check(store.runs())
        if stop is not None:
            raise stop
