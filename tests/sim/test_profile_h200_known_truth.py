"""The `h200-known-truth` profile against the real runs it was measured from (tests/fixtures/known-truth/h200: a
real SGLang 0.5.17 on an H200 under specab's driver): the simulator's true speed of every graphed arm lies within
the real runs' own spread (2 % either side), its accept length is the chain's at the head's realized acceptance, and
each cycle phase equals the engine's device timer. Pure arithmetic: no server, no wall clock."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from specab.analysis import model, phases
from specab.sim.profile import load_profile
from specab.sim.timing import TimingModel
from specab.vocab import engines

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "known-truth" / "h200"


@pytest.fixture(scope="module")
def real(tmp_path_factory) -> dict:
    """Per arm kind (0 for the baseline, else steps; graphed p 0.9 head only): the real runs' tok/s and phases."""
    out: dict = {}
    for name in ("known-truth-h200-20261204-055428", "known-truth-h200-causes-20261204-060246"):
        d = tmp_path_factory.mktemp("kt") / name
        d.mkdir()
        shutil.copy(FIX / name / "results.sqlite", d / "results.sqlite")
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
