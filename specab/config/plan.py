"""The run plan: arms x repeats in blocks, each block a seeded random order (or `blocked`).

Interleaving puts every arm in every block, so slow drift of the node hits all arms alike and
the analysis can pair each arm with the baseline of the same block. The order of block b
depends only on (seed, b), so adding blocks later (sequential stopping, --resume) never
changes the blocks already planned.
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
                   position=int(row["position"]), num_requests=None if m is None else int(m))  # type: ignore[arg-type]


def block_order(arms: list[str], seed: int, block: int) -> list[str]:
    """The seeded random order of one block (deterministic in seed and block only)."""
    order = list(arms)
    random.Random(f"specab-plan:{seed}:{block}").shuffle(order)
    return order


def make_plan(arms: list[str], repeats: int, seed: int, order: Order = "interleaved",
              first_block: int = 1, first_seq: int = 1, num_requests: int | None = None) -> list[PlannedRun]:
    """Plan `repeats` blocks of `arms` starting at block `first_block` and sequence `first_seq`; `num_requests`:
    the measured requests of these runs when a design chose them (None: the experiment's)."""
    if repeats < 1:
        raise ValueError(f"--repeats must be at least 1, got {repeats}")
    if not arms:
        raise ValueError("no arms to plan")
    if len(set(arms)) != len(arms):
        raise ValueError(f"duplicate arm names in {arms}")
    runs: list[PlannedRun] = []
    seq = first_seq
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
