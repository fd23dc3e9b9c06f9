"""The per-phase timing (specab/node/phasemetrics.py) and the /metrics parser it reads with
(specab.vocab.engines.parse_prometheus) on lines in the real format: the
SGLang 0.5.17 lines below are copied from shared/facts/real-sglang-0.5.17-h200/phase-metrics/eagle3.metrics.*
(an H200 probe); the 0.5.23 category lines use the names and labels of shared/reference/engines-2026.md A5."""
from __future__ import annotations

import pytest

from specab.node import phasemetrics
from specab.vocab import engines

L = 'engine_type="unified",model_name="/tmp/m/target",moe_ep_rank="0",pp_rank="0",tp_rank="0"'
REAL_0517_BEFORE = f"""# HELP sglang:forward_execution_seconds_total Total time that GPU is busy executing model forward passes. Refer to ForwardMode for category labels.
# TYPE sglang:forward_execution_seconds_total counter
sglang:forward_execution_seconds_total{{category="extend",{L}}} 1.2116145315170288
sglang:forward_execution_seconds_total{{category="decode",{L}}} 2.3547935732603054
# HELP sglang:cuda_graph_passes_total Total number of forward passes categorized by CUDA graph.
# TYPE sglang:cuda_graph_passes_total counter
sglang:cuda_graph_passes_total{{engine_type="unified",mode="prefill_none",model_name="/tmp/m/target",moe_ep_rank="0",pp_rank="0",tp_rank="0"}} 5.0
sglang:cuda_graph_passes_total{{engine_type="unified",mode="decode_cuda_graph",model_name="/tmp/m/target",moe_ep_rank="0",pp_rank="0",tp_rank="0"}} 610.0
sglang:generation_tokens_total{{engine_type="unified",is_streaming="false",model_name="/tmp/m/target"}} 608.0
sglang:generation_tokens_histogram_bucket{{engine_type="unified",le="+Inf",model_name="/tmp/m/target"}} 3.0
sglang:spec_accept_length{{{L}}} 0.0
"""
REAL_0517_AFTER = f"""sglang:forward_execution_seconds_total{{category="extend",{L}}} 1.216490243434906
sglang:forward_execution_seconds_total{{category="decode",{L}}} 2.6674428851604444
sglang:cuda_graph_passes_total{{engine_type="unified",mode="prefill_none",model_name="/tmp/m/target",moe_ep_rank="0",pp_rank="0",tp_rank="0"}} 6.0
sglang:cuda_graph_passes_total{{engine_type="unified",mode="decode_cuda_graph",model_name="/tmp/m/target",moe_ep_rank="0",pp_rank="0",tp_rank="0"}} 1010.0
sglang:generation_tokens_total{{engine_type="unified",is_streaming="false",model_name="/tmp/m/target"}} 1008.0
"""


def _v0523(draft: float, extend: float, verify: float, calls: float, none: float, tp1: float = 0.0) -> str:
    lines = [f'sglang:forward_execution_seconds_total{{category="{c}",{L}}} {v}'
             for c, v in (("eagle_draft", draft), ("eagle_draft_extend", extend), ("target_verify", verify),
                          ("extend", 0.5))]
    rank1 = L.replace('tp_rank="0"', 'tp_rank="1"')
    lines.append(f'sglang:forward_execution_seconds_total{{category="target_verify",{rank1}}} {tp1}')
    lines += [f'sglang:spec_verify_calls_total{{engine_type="unified",model_name="m"}} {calls}',
              f'sglang:cuda_graph_passes_total{{{L},mode="decode_none"}} {none}',
              f'sglang:generation_tokens_total{{engine_type="unified",is_streaming="true",model_name="m"}} {calls * 2}',
              f'sglang:generation_tokens_total{{engine_type="unified",is_streaming="false",model_name="m"}} 10']
    return "\n".join(lines) + "\n"


def test_real_0517_lines_give_extend_and_decode_only():
    d = phasemetrics.delta(phasemetrics.snapshot(REAL_0517_BEFORE), phasemetrics.snapshot(REAL_0517_AFTER))
    assert d["forward_s"]["decode"] == pytest.approx(0.31265, abs=1e-5)   # the facts file's "EAGLE-3 0.313 s"
    assert d["graph_passes"] == {"decode_cuda_graph": 400.0, "prefill_none": 1.0}
    assert d["generation_tokens"] == 400.0 and d["spec_verify_calls"] is None
    res = phasemetrics.result(REAL_0517_BEFORE, REAL_0517_AFTER, 1.0, 0.0, 1.0)
    assert res["available"] and res["categories"] == ["decode", "extend"]


def test_0523_categories_rank0_only_and_streaming_label_summed():
    before, after = _v0523(1, 0.2, 7, 250, 250, tp1=99), _v0523(1.8, 0.36, 12.8, 450, 450, tp1=500)
    d = phasemetrics.delta(phasemetrics.snapshot(before), phasemetrics.snapshot(after))
    assert d["forward_s"]["target_verify"] == pytest.approx(5.8)      # tp_rank 1 ignored
    assert d["forward_s"]["eagle_draft"] == pytest.approx(0.8) and d["forward_s"]["extend"] == 0
    assert d["spec_verify_calls"] == 200 and d["graph_passes"] == {"decode_none": 200}
    assert d["generation_tokens"] == 400          # is_streaming true + false, per name


def test_labels_with_escapes_and_timestamps_parse():
    s = engines.parse_prometheus('m{a="x\\"y",b="c,d"} 1.5 1700000000000\nn 2\n')
    assert s == [("m", {"a": 'x"y', "b": "c,d"}, 1.5), ("n", {}, 2.0)]


@pytest.mark.parametrize("exposed, value", [
    (r'C:\\new', "C:\\new"),  # an escaped backslash before "n": a backslash and an n, not a newline
    (r'a\nb', "a\nb"),        # an escaped newline
    (r'\\\"', '\\"'),         # an escaped backslash, then an escaped quote
    (r'x\ty', "x\\ty"),       # not an escape of the format: kept as written
])
def test_label_escapes_read_in_one_pass(exposed, value):
    assert engines.parse_prometheus('m{path="%s"} 1\n' % exposed) == [("m", {"path": value}, 1.0)]


@pytest.mark.parametrize("bad", ["sglang:x{category=extend} 1", "sglang:x 1.2.3", "{} 3"])
def test_malformed_lines_raise_with_the_line_number(bad):
    with pytest.raises(engines.MetricsParseError, match="line 2"):
        engines.parse_prometheus("# ok\n" + bad + "\n", strict=True)
    assert engines.parse_prometheus("# ok\n" + bad + "\nn 2\n") == [("n", {}, 2.0)]      # not strict: skipped
