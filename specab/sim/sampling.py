"""The simulated target's distribution, for requests sampled at temperature > 0, and its scores.

At each output position the target model's distribution is a function of the prompt and of the output so far (its
prefix): a generator seeded by the prompt's digest, the position and a rolling hash of the prefix draws ``K``
candidate token ids, ranked; candidate ``r`` has the raw logit ``-r * GAP`` (rank 0 is the greedy token). With
``EOS_SHARE`` of the states the end of sequence is one of the candidates (never rank 0), so an answer without
``ignore_eos`` ends where a drawn end of sequence comes. Every other token of the vocabulary has a negligible
probability: the score of a token outside the candidates is ``FLOOR_LOGPROB``.

A server samples with the request's temperature and top_p from the candidates (the end of sequence masked with
``ignore_eos``), drawing from a generator of its own: a baseline and a lossless speculative server draw differently
from the same law. A departure (outputs.py ``Departure``) changes the law from its position on: ``lossy=P`` draws
each committed decode token, with probability P, uniformly among the candidates instead (more off-greedy tokens);
``late_divergence`` does so for every token from its position; forced acceptance (``SGLANG_SIMULATE_ACC_LEN``)
commits tokens from outside the candidates after the prefill's; ``loop=N`` repeats N such tokens. Each request's
truth (the tokens drawn off the target's law, the sum of the target log-probabilities of its output) goes to the
trace.

Scores are log-probabilities under the raw distribution (temperature 1, no top_p), as an engine's input-token
log-probabilities are: log p(rank r) = -r * GAP - log sum_j exp(-j * GAP). Pure: nothing here sleeps or touches
files.
"""
from __future__ import annotations

import bisect
import functools
import hashlib
import math
import random
from dataclasses import dataclass
from typing import Optional, Sequence

K = 6                   # candidate tokens per state
GAP = 1.0               # raw logit step between consecutive candidates (nats)
EOS_SHARE = 0.25        # states whose candidates hold the end of sequence
EOS = -1                # the end of sequence among the candidates (never emitted as an output id)
FLOOR_LOGPROB = -20.0   # the score of a token outside the candidates
ID_LOW, ID_HIGH = 1000, 150000
_LOG_Z = math.log(sum(math.exp(-r * GAP) for r in range(K)))
_MASK = (1 << 61) - 1


@dataclass(frozen=True)
class Sampling:
    """A request's sampling settings (temperature > 0)."""
    temperature: float
    top_p: float = 1.0


def raw_logprob(rank: int) -> float:
    return -rank * GAP - _LOG_Z


def roll(h: int, token: int) -> int:
    """The prefix hash after ``token``: the state of the next position depends on every earlier output token."""
    return (h * 1000003 + token + 7) & _MASK


def candidates(digest: str, pos: int, h: int) -> list[int]:
    """The target's candidates at output position ``pos`` after the prefix hashed ``h``, by rank (EOS possible):
    drawn from a hash of the three (a few microseconds a token, where a seeded generator costs a hundred)."""
    raw = hashlib.blake2b(f"law:{digest}:{pos}:{h}".encode(), digest_size=64).digest()
    ids: list[int] = []
    for k in range(0, 60, 4):
        tok = ID_LOW + int.from_bytes(raw[k:k + 4], "little") % (ID_HIGH - ID_LOW)
        if tok not in ids:
            ids.append(tok)
            if len(ids) == K:
                break
    if raw[60] < 256 * EOS_SHARE:
        ids[1 + raw[61] % (K - 1)] = EOS
    return ids


def score(digest: str, ids: Sequence[int]) -> list[float]:
    """The target's raw log-probability of each output token in turn (a token outside the candidates:
    FLOOR_LOGPROB)."""
    out, h = [], 0
    for pos, tok in enumerate(ids):
        cands = candidates(digest, pos, h)
        out.append(raw_logprob(cands.index(tok)) if tok in cands else FLOOR_LOGPROB)
        h = roll(h, tok)
    return out


@functools.lru_cache(maxsize=256)
def _nucleus(temperature: float, top_p: float, masked: int) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """The ranks a draw keeps at temperature and top_p (rank ``masked`` left out: the end of sequence under
    ignore_eos; -1: none) and their cumulative weights: the smallest prefix by rank whose share reaches top_p."""
    ranks = [r for r in range(K) if r != masked]
    weights = [math.exp(-r * GAP / temperature) for r in ranks]
    total, cum, kept, cums = sum(weights), 0.0, [], []
    for r, w in zip(ranks, weights):
        kept.append(r)
        cum += w
        cums.append(cum)
        if cum / total >= top_p - 1e-12:
            break
    return tuple(kept), tuple(cums)


def _draw(cands: list[int], s: Sampling, ignore_eos: bool, rng: random.Random) -> int:
    """One token from the target's law at temperature and top_p (the end of sequence masked with ignore_eos)."""
    masked = cands.index(EOS) if ignore_eos and EOS in cands else -1
    ranks, cums = _nucleus(s.temperature, s.top_p, masked)
    return cands[ranks[min(len(ranks) - 1, bisect.bisect_right(cums, rng.random() * cums[-1]))]]


@dataclass
class Sample:
    """One sampled output: its ids, whether it ended at a drawn end of sequence, and the truth of its law."""
    ids: list[int]
    stopped: bool
    off_law: int                    # tokens not drawn from the target's law
    diverged_at: Optional[int]      # the first of them (None: none)
    target_logprob: float           # the sum of the target's raw log-probabilities of ``ids``


def sample(digest: str, max_new: int, ignore_eos: bool, s: Sampling, rng: random.Random,
           departs: "Departs") -> Sample:
    """The whole output of one request, drawn token by token until an end of sequence or ``max_new``."""
    ids: list[int] = []
    off, first, logp, h, stopped = 0, None, 0.0, 0, False
    cycle: list[int] = []
    while len(ids) < max_new:
        pos = len(ids)
        cands = candidates(digest, pos, h)
        law = departs.law(pos, rng)
        if law == "target":
            tok = _draw(cands, s, ignore_eos, rng)
        elif law == "uniform":
            tok = rng.choice([t for t in cands if t != EOS])
        elif law == "loop" and len(cycle) >= (departs.loop or 1):
            tok = cycle[len(cycle) - (departs.loop or 1)]
            cycle.append(tok)
        else:                                       # forced, or a loop's cycle being drawn
            tok = rng.randrange(ID_LOW, ID_HIGH)
            if law == "loop":
                cycle.append(tok)
        if tok == EOS:
            stopped = True
            break
        if law != "target":
            off += 1
            first = pos if first is None else first
        logp += raw_logprob(cands.index(tok)) if tok in cands else FLOOR_LOGPROB
        ids.append(tok)
        h = roll(h, tok)
    return Sample(ids=ids, stopped=stopped, off_law=off, diverged_at=first, target_logprob=logp)


@dataclass
class Departs:
    """Where a sampled output leaves the target's law (outputs.py's Departure, drawn for one request): ``law`` says,
    per position, "target", "uniform" (lossy, late divergence), "forced" or "loop"."""
    forced: bool = False
    lossy: float = 0.0
    late_from: Optional[int] = None     # a late divergence's position (drawn once per request)
    loop_from: Optional[int] = None
    loop: Optional[int] = None

    def law(self, pos: int, rng: random.Random) -> str:
        if pos == 0:
            return "target"                 # the prefill's token is always the target's
        if self.forced:
            return "forced"
        if self.loop_from is not None and pos >= self.loop_from:
            return "loop"
        if self.late_from is not None and pos >= self.late_from:
            return "uniform"
        if self.lossy > 0 and rng.random() < self.lossy:
            return "uniform"
        return "target"
