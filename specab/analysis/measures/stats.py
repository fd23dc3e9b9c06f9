"""Statistics: per-arm summaries, paired speedup within blocks, drift, sequential stopping.

Variance is hierarchical (requests within runs within server instances): every interval is taken
over *runs* (one number per run), never over requests pooled as if independent. Intervals are
seeded bootstrap intervals; with few runs the percentile bootstrap is too narrow, so we use the
expanded percentile bootstrap (Hesterberg 2015): the tail probability is adjusted so that
z_{a'/2} = sqrt(n/(n-1)) * t_{a/2, n-1}, which restores nominal coverage for small n.
See docs/statistics.md.
"""
from __future__ import annotations

import functools
import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

import numpy as np

from specab.analysis.evidence.model import Experiment, Run
# scipy is imported in the functions that use it: importing scipy.stats takes ~1.3 s, which every start of
# driver.py paid (status, --help, a run before its first report: 1.8 s -> 0.55 s for --help).

DEFAULT_BOOT = 4000
DEFAULT_SEED = 20240601
MIN_BOOTSTRAP_N = 5


# ------------------------------------------------------------------------ Student t quantile

@functools.lru_cache(maxsize=4096)     # pure; a report asks for the same few (p, df) hundreds of times
def t_ppf(p: float, df: float) -> float:
    """Quantile of Student's t (scipy.stats.t.ppf, cached)."""
    from scipy import stats as scipy_stats
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must lie in (0, 1), got {p}")
    return float(scipy_stats.t.ppf(p, df))


# ------------------------------------------------------------------------ bootstrap

@dataclass
class Interval:
    estimate: float
    lo: float
    hi: float
    n: int
    method: str = "expanded percentile bootstrap"

    @property
    def half_width_rel(self) -> float:
        """Half-width relative to the estimate (0.02 = +-2 %)."""
        return (self.hi - self.lo) / 2.0 / abs(self.estimate) if self.estimate else math.inf

    def to_dict(self) -> dict:
        return {**asdict(self), "half_width_rel": self.half_width_rel}


def _expanded_alpha(n: int, level: float) -> float:
    """Two-sided tail probability for the expanded percentile bootstrap."""
    from scipy import stats as scipy_stats
    a = 1.0 - level
    if n < 2:
        return a
    z = math.sqrt(n / (n - 1.0)) * t_ppf(1.0 - a / 2.0, n - 1)
    return 2.0 * float(scipy_stats.norm.sf(z))


def bootstrap_ci(values: Sequence[float], *, level: float = 0.95, n_boot: int = DEFAULT_BOOT,
                 seed: int = DEFAULT_SEED, strata: Sequence[object] | None = None) -> Interval:
    """Seeded bootstrap CI of the mean over the given values (one per run or block).

    strata: resample within each stratum (e.g. host), keeping the design's composition."""
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n == 0:
        raise ValueError("bootstrap of no values")
    est = float(x.mean())
    if n == 1:
        return Interval(est, -math.inf, math.inf, 1, "one value: no interval")
    if n < MIN_BOOTSTRAP_N:
        # the bootstrap of a mean cannot reach beyond [min, max] of so few values: t interval instead
        sd = float(x.std(ddof=1))
        h = t_ppf(0.5 + level / 2.0, n - 1) * sd / math.sqrt(n)
        return Interval(est, est - h, est + h, n, f"t interval (n < {MIN_BOOTSTRAP_N})")
    rng = np.random.default_rng(seed)
    if strata is None:
        idx = rng.integers(0, n, size=(n_boot, n))
    else:
        groups: dict[object, list[int]] = {}
        for i, s in enumerate(strata):
            groups.setdefault(s, []).append(i)
        cols = []
        for members in groups.values():
            m = np.asarray(members)
            cols.append(m[rng.integers(0, len(m), size=(n_boot, len(m)))])
        idx = np.concatenate(cols, axis=1)
    boots = x[idx].mean(axis=-1)
    a = _expanded_alpha(n, level)
    lo, hi = (float(q) for q in np.quantile(boots, [a / 2.0, 1.0 - a / 2.0]))
    # never narrower than the t interval of the mean: the bootstrap keeps its asymmetry, the t
    # interval guards nominal coverage with few blocks (docs/statistics.md, coverage study)
    h = t_ppf(0.5 + level / 2.0, n - 1) * float(x.std(ddof=1)) / math.sqrt(n)
    lo, hi = min(lo, est - h), max(hi, est + h)
    return Interval(est, lo, hi, n, "expanded percentile bootstrap")


# ------------------------------------------------------------------------ per-arm statistics

@dataclass
class Dist:
    """Median / mean / CI of one metric over runs (CI over run-level values)."""
    median: float | None
    mean: float | None
    ci: Interval | None
    n: int

    def to_dict(self) -> dict:
        return {"median": self.median, "mean": self.mean, "n": self.n,
                "ci": self.ci.to_dict() if self.ci else None}


def log_interval(values: Sequence[float], seed: int = DEFAULT_SEED) -> Interval | None:
    """The 95 % interval of positive values taken on their logs (the geometric mean and its bounds): a rate, a time
    or a capacity never gets a bound below zero, where a linear t interval over two or three values can."""
    if not values:
        return None
    li = bootstrap_ci(list(np.log(values)), seed=seed)
    return Interval(math.exp(li.estimate), math.exp(li.lo) if math.isfinite(li.lo) else -math.inf,
                    math.exp(li.hi) if math.isfinite(li.hi) else math.inf, li.n, li.method + " of logs")


def _dist(values: Sequence[float | None], seed: int) -> Dist:
    """Median, mean and the 95 % interval over runs; of positive values (tok/s, a time, an accept length) the
    interval is taken on their logs."""
    v = [float(x) for x in values if x is not None and math.isfinite(x)]
    if not v:
        return Dist(None, None, None, 0)
    ci = None if len(v) < 2 else log_interval(v, seed) if min(v) > 0 else bootstrap_ci(v, seed=seed)
    return Dist(statistics.median(v), statistics.fmean(v), ci, len(v))


@dataclass
class ArmStats:
    arm: str
    runs: int
    runs_failed: int                   # failed runs (not counting interrupted ones)
    requests: int
    tok_s_run: Dist                    # one value per run: the run's median request decode tok/s
    tok_s_request_median: float | None  # over all measured requests (descriptive only)
    tok_s_request_mean: float | None
    ttft_s: Dist
    tpot_s: Dist
    e2e_s: Dist
    accept_len: Dist                   # run-scoped, from requests
    log_accept_len: float | None       # mean of the server log's `accept len`
    accept_len_disagrees: bool         # requests vs log differ by more than 5 %
    cuda_graph_share: float | None     # share of decode lines with `cuda graph: True`
    per_run: list[dict] = field(default_factory=list)
    runs_interrupted: int = 0          # cut by the user's SIGINT/SIGTERM (resumable), not failures

    def to_dict(self) -> dict:
        return {**self.__dict__, **{k: getattr(self, k).to_dict()
                                    for k in ("tok_s_run", "ttft_s", "tpot_s", "e2e_s", "accept_len")}}


def _run_median(run: Run, attr: str) -> float | None:
    v = [getattr(r, attr) for r in run.measured if getattr(r, attr) is not None]
    return statistics.median(v) if v else None


ACCEPT_DISAGREE_REL = 0.05


def arm_stats(exp: Experiment, arm: str, seed: int = DEFAULT_SEED) -> ArmStats:
    runs = exp.runs_of(arm)
    failed = [r for r in exp.runs_of(arm, ok_only=False) if not r.ok and r.status not in ("running", "interrupted")]
    interrupted = [r for r in exp.runs_of(arm, ok_only=False) if r.status == "interrupted"]
    reqs = [q for r in runs for q in r.measured if q.decode_tok_s]
    tok_req = [q.decode_tok_s for q in reqs]
    acc_runs = [r.accept_len for r in runs]
    log_acc = [r.log.accept_len_mean for r in runs if r.log and r.log.accept_len_mean is not None]
    log_acc_mean = statistics.fmean(log_acc) if log_acc else None
    acc = _dist(acc_runs, seed)
    disagree = bool(acc.mean and log_acc_mean and abs(acc.mean - log_acc_mean) / acc.mean > ACCEPT_DISAGREE_REL)
    cg_t = sum(r.log.cuda_graph_true for r in runs if r.log)
    cg_n = cg_t + sum(r.log.cuda_graph_false for r in runs if r.log)
    per_run = [{"run_id": r.run_id, "block": r.block, "host": r.host, "tok_s": r.tok_s,
                "accept_len": r.accept_len, "midpoint": r.midpoint} for r in runs]
    return ArmStats(
        arm=arm, runs=len(runs), runs_failed=len(failed), runs_interrupted=len(interrupted), requests=len(reqs),
        tok_s_run=_dist([r.tok_s for r in runs], seed),
        tok_s_request_median=statistics.median(tok_req) if tok_req else None,
        tok_s_request_mean=statistics.fmean(tok_req) if tok_req else None,
        ttft_s=_dist([_run_median(r, "ttft_s") for r in runs], seed),
        tpot_s=_dist([_run_median(r, "tpot_s") for r in runs], seed),
        e2e_s=_dist([_run_median(r, "e2e_s") for r in runs], seed),
        accept_len=acc, log_accept_len=log_acc_mean, accept_len_disagrees=disagree,
        cuda_graph_share=cg_t / cg_n if cg_n else None, per_run=per_run)


# ------------------------------------------------------------------------ paired speedup

@dataclass
class Speedup:
    arm: str
    baseline: str
    ratios: list[float]                 # one per complete block: arm run / baseline run of that block
    blocks: list[tuple[str, int]]       # (host, block) of each ratio
    ci: Interval | None                 # geometric-mean ratio with its CI
    verdict: str

    @property
    def estimate(self) -> float | None:
        return self.ci.estimate if self.ci else (self.ratios[0] if self.ratios else None)

    def to_dict(self) -> dict:
        return {"arm": self.arm, "baseline": self.baseline, "ratios": self.ratios,
                "blocks": [list(b) for b in self.blocks], "estimate": self.estimate,
                "ci": self.ci.to_dict() if self.ci else None, "verdict": self.verdict}


def verdict_of(ci: Interval | None, ratios: Sequence[float] = ()) -> str:
    if ci is None or not math.isfinite(ci.lo):
        if len(ratios) == 1:
            return f"x{ratios[0]:.3f} from one block, not enough blocks for an interval"
        return "not enough blocks for an interval"
    pct = (ci.hi - ci.lo) / 2.0 * 100.0
    if ci.lo > 1.0:
        return f"faster (x{ci.estimate:.3f}, 95% CI {ci.lo:.3f}-{ci.hi:.3f})"
    if ci.hi < 1.0:
        return f"slower (x{ci.estimate:.3f}, 95% CI {ci.lo:.3f}-{ci.hi:.3f})"
    return f"no detectable difference at this precision (x{ci.estimate:.3f}, +-{pct:.1f}%)"


def _block_key(run: Run) -> tuple[str, int]:
    return (run.host, run.block)


def per_user_tok_s(run: Run) -> float | None:
    """The paired speedup's default measure: the run's median per-request (per-user) decode tok/s."""
    return run.tok_s


def paired_speedup(exp: Experiment, arm: str, seed: int = DEFAULT_SEED,
                   metric: Callable[[Run], float | None] = per_user_tok_s) -> Speedup:
    """Ratio of the arm's run to the baseline run of the same block (and host); CI over blocks.

    The estimate is the geometric mean of the block ratios (the mean of log ratios): a ratio and its
    inverse are treated symmetrically. With several hosts the bootstrap resamples blocks within each
    host (host is a blocking factor). ``metric`` is the run's number compared (per-user tok/s by default; the
    run's total output throughput for the speedup in throughput): one rule for every speedup."""
    baseline = exp.baseline_of(arm)
    ratios, keys, _ = block_ratios(exp, arm, baseline, metric)
    ci = ratio_ci(ratios, seed, [k[0] for k in keys])
    return Speedup(arm=arm, baseline=baseline, ratios=ratios, blocks=keys, ci=ci, verdict=verdict_of(ci, ratios))


def block_ratios(exp: Experiment, arm: str, reference: str, metric: Callable[[Run], float | None]
                  ) -> tuple[list[float], list[tuple[str, int]], int]:
    """`arm`'s run over `reference`'s run of the same block (and host), in (host, block) order, where both have the
    metric: the ratios, their (host, block) keys and how many pairs measured on one server instance."""
    ref = {_block_key(r): r for r in exp.runs_of(reference)}
    ratios, keys, shared = [], [], 0
    for r in sorted(exp.runs_of(arm), key=lambda r: (r.host, r.block)):
        b = ref.get(_block_key(r))
        mb, mr = (metric(b), metric(r)) if b is not None else (None, None)
        if not mb or not mr:
            continue
        ratios.append(mr / mb)
        keys.append(_block_key(r))
        shared += int(b.instance == r.instance)    # type: ignore[union-attr]
    return ratios, keys, shared


def ratio_ci(ratios: list[float], seed: int, hosts: Sequence[str] = ()) -> Interval | None:
    """The geometric-mean ratio with its interval over blocks (resampled within each host when `hosts`, one per
    ratio, names several); None below two ratios."""
    if len(ratios) < 2:
        return None
    strata = list(hosts) if len(set(hosts)) > 1 else None
    li = bootstrap_ci(np.log(ratios), seed=seed, strata=strata)
    return Interval(math.exp(li.estimate), math.exp(li.lo), math.exp(li.hi), li.n, li.method + " of log ratios")


@dataclass
class LoadRatio:
    """How one configuration's measure changes between two of its loads: `arm` over `reference` (the same
    configuration at another load), one ratio per block, with how many of those pairs ran on one server instance."""
    arm: str
    reference: str
    ratios: list[float]
    blocks: list[tuple[str, int]]
    shared: int                         # pairs whose two runs measured on one server instance (one per instance)
    ci: Interval | None

    @property
    def estimate(self) -> float | None:
        return self.ci.estimate if self.ci else (self.ratios[0] if self.ratios else None)

    def to_dict(self) -> dict:
        return {"arm": self.arm, "reference": self.reference, "ratios": self.ratios,
                "blocks": [list(b) for b in self.blocks], "shared_instance": self.shared, "estimate": self.estimate,
                "ci": self.ci.to_dict() if self.ci else None}


def load_ratio(exp: Experiment, arm: str, reference: str, seed: int = DEFAULT_SEED,
               metric: Callable[[Run], float | None] = per_user_tok_s) -> LoadRatio:
    """The ratio of `arm`'s run to `reference`'s run of the same block (and host), with its interval over blocks as
    the paired speedup's: the comparison across loads of one configuration (the arms differ only in load). Where the
    two runs measured on one server instance (design.server per-instance: Run.instance equal) the instance's own
    effect is in both and cancels in the ratio; with a server per run each adds its own (docs/statistics.md)."""
    ratios, keys, shared = block_ratios(exp, arm, reference, metric)
    return LoadRatio(arm=arm, reference=reference, ratios=ratios, blocks=keys, shared=shared,
                     ci=ratio_ci(ratios, seed, [k[0] for k in keys]))


def per_host_speedups(exp: Experiment, arm: str, seed: int = DEFAULT_SEED) -> dict[str, Speedup]:
    """The paired speedup per host (fleets): a host whose speedup differs is visible here."""
    out = {}
    for h in exp.hosts:
        sub = Experiment(id=exp.id, arms=exp.arms, runs=[r for r in exp.runs if r.host == h],
                         order=exp.order, baseline=exp.baseline)
        out[h] = paired_speedup(sub, arm, seed)
    return out


# ------------------------------------------------------------------------ drift

@dataclass
class Drift:
    points: list[tuple[float, float]]   # (seconds since the first baseline run, tok/s)
    slope_per_hour: float | None        # tok/s per hour
    slope_ci: tuple[float, float] | None
    change_rel: float | None            # fitted change over the experiment span, relative to the start
    beyond_noise: bool
    exposed: bool                       # the design lets drift bias the speedup (blocked order)
    message: str

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def drift(exp: Experiment, level: float = 0.95) -> Drift:
    """Baseline tok/s over time: OLS slope with a t interval; beyond noise when the interval excludes 0."""
    from scipy import stats as scipy_stats
    pts = sorted((r.midpoint, r.tok_s) for r in exp.runs_of(exp.baseline)
                 if r.midpoint is not None and r.tok_s)
    exposed = exp.order == "blocked"
    expo = (" This experiment ran in blocked order, so drift biases its speedups; rerun interleaved."
            if exposed else "")
    if len(pts) < 3:
        return Drift([], None, None, None, False, exposed,
                     f"drift: {len(pts)} baseline run(s), at least 3 are needed to tell a trend from noise." + expo)
    t0 = pts[0][0]
    x = np.array([p[0] - t0 for p in pts]) / 3600.0
    y = np.array([p[1] for p in pts])
    n = len(x)
    if np.ptp(x) == 0:
        return Drift([(float(a * 3600), float(b)) for a, b in zip(x, y)], None, None, None, False, exposed,
                     "drift: baseline runs have no spread in time." + expo)
    fit = scipy_stats.linregress(x, y)
    slope, icept = float(fit.slope), float(fit.intercept)
    se = float(fit.stderr)
    tq = t_ppf(0.5 + level / 2.0, n - 2)
    ci = (slope - tq * se, slope + tq * se)
    start = icept
    change = slope * float(x[-1]) / start if start else None
    beyond = ci[0] > 0 or ci[1] < 0
    span_s = float(x[-1]) * 3600
    span = f"{span_s:.0f} s" if span_s < 60 else f"{span_s / 60:.0f} min"
    if beyond:
        msg = (f"drift: the baseline moved {change * 100:+.1f}% over {span} "
               f"({slope:+.2f} tok/s per hour, 95% CI {ci[0]:+.2f} to {ci[1]:+.2f}), beyond run-to-run noise.")
    else:
        msg = (f"drift: no trend beyond noise in {n} baseline runs over {span} "
               f"(slope {slope:+.2f} tok/s per hour, 95% CI {ci[0]:+.2f} to {ci[1]:+.2f}).")
    return Drift([(float(a * 3600), float(b)) for a, b in zip(x, y)], slope, ci, change, beyond, exposed, msg + expo)


# ------------------------------------------------------------------------ sequential stopping

def complete_blocks(exp: Experiment) -> int:
    """Blocks in which every arm has a successful run."""
    per: dict[tuple[str, int], set[str]] = {}
    for r in exp.runs:
        if r.ok:
            per.setdefault(_block_key(r), set()).add(r.arm)
    names = {a.name for a in exp.arms}
    return sum(1 for arms in per.values() if names <= arms)


MIN_BLOCKS = 3


def decide_more_blocks(exp: Experiment, target_ci_rel: float, max_repeats: int,
                       seed: int = DEFAULT_SEED) -> tuple[bool, str]:
    """Sequential stopping for `--target-ci`: (run another block?, why).

    Stops when every speedup's 95% CI half-width (relative to its estimate) is <= target_ci_rel, or
    when max_repeats blocks exist. Never asks for a block beyond max_repeats."""
    if target_ci_rel <= 0:
        raise ValueError(f"--target-ci must be positive, got {target_ci_rel}")
    n = complete_blocks(exp)
    started = len({_block_key(r) for r in exp.runs})
    widths = {}
    for a in exp.spec_arms:
        sp = paired_speedup(exp, a.name, seed)
        widths[a.name] = sp.ci.half_width_rel if sp.ci and math.isfinite(sp.ci.lo) else math.inf
    desc = ", ".join(f"{k} +-{v * 100:.1f}%" if math.isfinite(v) else f"{k} n/a" for k, v in widths.items())
    if started >= max_repeats:
        ok = widths and all(v <= target_ci_rel for v in widths.values())
        why = "target met" if ok else f"target +-{target_ci_rel * 100:.1f}% not met"
        return False, f"stopped at --max-repeats {max_repeats} ({why}): speedup CI half-widths {desc}"
    if n < MIN_BLOCKS:
        return True, f"{n} complete block(s); at least {MIN_BLOCKS} are needed before judging the CI width"
    wide = {k: v for k, v in widths.items() if v > target_ci_rel}
    if not wide:
        return False, (f"every speedup CI half-width is within +-{target_ci_rel * 100:.1f}% after {n} blocks: {desc}")
    return True, (f"after {n} blocks {', '.join(wide)} still wider than +-{target_ci_rel * 100:.1f}% ({desc})")


# ------------------------------------------------------------------------ everything at once

@dataclass
class ExperimentStats:
    arms: dict[str, ArmStats]
    speedups: dict[str, Speedup]
    drift: Drift
    blocks: int
    hosts: list[str]
    host_speedups: dict[str, dict[str, Speedup]] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"arms": {k: v.to_dict() for k, v in self.arms.items()},
                "speedups": {k: v.to_dict() for k, v in self.speedups.items()},
                "drift": self.drift.to_dict(), "blocks": self.blocks, "hosts": self.hosts,
                "host_speedups": {h: {a: s.to_dict() for a, s in d.items()} for h, d in self.host_speedups.items()}}


def analyse(exp: Experiment, seed: int = DEFAULT_SEED) -> ExperimentStats:
    arms = {a.name: arm_stats(exp, a.name, seed) for a in exp.arms}
    sps = {a.name: paired_speedup(exp, a.name, seed) for a in exp.spec_arms}
    host_sps: dict[str, dict[str, Speedup]] = {}
    if len(exp.hosts) > 1:
        for a in exp.spec_arms:
            for h, s in per_host_speedups(exp, a.name, seed).items():
                host_sps.setdefault(h, {})[a.name] = s
    return ExperimentStats(arms=arms, speedups=sps, drift=drift(exp), blocks=complete_blocks(exp),
                           hosts=exp.hosts, host_speedups=host_sps)
