"""The H200 crossover with its interval, pooled over three machine leases (docs/validation/known-truth.md,
"Concurrency on the H200"), the steps matrix over two leases, and the STANDALONE draft under the driver: SGLang
0.5.17 serving the ~4B known-truth target. `driver.py report A --with B --with C --out DIR` pools the blocks of stores of one experiment after checking
that the arms they share are the same by content. Every pooled speedup and interval is also recomputed from the
stores' rows without specab's analysis (``recomputed``), so an error in the pooling or in ``stats.paired_speedup``
shows as a disagreement, not as a new pinned number."""
from __future__ import annotations

import json
import math
import sqlite3
import statistics
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as scipy_stats

from specab.analysis.evidence import combine, model
from specab.analysis.measures import concurrency, phases, stats, truthcheck
from specab.analysis.findings import doctor
from specab.analysis.evidence.model import AnalysisError
from specab.analysis.render.report import main as report_main
from tests.stores import copy_store

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "known-truth" / "h200"
LOW = FIX / "known-truth-h200-concurrency-20261204-160447"     # loads 1, 2, 4, 8 x 2 blocks
HIGH = FIX / "known-truth-h200-concurrency-20261204-162624"    # loads 16, 32 x 1 block, the next lease
NEW = FIX / "known-truth-h200-concurrency-20261205-015101"     # loads 8, 16, 32 x 2 blocks, a third lease
STANDALONE = FIX / "known-truth-h200-standalone-20261205-014207"
STANDALONE_3 = FIX / "known-truth-h200-standalone-20261205-120140"  # steps 1-3 x 3 blocks, the next day's lease
STEPS = FIX / "known-truth-h200-20261204-055428"                   # EAGLE-3 steps 1-3 x 2 blocks
STEPS_LATER = (FIX / "known-truth-h200-20261205-121517", FIX / "known-truth-h200-20261205-121856")  # 1 block each
TRUE_TAU_P09 = {1: 1.9081, 2: 2.7380, 3: 3.4595}          # the standalone draft (density 0.8993) on these prompts
TRUE_TAU = 3.4162


def _copies(tmp_path: Path, *srcs: Path) -> list[Path]:
    return [copy_store(s, tmp_path / s.name) for s in srcs]


def recomputed(stores: list[Path], measure: str = "per_user") -> dict[str, tuple[float, float, float]]:
    """Per arm, the paired speedup from the stores' rows alone (sqlite3, numpy, scipy; nothing of specab.analysis):
    each ok run's value (per user: the median decode tok/s of its measured requests; throughput: their output
    tokens over the first send to the last finish), divided by the same store's and block's baseline run, then the
    geometric mean of the ratios and its 95 % t interval on the log scale (the report's interval below 5 blocks)."""
    ratios: dict[str, list[float]] = {}
    for path in stores:
        con = sqlite3.connect(path / "results.sqlite")
        baseline = dict(con.execute("SELECT name, baseline FROM arms"))
        value = {}
        for seq, arm, block, host in con.execute("SELECT seq, arm, block, host FROM runs WHERE status = 'ok'"):
            rows = con.execute("SELECT decode_tok_s, output_tokens, start_ts, e2e_s FROM requests "
                               "WHERE seq = ? AND warmup = 0 AND ok = 1", (seq,)).fetchall()
            value[arm, block, host] = (statistics.median(r[0] for r in rows if r[0]) if measure == "per_user" else
                                       sum(r[1] for r in rows) / (max(r[2] + r[3] for r in rows) - min(r[2] for r in rows)))
        con.close()
        for (arm, block, host), v in value.items():
            if baseline[arm] != arm and (baseline[arm], block, host) in value:
                ratios.setdefault(arm, []).append(v / value[baseline[arm], block, host])
    out = {}
    for arm, rs in ratios.items():
        logs = np.log(rs)
        assert 2 <= len(logs) < 5, (arm, rs)          # the t interval's range; beyond it the report bootstraps
        h = scipy_stats.t.ppf(0.975, len(logs) - 1) * logs.std(ddof=1) / math.sqrt(len(logs))
        out[arm] = (math.exp(logs.mean()), math.exp(logs.mean() - h), math.exp(logs.mean() + h))
    return out


def assert_same(got: stats.Speedup, want: tuple[float, float, float]) -> None:
    assert got.ci is not None and (got.ci.estimate, got.ci.lo, got.ci.hi) == pytest.approx(want, rel=1e-9), (got, want)


def test_the_third_lease_had_the_true_cycle_count_on_every_request(tmp_path: Path) -> None:
    [d] = _copies(tmp_path, NEW)
    rep = truthcheck.check(model.load_store(d))
    reqs = [q for r in rep.runs if r.steps for q in r.requests]
    assert len(reqs) == 6 * 32 and all(q.measured_cycles == q.true_cycles and q.rule_ok for q in reqs)
    assert all(r.measured_tau == r.true_tau == pytest.approx(TRUE_TAU, abs=1e-4) for r in rep.runs if r.steps)


def test_pooled_over_three_leases_the_verdict_per_load_and_the_crossings_with_their_range(tmp_path: Path) -> None:
    """Two blocks per load leave the 16 and 32 verdicts without a usable interval (t with one degree of freedom);
    pooled with the other leases' blocks, 8 in flight has four and pays in both measures, and the crossings get a
    range. The numbers are those docs/validation/known-truth.md records."""
    e = combine.combine(_copies(tmp_path, LOW, HIGH, NEW))
    blocks = {model.arm_concurrency(e, a.name): len({r.block for r in e.runs_of(a.name)}) for a in e.spec_arms}
    assert blocks == {1: 2, 2: 2, 4: 2, 8: 4, 16: 3, 32: 3}
    rep = truthcheck.check(e)
    reqs = [q for r in rep.runs if r.steps for q in r.requests]
    assert len(reqs) == 16 * 32 and all(q.measured_cycles == q.true_cycles for q in reqs)
    [fam] = concurrency.analyse_loads(e).families
    user = {p.concurrency: round(p.per_user.estimate, 3) for p in fam.points}
    thr = {p.concurrency: round(p.throughput.estimate, 3) for p in fam.points}
    stores = [tmp_path / s.name for s in (LOW, HIGH, NEW)]
    per_user, throughput = recomputed(stores), recomputed(stores, "throughput")
    for p in fam.points:
        assert_same(p.per_user, per_user[p.arm])
        assert_same(p.throughput, throughput[p.arm])
    # the numbers docs/validation/known-truth.md records
    assert user == {1: 2.024, 2: 1.857, 4: 1.113, 8: 1.487, 16: 1.117, 32: 0.976}
    assert thr == {1: 1.784, 2: 1.695, 4: 1.049, 8: 1.330, 16: 0.871, 32: 0.813}
    at8 = next(p for p in fam.points if p.concurrency == 8)
    assert at8.per_user.ci.lo > 1 and at8.throughput.ci.lo > 1       # pays at 8 in flight, both measures
    text = fam.verdict()
    assert "stops paying per user at ~28.2 in flight (95% range 3.3 to above 32)" in text
    assert "stops paying in throughput at ~12.8 in flight (95% range 2.7 to above 32)" in text


def test_the_pooled_report_is_written_where_asked_and_says_what_it_pooled(tmp_path: Path) -> None:
    low, high, new = _copies(tmp_path, LOW, HIGH, NEW)
    out = tmp_path / "pooled"
    assert report_main(["report", str(low), "--with", str(high), "--with", str(new)]) == 2      # --out is required
    assert not out.exists()
    assert report_main(["report", str(low), "--with", str(high), "--with", str(new), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert "Pooled from 3 experiments" in md and "20261205-015101/006-eagle3-c8" in md
    assert "different experiment fingerprints" not in md        # the stores' arms were compared by content
    assert not (low / "report.md").exists()                     # each store's own report is left alone
    summary = json.loads((out / "report.json").read_text())["summary"]
    assert any("stops paying in throughput at ~12.8 in flight" in line for line in summary)


def test_stores_of_other_settings_or_another_arm_content_are_refused(tmp_path: Path) -> None:
    low, new, alone = _copies(tmp_path, LOW, NEW, STANDALONE)
    with pytest.raises(AnalysisError) as e:
        combine.combine([low, alone])
    assert "bench.output_len: 128 -> 256" in str(e.value) and "not the experiment" in str(e.value)
    with pytest.raises(AnalysisError, match="given twice"):
        combine.combine([low, low])
    # the same arm name with another content: eagle3-c8 drafting 2 steps in the third lease's store
    con = sqlite3.connect(new / "results.sqlite")
    fp = con.execute("SELECT value FROM meta WHERE key='fingerprint'").fetchone()[0]
    doc = json.loads(con.execute("SELECT doc_json FROM fingerprints WHERE fingerprint=?", (fp,)).fetchone()[0])
    doc["arms"]["eagle3-c8"]["server_args"]["speculative_num_steps"] = 2
    con.execute("UPDATE fingerprints SET doc_json=? WHERE fingerprint=?", (json.dumps(doc), fp))
    con.commit()
    con.close()
    with pytest.raises(AnalysisError) as e:
        combine.combine([low, new])
    assert "arm eagle3-c8 of known-truth-h200-concurrency-20261205-015101 is not the arm eagle3-c8" in str(e.value)
    assert "speculative_num_steps: 3 -> 2" in str(e.value)


def test_a_standalone_draft_under_the_driver_has_the_exact_truth(tmp_path: Path) -> None:
    """STANDALONE s3 at p 0.9: every request's cycle count is the truth (tau 3.4595). Its steps-1 and -2 arms failed
    env verification, which the matrix now prevents (tests/driver/test_matrix.py); the report says they were not
    measured, not that the engine cannot measure them."""
    [d] = _copies(tmp_path, STANDALONE)
    e = model.load_store(d)
    rep = truthcheck.check(e)
    reqs = [q for r in rep.runs if r.steps for q in r.requests]
    assert len(reqs) == 12 and all(q.measured_cycles == q.true_cycles and q.rule_ok for q in reqs)
    assert {round(r.true_tau, 4) for r in rep.runs if r.steps} == {3.4595}
    failed = {r.arm: r.error for r in e.runs if r.status == "failed"}
    assert set(failed) == {"standalone-s1-k1-d4", "standalone-s2-k1-d4"}
    assert all("speculative_num_draft_tokens: expected 4" in (why or "") for why in failed.values())
    ph = phases.analyse_phases(e)
    assert ph.unavailable == {"standalone-s1-k1-d4": phases.NO_COMPLETED_RUN,
                              "standalone-s2-k1-d4": phases.NO_COMPLETED_RUN}
    assert ph.arms["standalone-s3-k1-d4"].verify_ms.mean == pytest.approx(2.75, abs=0.01)


def _speedups(e: model.Experiment) -> dict[int | None, stats.Speedup]:
    return {a.steps: stats.paired_speedup(e, a.name) for a in e.spec_arms}


def test_a_standalone_draft_at_steps_1_to_3_three_blocks_exact_truth_and_a_verdict_at_each_steps(
        tmp_path: Path) -> None:
    """The steps matrix the first STANDALONE lease could not finish, three interleaved blocks (two device calls, the
    second a --resume on the same machine). Every request's cycle count is the truth; each steps' speedup excludes 1,
    with intervals as wide as the speculative instances differ, which the doctor puts on the host (the baseline's
    step held within 0.2 %), not the draft: the forward passes are the same in every instance."""
    [d] = _copies(tmp_path, STANDALONE_3)
    e = model.load_store(d)
    assert len(e.runs) == 12 and all(r.ok for r in e.runs)
    rep = truthcheck.check(e)
    reqs = [q for r in rep.runs if r.steps for q in r.requests]
    assert len(reqs) == 54 and all(q.measured_cycles == q.true_cycles and q.rule_ok for q in reqs)
    assert {r.steps: round(r.true_tau, 4) for r in rep.runs if r.steps} == TRUE_TAU_P09
    assert all(r.measured_tau == r.true_tau for r in rep.runs if r.steps)
    sp = _speedups(e)
    want = recomputed([d])
    for a in e.spec_arms:
        assert_same(sp[a.steps], want[a.name])
    assert {k: round(v.estimate, 3) for k, v in sp.items()} == {1: 1.291, 2: 1.841, 3: 2.181}
    assert {k: (round(v.ci.lo, 3), round(v.ci.hi, 3)) for k, v in sp.items()} == \
        {1: (1.190, 1.401), 2: (1.261, 2.690), 3: (1.246, 3.818)}
    assert all(v.verdict.startswith("faster") and len(v.ratios) == 3 for v in sp.values())
    unstable = {f.arm: f for f in doctor.diagnose(e) if f.rule == "cycle-time-unstable"}
    assert set(unstable) == {"standalone-s1-k1-d2", "standalone-s2-k1-d3", "standalone-s3-k1-d4"}
    assert "between its server instances by 55% (run medians 3.07-4.77 ms)" in unstable["standalone-s3-k1-d4"].message
    ph = phases.analyse_phases(e).arms
    verify = [ph[a].verify_ms.mean for a in ("standalone-s1-k1-d2", "standalone-s2-k1-d3", "standalone-s3-k1-d4")]
    assert verify == pytest.approx([2.69, 2.69, 2.71], abs=0.01)     # one verify pass whatever the steps
    assert ph["standalone-s3-k1-d4"].draft_ms.mean == pytest.approx(0.18, abs=0.01)


def test_the_eagle3_steps_matrix_pooled_over_two_leases_has_four_blocks_and_tight_intervals(tmp_path: Path) -> None:
    """Two blocks on 2026-12-04 and one block in each of two stores on 2026-12-05 (the models rebuilt from the same
    seeds: the same agreement set, density 0.9021): the arms are the same by content, every request has the true
    cycle count, and with four blocks each steps has its interval; the baseline moved 0.5 % between the days."""
    e = combine.combine(_copies(tmp_path, STEPS, *STEPS_LATER))
    assert {a.name: len({r.block for r in e.runs_of(a.name)}) for a in e.arms} == \
        {"baseline": 4, "eagle3-s1-k1-d2": 4, "eagle3-s2-k1-d3": 4, "eagle3-s3-k1-d4": 4}
    rep = truthcheck.check(e)
    reqs = [q for r in rep.runs if r.steps for q in r.requests]
    assert len(reqs) == 72 and all(q.measured_cycles == q.true_cycles and q.rule_ok for q in reqs)
    assert {r.steps: round(r.true_tau, 4) for r in rep.runs if r.steps} == {1: 1.9128, 2: 2.7380, 3: 3.4439}
    sp = _speedups(e)
    want = recomputed([tmp_path / s.name for s in (STEPS, *STEPS_LATER)])
    for a in e.spec_arms:
        assert_same(sp[a.steps], want[a.name])
    assert {k: round(v.estimate, 3) for k, v in sp.items()} == {1: 1.389, 2: 1.730, 3: 2.049}
    assert {k: (round(v.ci.lo, 3), round(v.ci.hi, 3)) for k, v in sp.items()} == \
        {1: (1.375, 1.404), 2: (1.586, 1.887), 3: (2.017, 2.080)}
    base = sorted(r.tok_s for r in e.runs_of("baseline"))
    assert base[-1] / base[0] - 1 < 0.006
