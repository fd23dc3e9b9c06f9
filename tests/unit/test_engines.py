"""Engine knowledge (specab/vocab/engines.py): spellings against SGLang 0.5.23's real `--help`."""
from __future__ import annotations

from pathlib import Path

import pytest

from specab.config.spec import ArmSpec
from specab.driver import preflight
from specab.vocab import engines
from tests.launch_argv import argv_of

HELP_0523 = Path(__file__).resolve().parents[2] / "specab" / "sim" / "data" / "sglang-0.5.23-help.txt"


@pytest.fixture(scope="module")
def flags_0523() -> frozenset[str]:
    return frozenset(preflight.parse_help_flags(HELP_0523.read_text()))


def flags_0509(flags_0523: frozenset[str]) -> frozenset[str]:
    """0.5.9's graph flags: the legacy ones, none of the per-phase ones."""
    return frozenset({f for f in flags_0523 if not f.startswith("--cuda-graph")}
                     | {"--cuda-graph-max-bs", "--cuda-graph-bs", "--disable-cuda-graph"})


def test_real_help_is_the_0523_generation(flags_0523):
    assert "--cuda-graph-max-bs-decode" in flags_0523 and "--cuda-graph-max-bs" not in flags_0523
    assert engines.generation_of_flags(flags_0523) == "0.5.23"
    assert engines.generation_of_flags(flags_0509(flags_0523)) == "0.5.9"


def test_logical_graph_names_get_the_0523_spelling(flags_0523):
    args = {"tp_size": 8, "cuda_graph_max_bs": 16, "disable_cuda_graph": True, "cuda_graph_bs": [1, 2, 4]}
    spelled = engines.spell_args(args, flags_0523)
    assert argv_of(spelled) == [
        "--tp-size", "8", "--cuda-graph-max-bs-decode", "16", "--cuda-graph-backend-decode", "disabled",
        "--cuda-graph-backend-prefill", "disabled", "--cuda-graph-bs-decode", "1", "2", "4"]
    assert all(f in flags_0523 for f in argv_of(spelled) if f.startswith("--"))


def test_logical_graph_names_keep_the_0509_spelling(flags_0523):
    args = {"cuda_graph_max_bs": 16, "disable_cuda_graph": True, "disable_radix_cache": False}
    spelled = engines.spell_args(args, flags_0509(flags_0523))
    assert spelled == {"cuda_graph_max_bs": 16, "disable_cuda_graph": True, "disable_radix_cache": False}


def test_no_spelling_is_refused_with_the_flags_that_exist(flags_0523):
    no_max_bs = frozenset(f for f in flags_0523 if not f.startswith("--cuda-graph-max-bs"))
    with pytest.raises(engines.NoSpelling) as exc:
        engines.spell_args({"cuda_graph_max_bs": 16}, no_max_bs)
    msg = str(exc.value)
    assert "--cuda-graph-max-bs-decode" in msg and "--cuda-graph-backend-decode" in msg
    assert "cuda_graph_max_bs" in msg


def test_no_flags_known_keeps_the_experiment_names():
    assert engines.spell_args({"cuda_graph_max_bs": 16}, None) == {"cuda_graph_max_bs": 16}


def test_preflight_spells_arms_and_reports_unspellable_ones(flags_0523):
    ef = preflight.EngineFlags("sim0", ("python", "-m", "x"), "sglang 0.5.23", flags_0523)
    arm = ArmSpec(name="b", server_args={"model_path": "/m", "cuda_graph_max_bs": 16}, env={},
                  is_baseline=True, baseline="b")
    assert preflight.unknown_flags([arm], ef) == []
    (spelled,) = preflight.spell_arms([arm], [ef])
    assert spelled.to_extravar()["server_args"] == {"model_path": "/m", "cuda_graph_max_bs_decode": 16}
    assert spelled.to_json()["server_args"] == arm.server_args      # stored: the logical names
    bare = preflight.EngineFlags("sim0", ("x",), None, frozenset({"--model-path"}))
    (msg,) = preflight.unknown_flags([arm], bare)
    assert "no spelling" in msg and "sim0" in msg
    with pytest.raises(preflight.PreflightError):
        preflight.spell_arms([arm], [bare])


def test_readback_both_generations():
    assert engines.graph_max_bs({"cuda_graph_config": {"decode": {"backend": "full", "max_bs": 48, "bs": [1]}}}) == 48
    assert engines.graph_max_bs({"cuda_graph_max_bs": 8}) == 8
    assert engines.graph_disabled({"cuda_graph_config": {"decode": {"backend": "disabled"}}}) is True
    assert engines.spec_meta({"spec_accept_token_num": 5, "spec_verify_ct": 2, "x": 1}) == {
        "spec_num_correct_drafts": 5, "spec_verify_ct": 2}


def test_versions():
    assert engines.generation_of_version("sglang 0.5.23") == "0.5.23"
    assert engines.generation_of_version("0.5.9") == "0.5.9"
    assert engines.generation_of_version("unknown") is None
    assert engines.generation("0.5.23").overlap_kept_under_spec
    assert not engines.generation("0.5.9").overlap_kept_under_spec
