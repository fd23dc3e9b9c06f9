"""The verdict per load (specab/analysis/measures/concurrency.py) on constructed experiments whose speedups are known."""
from __future__ import annotations

import math
import re

import pytest

from specab.analysis.measures import concurrency
from specab.analysis.render import report
from specab.analysis.evidence.model import Arm
from tests.analysis.factory import BASE_ARGS, TUNED, experiment, spec_args

LOADS = (1, 8, 32)


def _arms(loads=LOADS) -> list[Arm]:
    out = []
    for c in loads:
        out.append(Arm(f"baseline-c{c}", dict(BASE_ARGS), dict(TUNED), baseline=f"baseline-c{c}",
                       matrix={"concurrency": c}))
        out.append(Arm(f"eagle3-s2-k1-d3-c{c}", spec_args(2), dict(TUNED), baseline=f"baseline-c{c}",
                       matrix={"steps": 2, "concurrency": c}))
    return out


def _exp(speedups: dict[int, float], blocks: int = 4, run_cv: float = 0.01):
    tok = {}
    for c, sp in speedups.items():
        base = 400.0 / (1 + 0.012 * (c - 1))
        tok[f"baseline-c{c}"] = base
        tok[f"eagle3-s2-k1-d3-c{c}"] = base * sp
    exp = experiment(tok, blocks=blocks, arm_list=_arms(tuple(speedups)), run_cv=run_cv)
    exp.baseline = "baseline-c1"
    return exp


def _total_tok_s(run) -> float:
    reqs = run.measured
    start = min(q.start_ts for q in reqs)
    end = max(q.start_ts + q.e2e_s for q in reqs)
    return sum(q.output_tokens for q in reqs) / (end - start)


def test_crossing_interpolates_log_speedup_in_log_load():
    c, direction = concurrency.crossing([1, 8, 32], [1.5, 0.8, 0.6])
    t = math.log(1.5) / (math.log(1.5) - math.log(0.8))
    assert direction == "stops" and c == pytest.approx(8 ** t)
    # starts paying as the load grows (the other direction) and no crossing at all
    assert concurrency.crossing([1, 4], [0.9, 1.2])[1] == "starts"
    assert concurrency.crossing([1, 8, 32], [1.5, 1.2, 1.1]) == (None, "")
    # a load without a value is skipped, not read as a crossing
    assert concurrency.crossing([1, 8, 32], [1.5, None, 0.5])[0] == pytest.approx(
        math.exp(math.log(32) * math.log(1.5) / (math.log(1.5) - math.log(0.5))))


def test_speedups_per_load_and_the_crossover_with_its_range():
    exp = _exp({1: 1.5, 8: 0.8, 32: 0.6})
    rep = concurrency.analyse_loads(exp)
    assert rep.loads == [1, 8, 32] and len(rep.families) == 1
    fam = rep.families[0]
    assert fam.name == "eagle3-s2-k1-d3" and [p.concurrency for p in fam.points] == [1, 8, 32]
    for p, want in zip(fam.points, (1.5, 0.8, 0.6)):
        assert p.baseline == f"baseline-c{p.concurrency}"          # each load against its own baseline
        assert p.per_user.estimate == pytest.approx(want, rel=0.02)
        assert p.per_user.ci is not None and p.per_user.ci.lo < p.per_user.estimate < p.per_user.ci.hi
        # in throughput: every measured token over the measured window, TTFTs and gaps included, paired per block
        by_block = {r.block: _total_tok_s(r) for r in exp.runs_of(p.baseline)}
        ratios = [_total_tok_s(r) / by_block[r.block] for r in sorted(exp.runs_of(p.arm), key=lambda r: r.block)]
        assert p.throughput.ratios == pytest.approx(ratios) and p.throughput.ci is not None
        assert p.throughput.estimate == pytest.approx(math.exp(sum(map(math.log, ratios)) / len(ratios)))
        # break-even from the runs at this load: tau * baseline / arm tok/s
        assert p.tau_star == pytest.approx(p.tau * p.baseline_tok_s / p.arm_tok_s)
    x = fam.per_user
    lo_curve, _ = concurrency.crossing([1, 8, 32], [p.per_user.ci.lo for p in fam.points])
    hi_curve, _ = concurrency.crossing([1, 8, 32], [p.per_user.ci.hi for p in fam.points])
    assert x.direction == "stops" and 1 < x.lo < x.estimate < x.hi < 8
    assert (x.lo, x.hi) == (pytest.approx(lo_curve), pytest.approx(hi_curve))
    assert x.estimate == pytest.approx(concurrency.crossing([1, 8, 32], [p.per_user.estimate for p in fam.points])[0])
    v = fam.verdict()
    assert v.startswith("eagle3-s2-k1-d3: 1.5") and "at 1 in flight (single-stream)" in v
    assert v.count("single-stream") == 2 and "stops paying per user at ~" in v     # once per measure, at 1 only


def test_open_ends_and_no_crossing():
    # the lower ends are under 1 already at the smallest load: the range's low end lies below the measured loads
    exp = _exp({1: 1.01, 8: 0.7}, run_cv=0.03)
    x = concurrency.analyse_loads(exp).families[0].per_user
    assert x.estimate is not None and 1 < x.estimate < 8
    assert x.lo is None and x.lo_open and "below 1" in x.text()
    # paying everywhere: no crossover, said so
    y = concurrency.analyse_loads(_exp({1: 1.6, 8: 1.3})).families[0].per_user
    assert y.estimate is None and y.pays == "everywhere" and "every measured load (up to 8" in y.text()


def test_report_states_the_verdict_per_load():
    exp = _exp({1: 1.5, 8: 0.8, 32: 0.6})
    rep = report.build_report(exp, plots=False)
    per_load = [s for s in rep.summary if s.startswith("Per load: ")]
    assert len(per_load) == 1 and "stops paying per user" in per_load[0]
    assert any("per user at 8 in flight" in s for s in rep.summary)
    assert not any("single-stream" in s for s in rep.summary if "-c8" in s or "-c32" in s)
    fams = rep.data["loads"]["families"]
    assert [p["concurrency"] for p in fams[0]["points"]] == [1, 8, 32]
    md = report.to_markdown(rep)
    assert "## Verdict per load" in md and "Speculative-decoding model vs baseline-c8 (8 in flight)" in md


def _rate_exp(speedups: dict[float, float], cap: int = 16):
    """A request-rate sweep at a cap of `cap` in flight: arms `<name>-c<cap>-r<R>` as `--matrix concurrency=<cap>
    request_rate=...` names them."""
    arms, tok = [], {}
    for r, sp in speedups.items():
        b, s = f"baseline-c{cap}-r{r:g}", f"eagle3-s2-k1-d3-c{cap}-r{r:g}"
        arms += [Arm(b, dict(BASE_ARGS), dict(TUNED), baseline=b, matrix={"concurrency": cap, "request_rate": r}),
                 Arm(s, spec_args(2), dict(TUNED), baseline=b,
                     matrix={"steps": 2, "concurrency": cap, "request_rate": r})]
        tok[b] = 400.0 / (1 + 0.05 * r)
        tok[s] = tok[b] * sp
    exp = experiment(tok, blocks=4, arm_list=arms, run_cv=0.01)
    exp.baseline = arms[0].name
    return exp


def test_a_request_rate_sweep_is_one_family_over_arrival_rates():
    """`--matrix concurrency=16 request_rate=2,8,32`: the loads are the arrival rates (requests per second, the cap of
    16 in flight stays in the family's name), the crossover is a rate, and every label says which."""
    rep = concurrency.analyse_loads(_rate_exp({2: 1.6, 8: 1.2, 32: 0.7}))
    [fam] = rep.families
    assert fam.name == "eagle3-s2-k1-d3-c16" and [p.load for p in fam.points] == [2, 8, 32]
    assert rep.loads == [2, 8, 32] and rep.unit == "req/s"
    assert fam.points[0].label == "2 req/s (at most 16 in flight)"
    c = fam.per_user
    assert c.unit == "req/s" and c.direction == "stops" and 8 < c.estimate < 32
    assert math.isclose(c.estimate, concurrency.crossing([8, 32], [1.2, 0.7])[0], rel_tol=0.02)
    assert f"stops paying per user at ~{c.estimate:.1f} req/s" in fam.verdict()
    assert re.search(r"1\.6\dx at 2 req/s \(at most 16 in flight\), 1\.2\dx at 8 req/s, 0\.7\dx at 32 req/s per user",
                     fam.verdict()), fam.verdict()
    md = report.to_markdown(report.build_report(_rate_exp({2: 1.6, 8: 1.2, 32: 0.7}), plots=False))
    assert "per user at 8 req/s (at most 16 in flight)" in md and "in flight (single-stream)" not in md
