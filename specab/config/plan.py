"""The run plan: arms x repeats in blocks, each block a seeded random order (or `blocked`).

Interleaving puts every arm in every block, so slow drift of the node hits all arms alike and
the analysis can pair each arm with the baseline of the same block. The order of block b
depends only on (seed, b), so adding blocks later (sequential stopping, --resume) never
changes the blocks already planned.

A burn-in (the experiment's design.burn_in) puts N unmeasured runs before the first block on each host: ordinary
runs of the plan (a server start and its benchmark, through the same executors, stored as they finish) marked
``burn_in``, with the block they precede (so a fleet runs each host's burn-in on that host) and the arms in that
block's order, taken in turn. They come first in the plan, so a node's first starts are theirs; the analysis keeps
them apart from the measured runs.
"""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Literal

Order = Literal["interleaved", "blocked"]


@dataclass(frozen=True)
class PlannedRun:
    seq: int                # 1-based, the run's position in the experiment
    block: int              # 1-based replicate block
    arm: str
    position: int           # position within its block (1-based)
    # measured requests of this run when the design by cost chose them (docs/statistics.md, "Design by cost");
    # None: the experiment's bench.num_requests
    num_requests: int | None = None
    burn_in: bool = False   # an unmeasured start before block `block` (design.burn_in): run, stored, not analysed

    @property
    def run_id(self) -> str:
        return f"{self.seq:03d}-{self.arm}"

    def to_json(self) -> dict[str, object]:
        return {**asdict(self), "run_id": self.run_id}

    @classmethod
    def from_row(cls, row: dict[str, object]) -> "PlannedRun":
        """A planned run from a row of the store's plan table (num_requests absent in stores before it)."""
        m = row.get("num_requests")
        return cls(seq=int(row["seq"]), block=int(row["block"]), arm=str(row["arm"]),  # type: ignore[arg-type]
                   position=int(row["position"]), num_requests=None if m is None else int(m),  # type: ignore[arg-type]
                   burn_in=bool(row.get("burn_in")))


def block_order(arms: list[str], seed: int, block: int) -> list[str]:
    """The seeded random order of one block (deterministic in seed and block only)."""
    order = list(arms)
    random.Random(f"specab-plan:{seed}:{block}").shuffle(order)
    return order


def burn_in_runs(arms: list[str], burn_in: int, seed: int, order: Order = "interleaved", blocks: int = 1,
                 first_block: int = 1, first_seq: int = 1, num_requests: int | None = None) -> list[PlannedRun]:
    """`burn_in` unmeasured runs before each of the `blocks` blocks from `first_block` (one per host of a fleet: a
    host's first block), the arms in that block's order taken in turn, numbered from `first_seq`."""
    if burn_in < 0:
        raise ValueError(f"burn_in must be at least 0, got {burn_in}")
    runs: list[PlannedRun] = []
    for b in range(first_block, first_block + blocks):
        names = block_order(arms, seed, b) if order == "interleaved" else list(arms)
        for i in range(burn_in):
            runs.append(PlannedRun(seq=first_seq + len(runs), block=b, arm=names[i % len(names)], position=i + 1,
                                   num_requests=num_requests, burn_in=True))
    return runs


def make_plan(arms: list[str], repeats: int, seed: int, order: Order = "interleaved",
              first_block: int = 1, first_seq: int = 1, num_requests: int | None = None,
              burn_in: int = 0, burn_in_blocks: int = 1) -> list[PlannedRun]:
    """Plan `repeats` blocks of `arms` starting at block `first_block` and sequence `first_seq`; `num_requests`:
    the measured requests of these runs when a design chose them (None: the experiment's). With `burn_in`, that
    many unmeasured runs come first, before each of the first `burn_in_blocks` blocks (a fleet's hosts' first)."""
    if repeats < 1:
        raise ValueError(f"--repeats must be at least 1, got {repeats}")
    if not arms:
        raise ValueError("no arms to plan")
    if len(set(arms)) != len(arms):
        raise ValueError(f"duplicate arm names in {arms}")
    runs = burn_in_runs(arms, burn_in, seed, order, min(burn_in_blocks, repeats), first_block, first_seq,
                        num_requests)
    seq = first_seq + len(runs)
    if order == "blocked":
        # all repeats of arm A, then arm B ... (block = replicate index, for pairing)
        for arm in arms:
            for r in range(repeats):
                runs.append(PlannedRun(seq=seq, block=first_block + r, arm=arm, position=arms.index(arm) + 1,
                                       num_requests=num_requests))
                seq += 1
        return runs
    if order != "interleaved":
        raise ValueError(f"unknown order {order!r}: use interleaved or blocked")
    for b in range(first_block, first_block + repeats):
        for pos, arm in enumerate(block_order(arms, seed, b), start=1):
            runs.append(PlannedRun(seq=seq, block=b, arm=arm, position=pos, num_requests=num_requests))
            seq += 1
    return runs
