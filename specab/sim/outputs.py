"""What the simulated model generates, and how a speculative server departs from it.

The target model is a function of the prompt: its greedy continuation (the token ids, and without ``ignore_eos`` the
position of its end of sequence) comes from a generator seeded by the prompt alone, so every server instance and
every arm serving the target generates the same output for the same prompt, as a real greedy target does. A lossless
speculative server commits exactly the target's tokens. The ways a speculative server departs from them, each
recorded per request as ``diverged_at`` (the 0-based position of its first token that is not the target's; None:
none) in the simulator's trace, the truth the output-validity analysis is tested against:

- forced acceptance, SGLang's ``SGLANG_SIMULATE_ACC_LEN`` on a speculative server: draft tokens are committed
  unchecked, so only the prefill's token is the target's (measured on a real SGLang 0.5.17: 3 of 768 tokens of
  3 requests followed the target);
- fault ``lossy=P``: each token a decode step commits is not the target's with probability P;
- fault ``late_divergence=FROM:SHARE``: a share SHARE of requests departs once, at a position drawn uniformly from
  the last (1 - FROM) of its length: the late divergence batch-dependent numerics give real models; off in the
  deterministic mode (``--enable-deterministic-inference``: batch-invariant kernels), where the others stay;
- fault ``loop=N``: the output departs within its first 8 tokens into a repeated N-token cycle and runs to the token
  limit (a loop is easy to draft: acceptance and tok/s rise).

From its first departure on, an output follows a trajectory of its own (a real model conditions on what it emitted),
and without ``ignore_eos`` ends where that trajectory ends. A request sampled at temperature > 0 draws its output
from the target's distribution instead (sampling.py), each departure changing that law. Pure: nothing here sleeps or
touches files.
"""
from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass
from typing import Optional, Sequence

from specab.sim import sampling

ID_LOW, ID_HIGH = 1000, 150000      # output token ids are drawn from [ID_LOW, ID_HIGH)
LOOP_START_MAX = 8                  # a looping output departs within its first 8 tokens


@dataclass(frozen=True)
class Departure:
    """How a server's committed tokens depart from the target's (all off: the target's exactly)."""
    forced: bool = False                        # SGLANG_SIMULATE_ACC_LEN on a speculative server
    lossy: float = 0.0                          # per committed decode token
    late: Optional[tuple[float, float]] = None  # (FROM, SHARE)
    loop: Optional[int] = None                  # cycle length N

    @property
    def any(self) -> bool:
        return self.forced or self.lossy > 0 or self.late is not None or self.loop is not None


def prompt_digest(prompt: Sequence[str]) -> str:
    return hashlib.sha256("\x1f".join(prompt).encode("utf-8")).hexdigest()[:32]


def _end(rng: random.Random, max_new: int, ignore_eos: bool) -> int:
    """Where an output ends: at the token limit, or (without ignore_eos) where its model's end of sequence comes."""
    if ignore_eos or max_new <= 1:
        return max(0, max_new)
    return rng.randint(max(1, max_new // 2), max_new)


class Output:
    """One request's output, token by token: the target's, then (from ``diverged_at``) a trajectory of its own."""

    def __init__(self, prompt: Sequence[str], max_new: int, ignore_eos: bool, departure: Departure,
                 draw: random.Random, other_seed: str, sampled: Optional[sampling.Sampling] = None) -> None:
        digest = prompt_digest(prompt)
        self.ids: list[int] = []
        self.sample: Optional[sampling.Sample] = None
        if sampled is not None:
            self._sampled(digest, max(0, max_new), ignore_eos, departure, draw, sampled, other_seed)
            return
        self._target = random.Random(f"target:{digest}")
        target_end = _end(random.Random(f"target-end:{digest}"), max_new, ignore_eos)
        self.diverged_at = self._departure(departure, target_end, draw)
        self.loop = departure.loop if self.diverged_at is not None else None
        self.stop_at = target_end
        self._other = random.Random(f"other:{digest}:{other_seed}")
        if self.diverged_at is not None:
            self.stop_at = (max(0, max_new) if self.loop is not None
                            else max(self.diverged_at + 1, _end(self._other, max_new, ignore_eos)))

    def _sampled(self, digest: str, max_new: int, ignore_eos: bool, d: Departure, draw: random.Random,
                 s: sampling.Sampling, other_seed: str) -> None:
        """The whole output drawn at once from the target's law (sampling.py), departing where ``d`` says."""
        departs = sampling.Departs(forced=d.forced, lossy=d.lossy, loop=d.loop)
        if d.loop is not None and max_new > 1:
            departs.loop_from = draw.randint(1, min(LOOP_START_MAX, max_new - 1))
        if d.late is not None and max_new > 1 and draw.random() < d.late[1]:
            departs.late_from = draw.randint(min(max_new - 1, max(1, math.ceil(d.late[0] * max_new))), max_new - 1)
        self.sample = sampling.sample(digest, max_new, ignore_eos, s, random.Random(f"sample:{other_seed}"), departs)
        self.diverged_at = self.sample.diverged_at
        self.loop = d.loop if departs.loop_from is not None else None
        self.stop_at = len(self.sample.ids)

    @staticmethod
    def _departure(d: Departure, n: int, draw: random.Random) -> Optional[int]:
        """The first position whose token is not the target's (None: the whole output is), drawn once."""
        if n <= 1 or not d.any:          # one token: the prefill's, always the target's
            return None
        if d.forced:
            return 1
        if d.loop is not None:
            return draw.randint(1, min(LOOP_START_MAX, n - 1))
        if d.late is not None:
            start, share = d.late
            if draw.random() >= share:
                return None
            return draw.randint(min(n - 1, max(1, math.ceil(start * n))), n - 1)
        pos = 1
        while pos < n:
            if draw.random() < d.lossy:
                return pos
            pos += 1
        return None

    def next_id(self) -> int:
        pos = len(self.ids)
        if self.sample is not None:
            self.ids.append(self.sample.ids[pos])
            return self.ids[-1]
        target = self._target.randrange(ID_LOW, ID_HIGH)    # drawn at every position: the target's stays aligned
        if self.diverged_at is None or pos < self.diverged_at:
            tok = target
        elif self.loop is not None and pos - self.diverged_at >= self.loop:
            tok = self.ids[pos - self.loop]     # the first N tokens after the departure are the cycle, repeated
        else:
            tok = self._other.randrange(ID_LOW, ID_HIGH)
            if pos == self.diverged_at and tok == target:
                tok = ID_LOW + (tok - ID_LOW + 1) % (ID_HIGH - ID_LOW)
        self.ids.append(tok)
        return tok
