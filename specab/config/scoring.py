"""Which baseline run scores which runs' outputs (temperature > 0), decided from the plan alone.

At temperature > 0 the baseline server scores outputs under the target (specab/node/scoring.py), inside its own run
after the measured window, so the scoring costs no extra server start. A run's outputs can only be scored by a
baseline run that comes after it on the same node: each baseline run scores its own outputs and those of every
earlier run of its speculative arms on its host that no earlier run of it scored. In an interleaved block whose
baseline comes first, that block's speculative runs are scored by the next block's baseline run (on a fleet, the
next block on the same host); the runs after the last baseline run of a host stay unscored, and the analysis says
so (docs/analysis.md, "Output distribution"). The assignment depends only on the runs before a baseline run, so
blocks added later (``--target-ci``) or a resume never change it. Burn-in runs (unmeasured) are given to none.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from specab.config.plan import PlannedRun


def assign(runs: Sequence[PlannedRun], baseline_of: Mapping[str, str]) -> dict[int, list[str]]:
    """The runs of one host -> {seq of each baseline run: the run ids it scores, in plan order, its own last}.
    ``baseline_of``: each arm's baseline (a baseline names itself)."""
    waiting: dict[str, list[str]] = {}
    out: dict[int, list[str]] = {}
    for pr in sorted(runs, key=lambda r: r.seq):
        base = baseline_of.get(pr.arm, pr.arm)
        if base == pr.arm:
            out[pr.seq] = waiting.pop(pr.arm, []) + [pr.run_id]
        else:
            waiting.setdefault(base, []).append(pr.run_id)
    return out

