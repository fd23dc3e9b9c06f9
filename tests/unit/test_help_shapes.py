"""What each engine flag takes, from the node's own `--help` usage (known engine arguments are
type-checked, choices taken from the node's --help): held against the real SGLang 0.5.23 and vLLM 0.32.0 help texts,
so a value the engine's argparse would refuse is refused before a model is loaded."""
from __future__ import annotations

from pathlib import Path

import pytest

from specab.config.spec import ArmSpec
from specab.driver import preflight
from specab.driver.options import Options, prepare

REPO = Path(__file__).resolve().parents[2]
SGLANG_0523 = (REPO / "specab" / "sim" / "data" / "sglang-0.5.23-help.txt").read_text()
VLLM_032 = (REPO / "tests" / "fixtures" / "vllm-0.32.0" / "help.txt").read_text()


def engine(text: str) -> preflight.EngineFlags:
    return preflight.EngineFlags("node", ("python",), None, frozenset(preflight.parse_help_flags(text)),
                                 shapes=preflight.parse_help_shapes(text))


def test_shapes_of_the_real_help_texts() -> None:
    sg, vl = preflight.parse_help_shapes(SGLANG_0523), preflight.parse_help_shapes(VLLM_032)
    assert sg["--trust-remote-code"] == preflight.SWITCH and sg["--tp-size"] == preflight.VALUE
    assert sg["--model-path"] == preflight.VALUE            # required: outside brackets
    assert "bfloat16" in sg["--dtype"] and "dummy" in sg["--load-format"]
    assert vl["--enforce-eager"] == preflight.SWITCH        # [--enforce-eager | --no-enforce-eager]
    assert vl["--load-format"] == preflight.VALUE and "bfloat16" in vl["--dtype"]
    assert preflight.parse_help_shapes("usage: x [-h] [--a [A ...]] [--b]\n\nopts\n") == {
        "--a": preflight.OPTIONAL, "--b": preflight.SWITCH}


def test_the_shipped_experiments_pass_their_engines_help() -> None:
    for name, text, matrix in (("default.yml", SGLANG_0523, ["steps=1,2,3"]), ("vllm-cpu.yml", VLLM_032, [])):
        p = prepare(Options(experiment_file=str(REPO / "experiments" / name), matrix=matrix))
        assert preflight.unknown_flags(p.arms, engine(text)) == [], name


HELP = {"sglang-0.5.23": SGLANG_0523, "vllm-0.32.0": VLLM_032}


@pytest.mark.parametrize("which, args, why", [
    ("sglang-0.5.23", {"dtype": "bf16"}, "is not one of --dtype's choices on this engine (auto, half, float16, bfloat16"),
    ("sglang-0.5.23", {"dtype": "bf16"}, "did you mean bfloat16?"),
    ("sglang-0.5.23", {"trust_remote_code": "yes"}, "--trust-remote-code is a switch on this engine (it takes no value)"),
    ("sglang-0.5.23", {"tp_size": True}, "--tp-size needs a value on this engine"),
    ("sglang-0.5.23", {"load_format": "dumy"}, "did you mean dummy?"),
    ("vllm-0.32.0", {"enforce_eager": "1"}, "--enforce-eager is a switch"),
    ("vllm-0.32.0", {"dtype": "bf16"}, "did you mean bfloat16?"),
])
def test_a_value_the_engines_parser_would_refuse_is_refused_before_launch(which: str, args: dict, why: str) -> None:
    text = HELP[which]
    arm = ArmSpec(name="baseline", server_args={"model_path": "/m", **args}, env={}, is_baseline=True,
                  baseline="baseline")
    msgs = preflight.unknown_flags([arm], engine(text))
    assert len(msgs) == 1 and why in msgs[0], msgs


def test_values_the_parser_accepts_pass() -> None:
    arm = ArmSpec(name="baseline", server_args={"model_path": "/m", "dtype": "bfloat16", "trust_remote_code": True,
                                                "disable_cuda_graph_padding": False, "tp_size": 2,
                                                "load_format": None}, env={}, is_baseline=True, baseline="baseline")
    assert preflight.unknown_flags([arm], engine(SGLANG_0523)) == []
