"""The SGLang command line: flags accepted and refused, help, and the speculative rules."""
from __future__ import annotations

import subprocess

import pytest

from specab.sim.args import SpecRuleError, apply_rules, parse_server_args
from tests.sim.conftest import PY, REPO, base_env

HARNESS_FLAGS = [
    "--model-path", "/m", "--tp-size", "8", "--mem-fraction-static", "0.88", "--host", "0.0.0.0",
    "--port", "8000", "--trust-remote-code", "--disable-custom-all-reduce", "--num-continuous-decode-steps", "4",
    "--cuda-graph-max-bs", "48", "--max-running-requests", "48", "--disable-overlap-schedule",
    "--decode-log-interval", "10", "--log-level", "info", "--enable-metrics", "--nnodes", "1", "--node-rank", "0",
    "--dist-init-addr", "10.0.0.1:25000", "--speculative-algorithm", "EAGLE3",
    "--speculative-draft-model-path", "/d", "--speculative-num-steps", "2", "--speculative-eagle-topk", "1",
    "--speculative-num-draft-tokens", "3", "--disable-cuda-graph",
]


def test_every_flag_the_harness_uses_is_accepted_with_sglang_field_names():
    a = parse_server_args(HARNESS_FLAGS, version="0.5.9")
    assert (a.model_path, a.tp_size, a.mem_fraction_static, a.host, a.port) == ("/m", 8, 0.88, "0.0.0.0", 8000)
    assert a.trust_remote_code and a.disable_custom_all_reduce and a.disable_overlap_schedule and a.enable_metrics
    assert a.disable_cuda_graph and a.num_continuous_decode_steps == 4 and a.cuda_graph_max_bs == 48
    assert (a.speculative_algorithm, a.speculative_num_steps, a.speculative_eagle_topk,
            a.speculative_num_draft_tokens) == ("EAGLE3", 2, 1, 3)
    assert a.dist_init_addr == "10.0.0.1:25000" and a.decode_log_interval == 10
    alias = parse_server_args(["--model-path", "/m", "--tensor-parallel-size", "4"])
    assert alias.tp_size == 4


def test_unknown_flag_exits_2_with_argparse_message(tmp_path):
    r = subprocess.run([PY, "-m", "specab.sim.launch_server", "--model-path", "/m", "--bogus-flag", "1"],
                       env=base_env(tmp_path, 1), cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "error: unrecognized arguments: --bogus-flag 1" in r.stderr
    assert r.stderr.startswith("usage: ")


def test_help_lists_sglang_flags(tmp_path):
    r = subprocess.run([PY, "-m", "specab.sim.launch_server", "--help"], env=base_env(tmp_path, 1), cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    for flag in ("--speculative-num-draft-tokens", "--mem-fraction-static", "--tp-size", "--decode-log-interval"):
        assert flag in r.stdout


def test_partial_spec_arguments_are_refused_with_the_rule(tmp_path):
    with pytest.raises(SpecRuleError, match="all three"):
        apply_rules(parse_server_args(["--model-path", "/m", "--speculative-algorithm", "EAGLE3",
                                       "--speculative-draft-model-path", "/d", "--speculative-eagle-topk", "1"]))
    with pytest.raises(SpecRuleError, match="all three"):
        apply_rules(parse_server_args(["--model-path", "/m", "--speculative-algorithm", "EAGLE3",
                                       "--speculative-draft-model-path", "/d", "--speculative-num-steps", "2"]))
    r = subprocess.run([PY, "-m", "specab.sim.launch_server", "--model-path", "/m", "--speculative-algorithm",
                        "EAGLE3", "--speculative-draft-model-path", "/d", "--speculative-num-steps", "2"],
                       env=base_env(tmp_path, 1), cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert "Traceback (most recent call last):" in r.stderr
    assert "AssertionError: speculative_num_steps was given without" in r.stderr


def test_spec_rules_adjust_like_sglang():
    a, warnings = apply_rules(parse_server_args(["--model-path", "/m", "--speculative-algorithm", "EAGLE3",
                                                 "--speculative-draft-model-path", "/d", "--speculative-num-steps",
                                                 "2", "--speculative-eagle-topk", "1",
                                                 "--speculative-num-draft-tokens", "5"]), version="0.5.9")
    assert a.speculative_num_draft_tokens == 3
    assert a.max_running_requests == 48 and a.disable_overlap_schedule is True
    assert ("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
            "speculative_eagle_topk == 1") in warnings
    assert any(w.startswith("Max running requests is reset to 48 for speculative decoding.") for w in warnings)
    assert "Overlap scheduler is disabled because of using eagle speculative decoding." in warnings
    auto, _ = apply_rules(parse_server_args(["--model-path", "/m", "--speculative-algorithm", "EAGLE3",
                                             "--speculative-draft-model-path", "/d"]))
    assert (auto.speculative_num_steps, auto.speculative_eagle_topk, auto.speculative_num_draft_tokens) == (3, 1, 4)
    llama, _ = apply_rules(parse_server_args(["--model-path", "/m", "--speculative-algorithm", "EAGLE3",
                                              "--speculative-draft-model-path", "/d"]), "LlamaForCausalLM")
    assert (llama.speculative_num_steps, llama.speculative_eagle_topk,
            llama.speculative_num_draft_tokens) == (5, 4, 8)
    explicit, _ = apply_rules(parse_server_args(["--model-path", "/m", "--speculative-algorithm", "NEXTN",
                                                 "--speculative-draft-model-path", "/d",
                                                 "--max-running-requests", "64", "--speculative-num-steps", "3",
                                                 "--speculative-eagle-topk", "4",
                                                 "--speculative-num-draft-tokens", "8"]))
    assert explicit.speculative_algorithm == "EAGLE" and explicit.max_running_requests == 64
    assert explicit.speculative_num_draft_tokens == 8
    base, warnings = apply_rules(parse_server_args(["--model-path", "/m"]))
    assert base.max_running_requests is None and base.disable_overlap_schedule is False and not warnings


def test_tp_must_divide_by_nodes():
    with pytest.raises(SpecRuleError, match="tp_size must be divisible by number of nodes"):
        apply_rules(parse_server_args(["--model-path", "/m", "--tp-size", "3", "--nnodes", "2",
                                       "--dist-init-addr", "h:1"]))


# 0.5.23 (shared/facts/sglang-0.5.23-help.txt, engines-2026.md A1/A2)
_I = HARNESS_FLAGS.index("--cuda-graph-max-bs")
FLAGS_0523 = [f for f in HARNESS_FLAGS[:_I] + HARNESS_FLAGS[_I + 2:] if f != "--disable-cuda-graph"] + [
    "--cuda-graph-max-bs-decode", "48", "--cuda-graph-backend-decode", "disabled",
    "--cuda-graph-backend-prefill", "disabled"]


def test_0523_per_phase_graph_flags_and_real_flags_accepted():
    flags = FLAGS_0523 + ["--enable-mfu-metrics", "--attn-dp-size", "1"]     # real 0.5.23 flags the sim ignores
    a = parse_server_args(flags, version="0.5.23")
    assert a.cuda_graph_max_bs == 48 and a.disable_cuda_graph and a.cuda_graph_backend_prefill == "disabled"


@pytest.mark.parametrize("flag, could", [("--cuda-graph-max-bs", "--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill"),
                                         ("--cuda-graph-bs", "--cuda-graph-bs-decode, --cuda-graph-bs-prefill")])
def test_0523_legacy_graph_flags_exit_2_ambiguous(tmp_path, flag, could):
    env = {**base_env(tmp_path, 1), "SPECAB_SIM_SGLANG_VERSION": "0.5.23"}
    r = subprocess.run([PY, "-m", "specab.sim.launch_server", "--model-path", "/m", flag, "8"],
                       env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert f"error: ambiguous option: {flag} could match {could}" in r.stderr


def test_0523_help_is_the_real_flag_set(tmp_path):
    from specab.sim.versions import HELP_0523
    env = {**base_env(tmp_path, 1), "SPECAB_SIM_SGLANG_VERSION": "0.5.23"}
    r = subprocess.run([PY, "-m", "specab.sim.launch_server", "--help"], env=env, cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == HELP_0523.read_text()


def test_0523_keeps_overlap_and_mixed_chunk_under_spec():
    argv = ["--model-path", "/m", "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/d",
            "--enable-mixed-chunk"]
    new, warnings = apply_rules(parse_server_args(argv, version="0.5.23"), version="0.5.23")
    assert new.disable_overlap_schedule is False and new.enable_mixed_chunk is True
    assert not any("Overlap scheduler is disabled" in w for w in warnings)
    old, warnings = apply_rules(parse_server_args(argv, version="0.5.9"), version="0.5.9")
    assert old.disable_overlap_schedule is True and old.enable_mixed_chunk is False


def test_unknown_version_is_refused(tmp_path):
    env = {**base_env(tmp_path, 1), "SPECAB_SIM_SGLANG_VERSION": "0.4.0"}
    r = subprocess.run([PY, "-m", "specab.sim.launch_server", "--model-path", "/m"], env=env, cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "SPECAB_SIM_SGLANG_VERSION='0.4.0'" in r.stderr and "0.5.23" in r.stderr


def test_059_help_is_the_real_059_flag_set_and_refuses_0523_flags(tmp_path):
    """0.5.9's --help lists exactly the real 0.5.9 flags (its add_cli_args: 341 with aliases, engines-2026.md A1),
    so the driver's preflight reads the 0.5.9 generation; an unmodelled 0.5.9 flag is accepted, a 0.5.23-only
    flag is not."""
    from specab.driver.preflight import parse_help_flags
    from specab.vocab import engines
    from specab.sim.versions import FLAGS_059
    real = {l.strip() for l in FLAGS_059.read_text().splitlines() if l.startswith("--")}
    env = {**base_env(tmp_path, 1), "SPECAB_SIM_SGLANG_VERSION": "0.5.9"}
    r = subprocess.run([PY, "-m", "specab.sim.launch_server", "--help"], env=env, cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    flags = parse_help_flags(r.stdout)
    assert r.returncode == 0 and flags == real and len(real) == 341
    assert engines.generation_of_flags(flags) == "0.5.9" and "--cuda-graph-max-bs" in flags
    assert parse_server_args(["--model-path", "/m", "--enable-piecewise-cuda-graph"], version="0.5.9").model_path == "/m"
    with pytest.raises(SystemExit) as exc:
        parse_server_args(["--model-path", "/m", "--cuda-graph-backend-decode", "disabled"], version="0.5.9")
    assert exc.value.code == 2
