"""Verdict economics: what a run costs, where the noise comes from, and the design that buys a target
precision of the paired speedup for the fewest GPU-seconds (docs/statistics.md, "Design by cost").

Pure functions over numbers; the store and the driver feed them. The model, on the log scale of a run's
value (its median request decode tok/s):

    log y[arm, block] = mu[arm] + s[block] + b[arm, block] + median_k(e[arm, block, k])

``s`` is shared by both arms of a block (the node's state: drift, the seed's 89 -> 82 shift) and cancels in
the paired ratio; ``b`` is the server instance's own offset (variance ``between`` summed over the two arms of
a ratio); ``e`` is the request-to-request noise inside a run (per-request variance ``within``, summed over
the two arms). The log ratio of block j with m requests per run has variance

    v(m) = between + MEDIAN_VAR_FACTOR * within / m

and the interval of the mean log ratio over n blocks is a t interval with n - 1 degrees of freedom: the
interval is always over instances, never over requests pooled as if independent.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Sequence

import numpy as np

from specab.analysis.measures.stats import t_ppf
# scipy is imported in the functions that use it: importing scipy.stats takes ~1.3 s, which every start of
# driver.py paid (status, --help, a run before its first report: 1.8 s -> 0.55 s for --help).

# Variance of the median of m normal draws is about (pi/2) sigma^2 / m (asymptotic; conservative for small m).
MEDIAN_VAR_FACTOR = math.pi / 2.0
# Fewest blocks (= restarts per arm) a design may have. With 3 blocks the between-instance variance has 2
# degrees of freedom and the t quantile is 4.30; below that (1 df, t = 12.7) no honest interval exists. Three
# is also the sequential design's minimum (specab.analysis.measures.stats.MIN_BLOCKS), so the two designs compare
# fairly.
MIN_RESTARTS = 3
# A default prior for the between-instance variance of a block's log ratio when no history exists: two
# instances each off by 1 % (sd), worth one degree of freedom (the data outweighs it after two blocks).
DEFAULT_BETWEEN = 2 * 0.01 ** 2
DEFAULT_BETWEEN_DF = 1.0
# A design keeps the experiment's requests per run unless moving them saves at least this share of the
# expected GPU-seconds.
KEEP_UNLESS_SAVING = 0.10


class DesignError(ValueError):
    """A design question without an answer (bad input); the message says what to change."""


# ------------------------------------------------------------------------------------------ cost model

@dataclass(frozen=True)
class RunCost:
    """Seconds one run holds its GPUs, split by what the design can change.

    load_s: start -> ready (weights, graph capture); per_request_s: one measured request; fixed_bench_s: the
    warm-up requests and the client's start; dead_s: stop, GPUs-free wait, env check, collect; gpus: GPUs held.
    source: where the numbers come from (history, this experiment, the simulator profile, an estimate)."""
    load_s: float
    per_request_s: float
    fixed_bench_s: float = 0.0
    dead_s: float = 0.0
    gpus: int = 1
    source: str = "estimate"

    def __post_init__(self) -> None:
        for k in ("load_s", "per_request_s", "fixed_bench_s", "dead_s"):
            v = getattr(self, k)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise DesignError(f"run cost: {k} must be a finite number >= 0 seconds, got {v!r}")
        if self.per_request_s <= 0:
            raise DesignError(f"run cost: per_request_s must be > 0 seconds, got {self.per_request_s!r}")
        if int(self.gpus) < 1:
            raise DesignError(f"run cost: gpus must be >= 1, got {self.gpus!r}")

    @property
    def restart_s(self) -> float:
        """What a run costs before its first measured request and after its last: the price of a restart."""
        return self.load_s + self.fixed_bench_s + self.dead_s

    def run_s(self, requests: float) -> float:
        return self.restart_s + requests * self.per_request_s

    def gpu_s(self, requests: float) -> float:
        return self.gpus * self.run_s(requests)


def mean_cost(costs: Sequence[RunCost]) -> RunCost:
    """The average run of a block (one run per arm: a speculative arm loads a draft too)."""
    if not costs:
        raise DesignError("mean_cost of no runs")
    k = len(costs)
    return RunCost(load_s=sum(c.load_s for c in costs) / k, per_request_s=sum(c.per_request_s for c in costs) / k,
                   fixed_bench_s=sum(c.fixed_bench_s for c in costs) / k, dead_s=sum(c.dead_s for c in costs) / k,
                   gpus=max(c.gpus for c in costs), source=costs[0].source)


# ------------------------------------------------------------------------------------ variance components

@dataclass(frozen=True)
class Components:
    """Variance components of one paired log ratio (both arms summed): ``between`` (instances) and ``within``
    (per request), with the degrees of freedom behind each estimate and where it came from."""
    between: float
    within: float
    between_df: float = 0.0
    within_df: float = 0.0
    source: str = "data"

    def block_var(self, requests: float) -> float:
        """Variance of one block's log ratio with `requests` measured requests per run."""
        return self.between + MEDIAN_VAR_FACTOR * self.within / max(requests, 1.0)

    def within_share(self, requests: float) -> float:
        """Share of a block's variance that more requests per run would remove."""
        v = self.block_var(requests)
        return (v - self.between) / v if v > 0 else 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def estimate_components(ratios: Sequence[float], requests: Sequence[tuple[Sequence[float], Sequence[float]]],
                        prior: Components | None = None) -> Components:
    """Variance components from the blocks so far (method of moments, a one-way random-effects model).

    ratios: one log ratio per complete block; requests: per block, the (arm, baseline) runs' measured request
    log speeds. ``within`` pools the request variance inside every run (sum over the two arms); ``between`` is
    the variance of the block log ratios less the part the requests explain, truncated at 0. A prior (history
    of this node, or the defaults) is pooled in by degrees of freedom, so one noisy block cannot swing the
    design; the data outweigh it as blocks accumulate."""
    if len(ratios) != len(requests):
        raise DesignError(f"estimate_components: {len(ratios)} ratios but {len(requests)} blocks of requests")
    sides = [_pooled_within([pair[side] for pair in requests]) for side in (0, 1)]
    inv_m = [(_inverse_count(arm_req) + _inverse_count(base_req)) / 2.0 for arm_req, base_req in requests]
    w_df = float(min(df for _, df in sides))
    within = sum(ss / df for ss, df in sides if df) if w_df else None
    between, b_df = None, 0.0
    if len(ratios) >= 2 and within is not None:
        between = _between_moment(ratios, within, inv_m)
        b_df = float(len(ratios) - 1)
    if prior is not None:
        within = _pool(within, w_df, prior.within, prior.within_df)
        between = _pool(between, b_df, prior.between, prior.between_df)
        w_df, b_df = w_df + prior.within_df, b_df + prior.between_df
        src = "data + " + prior.source if (len(ratios) or w_df > prior.within_df) else prior.source
    else:
        src = "data"
    if within is None:
        raise DesignError("estimate_components: no run with 2 or more measured requests and no prior; "
                          "run a block first or give a prior (history of this node)")
    if between is None:
        between, src = DEFAULT_BETWEEN, src + " + default between"
        b_df = DEFAULT_BETWEEN_DF
    return Components(between=between, within=within, between_df=b_df, within_df=w_df, source=src)


def instance_components(values: Sequence[float], requests: Sequence[Sequence[float]]) -> Components:
    """The same one-way model for ONE arm's runs: ``values`` the runs' log tok/s (one per server instance),
    ``requests`` each run's measured request log speeds. ``within`` is the per-request variance inside a run,
    ``between`` the variance of the instances less the part their requests explain (truncated at 0), with n - 1
    degrees of freedom (0, and ``between`` 0, below two instances: no default is put in its place). It is the
    spread across restarts of an arm beside the spread within its runs (specab.analysis.instances)."""
    if len(values) != len(requests):
        raise DesignError(f"instance_components: {len(values)} runs but {len(requests)} runs of requests")
    ss, df = _pooled_within(requests)
    if not df:
        raise DesignError("instance_components: no run with 2 or more measured requests")
    within = ss / df
    if len(values) < 2:
        return Components(between=0.0, within=within, between_df=0.0, within_df=float(df), source="data")
    between = _between_moment(values, within, [_inverse_count(r) for r in requests])
    return Components(between=between, within=within, between_df=float(len(values) - 1), within_df=float(df),
                      source="data")


def _pooled_within(runs: Sequence[Sequence[float]]) -> tuple[float, int]:
    """Sum of squares about each run's mean and its degrees of freedom, pooled over the runs with 2+ requests."""
    ss, df = 0.0, 0
    for req in runs:
        x = np.asarray(req, dtype=float)
        if len(x) >= 2:
            ss += float(((x - x.mean()) ** 2).sum())
            df += len(x) - 1
    return ss, df


def _inverse_count(req: Sequence[float]) -> float:
    return 1.0 / max(len(req), 1)


def _between_moment(values: Sequence[float], within: float, inv_m: Sequence[float]) -> float:
    """The variance of ``values`` less what their runs' requests explain (the median of m requests adds
    MEDIAN_VAR_FACTOR * within / m), truncated at 0."""
    var = float(np.var(np.asarray(values, dtype=float), ddof=1))
    return max(0.0, var - MEDIAN_VAR_FACTOR * within * float(np.mean(inv_m)))


def _pool(est: float | None, df: float, prior: float, prior_df: float) -> float:
    if est is None or df <= 0:
        return prior
    return (est * df + prior * prior_df) / (df + prior_df)


# ------------------------------------------------------------------------------------------- allocation

@dataclass(frozen=True)
class Design:
    """A planned design: `blocks` restarts per arm, `requests` measured requests per run in the blocks still to
    run, the expected GPU-seconds of the whole experiment (done + to do) and its range."""
    blocks: int
    requests: int
    gpu_s: float
    gpu_s_low: float
    gpu_s_high: float
    half_width: float                  # expected relative half-width at `blocks`
    feasible: bool                     # the target is reachable within the bounds
    reason: str
    arms: int = 2
    components: Components | None = None
    cost: RunCost | None = None
    done_blocks: int = 0
    done_gpu_s: float = 0.0

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("blocks", "requests", "gpu_s", "gpu_s_low", "gpu_s_high", "half_width",
                                           "feasible", "reason", "arms", "done_blocks", "done_gpu_s")}
        d["gpu_minutes"] = self.gpu_s / 60.0
        d["components"] = self.components.to_dict() if self.components else None
        d["cost"] = self.cost.__dict__ if self.cost else None
        return d


def t_quantile(level: float, df: float) -> float:
    return t_ppf(0.5 + level / 2.0, df)


def _requests_needed(n: int, done_var: float, done: int, comps: Components, target_log: float, level: float
                     ) -> float | None:
    """Fewest requests per run in blocks done+1..n such that the t half-width at n blocks meets the target."""
    budget = (target_log * n / t_quantile(level, n - 1)) ** 2 - done_var
    per_block = budget / (n - done)
    spare = per_block - comps.between
    if spare <= 0:
        return None
    return MEDIAN_VAR_FACTOR * comps.within / spare if comps.within > 0 else 1.0


def plan_design(comps: Components, cost: RunCost, target_rel: float, *, arms: int = 2, level: float = 0.95,
                min_blocks: int = MIN_RESTARTS, max_blocks: int = 60, min_requests: int = 2,
                max_requests: int = 400, done_var: Sequence[float] = (), done_gpu_s: float = 0.0,
                range_sd: float = 1.0, keep_requests: int | None = None) -> Design:
    """The two-stage allocation: blocks n >= min_blocks and requests m per run (in the blocks still to run)
    that meet the target half-width at the least expected GPU-seconds.

    For every n the fewest m that meets t_{n-1} * sqrt(sum_j v_j) / n <= asinh(target) is found in closed form
    (v_j the block variances: those of the blocks done, v(m) for the rest); the cheapest (n, m) wins. Where
    no m helps (the between-instance variance alone is too large for n blocks) n grows: the fall-back to
    more restarts. `range_sd` widens the expected cost by the uncertainty of the between component.
    `keep_requests`: the experiment's own requests per run, kept unless the best design saves at least
    KEEP_UNLESS_SAVING of the expected cost (a plan that moves for a 2 % saving moves on noise)."""
    if not 0 < target_rel < 1:
        raise DesignError(f"target half-width must lie in (0, 1) (0.02 = +-2 %), got {target_rel}")
    if min_blocks < 2 or max_blocks < min_blocks:
        raise DesignError(f"blocks: need 2 <= min_blocks <= max_blocks, got {min_blocks}..{max_blocks}")
    if min_requests < 1 or max_requests < min_requests:
        raise DesignError(f"requests: need 1 <= min_requests <= max_requests, got {min_requests}..{max_requests}")
    target_log = math.asinh(target_rel)
    done = len(done_var)
    dvar = float(sum(done_var))
    best: tuple[float, int, int, float] | None = None
    for n in range(max(min_blocks, done + 1), max_blocks + 1):
        m = _requests_needed(n, dvar, done, comps, target_log, level)
        if m is None or m > max_requests:
            continue
        m_int = max(min_requests, math.ceil(m - 1e-9))
        g = done_gpu_s + (n - done) * arms * cost.gpu_s(m_int)
        if best is None or g < best[0] - 1e-9:
            best = (g, n, m_int, m)
    if best is None:
        # infeasible within the bounds: the most blocks, each run as long as buys the most precision per GPU-second
        # (the textbook two-stage optimum m* = sqrt(restart x (pi/2) within / (per-request x between)))
        n, m_int = max_blocks, _narrowest_per_cost(comps, cost, min_requests, max_requests)
        hw = _half_width(n, dvar, done, comps, m_int, level)
        g = done_gpu_s + max(0, n - done) * arms * cost.gpu_s(m_int)
        if _requests_needed(n, 0.0, 0, comps, target_log, level) is None:
            short = (f"the between-instance variance alone (sd {math.sqrt(comps.between):.2%} per block) needs "
                     f"more restarts")
        elif done and _requests_needed(n, dvar, done, comps, target_log, level) is None:
            short = f"the {done} block(s) run so far leave the blocks still allowed too little to narrow it"
        else:
            short = f"it needs more than {max_requests} requests per run"
        return Design(n, m_int, g, g, g, hw, False,
                      f"+-{target_rel:.1%} is out of reach within {max_blocks} blocks: {short}; "
                      f"{m_int} requests per run narrow it most per GPU-second",
                      arms, comps, cost, done, done_gpu_s)
    g, n, m_int, _ = best
    if keep_requests is not None and m_int != keep_requests and min_requests <= keep_requests <= max_requests:
        kept = _best_blocks(keep_requests, dvar, done, comps, target_rel, level, min_blocks, max_blocks)
        if kept is not None:
            g_keep = done_gpu_s + (kept - done) * arms * cost.gpu_s(keep_requests)
            # compared without the steps of whole blocks: at whole blocks two designs a few per cent apart can look
            # 10-20 % apart (one needs 6 blocks where the other needs 5 just), and the design moved on that step
            s_keep = _smooth_cost(keep_requests, dvar, done, comps, cost, target_log, level, min_blocks, max_blocks,
                                  arms, done_gpu_s)
            s_best = _smooth_cost(m_int, dvar, done, comps, cost, target_log, level, min_blocks, max_blocks, arms,
                                  done_gpu_s)
            if s_keep <= s_best * (1.0 + KEEP_UNLESS_SAVING):
                g, n, m_int = g_keep, kept, keep_requests
    hw = _half_width(n, dvar, done, comps, m_int, level)
    lo, hi = g, g
    if range_sd > 0:
        lo, hi = _cost_range(comps, cost, target_rel, arms, level, min_blocks, max_blocks, done_var, done_gpu_s,
                             m_int, range_sd, min_requests, max_requests)
        lo, hi = min(lo, g), max(hi, g)
    if n == max(min_blocks, done + 1) and m_int <= min_requests:
        why = (f"the noise is small: the minimum of {n} restarts per arm with the fewest requests ({m_int}) "
               f"already meets the target")
    elif n == max(min_blocks, done + 1) and m_int > min_requests:
        why = (f"the within-run (request) noise dominates: {n} restarts per arm (the minimum) with longer runs "
               f"of {m_int} requests")
    elif m_int <= min_requests:
        why = f"the between-instance noise dominates: short runs ({m_int} requests) and {n} restarts per arm"
    else:
        why = f"{n} restarts per arm x {m_int} requests per run balance restart cost against request noise"
    return Design(n, m_int, g, lo, hi, hw, True, why, arms, comps, cost, done, done_gpu_s)


def _narrowest_per_cost(comps: Components, cost: RunCost, min_requests: int, max_requests: int) -> int:
    """Requests per run that minimise a block's variance times its cost (the classic two-stage allocation)."""
    if comps.within <= 0:
        return min_requests
    if comps.between <= 0:
        return max_requests
    m = math.sqrt(cost.restart_s * MEDIAN_VAR_FACTOR * comps.within / (cost.per_request_s * comps.between))
    return int(min(max_requests, max(min_requests, round(m))))


def _smooth_cost(m: float, dvar: float, done: int, comps: Components, cost: RunCost, target_log: float, level: float,
                 min_blocks: int, max_blocks: int, arms: int, done_gpu_s: float) -> float:
    """Expected GPU-seconds with m requests per run in the blocks to come, the blocks taken as a real number (where
    the expected half-width meets the target, interpolated between whole blocks): the cost of a design without
    the steps of whole blocks, which make two nearly equal designs look 10-20 % apart."""
    lo = max(min_blocks, done + 1)

    def excess(n: int) -> float:
        var = (dvar + (n - done) * comps.block_var(m)) / n ** 2
        return t_quantile(level, n - 1) * math.sqrt(var) - target_log
    n_real = float(max_blocks)
    prev = excess(lo)
    if prev <= 0:
        n_real = float(lo)
    else:
        for n in range(lo + 1, max_blocks + 1):
            cur = excess(n)
            if cur <= 0:
                n_real = n - 1 + prev / (prev - cur)
                break
            prev = cur
    return done_gpu_s + (n_real - done) * arms * cost.gpu_s(m)


def _best_blocks(m: int, dvar: float, done: int, comps: Components, target_rel: float, level: float,
                 min_blocks: int, max_blocks: int) -> int | None:
    return next((n for n in range(max(min_blocks, done + 1), max_blocks + 1)
                 if _half_width(n, dvar, done, comps, m, level) <= target_rel), None)


def _half_width(n: int, dvar: float, done: int, comps: Components, m: float, level: float) -> float:
    var = (dvar + (n - done) * comps.block_var(m)) / n ** 2
    return math.sinh(t_quantile(level, n - 1) * math.sqrt(var))


def _cost_range(comps: Components, cost: RunCost, target_rel: float, arms: int, level: float, min_blocks: int,
                max_blocks: int, done_var: Sequence[float], done_gpu_s: float, m_planned: int, range_sd: float,
                min_requests: int, max_requests: int) -> tuple[float, float]:
    """Expected cost if the components are at the low or high end of their uncertainty (chi-square with their
    degrees of freedom): the plan's m is kept (it is chosen now) and the blocks needed follow; where those blocks
    would pass the cap, the design moves the requests per run (it re-plans after every block), and that plan's
    cost counts."""
    from scipy import stats as scipy_stats
    def scale(df: float) -> tuple[float, float]:
        q = scipy_stats.chi2.ppf([0.5 - 0.3413 * range_sd, 0.5 + 0.3413 * range_sd], max(df, 1.0)) / max(df, 1.0)
        return 1.0 / q[1], 1.0 / q[0]          # a variance estimate s2 is consistent with s2/q_hi .. s2/q_lo
    (b_lo, b_hi), (w_lo, w_hi) = scale(comps.between_df), scale(comps.within_df)
    out = []
    for bf, wf in ((b_lo, w_lo), (b_hi, w_hi)):
        c = replace(comps, between=comps.between * bf, within=comps.within * wf)
        n = _blocks_for(c, m_planned, target_rel, level, min_blocks, max_blocks, done_var)
        if (n < max_blocks or min_requests == max_requests
                or _half_width(n, float(sum(done_var)), len(done_var), c, m_planned, level) <= target_rel):
            out.append(done_gpu_s + max(0, n - len(done_var)) * arms * cost.gpu_s(m_planned))
        else:
            out.append(plan_design(c, cost, target_rel, arms=arms, level=level, min_blocks=min_blocks,
                                   max_blocks=max_blocks, min_requests=min_requests, max_requests=max_requests,
                                   done_var=done_var, done_gpu_s=done_gpu_s, range_sd=0.0).gpu_s)
    return min(out), max(out)


def _blocks_for(comps: Components, m: float, target_rel: float, level: float, min_blocks: int, max_blocks: int,
                done_var: Sequence[float]) -> int:
    """Blocks until the expected half-width meets the target with m requests per run (capped)."""
    done = len(done_var)
    return next((n for n in range(max(min_blocks, done + 1), max_blocks + 1)
                 if _half_width(n, float(sum(done_var)), done, comps, m, level) <= target_rel), max_blocks)


def model_half_width(comps: Components, requests_per_block: Sequence[float], level: float = 0.95) -> float:
    """Relative half-width the variance-components model gives the blocks run so far (their requests per run):
    the second opinion a stop needs besides the interval itself (docs/statistics.md, "When to stop")."""
    n = len(requests_per_block)
    if n < 2:
        return math.inf
    return _half_width(n, sum(comps.block_var(m) for m in requests_per_block), n, comps, 1.0, level)


def implausibly_narrow(comps: Components, requests_per_block: Sequence[float], ci_half_width: float,
                       level: float = 0.95) -> bool:
    """Do the blocks agree better than the variance components make plausible? The interval's own variance of a
    block's log ratio (the t interval inverted: n (asinh(h) / t_{n-1})^2; the report's bootstrap interval is never
    narrower than the t interval, so this errs towards letting the stop pass) against the model's mean block
    variance, a chi-square test with n - 1 degrees of freedom at GATE_ALPHA."""
    from scipy import stats as scipy_stats
    n = len(requests_per_block)
    if n < 2 or not math.isfinite(ci_half_width):
        return False
    data_var = n * (math.asinh(ci_half_width) / t_quantile(level, n - 1)) ** 2
    model_var = sum(comps.block_var(m) for m in requests_per_block) / n
    return data_var < model_var * float(scipy_stats.chi2.ppf(GATE_ALPHA, n - 1)) / (n - 1)


# ------------------------------------------------------------------------------------------ when to stop

# Below this many blocks the interval's own variance estimate has at most 3 degrees of freedom (and the report's
# interval is a plain t interval, specab.analysis.measures.stats.MIN_BOOTSTRAP_N): stopping on it alone picks the blocks
# that happened to agree (the coverage study: 81 % coverage among stops at 3 blocks, 88 % at 4). Such an early
# stop of a design that moved the requests per run away from the experiment's is refused when the blocks agree
# implausibly well for the variance-components model (this experiment's requests + the node's history): when
# their variance is below the model's by more than chance explains at GATE_ALPHA (a chi-square test with n - 1
# degrees of freedom). A design that kept the experiment's requests in every block is the sequential design
# decision for decision and keeps the sequential stop (docs/statistics.md, "When to stop").
MODEL_GATE_BELOW = 4
# Refusing every early stop the model does not expect costs 4.5-5 % more GPU-minutes than the sequential design in
# the instance-dominated regime, where 3 blocks are never expected to suffice; refusing only the implausibly lucky
# ones (5 %) keeps the coverage (docs/performance.md 3b).
GATE_ALPHA = 0.05


@dataclass(frozen=True)
class Step:
    """The decision after a block: run another? with how many requests per run? and the current plan."""
    more: bool
    requests: int
    plan: Design
    why: str


def next_step(comps: Components, cost: RunCost, target_rel: float, requests_per_block: Sequence[float],
              ci_half_width: float, *, arms: int = 2, min_blocks: int = MIN_RESTARTS, max_blocks: int = 60,
              min_requests: int = 2, max_requests: int = 400, level: float = 0.95,
              done_gpu_s: float = 0.0, keep_requests: int | None = None) -> Step:
    """Design by cost, updated after every block (the `--target-ci` decision of the cost design).

    Stops when the report's interval is within the target after at least `min_blocks` blocks, and, below
    MODEL_GATE_BELOW blocks in a design that moved the requests per run away from `keep_requests` (the
    experiment's), the blocks do not agree implausibly well for the model (`implausibly_narrow`); stops at
    `max_blocks` whatever the width. Otherwise plans the rest (plan_design over the blocks done) and says how many
    requests the next block's runs get. `requests_per_block`: the measured requests per run of each block done."""
    n = len(requests_per_block)
    done_var = [comps.block_var(m) for m in requests_per_block]
    plan = plan_design(comps, cost, target_rel, arms=arms, level=level, min_blocks=min_blocks,
                       max_blocks=max(max_blocks, n + 1), min_requests=min_requests, max_requests=max_requests,
                       done_var=done_var, done_gpu_s=done_gpu_s, range_sd=0.0, keep_requests=keep_requests)
    width = f"+-{ci_half_width:.2%}" if math.isfinite(ci_half_width) else "no interval yet"
    if n >= max_blocks:
        return Step(False, plan.requests, plan, f"stopped at {max_blocks} blocks (the cap), interval {width}")
    if n >= min_blocks and ci_half_width <= target_rel:
        kept = keep_requests is not None and all(m == keep_requests for m in requests_per_block)
        if n >= MODEL_GATE_BELOW or kept or not implausibly_narrow(comps, requests_per_block, ci_half_width, level):
            return Step(False, plan.requests, plan, f"interval {width} within +-{target_rel:.1%} after {n} blocks")
        model_hw = model_half_width(comps, requests_per_block, level)
        return Step(True, plan.requests, plan,
                    f"interval {width} after only {n} blocks, but the variance components expect "
                    f"+-{model_hw:.2%} (blocks this alike happen by chance less than {GATE_ALPHA:.0%} of the time): "
                    f"one more block of {plan.requests} requests per run")
    return Step(True, plan.requests, plan,
                f"interval {width} after {n} block(s); plan: {plan.blocks} blocks, {plan.requests} requests "
                f"per run ({plan.reason})")
