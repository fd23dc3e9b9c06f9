"""The exact truth of a known-truth model pair (stdlib only): the rule, the draft's agreement, each cycle.

``known_truth.json`` (written next to each model by :mod:`specab.knowntruth.build`) is enough to recompute
everything here without specab:

- ``vocab_size``, ``first`` (the first non-special token id), ``rule`` = ``"t+1"``: the target's greedy next
  token after t is ``first + (t - first + 1) mod (vocab_size - first)`` for t >= first, and ``first`` for a
  special token (t < first).
- a draft's file adds ``agree`` (the sorted token ids t after which the draft proposes f(t); after any other
  token it proposes f(f(t)), which is wrong), ``p`` (the density it was drawn with) and ``seed``.
- ``token_text``: the tokenizer's word for id t is ``"w%d" % (t - first)`` (specials ``<pad> <s> </s> <unk>``).

The chain rule (topk 1, ``steps`` drafted tokens per cycle): from the last accepted token c, the draft's i-th
proposal is right iff the i-th token of the chain c, f(c), f(f(c)), ... lies in ``agree``; a cycle accepts the
consecutive right proposals (at most ``steps``) plus the target's bonus token. The prefill makes the first
output token (f of the prompt's last token) and is not a cycle.
"""
from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

FILE = "known_truth.json"
RULE = "t+1"


class KnownTruthError(Exception):
    """A known_truth.json that does not describe a known-truth model (what is wrong, which file)."""


@dataclass(frozen=True)
class Rule:
    vocab_size: int
    first: int

    def next(self, t: int) -> int:
        if t < self.first:
            return self.first
        return self.first + (t - self.first + 1) % (self.vocab_size - self.first)

    def follows(self, prompt_last: int, output_ids: Sequence[int]) -> int:
        """How many output tokens are the rule's next token after the token before them."""
        prev, n = prompt_last, 0
        for t in output_ids:
            n += t == self.next(prev)
            prev = t
        return n


@dataclass(frozen=True)
class RequestTruth:
    tokens: int                      # output tokens
    cycles: int                      # verify cycles (the prefill token excluded)
    accepted: tuple[int, ...]        # accepted draft tokens per cycle (the bonus token excluded)
    hits: tuple[int, ...] = ()       # right proposals per cycle, also those past the request's last token

    @property
    def accept_len(self) -> float:
        """SGLang's per-request accept length, completion_tokens / spec_verify_ct (the prefill token counted)."""
        return self.tokens / self.cycles if self.cycles else 0.0

    @property
    def drafted_accepted(self) -> int:
        return sum(self.accepted)

    @property
    def engine_accepted(self) -> int:
        """Accepted drafts as vLLM counts them: every cycle's right proposals, the last cycle's past max_tokens too."""
        return sum(self.accepted[:-1]) + self.hits[-1] if self.hits else 0

    def proposals_checked(self, steps: int) -> int:
        """Proposals the request's cycles decided on: each cycle's hits and, where it stopped short of steps with room
        for another token, the miss that stopped it (the last cycle only up to the tokens it could still add)."""
        made, checked = 1, 0
        for acc in self.accepted:
            checked += acc + (1 if acc < steps and acc < self.tokens - made - 1 else 0)
            made += acc + 1
        return checked


@dataclass(frozen=True)
class DraftTruth:
    """A draft's agreement with the target's rule (one draft model or EAGLE-3 head)."""
    rule: Rule
    agree: frozenset[int]
    p: float | None = None
    seed: int | None = None
    kind: str | None = None
    sha256: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def density(self) -> float:
        """The realized density of the agreement set over the non-special tokens."""
        n = self.rule.vocab_size - self.rule.first
        return sum(1 for t in self.agree if t >= self.rule.first) / n

    def request(self, prompt_last: int, tokens: int, steps: int) -> RequestTruth:
        """The exact cycles of one greedy request of ``tokens`` output tokens after ``prompt_last``."""
        if steps < 1:
            raise ValueError(f"steps must be >= 1 (got {steps})")
        if tokens < 1:
            return RequestTruth(0, 0, (), ())
        c = self.rule.next(prompt_last)             # the prefill's token
        made, acc, all_hits = 1, [], []
        while made < tokens:
            hits, x = 0, c
            while hits < steps and x in self.agree:
                hits += 1
                x = self.rule.next(x)
            gained = min(hits + 1, tokens - made)
            for _ in range(gained):
                c = self.rule.next(c)
            made += gained
            acc.append(gained - 1)
            all_hits.append(hits)
        return RequestTruth(made, len(acc), tuple(acc), tuple(all_hits))


def rule_of(doc: dict[str, Any], where: str = FILE) -> Rule:
    try:
        vocab, first = int(doc["vocab_size"]), int(doc["first"])
    except (KeyError, TypeError, ValueError) as exc:
        raise KnownTruthError(f"{where}: needs integer 'vocab_size' and 'first' ({exc})") from None
    if doc.get("rule") != RULE:
        raise KnownTruthError(f"{where}: rule {doc.get('rule')!r} is not {RULE!r}")
    if not 0 <= first < vocab - 1:
        raise KnownTruthError(f"{where}: first {first} must lie in [0, vocab_size - 1) (vocab_size {vocab})")
    return Rule(vocab, first)


def draft_of(doc: dict[str, Any], where: str = FILE) -> DraftTruth:
    """A draft's truth from its known_truth.json (``agree`` as a list) or a run summary's copy (a bitmap)."""
    rule = rule_of(doc, where)
    if "agree" in doc:
        agree = frozenset(int(t) for t in doc["agree"])
    elif "agree_bitmap_b64" in doc:
        bits = base64.b64decode(doc["agree_bitmap_b64"])
        agree = frozenset(t for t in range(rule.vocab_size) if bits[t >> 3] >> (t & 7) & 1)
    else:
        raise KnownTruthError(f"{where}: a draft's known truth needs 'agree' (the token ids where it agrees)")
    if any(not 0 <= t < rule.vocab_size for t in agree):
        raise KnownTruthError(f"{where}: 'agree' holds ids outside [0, vocab_size {rule.vocab_size})")
    return DraftTruth(rule, agree, doc.get("p"), doc.get("seed"), doc.get("kind"), doc.get("sha256"),
                      {k: v for k, v in doc.items() if k not in ("agree", "agree_bitmap_b64")})


def load(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise KnownTruthError(f"{path}: cannot read a known_truth.json: {exc}") from None
    if not isinstance(doc, dict):
        raise KnownTruthError(f"{path}: not a JSON object")
    rule_of(doc, str(path))
    return doc


def run_truth(draft: DraftTruth, requests: Iterable[tuple[int, int]], steps: int) -> list[RequestTruth]:
    """The truth of each (prompt_last_token, output_tokens) request."""
    return [draft.request(last, n, steps) for last, n in requests]
