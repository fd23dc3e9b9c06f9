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

With one server per instance (design.server: per-instance, docs/decisions/0011), the arms that differ only in load
form a group (``groups``: arm -> group), and a block runs each group's arms back to back: an **instance**, one
server start for its loads. The block's order is the same seeded shuffle, its arms gathered by group where the
group's first arm falls, so the groups' order and each group's load order are both drawn from (seed, block). A run of
an instance carries its ``instance`` (the seq of the instance's first run) and its ``instance_pos`` (1, 2, ...); a
group of one arm, and a burn-in run, has no instance.
"""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass, replace
from typing import Literal, Mapping

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
    # the instance the run belongs to (the seq of its first run) and its position there (1-based); None / 0: the run
    # starts a server of its own (design.server: per-run, or an arm with no other load in its block)
    instance: int | None = None
    instance_pos: int = 0

    @property
    def run_id(self) -> str:
        return f"{self.seq:03d}-{self.arm}"

    def to_json(self) -> dict[str, object]:
        return {**asdict(self), "run_id": self.run_id}

    @classmethod
    def from_row(cls, row: dict[str, object]) -> "PlannedRun":
        """A planned run from a row of the store's plan table (num_requests absent in stores before it)."""
        m, i = row.get("num_requests"), row.get("instance")
        return cls(seq=int(row["seq"]), block=int(row["block"]), arm=str(row["arm"]),  # type: ignore[arg-type]
                   position=int(row["position"]), num_requests=None if m is None else int(m),  # type: ignore[arg-type]
                   burn_in=bool(row.get("burn_in")), instance=None if i is None else int(i),  # type: ignore[arg-type]
                   instance_pos=int(row.get("instance_pos") or 0))  # type: ignore[arg-type]


def block_order(arms: list[str], seed: int, block: int) -> list[str]:
    """The seeded random order of one block (deterministic in seed and block only)."""
    order = list(arms)
    random.Random(f"specab-plan:{seed}:{block}").shuffle(order)
    return order


def grouped_order(order: list[str], groups: Mapping[str, str]) -> list[str]:
    """A block's order with each group's arms together, where the group's first arm falls in ``order``, in the
    order they have there; an arm in no group keeps its place."""
    out: list[str] = []
    done: set[str] = set()
    for arm in order:
        g = groups.get(arm)
        if g is None:
            out.append(arm)
        elif g not in done:
            done.add(g)
            out += [a for a in order if groups.get(a) == g]
    return out


def _instances(runs: list[PlannedRun], groups: Mapping[str, str]) -> list[PlannedRun]:
    """Each run of a group of two or more consecutive runs of one block marked with its instance and position."""
    out: list[PlannedRun] = []
    i = 0
    while i < len(runs):
        g = None if runs[i].burn_in else groups.get(runs[i].arm)
        j = i + 1
        while g is not None and j < len(runs) and runs[j].block == runs[i].block and not runs[j].burn_in \
                and groups.get(runs[j].arm) == g:
            j += 1
        if j - i >= 2:
            out += [replace(r, instance=runs[i].seq, instance_pos=k + 1) for k, r in enumerate(runs[i:j])]
        else:
            out += runs[i:j]
        i = j
    return out


def keeps(runs: list[PlannedRun]) -> set[int]:
    """The seqs of the runs whose next run in ``runs`` (the order they run in) continues their instance: their
    server is kept up for it. A run before a gap (its next planned run already done) keeps nothing."""
    return {a.seq for a, b in zip(runs, runs[1:])
            if a.instance is not None and b.instance == a.instance and b.instance_pos > a.instance_pos}
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
              burn_in: int = 0, burn_in_blocks: int = 1,
              groups: Mapping[str, str] | None = None) -> list[PlannedRun]:
    """Plan `repeats` blocks of `arms` starting at block `first_block` and sequence `first_seq`; `num_requests`:
    the measured requests of these runs when a design chose them (None: the experiment's). With `burn_in`, that
    many unmeasured runs come first, before each of the first `burn_in_blocks` blocks (a fleet's hosts' first).
    `groups`: arm -> its group of arms that differ only in load, whose runs in a block form one instance (one server
    per instance)."""
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
        names = block_order(arms, seed, b)
        for pos, arm in enumerate(grouped_order(names, groups) if groups else names, start=1):
            runs.append(PlannedRun(seq=seq, block=b, arm=arm, position=pos, num_requests=num_requests))
            seq += 1
    return _instances(runs, groups) if groups else runs
