"""The instance as the unit of noise (specab.analysis.cost.instances): the report's spread across restarts beside the
spread within a run, on the real H100 stores, and the doctor's `instance-trend` rule against planted truth.

The H100 stores (tests/fixtures/validity/h100): `validity-…-054331` is one block of five arms on a freshly started
machine; `spread-…-054911` is baseline + EAGLE-3 s3 over four blocks on the same machine right after (warm);
`spread-burn-in-…-140242` is baseline + EAGLE-3 s3 with design.burn_in: 1 on another freshly started H100, its
burn-in and two blocks (the device call's limit cut the third)."""
from __future__ import annotations

import math
import re
import statistics
from pathlib import Path

import numpy as np
import pytest

from specab.analysis.cost import design, instances
from specab.analysis.evidence.model import Experiment, load_store
from specab.analysis.findings import doctor
from specab.analysis.measures import stats
from specab.analysis.render import report
from tests.analysis import factory
from tests.stores import copy_store

H100 = Path(__file__).resolve().parents[1] / "fixtures" / "validity" / "h100"
FRESH, WARM = "validity-h200-20261206-054331", "spread-h200-20261206-054911"
# The H200 stores (tests/fixtures/validity/h200): three device calls, one after another, on ONE freshly started H200:
# the five arms of one block, then the spread without a burn-in, then with one (docs/validation/validity.md)
H200 = H100.parent / "h200"
H200_STORES = ("validity-h200-20261206-221559", "spread-h200-20261206-222136", "spread-burn-in-h200-20261206-222835")


@pytest.fixture(scope="module")
def h100(tmp_path_factory) -> dict[str, Experiment]:
    root = tmp_path_factory.mktemp("h100")
    return {name: load_store(copy_store(H100 / name, root / name), read_logs=False) for name in (FRESH, WARM)}


def _fresh_then_warm(h100: dict[str, Experiment]) -> Experiment:
    """The two arms both stores share, every instance of the machine in the order it started (the fresh machine's
    first instances first)."""
    keep = {"baseline", "eagle3-s3"}
    warm = h100[WARM]
    return Experiment(id="h100", arms=warm.arms, runs=[r for r in h100[FRESH].runs if r.arm in keep] + warm.runs)


def test_the_h100_spread_per_arm_is_the_design_estimators_over_the_stores_runs(h100):
    e = h100[WARM]
    rep = instances.analyse(e)
    by = {a.arm: a for a in rep.arms}
    assert [a.restarts for a in rep.arms] == [4, 4]
    for name, spread in by.items():
        runs = sorted(e.runs_of(name), key=lambda r: r.started)
        assert spread.run_ids == [r.run_id for r in runs]
        logs = [math.log(r.tok_s) for r in runs]
        reqs = [[math.log(q.decode_tok_s) for q in r.measured] for r in runs]
        comps = design.instance_components(logs, reqs)              # the one estimator, not a second one
        assert spread.within_sd == math.sqrt(comps.within)
        assert spread.implied_se == pytest.approx(math.sqrt(design.MEDIAN_VAR_FACTOR * comps.within / 12))
        assert spread.observed_sd == pytest.approx(statistics.stdev(logs))
        assert spread.between_sd == math.sqrt(comps.between)
    # the numbers the report shows for this store (SGLang 0.5.17 on an H100, known-truth pair)
    assert rep.rows() == [
        ["baseline", "4", "324.0-324.1", "0.01% (0.00%-0.05%)", "0.02%", "0.01% (12)", "- (baseline)"],
        ["eagle3-s3", "4", "530.2-531.8", "0.14% (0.08%-0.51%)*", "4.84%", "1.75% (12)", "restarts (100%)*"]]
    # EAGLE-3's requests vary 4.8 % (their prompts accept differently) but its four instances agree to 0.14 %: the
    # same prompts in every run, so the requests' spread does not reach a run's median; the design's moment
    # estimate is 0 there and the instances' own sd is shown, starred and explained
    eagle = by["eagle3-s3"]
    assert eagle.requests_repeat and eagle.between_sd == 0.0 and eagle.spread_sd == eagle.observed_sd
    assert not by["baseline"].requests_repeat
    assert any(n.startswith("* The instances of eagle3-s3 (sd 0.14% against 1.75%)") for n in rep.notes())


def test_the_report_has_the_instance_spread_in_its_text_and_its_json(h100):
    rep = report.build_report(h100[WARM], plots=False)
    md = report.to_markdown(rep)
    assert "## Instance spread" in md
    assert "| eagle3-s3 | 4 | 530.2-531.8 | 0.14% (0.08%-0.51%)* | 4.84% | 1.75% (12) | restarts (100%)* |" in md
    data = rep.data["instances"]["arms"]
    assert data["eagle3-s3"]["restarts"] == 4 and data["eagle3-s3"]["dominant"] == "restarts"
    assert data["baseline"]["between_ci"][1] == pytest.approx(0.000494, rel=0.01)
    assert rep.data["instances"]["burn_in"] == []


def test_one_instance_per_arm_has_no_between_spread_and_no_verdict_share(h100):
    rows = instances.analyse(h100[FRESH]).rows()
    assert [r[1] for r in rows] == ["1"] * 5
    assert all(r[3] == "- (one instance)" for r in rows)
    assert [r[6] for r in rows] == ["- (baseline)"] + ["- (below 2 blocks)"] * 4


def test_no_first_instance_slowness_on_the_h100_so_the_rule_is_silent(h100):
    """The claim first, from the data: on the freshly started H100 the first instance of each arm was not slow
    (baseline: the fastest of its five; EAGLE-3 s3: the second fastest, above its later ones' median), and the five
    are within 0.3 % of each other; then the rule says nothing, on either store or on both together, whatever
    effect size it is asked to look for."""
    both = _fresh_then_warm(h100)
    for arm in ("baseline", "eagle3-s3"):
        tok = [r.tok_s for r in sorted(both.runs_of(arm), key=lambda r: r.started)]
        assert len(tok) == 5 and tok[0] > statistics.median(tok[1:]) and max(tok) / min(tok) - 1 < 0.004, tok
    assert max(r.tok_s for r in both.runs_of("baseline")) == both.runs_of("baseline")[0].tok_s
    assert instances.trends(both) == [] and instances.trends(both, min_change=0.0) == []
    for e in h100.values():
        assert not [f for f in doctor.diagnose(e, stats.analyse(e)) if f.rule == "instance-trend"]


def test_on_a_fresh_h100_the_burn_in_start_ran_as_fast_as_the_measured_ones_and_stays_out_of_the_analysis(tmp_path):
    """The burn-in of a real store: the first start of a freshly started H100 (its Triton compilation included) ran
    EAGLE-3 s3 within 0.2 % of the arm's measured instances on that machine, so there a burn-in buys nothing; the
    report shows it apart with that change, computed from the store's own rates, and no analysis counts it. Blocks 3
    and 4 were resumed on another H100 behind the same inventory name (its GPU's UUID in the runs' manifests), where
    the baseline ran 3.5 % faster: the instances are judged per machine, so that machine change is said as one and
    not read as the first instances running slow (which asked for a burn-in of 5 starts)."""
    name = "spread-burn-in-h200-20261206-140242"
    e = load_store(copy_store(H100 / name, tmp_path / name), read_logs=False)
    [burn] = e.burn_in
    uuid = {r.run_id: r.manifest["gpu"]["gpus"][0]["uuid"] for r in e.runs + e.burn_in}
    first = [r.run_id for r in e.runs + e.burn_in if uuid[r.run_id] == uuid[burn.run_id]]
    assert sorted(first) == ["001-eagle3-s3", "002-eagle3-s3", "003-baseline", "004-eagle3-s3", "005-baseline"]
    assert len(set(uuid.values())) == 2 and {r.host for r in e.runs} == {"gpu0"}
    measured = [r.tok_s for r in e.runs_of("eagle3-s3") if r.run_id in first]
    assert (burn.run_id, burn.arm, len(measured), len(e.runs_of("eagle3-s3"))) == ("001-eagle3-s3", "eagle3-s3", 2, 4)
    change = burn.tok_s / statistics.fmean(measured) - 1
    assert abs(change) < 0.002, (burn.tok_s, measured)
    rep = instances.analyse(e)
    [b] = rep.burn_in
    assert b.change == pytest.approx(change, rel=1e-12)
    notes = " ".join(rep.notes())
    assert f"001-eagle3-s3 {burn.tok_s:.1f} tok/s ({change:+.1%} against its measured instances on gpu0 " \
           f"({uuid[burn.run_id][:12]}))" in notes
    later = sorted(set(uuid) - set(first))
    assert (f"gpu0 ran on 2 machines (its GPUs' UUIDs changed, e.g. a resume on another machine): "
            f"gpu0 ({uuid[first[0]][:12]}): {', '.join(sorted(first))}; gpu0 ({uuid[later[0]][:12]}): "
            f"{', '.join(later)}") in notes
    assert [(a.arm, a.restarts) for a in rep.arms] == [("baseline", 4), ("eagle3-s3", 4)]
    assert stats.analyse(e).arms["eagle3-s3"].runs == 4
    assert instances.trends(e) == []
    found = {f.rule: f for f in doctor.diagnose(e, stats.analyse(e))}
    assert "instance-trend" not in found
    assert "Its host changed machines" in found["baseline-drift"].message


def _slowed(factor: dict[int, float]):
    """A tweak of factory.experiment: the runs at these start positions (1-based seq) decode `factor` as fast."""
    def tweak(run, arm):
        f = factor.get(run.seq)
        if f is not None:
            for q in run.requests:
                q.decode_tok_s *= f
    return tweak


def _trend_findings(e: Experiment) -> list[doctor.Finding]:
    return [f for f in doctor.diagnose(e, stats.analyse(e)) if f.rule == "instance-trend"]


def test_the_first_starts_slow_are_named_run_by_run_with_the_burn_in_to_set():
    # the node's first two starts decode 20 % slower (what the H200's freshly started machines did): both arms'
    # block-1 runs; the rule names exactly those and asks for a burn-in that covers both starts
    e = factory.experiment({"baseline": 82.0, "eagle3-s2": 120.0}, blocks=4, tweak=_slowed({1: 0.8, 2: 0.8}))
    found = _trend_findings(e)
    assert sorted((f.arm, tuple(f.runs)) for f in found) == sorted(
        (r.arm, (r.run_id,)) for r in e.runs if r.seq in (1, 2))
    for f in found:
        assert f.severity == "warning" and re.search(r"ran (19|20|21)% slower than its later ones", f.message)
        assert "set design.burn_in in the experiment file to at least" in f.message
        assert "(start 1)" in f.evidence[0] or "(start 2)" in f.evidence[0]
    second = next(r for r in e.runs if r.seq == 2)
    [of_second] = [f for f in found if f.runs == [second.run_id]]
    assert f"{second.run_id}=" in of_second.evidence[0] and "(start 2)" in of_second.evidence[0]
    assert "to at least 2 (unmeasured server starts" in of_second.message


def test_the_first_two_instances_of_one_arm_slow_count_as_one_lead():
    e = factory.experiment({"baseline": 82.0}, blocks=5, tweak=_slowed({1: 0.85, 2: 0.88}))
    [t] = instances.trends(e)
    assert (t.kind, t.lead, t.low) == ("first", 2, ["001-baseline", "002-baseline"])
    assert t.change == pytest.approx(-0.135, abs=0.01)          # the two against the later ones' mean


def test_a_warm_up_over_the_run_order_is_a_trend_and_a_slow_down_is_left_to_the_drift_rule():
    up = factory.experiment({"baseline": 82.0}, blocks=6, tweak=_slowed({i: 0.90 + 0.02 * i for i in range(1, 7)}))
    [t] = instances.trends(up)
    assert t.kind == "order" and t.change == pytest.approx(0.10 / 0.92, abs=0.01)
    assert re.search(r"sped up along the run order, \+1[01]% from first to last", t.message())
    assert "design.burn_in in the experiment file to at least 3 (unmeasured" in t.message()    # its 3rd of 6
    down = factory.experiment({"baseline": 82.0}, blocks=6, drift_per_run=-0.01)
    assert instances.trends(down) == []


@pytest.mark.parametrize("factor", [0.99, 1.0])
def test_silent_below_the_effect_size_and_on_a_steady_node(factor):
    e = factory.experiment({"baseline": 82.0, "eagle3-s2": 120.0}, blocks=4, tweak=_slowed({1: factor, 2: factor}))
    assert _trend_findings(e) == []


def test_silent_where_the_runs_spread_covers_the_first_one():
    # instances that spread 10 % anyway (run_cv): a first one 12 % low is within what its arm shows
    rng = np.random.default_rng(5)
    quiet = 0
    for seed in rng.integers(1, 10_000, 20):
        e = factory.experiment({"baseline": 82.0}, blocks=6, run_cv=0.10, seed=int(seed), tweak=_slowed({1: 0.88}))
        quiet += not instances.trends(e)
    assert quiet >= 18, quiet


def test_burn_in_runs_are_shown_apart_and_never_analysed():
    e = factory.experiment({"baseline": 82.0, "eagle3-s2": 120.0}, blocks=3)
    burn = factory.experiment({"baseline": 82.0}, blocks=1, tweak=_slowed({1: 0.75})).runs
    burn[0].started = e.runs[0].started - 300
    e.burn_in = burn
    rep = instances.analyse(e)
    [b] = rep.burn_in
    assert (b.run_id, b.arm) == ("001-baseline", "baseline") and b.change == pytest.approx(-0.25, abs=0.01)
    assert any(n.startswith("Burn-in (design.burn_in: 1 unmeasured start(s) before block 1, not analysed): "
                            "001-baseline ") and "against its measured instances on localhost" in n
               for n in rep.notes())
    assert [a.restarts for a in rep.arms] == [3, 3]
    assert stats.analyse(e).arms["baseline"].runs == 3
    # the host's starts count the burn-in: the measured instances start at 2
    [t] = instances.trends(_with_first_measured_slow(e))
    assert t.burn_in == 1 and t.starts[0] == 2 and "(after 1 burn-in start(s))" in t.message()
    assert "design.burn_in in the experiment file to at least 2 (unmeasured" in t.message()


def _with_first_measured_slow(e: Experiment) -> Experiment:
    for q in e.runs_of("baseline")[0].requests:
        q.decode_tok_s *= 0.7
    return e


def test_on_a_fresh_h200_no_first_start_was_slow_and_the_burn_in_changed_nothing(tmp_path):
    """The H200 claim, from the stores' own rates: the 22 server starts of three device calls ran on one GPU (one
    UUID in every manifest), the machine's first start (eagle3-s3, Triton compilation included) 0.1 % below the
    arm's later instances' median, every baseline instance within 0.14 % of every other (9 starts) and every EAGLE-3
    s3 instance within 1.4 % (10 starts), where the H200 facts saw 532-677 tok/s over 8 instances on two machines.
    The burn-in start ran +0.35 % against the measured instances: it bought nothing, and no instance-trend fires on
    any store (whatever effect size the rule is asked for) or on the 22 starts in run order."""
    stores = {n: load_store(copy_store(H200 / n, tmp_path / n), read_logs=False) for n in H200_STORES}
    runs = sorted((r for e in stores.values() for r in e.runs + e.burn_in), key=lambda r: r.started)
    assert len(runs) == 22 and len({r.manifest["gpu"]["gpus"][0]["uuid"] for r in runs}) == 1
    assert runs[0].run_id == "001-eagle3-s3" and runs[0].arm == "eagle3-s3"
    tok = {arm: [r.tok_s for r in runs if r.arm == arm] for arm in ("baseline", "eagle3-s3")}
    assert [len(t) for t in tok.values()] == [9, 10]
    assert -0.0011 < tok["eagle3-s3"][0] / statistics.median(tok["eagle3-s3"][1:]) - 1 < 0
    assert max(tok["baseline"]) / min(tok["baseline"]) - 1 < 0.0014
    assert max(tok["eagle3-s3"]) / min(tok["eagle3-s3"]) - 1 < 0.014
    burn_store = stores["spread-burn-in-h200-20261206-222835"]
    [burn] = burn_store.burn_in
    change = burn.tok_s / statistics.fmean(r.tok_s for r in burn_store.runs_of("eagle3-s3")) - 1
    [b] = instances.analyse(burn_store).burn_in
    assert (b.run_id, round(b.change, 4)) == ("001-eagle3-s3", 0.0035) and b.change == pytest.approx(change, rel=1e-12)
    for e in stores.values():
        assert instances.trends(e) == [] and instances.trends(e, min_change=0.0) == []
        assert "instance-trend" not in {f.rule for f in doctor.diagnose(e, stats.analyse(e))}
    # the report's rows for the spread without a burn-in (SGLang 0.5.17, known-truth pair, 12 requests x 256 tokens)
    assert instances.analyse(stores["spread-h200-20261206-222136"]).rows() == [
        ["baseline", "4", "430.5-430.9", "0.00% (0.00%-0.14%)", "0.13%", "0.05% (12)", "- (baseline)"],
        ["eagle3-s3", "4", "701.2-702.3", "0.08% (0.04%-0.28%)*", "5.01%", "1.81% (12)", "restarts (100%)*"]]
