"""The server instance as the unit of noise: each arm's spread across restarts beside the spread within its runs,
which of the two sets the width of its verdict, the burn-in starts, and a trend over the run order (the first
instances on a node slow) for the doctor's `instance-trend` rule (docs/statistics.md, "Instance spread").

Every number is on the log scale of a run's value (the median of its measured requests' decode tok/s), so an sd
reads as a share of the mean. The variance components are the design's (specab.analysis.cost.design:
`instance_components` per arm, `estimate_components` of the paired log ratio for the verdict); this module adds
their interval and the order in which the instances ran."""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field

from specab.analysis.cost import design, economics
from specab.analysis.evidence.model import Experiment, Run

LEVEL = 0.95
# A leading instance counts as low when it sits this many predictive sd below the later instances of its arm
# (their spread, never below what their requests alone explain) and at least `min_change` below their mean.
FIRST_Z = 4.0
# A drift of tok/s with the run order counts when its slope is beyond noise at this level (two-sided t test).
TREND_ALPHA = 0.01
# Below this ratio of the instances' own sd to the sd their requests imply, the run medians agree closer than
# independent requests allow: the request-to-request spread repeats in every run (the same seeded prompts).
CLOSER_THAN_REQUESTS = 0.5


# ------------------------------------------------------------------------------------------ spread per arm

@dataclass(frozen=True)
class ArmSpread:
    """One arm's instances: tok/s per instance in run order, the variance components over them (relative sd), and,
    for an arm compared with a baseline, the share of its paired block variance that the instances make."""
    arm: str
    run_ids: list[str]
    tok_s: list[float]
    requests: float                         # measured requests per run (median over its runs)
    within_sd: float                        # per request, inside a run
    implied_se: float                       # of a run's median from its requests alone: sqrt(pi/2 within / m)
    observed_sd: float | None               # of the instances' log tok/s (None below 2 instances)
    between_sd: float | None                # the design's estimate: the instances' sd less the requests' part
    between_ci: tuple[float, float] | None  # 95 % interval of the between sd (None below 3 instances)
    # the instances agree closer than their requests allow (CLOSER_THAN_REQUESTS): the requests' spread repeats
    # in every run, so the instances' own sd is their spread and its interval is taken without the requests' part
    requests_repeat: bool = False
    baseline: str | None = None             # the arm it is compared with (None: a baseline)
    verdict_between_share: float | None = None   # instances' share of a paired block's variance (None: no verdict)

    @property
    def restarts(self) -> int:
        return len(self.tok_s)

    @property
    def spread_sd(self) -> float | None:
        """The sd of an instance's speed the report shows: the design's between estimate, or the instances' own
        where their requests repeat."""
        return self.observed_sd if self.requests_repeat else self.between_sd

    @property
    def dominant(self) -> str | None:
        if self.verdict_between_share is None:
            return None
        return "restarts" if self.verdict_between_share >= 0.5 else "requests"

    def to_dict(self) -> dict:
        return {**asdict(self), "restarts": self.restarts, "spread_sd": self.spread_sd, "dominant": self.dominant}


def _logs(run: Run) -> tuple[float, list[float]]:
    return math.log(run.tok_s), [math.log(q.decode_tok_s) for q in run.measured if q.decode_tok_s]  # type: ignore


def _repeat(observed_var: float, request_part: float, n: int) -> bool:
    """Do n values (instances, or paired blocks) vary less than their requests' part alone would make them?"""
    return n >= 3 and observed_var < CLOSER_THAN_REQUESTS ** 2 * request_part


def between_interval(values: list[float], request_part: float, level: float = LEVEL) -> tuple[float, float] | None:
    """Interval of the between-instance sd: the chi-square interval of the instances' variance (n - 1 degrees of
    freedom) less the requests' part (`request_part`, which its many degrees of freedom make known by comparison)."""
    from scipy import stats as scipy_stats
    n = len(values)
    if n < design.MIN_RESTARTS:
        return None
    s2 = statistics.variance(values)
    q_hi, q_lo = (float(scipy_stats.chi2.ppf(p, n - 1)) for p in (0.5 + level / 2, 0.5 - level / 2))
    lo, hi = ((n - 1) * s2 / q - request_part for q in (q_hi, q_lo))
    return math.sqrt(max(lo, 0.0)), math.sqrt(max(hi, 0.0))


def arm_spread(exp: Experiment, arm: str) -> ArmSpread | None:
    """The arm's spread across restarts and within its runs; None when no run of it has 2+ timed requests."""
    runs = sorted((r for r in exp.runs_of(arm) if r.tok_s), key=_order_key)
    logs = [_logs(r) for r in runs]
    try:
        comps = design.instance_components([v for v, _ in logs], [q for _, q in logs])
    except design.DesignError:
        return None
    values = [v for v, _ in logs]
    part = design.MEDIAN_VAR_FACTOR * comps.within * statistics.fmean(1.0 / max(len(q), 1) for _, q in logs)
    repeat = len(values) >= 2 and _repeat(statistics.variance(values), part, len(values))
    m = float(statistics.median(len(q) for _, q in logs))
    baseline = exp.baseline_of(arm) if arm in {a.name for a in exp.spec_arms} else None
    return ArmSpread(arm=arm, run_ids=[r.run_id for r in runs], tok_s=[float(r.tok_s) for r in runs],  # type: ignore
                     requests=m, within_sd=math.sqrt(comps.within), implied_se=math.sqrt(part),
                     observed_sd=statistics.stdev(values) if len(values) >= 2 else None,
                     between_sd=math.sqrt(comps.between) if comps.between_df else None,
                     between_ci=between_interval(values, 0.0 if repeat else part), requests_repeat=repeat,
                     baseline=baseline, verdict_between_share=_verdict_share(exp, arm, m) if baseline else None)


def _verdict_share(exp: Experiment, arm: str, requests: float) -> float | None:
    """The instances' share of one block's variance of the arm's paired log ratio (the verdict's interval is a t
    interval over blocks of that variance): between / (between + pi/2 within / m); all of it where the blocks vary
    less than the requests' part alone would make them (the requests repeat in every run). None below 2 blocks."""
    ratios, _ = economics.paired_blocks(exp, arm)
    if len(ratios) < 2:
        return None
    try:
        comps = economics.components_of(exp, arm)
    except design.DesignError:
        return None
    if _repeat(statistics.variance(ratios), comps.block_var(requests) - comps.between, len(ratios)):
        return 1.0
    return 1.0 - comps.within_share(requests)


def _order_key(run: Run) -> tuple[float, int]:
    """Runs in the order their servers started (the store's start time; the plan's seq where none)."""
    return (run.started if run.started is not None else math.inf, run.seq)


def _gpus(run: Run) -> tuple[str, ...]:
    """The UUIDs of the GPUs the run's manifest recorded (nvidia-smi's, at the run's start)."""
    gpu = run.manifest.get("gpu")
    gpus = gpu.get("gpus") if isinstance(gpu, dict) else None
    return tuple(sorted(str(g["uuid"]) for g in gpus or [] if isinstance(g, dict) and g.get("uuid")))


def machines(exp: Experiment) -> dict[str, str]:
    """The machine each run (burn-in starts included) ran on, by run id: its host's inventory name, with its GPUs'
    UUIDs where that name held more than one set of GPUs over the experiment (a resume on another machine behind
    the same name). Instances are compared per machine: two machines differ by more than a restart does."""
    runs = exp.runs + exp.burn_in
    sets: dict[str, set[tuple[str, ...]]] = {}
    for r in runs:
        sets.setdefault(r.host, set()).add(_gpus(r))
    return {r.run_id: (f"{r.host} ({', '.join(u[:12] for u in _gpus(r))})"
                       if len(sets[r.host]) > 1 and _gpus(r) else r.host) for r in runs}


def machine_changes(exp: Experiment) -> list[str]:
    """One line per host whose runs ran on more than one machine: each machine with its runs, in run order."""
    of = machines(exp)
    out = []
    for host in sorted({r.host for r in exp.runs}):
        runs = sorted((r for r in exp.runs + exp.burn_in if r.host == host), key=_order_key)
        labels = list(dict.fromkeys(of[r.run_id] for r in runs))
        if len(labels) > 1:
            out.append(f"{host} ran on {len(labels)} machines (its GPUs' UUIDs changed, e.g. a resume on another "
                       "machine): " + "; ".join(f"{m}: {', '.join(r.run_id for r in runs if of[r.run_id] == m)}"
                                               for m in labels)
                       + ". Burn-in and run-order trends are judged per machine.")
    return out


# ------------------------------------------------------------------------------------------ burn-in

@dataclass(frozen=True)
class BurnIn:
    """An unmeasured start before block 1 (design.burn_in): how fast it ran against its arm's measured instances
    on the same machine."""
    run_id: str
    arm: str
    host: str                               # the machine (`machines`): the host, with its GPUs where it changed
    status: str
    tok_s: float | None
    measured_tok_s: float | None            # the mean of the arm's measured instances on that machine

    @property
    def change(self) -> float | None:
        if self.tok_s is None or not self.measured_tok_s:
            return None
        return self.tok_s / self.measured_tok_s - 1.0


def burn_ins(exp: Experiment) -> list[BurnIn]:
    out = []
    of = machines(exp)
    for r in sorted(exp.burn_in, key=_order_key):
        later = [x.tok_s for x in exp.runs_of(r.arm) if of[x.run_id] == of[r.run_id] and x.tok_s]
        out.append(BurnIn(r.run_id, r.arm, of[r.run_id], r.status if r.ok else "failed", r.tok_s if r.ok else None,
                          statistics.fmean(later) if later else None))
    return out


# ------------------------------------------------------------------------------------------ the report's part

@dataclass
class InstanceReport:
    arms: list[ArmSpread] = field(default_factory=list)
    burn_in: list[BurnIn] = field(default_factory=list)
    machine_changes: list[str] = field(default_factory=list)

    HEADER = ["arm", "restarts", "tok/s per instance (min-max)", "between instances sd (95% CI)",
              "within a run: sd per request", "its se of a run (requests)", "verdict's interval set by"]

    def rows(self) -> list[list[str]]:
        return [[a.arm, str(a.restarts), f"{min(a.tok_s):.1f}-{max(a.tok_s):.1f}", _between_cell(a),
                 f"{a.within_sd:.2%}", f"{a.implied_se:.2%} ({a.requests:g})", _dominant_cell(a)] for a in self.arms]

    def notes(self) -> list[str]:
        out = []
        close = [a for a in self.arms if a.requests_repeat]
        if close:
            out.append("* The instances of " + ", ".join(
                f"{a.arm} (sd {a.observed_sd:.2%} against {a.implied_se:.2%})" for a in close)
                + " agree closer than independent requests would let them: the requests' spread repeats from run "
                  "to run (the same seeded prompts in every run), so it does not move a run's median. Their "
                  "between-instance sd is then the instances' own (the model's estimate, which takes the requests' "
                  "part out, is 0), and a verdict on them is set by the restarts alone.")
        if self.burn_in:
            out.append(f"Burn-in (design.burn_in: {len(self.burn_in)} unmeasured start(s) before block 1, not "
                       f"analysed): " + "; ".join(_burn_in_text(b) for b in self.burn_in) + ".")
        return out + self.machine_changes

    def to_dict(self) -> dict:
        return {"arms": {a.arm: a.to_dict() for a in self.arms},
                "burn_in": [{**asdict(b), "change": b.change} for b in self.burn_in],
                "machine_changes": self.machine_changes}


INTRO = ("Each run is one server instance (a restart). Per arm: its instances' tok/s, the sd of an instance's speed "
         "once its requests' part is taken out (the between-instance component of the design's variance model, with "
         "a 95% chi-square interval from 3 instances on), the sd of one request inside a run and what it alone "
         "makes the sd of a run's median, as shares of the mean. The verdict's interval is a t interval over "
         "paired blocks; the last column says which part dominates a block's variance of the paired log ratio "
         "(more restarts narrow the first, more requests per run the second).")


def analyse(exp: Experiment) -> InstanceReport:
    arms = [s for s in (arm_spread(exp, a.name) for a in exp.arms) if s is not None]
    return InstanceReport(arms=arms, burn_in=burn_ins(exp), machine_changes=machine_changes(exp))


def _between_cell(a: ArmSpread) -> str:
    if a.spread_sd is None:
        return "- (one instance)"
    ci = f" ({a.between_ci[0]:.2%}-{a.between_ci[1]:.2%})" if a.between_ci else " (no interval below 3)"
    return f"{a.spread_sd:.2%}{ci}" + ("*" if a.requests_repeat else "")


def _dominant_cell(a: ArmSpread) -> str:
    if a.baseline is None:
        return "- (baseline)"
    if a.verdict_between_share is None:
        return "- (below 2 blocks)"
    share = a.verdict_between_share if a.dominant == "restarts" else 1.0 - a.verdict_between_share
    return f"{a.dominant} ({share:.0%})" + ("*" if a.requests_repeat else "")


def _burn_in_text(b: BurnIn) -> str:
    if b.tok_s is None:
        return f"{b.run_id} {b.status}"
    vs = f" ({b.change:+.1%} against its measured instances on {b.host})" if b.change is not None else ""
    return f"{b.run_id} {b.tok_s:.1f} tok/s{vs}"


# ------------------------------------------------------------------------------------------ trend over run order

@dataclass(frozen=True)
class Trend:
    """An arm's instances on one machine (`machines`) whose speed moved with the order they started in. kind
    "first": the first `lead` of them ran low against the later ones; kind "order": tok/s rose along the run order (a
    node warming up; one that slows along the run order is drifting, the baseline-drift rule's finding)."""
    arm: str
    host: str
    kind: str
    run_ids: list[str]                      # the arm's instances on the host, in run order
    tok_s: list[float]
    starts: list[int]                       # each one's start on the host in this experiment (1 = its first)
    lead: int                               # kind "first": how many leading instances are low
    change: float                           # first: the lead's worst against the rest's mean; order: fitted change
    noise: float                            # the relative sd the change was judged against
    burn_in: int = 0                        # unmeasured starts the host had before (design.burn_in)

    @property
    def low(self) -> list[str]:
        return self.run_ids[:self.lead] if self.kind == "first" else []

    def message(self) -> str:
        where = f"on {self.host}" + (f" (after {self.burn_in} burn-in start(s))" if self.burn_in else "")
        if self.kind == "first":
            what = (f"{self.arm}: its first {'instance' if self.lead == 1 else f'{self.lead} instances'} {where} "
                    f"ran {-self.change:.0%} slower than its later ones, far beyond the {self.noise:.2%} sd those "
                    f"show (their requests included)")
        else:
            what = (f"{self.arm}: its instances {where} sped up along the run order, {self.change:+.0%} from first "
                    f"to last, beyond the noise of its runs ({self.noise:.2%} sd)")
        return (what + ". The node's first server starts run slow (a freshly started machine warms up), so the "
                "first blocks measure the warm-up, not the arm: set design.burn_in in the experiment file to at "
                f"least {self._starts_needed()} (unmeasured server starts and benchmarks before block 1), or run "
                "more blocks so the first ones weigh less.")

    def _starts_needed(self) -> int:
        """The burn-in (in starts of the host, its burn-in included) that would have taken the slow starts: the
        last low one's; for a rise along the run order, the start of the arm's middle instance."""
        if self.kind == "first":
            return max(self.starts[:self.lead])
        return self.starts[max(0, len(self.starts) // 2 - 1)]

    def evidence(self) -> list[str]:
        return [f"{self.arm} on {self.host}, in run order: " + ", ".join(
            f"{rid}={v:.1f} (start {s})" for rid, v, s in zip(self.run_ids, self.tok_s, self.starts))]


def trends(exp: Experiment, min_change: float = 0.02) -> list[Trend]:
    """Every arm's instances per machine checked against their run order (3 or more instances): the leading one or
    two low (`_first_low`), else tok/s rising along the order (`_order_drift`, 4 or more). Judged against the
    later instances' spread, never below what their requests alone explain, and only a change of `min_change` or
    more counts (a smaller one moves no verdict made at the usual precision)."""
    out = []
    of = machines(exp)
    for machine in sorted({of[r.run_id] for r in exp.runs}):
        started = sorted([r for r in exp.runs + exp.burn_in if of[r.run_id] == machine], key=_order_key)
        start_of = {r.run_id: i for i, r in enumerate(started, 1)}
        burned = sum(1 for r in exp.burn_in if of[r.run_id] == machine)
        for a in exp.arms:
            runs = sorted((r for r in exp.runs_of(a.name) if of[r.run_id] == machine and r.tok_s), key=_order_key)
            if len(runs) < 3:
                continue
            logs = [_logs(r) for r in runs]
            found = _first_low(logs, min_change) or _order_drift(logs, min_change)
            if found is not None:
                kind, lead, change, noise = found
                out.append(Trend(a.name, machine, kind, [r.run_id for r in runs],
                                 [float(r.tok_s) for r in runs],  # type: ignore
                                 [start_of[r.run_id] for r in runs], lead, change, noise, burned))
    return out


def _request_floor(logs: list[tuple[float, list[float]]]) -> float:
    """The variance of a run's median that its requests alone explain (0 where no run has 2+ requests)."""
    try:
        comps = design.instance_components([v for v, _ in logs], [q for _, q in logs])
    except design.DesignError:
        return 0.0
    return design.MEDIAN_VAR_FACTOR * comps.within * statistics.fmean(1.0 / max(len(q), 1) for _, q in logs)


def _first_low(logs: list[tuple[float, list[float]]], min_change: float) -> tuple[str, int, float, float] | None:
    """The first two instances (else the first) all below the later ones' mean by FIRST_Z predictive sd and by
    `min_change` or more: ("first", lead, change of the lead's mean against the later ones', sd)."""
    for lead in (2, 1):
        rest = logs[lead:]
        if len(rest) < 2:
            continue
        values = [v for v, _ in rest]
        gap = statistics.fmean(values) - max(v for v, _ in logs[:lead])       # the lead's best against the rest
        sd = math.sqrt(max(statistics.variance(values), _request_floor(rest)) * (1.0 + 1.0 / len(rest)))
        if 1.0 - math.exp(-gap) >= min_change and gap >= FIRST_Z * sd:
            change = math.exp(statistics.fmean(v for v, _ in logs[:lead]) - statistics.fmean(values)) - 1.0
            return "first", lead, change, sd
    return None


def _order_drift(logs: list[tuple[float, list[float]]], min_change: float) -> tuple[str, int, float, float] | None:
    """tok/s rising along the run order: the OLS slope of log tok/s on the position, its residual variance never
    below the requests' part, beyond noise at TREND_ALPHA (two-sided) and a fitted rise of `min_change` or more."""
    from scipy import stats as scipy_stats
    n = len(logs)
    if n < 4:
        return None
    y = [v for v, _ in logs]
    x_bar, y_bar = (n - 1) / 2.0, statistics.fmean(y)
    sxx = sum((i - x_bar) ** 2 for i in range(n))
    slope = sum((i - x_bar) * (v - y_bar) for i, v in enumerate(y)) / sxx
    resid = sum((v - y_bar - slope * (i - x_bar)) ** 2 for i, v in enumerate(y)) / (n - 2)
    var = max(resid, _request_floor(logs))
    if var <= 0:
        return None
    t = slope / math.sqrt(var / sxx)
    change = math.exp(slope * (n - 1)) - 1.0
    if change >= min_change and 2 * float(scipy_stats.t.sf(abs(t), n - 2)) < TREND_ALPHA:
        return "order", 0, change, math.sqrt(var)
    return None
