"""The verdict per load on the real H200 (docs/validation/known-truth.md, "Concurrency on the H200"): SGLang 0.5.17
serving the ~4B known-truth target, baseline against its p 0.9 EAGLE-3 head at steps 3, each load with its own
baseline. The truth holds at every load (the accept length does not change with the batch), so what the speedup
loses as the load grows is the cycle's cost alone; the doctor says why, and does not blame the client for it."""
from __future__ import annotations

import sqlite3
import tarfile
from pathlib import Path

import pytest

from specab.analysis.evidence import model
from specab.analysis.measures import concurrency, truthcheck
from specab.analysis.findings import doctor
from tests.stores import copy_store

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "known-truth" / "h200"
# --matrix concurrency=1,2,4,8 --repeats 2 over three device calls of one lease (16 runs)
LOW = FIX / "known-truth-h200-concurrency-20261204-160447"
# --matrix concurrency=16,32 --repeats 1 on the next lease (4 runs)
HIGH = FIX / "known-truth-h200-concurrency-20261204-162624"
TRUE_TAU = 3.4162          # the chain rule on these prompts: 32 requests x 128 tokens over 1,199 true cycles


def _load(src: Path, tmp_path: Path) -> model.Experiment:
    return model.load_store(copy_store(src, tmp_path / src.name))


@pytest.mark.parametrize("src,loads,spec_requests", [(LOW, (1, 2, 4, 8), 8 * 32), (HIGH, (16, 32), 2 * 32)])
def test_the_accept_length_is_the_truth_at_every_load(src: Path, loads: tuple[int, ...], spec_requests: int,
                                                       tmp_path: Path) -> None:
    e = _load(src, tmp_path)
    rep = truthcheck.check(e)
    reqs = [q for r in rep.runs if r.steps for q in r.requests]
    assert len(reqs) == spec_requests and all(q.measured_cycles == q.true_cycles and q.rule_ok for q in reqs)
    taus = {model.arm_concurrency(e, r.arm): r.measured_tau for r in rep.runs if r.steps}
    assert set(taus) == set(loads) and all(t == pytest.approx(TRUE_TAU, abs=1e-4) for t in taus.values())
    assert all(r.measured_tau == r.true_tau for r in rep.runs if r.steps)


def _estimates(e: model.Experiment) -> tuple[concurrency.Family, dict[int, float], dict[int, float]]:
    [fam] = concurrency.analyse_loads(e).families
    return (fam, {p.concurrency: round(p.per_user.estimate, 3) for p in fam.points},
            {p.concurrency: round(p.throughput.estimate, 3) for p in fam.points})


def test_the_verdict_per_load_and_where_speculation_stops_paying(tmp_path: Path) -> None:
    """Per user EAGLE-3 s3 pays up to 16 in flight and loses at 32 (crossing ~19); in throughput it pays up to 8
    and loses from 16. The numbers are the ones docs/validation/known-truth.md records."""
    fam, user, thr = _estimates(_load(LOW, tmp_path))
    assert user == {1: 2.024, 2: 1.857, 4: 1.113, 8: 1.449}
    assert thr == {1: 1.784, 2: 1.695, 4: 1.049, 8: 1.296}
    at2 = next(p for p in fam.points if p.concurrency == 2).per_user.ci
    assert at2 is not None and (round(at2.lo, 3), round(at2.hi, 3)) == (1.842, 1.871)
    assert fam.per_user.pays == "everywhere" and fam.per_user.estimate is None
    assert "pays per user at every measured load (up to 8 in flight)" in fam.verdict()
    # the break-even accept length at each load, from the runs at that load: the verify pass costs more with the
    # batch, so tau* grows while tau stays 3.42
    tau_star = {p.concurrency: round(p.tau_star, 2) for p in fam.points}
    assert tau_star[1] < tau_star[2] < tau_star[4] < TRUE_TAU and tau_star[1] == 1.69

    fam, user, thr = _estimates(_load(HIGH, tmp_path))
    assert user == {16: 1.107, 32: 0.757} and thr == {16: 0.911, 32: 0.507}
    assert fam.per_user.estimate == pytest.approx(19.3, abs=0.05)
    assert fam.per_user.lo_open and fam.per_user.hi_open          # one block: no interval at either load
    assert fam.throughput.pays == "nowhere"
    assert "stops paying per user at ~19.3 in flight (95% range below 16 to above 32)" in fam.verdict()


def _with_logs(tmp_path: Path) -> model.Experiment:
    """LOW's store with the server logs of its EAGLE-3 runs at 4 and 8 in flight where the driver had them."""
    d = copy_store(LOW, tmp_path / LOW.name)
    with tarfile.open(LOW / "server-logs.tar.xz") as t:
        t.extractall(d)     # the repository's own fixture: three regular files
    with sqlite3.connect(d / "results.sqlite") as c:
        for run in ("002-eagle3-c4", "004-eagle3-c8", "011-eagle3-c4"):
            c.execute("UPDATE runs SET run_dir = ? WHERE run_id = ?", (str(d / run), run))
    return model.load_store(d)


def test_arrivals_stalling_the_batch_are_not_blamed_on_the_client(tmp_path: Path) -> None:
    """At 4 and 8 in flight SGLang's decode lines say ~580-770 tok/s per running request while the client measured
    ~460-690: each arriving request's prefill pauses the whole batch, and the decode lines' median leaves those
    lines out. The client used 8-19 % of a core. The doctor explains the gap as the load's (phase-accounting) and
    does not send the user to move the client."""
    e = _with_logs(tmp_path)
    gaps = {}
    for r in e.runs:
        if r.log is not None:
            gaps[r.run_id] = (r.tok_s / r.log.gen_tok_s_per_req_median, r.client_cpu_s / r.duration_s)
    assert set(gaps) == {"002-eagle3-c4", "004-eagle3-c8", "011-eagle3-c4"}
    assert all(ratio < 0.85 and cpu < 0.2 for ratio, cpu in gaps.values()), gaps  # the gap the old rule fired on
    found = doctor.diagnose(e)
    assert not [f for f in found if f.rule == "client-bottleneck"]
    why = {f.arm: f.message for f in found if f.rule == "phase-accounting"}
    assert set(why) == {"eagle3-c4", "eagle3-c8"}
    assert all("the prefills of arriving requests pause every running one" in m for m in why.values())


def test_a_client_at_a_full_core_is_still_named(tmp_path: Path) -> None:
    """The baseline at 32 in flight streamed ~9,000 tokens a second to one client process, which ran at 99 % of a
    core for the whole measurement: its per-user rate may be the client's, and the doctor says so."""
    found = [f for f in doctor.diagnose(_load(HIGH, tmp_path)) if f.rule == "client-bottleneck"]
    assert {f.arm for f in found} == {"baseline-c32", "baseline-c16"}
    assert any("(99% of a core)" in ev for f in found for ev in f.evidence)


def test_like_for_like_names_what_sglang_itself_changed(tmp_path: Path) -> None:
    """Both arms set max_running_requests 48 and graphs up to 48 themselves; what differs is the list of batch sizes
    SGLang captures graphs at for a speculative server, and the finding says that (not max_running_requests)."""
    found = [f for f in doctor.diagnose(_load(LOW, tmp_path)) if f.rule == "arms-not-like-for-like"]
    assert len(found) == 4                      # one per load's baseline group
    # at 1 and 2 in flight both arms ran every batch under the same graph ([1, 2, 4, ...] against [1, 2, 3, ...]):
    # an info; from 4 the baseline pads a batch of 3 to 4 where the speculative arm has its own graph: a warning
    assert sorted((f.message.split(" compared with ")[1].split(" ")[0], f.severity) for f in found) == \
        [("baseline-c1", "info"), ("baseline-c2", "info"), ("baseline-c4", "warning"), ("baseline-c8", "warning")]
    for f in found:
        assert "(cuda_graph_bs)" in f.message and "max_running_requests" not in f.message
        assert "SGLang 0.5.17 captures CUDA graphs at other batch sizes for speculative arms" in f.message
        assert "--cuda-graph-bs-decode" in f.message
