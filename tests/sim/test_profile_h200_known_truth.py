"""The `h200-known-truth` profile against the real runs it was measured from (tests/fixtures/known-truth/h200: a
real SGLang 0.5.17 on an H200 under specab's driver): the simulator's true speed of every graphed arm lies within
the real runs' own spread (2 % either side), its accept length is the chain's at the head's realized acceptance, and
each cycle phase equals the engine's device timer. Pure arithmetic: no server, no wall clock."""
from __future__ import annotations

from pathlib import Path

import pytest

from specab.analysis.evidence import model
from specab.analysis.measures import phases
from specab.sim.profile import load_profile
from specab.sim.timing import TimingModel
from specab.vocab import engines
from tests.stores import copy_store

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "known-truth" / "h200"


@pytest.fixture(scope="module")
def real(tmp_path_factory) -> dict:
    """Per arm kind (0 for the baseline, else steps; graphed p 0.9 head only): the real runs' tok/s and phases."""
    out: dict = {}
    for name in ("known-truth-h200-20261204-055428", "known-truth-h200-causes-20261204-060246"):
        d = copy_store(FIX / name, tmp_path_factory.mktemp("kt") / name)
        e = model.load_store(d)
        for r in e.runs:
            args = r.server_args
            if engines.graph_disabled(args) or "p0.5" in str(args.get("speculative_draft_model_path")):
                continue
            k = int(args.get("speculative_num_steps") or 0)
            out.setdefault(k, {"tok_s": [], "phases": []})["tok_s"].append(r.tok_s)
            if k:
                out[k]["phases"].append(phases.run_phases(r))
    return out


def sim(k: int, **extra) -> TimingModel:
    args = {"tp_size": 1, **extra}
    if k:
        args.update(speculative_algorithm="EAGLE3", speculative_draft_model_path="/kt/eagle3", speculative_num_steps=k,
                    speculative_eagle_topk=1, speculative_num_draft_tokens=k + 1)
    return TimingModel.create(load_profile("h200-known-truth").without_noise(), args, {})


def test_the_profile_s_speeds_lie_within_the_real_runs(real: dict) -> None:
    assert sorted(real) == [0, 1, 2, 3, 4, 5]
    for k, got in real.items():
        lo, hi = min(got["tok_s"]) * 0.98, max(got["tok_s"]) * 1.02
        assert lo <= sim(k).true_decode_tok_s() <= hi, (k, sim(k).true_decode_tok_s(), got["tok_s"])


def test_the_profile_s_cycle_phases_are_the_device_timer_s(real: dict) -> None:
    for k in (1, 2, 3, 4, 5):
        ph = sim(k).nominal_spec_phases_ms()
        runs = real[k]["phases"]
        mean = lambda xs: sum(xs) / len(xs)                        # noqa: E731
        assert ph.draft_ms == pytest.approx(mean([r.draft_ms for r in runs]), abs=0.05), k
        assert ph.draft_extend_ms == pytest.approx(mean([r.draft_extend_ms for r in runs]), abs=0.02), k
        assert ph.verify_ms == pytest.approx(mean([r.verify_ms for r in runs]), abs=0.05), k
    assert sim(1).nominal_spec_phases_ms().draft_ms == 0.0         # steps 1: the draft token comes from draft-extend
    assert sim(3, disable_cuda_graph=True).nominal_spec_phases_ms().verify_ms == pytest.approx(10.57, abs=0.01)


def test_the_profile_s_accept_length_is_the_chain_at_the_realized_acceptance() -> None:
    # the p 0.9 head's true tau on the measured prompts: 1.9128, 2.7380, 3.4439, 4.1853, 4.7554
    for k, true_tau in ((1, 1.9128), (2, 2.7380), (3, 3.4439), (4, 4.1853), (5, 4.7554)):
        assert sim(k).expected_accept_length() == pytest.approx(true_tau, rel=0.012), k


# the known-truth facts, concurrency on the H200 (kt_conc.sh, h200-concurrency.jsonl): per arm and load the median
# per-user tok/s and the accept length (EAGLE-3 s3, p 0.9 head; both servers --max-running-requests 48)
CONCURRENCY_FACTS = {"baseline": {1: (402.9, None), 8: (365.9, None), 32: (293.6, None)},
                     "eagle3-s3": {1: (815.6, 3.631), 8: (339.2, 3.448), 32: (247.2, 3.442)}}


@pytest.mark.parametrize("bs", [8, 32])
def test_the_batched_cycle_and_step_grow_as_on_the_h200(bs: int) -> None:
    """The cycle per request at a batch of bs over the single-stream one (tau / per-user tok/s: the facts' accept
    length held ~3.5 at every load, so the cycle alone moved) and the baseline step likewise, within 2 %."""
    spec, base = CONCURRENCY_FACTS["eagle3-s3"], CONCURRENCY_FACTS["baseline"]
    real_cycle = (spec[bs][1] / spec[bs][0]) / (spec[1][1] / spec[1][0])
    real_step = base[1][0] / base[bs][0]
    s3, b = sim(3), sim(0)
    assert s3.nominal_spec_cycle_s(bs) / s3.nominal_spec_cycle_s(1) == pytest.approx(real_cycle, rel=0.02)
    assert b.nominal_decode_step_s(bs) / b.nominal_decode_step_s(1) == pytest.approx(real_step, rel=0.02)


def test_speculation_wins_single_stream_and_loses_at_8_and_32_as_on_the_h200() -> None:
    """The true per-user speedup of s3 at each load within 8 % of the real one (2.03x, 0.93x, 0.84x: the profile keeps
    one accept length at every load while the real one fell from 3.63 to 3.44): the verdict
    changes side between 1 and 8 in flight, as the real engine's did."""
    s3, b = sim(3), sim(0)
    for bs in (1, 8, 32):
        real = CONCURRENCY_FACTS["eagle3-s3"][bs][0] / CONCURRENCY_FACTS["baseline"][bs][0]
        got = s3.true_decode_tok_s(bs=bs) / b.true_decode_tok_s(bs=bs)
        assert got == pytest.approx(real, rel=0.08), (bs, got, real)
        assert (got > 1) == (real > 1)
