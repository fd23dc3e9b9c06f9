"""``--search request_rate`` (or ``concurrency``): the load axis a capacity search varies, its range and tolerance,
the grid its probes lie on, and the arms of a probe load. Checked before any node is touched.

A probe is an ordinary arm of the matrix: the arm ``--matrix request_rate=<load>`` would make (same name, launch
script and fingerprint rule), so each probe runs, is stored and resumes like any run. The loads lie on a geometric
grid fixed by the search's start and tolerance, ``lo x 2^(k/n)`` with n the steps per doubling (the fewest, a power of
two, whose step is within the tolerance), so the blocks probe the same loads again and each load gets a paired
comparison over blocks. The probe design itself (which grid points each block runs) is
specab.analysis.cost.search; docs/analysis.md, "SLO and capacity", says why.
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any

from specab.config.matrix import BENCH_AXES, CONCURRENCY, RATE, Axis, build_arms
from specab.config.spec import ArmSpec, ExperimentSpec
from specab.config.yamlfile import ConfigError

DEFAULT_TOL = 0.10
DEFAULT_RANGE = {RATE: (1.0, 32.0), CONCURRENCY: (1.0, 64.0)}
# the ladder may extend this many doublings beyond the range: up (a higher load is a shorter run) and down (a rate a
# quarter of the start already makes a run of requests / rate seconds four times as long)
MAX_DOUBLINGS_UP, MAX_DOUBLINGS_DOWN = 6, 2
_RANGE = re.compile(r"^(?P<lo>[0-9.]+)\.\.(?P<hi>[0-9.]+)$")


@dataclass(frozen=True)
class Search:
    axis: str           # request_rate | concurrency
    lo: float           # the ladder's first load
    hi: float           # the ladder's last load at most
    tol: float          # relative: the grid step, and the width the bracket narrows to
    most: float = math.inf  # the highest load a probe may take (concurrency: the run's measured requests)

    @property
    def steps_per_doubling(self) -> int:
        """n: the fewest grid steps per doubling, a power of two, with 2^(1/n) <= 1 + tol."""
        n = 1
        while 2.0 ** (1.0 / n) > 1.0 + self.tol + 1e-12:
            n *= 2
        return n

    @property
    def unit(self) -> str:
        return "req/s" if self.axis == RATE else "in flight"

    def load(self, k: float) -> float:
        """Grid point k (an integer index; 0 is lo) as the load the probe runs at: a rate to 3 significant digits,
        a concurrency to a whole number of requests (at least 1)."""
        x = self.lo * 2.0 ** (k / self.steps_per_doubling)
        if self.axis == CONCURRENCY:
            return float(max(1, round(x)))
        return float(f"{x:.3g}")

    def index(self, load: float) -> float:
        """The (fractional) grid index of a load."""
        return self.steps_per_doubling * math.log2(load / self.lo)

    def ladder(self) -> list[float]:
        """Block 1's loads: lo doubling up to hi."""
        n, out, k = self.steps_per_doubling, [], 0
        while self.load(k) <= self.hi * (1 + 1e-9):
            out.append(self.load(k))
            k += n
        return sorted(set(out))

    def in_reach(self, k: int) -> bool:
        """Whether grid point k lies within the doublings the ladder may extend beyond the range and at most
        ``most``."""
        n = self.steps_per_doubling
        top = self.index(self.hi) + MAX_DOUBLINGS_UP * n
        return -MAX_DOUBLINGS_DOWN * n <= k <= top and self.load(k) <= self.most

    def text(self) -> str:
        return (f"--search {self.axis}={self.lo:g}..{self.hi:g} (tolerance {self.tol:.0%}: grid step "
                f"x{2.0 ** (1.0 / self.steps_per_doubling):.3f})")

    def to_dict(self) -> dict[str, Any]:
        return {"axis": self.axis, "lo": self.lo, "hi": self.hi, "tol": self.tol, "unit": self.unit,
                "steps_per_doubling": self.steps_per_doubling, "text": self.text()}


def parse(text: str, tol: float | None = None) -> Search:
    """``--search AXIS[=LO..HI]`` (and ``--search-tol``) as a Search; ConfigError when the axis is not a load or the
    range is not one."""
    axis, _, rng = text.strip().partition("=")
    if axis not in BENCH_AXES:
        raise ConfigError(f"--search {text}: {axis!r} is not a load; a capacity search varies request_rate "
                          f"(arrivals per second) or concurrency (requests in flight).")
    lo, hi = DEFAULT_RANGE[axis]
    if rng:
        m = _RANGE.match(rng)
        try:
            lo, hi = (float(m.group("lo")), float(m.group("hi"))) if m else (-1.0, -1.0)
        except ValueError:
            lo = hi = -1.0
        if not 0 < lo < hi or (axis == CONCURRENCY and (lo != int(lo) or hi != int(hi))):
            raise ConfigError(f"--search {text}: the range is LO..HI with 0 < LO < HI (whole numbers for "
                              f"concurrency), e.g. --search {axis}=2..32.")
    t = DEFAULT_TOL if tol is None else tol
    if not 0 < t < 1:
        raise ConfigError(f"--search-tol {t}: give a tolerance between 0% and 100%, e.g. 10%.")
    return Search(axis, lo, hi, t)


def check(search: Search, has_slo: bool, exp: ExperimentSpec, axes: list[Axis]) -> Search:
    """Refuse a search that cannot run: without an SLO, over an axis the matrix also sweeps, a concurrency search of
    an open load, one whose probes the bench's requests cannot fill. Returns it with its reach: a concurrency search
    probes at most as many in flight as a run measures requests."""
    if not has_slo:
        raise ConfigError(f"--search {search.axis}: a capacity search finds the highest load that meets an SLO, and "
                          f"{exp.path} has none: add slo: to the experiment (e.g. slo: {{ttft_ms: {{p95: 200}}, "
                          f"tpot_ms: {{p95: 10}}}}) or --slo ttft_ms:p95=200 --slo tpot_ms:p95=10.")
    if any(ax.key in BENCH_AXES and (ax.key == search.axis or search.axis == CONCURRENCY) for ax in axes):
        raise ConfigError(f"--search {search.axis} varies the load itself: drop --matrix "
                          f"{', '.join(ax.label for ax in axes if ax.key in BENCH_AXES)} (a request_rate search keeps "
                          f"bench.concurrency as its in-flight cap, or sweeps it with --matrix concurrency=...).")
    rate = float(exp.bench_settings.get("request_rate") or 0)
    if search.axis == CONCURRENCY and rate > 0:
        raise ConfigError(f"--search concurrency measures a closed loop, but bench.request_rate is {rate:g} in "
                          f"{exp.path}: set it to 0 or search request_rate.")
    need = int(search.hi) if search.axis == CONCURRENCY else 3
    if int(exp.bench_settings["num_requests"]) < need:
        raise ConfigError(f"--search {search.axis}: bench.num_requests {exp.bench_settings['num_requests']} in "
                          f"{exp.path} is too few: a probe needs at least {need} measured requests (at least "
                          f"as many as its requests in flight, and 3 to time an arrival rate).")
    if search.axis == CONCURRENCY:
        return dataclasses.replace(search, most=float(exp.bench_settings["num_requests"]))
    return search


def probe_arms(exp: ExperimentSpec, axes: list[Axis], search: Search, loads: list[float]) -> list[ArmSpec]:
    """The arms of the given probe loads: exactly those --matrix <axis>=<loads> makes with the other axes."""
    values = tuple(int(x) if search.axis == CONCURRENCY or float(x).is_integer() else float(x)
                   for x in sorted(set(loads)))
    return build_arms(exp, axes + [Axis(search.axis, search.axis, values)]).arms


def load_of(arm: ArmSpec | dict[str, Any], axis: str) -> float | None:
    """The probe load an arm runs at (its bench condition), None for an arm of no probe."""
    bench = arm.bench if isinstance(arm, ArmSpec) else (arm.get("bench") or arm.get("matrix") or {})
    v = bench.get(axis)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
