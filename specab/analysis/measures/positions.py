"""Per-position acceptance: how often the draft's i-th proposal was accepted, given that its (i-1)-th was.

Evidence per run (``Run.spec_positions``, from bench_summary.json's ``spec_positions``, node/loadgen): the verify
cycles and, per draft position i = 1..k, the cycles that accepted position i. It comes from each request's own counts
(SGLang's per-request ``spec_correct_drafts_histogram``; vLLM's ``spec_decode_num_accepted_tokens_per_pos`` around each
request, known-truth runs) or from vLLM's counters over the measured window (``from: metrics``). Both engines count a
cycle's correct proposals also past the request's last token (vocab/engines.py ``accepted_per_position``).

With a_0 = cycles and a_i = the cycles that accepted position i, the conditional acceptance at position i is
a_i / a_{i-1} (specmodel.conditional_rates): the chain model's alpha_i (specmodel.chain_tau_rates). The tokens per cycle they imply,
1 + sum_i a_i / cycles, is vLLM's acceptance length (the bonus token included).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from specab.analysis.measures import specmodel
from specab.analysis.evidence.model import Experiment, Run


@dataclass(frozen=True)
class Counts:
    """One run's (or a pool of runs') per-position counts."""
    cycles: int
    accepted: tuple[int, ...]        # accepted[i-1]: the cycles that accepted draft position i
    source: str = "requests"         # requests (each request's own counts) | metrics (the window's counter delta)

    @classmethod
    def of(cls, doc: dict | None, steps: int | None = None) -> "Counts | None":
        """From a summary's spec_positions; positions past the recorded list (SGLang sends its histogram only up to
        the largest count seen) accepted nothing, up to ``steps``. None without cycles."""
        if not isinstance(doc, dict):
            return None
        cycles, acc = doc.get("cycles"), doc.get("accepted_per_pos")
        if not isinstance(cycles, int) or cycles <= 0 or not isinstance(acc, list) or \
                not all(isinstance(x, int) and x >= 0 for x in acc):
            return None
        k = max(len(acc), steps or 0)
        return cls(cycles, tuple(acc) + (0,) * (k - len(acc)), str(doc.get("from") or "requests"))

    def __add__(self, other: "Counts") -> "Counts":
        k = max(len(self.accepted), len(other.accepted))
        a = self.accepted + (0,) * (k - len(self.accepted))
        b = other.accepted + (0,) * (k - len(other.accepted))
        source = self.source if self.source == other.source else "mixed"
        return Counts(self.cycles + other.cycles, tuple(x + y for x, y in zip(a, b)), source)

    @property
    def conditional(self) -> list[float | None]:
        """P(position i accepted | position i-1 accepted), i = 1..k; None where position i-1 was never accepted."""
        return specmodel.conditional_rates(self.cycles, self.accepted)

    @property
    def tokens_per_cycle(self) -> float:
        """1 + accepted drafts / cycles: what the conditional rates imply through the chain."""
        return 1.0 + sum(self.accepted) / self.cycles

    def chain_rates(self) -> list[float]:
        """The conditional rates for the chain model: a position never reached counts as never accepted."""
        return [x if x is not None else 0.0 for x in self.conditional]


def of_run(run: Run, steps: int | None = None) -> Counts | None:
    return Counts.of(run.spec_positions, steps)


@dataclass
class ArmPositions:
    """An arm's per-position acceptance: pooled over its runs (counts summed) and per run."""
    arm: str
    steps: int | None
    runs: int                              # ok runs that recorded per-position counts
    runs_without: int                      # ok runs that did not
    pooled: Counts
    per_run: list[list[float | None]] = field(default_factory=list)   # each run's conditional rates

    @property
    def conditional(self) -> list[float | None]:
        return self.pooled.conditional

    def spread(self, i: int) -> tuple[float, float] | None:
        """Lowest and highest conditional rate at position i+1 over the runs (None with fewer than two)."""
        vals = [r[i] for r in self.per_run if i < len(r) and r[i] is not None]
        return (min(vals), max(vals)) if len(vals) > 1 else None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["pooled"] = dict(asdict(self.pooled), conditional=self.conditional,
                           tokens_per_cycle=self.pooled.tokens_per_cycle)
        return d


def arm_positions(exp: Experiment, arm: str) -> ArmPositions | None:
    """The arm's per-position acceptance over its ok runs that recorded it; None when none did."""
    steps = exp.arm(arm).steps
    runs = exp.runs_of(arm)
    counts = [c for c in (of_run(r, steps) for r in runs) if c is not None]
    if not counts:
        return None
    pooled = counts[0]
    for c in counts[1:]:
        pooled = pooled + c
    return ArmPositions(arm, steps, len(counts), len(runs) - len(counts), pooled, [c.conditional for c in counts])


def table(exp: Experiment) -> list[ArmPositions]:
    """Every speculative arm that measured per-position acceptance, in the experiment's arm order."""
    return [p for p in (arm_positions(exp, a.name) for a in exp.spec_arms) if p is not None]
