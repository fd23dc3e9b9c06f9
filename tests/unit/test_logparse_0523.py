"""SGLang 0.5.23 log lines, built from the format strings in shared/reference/engines-2026.md A3 and
sglang.md (metrics_reporter.py, cuda_graph_setup.py, eagle_worker_v2.py), not from the simulator."""
from __future__ import annotations

from specab.analysis.evidence.logparse import iter_records, parse_line, summarize
from specab.vocab import contract

P = "[2026-10-20 10:00:01 TP0] "


def decode_0523(A: float, P_: float, C: float | None = None, B: float | None = None, occ: bool = False) -> str:
    # metrics_reporter.py:963-1042: "Decode batch, #running-req: R, #token: T, token usage: U, accept len: A,
    # accept rate: P, [cap len: C, ][block accept len: B, ]cuda graph: G, gen throughput (token/s): X,
    # #queue-req: Q[, fwd occupancy: a%, fwd+idle occupancy: b%]"
    msg = f"Decode batch, #running-req: {1}, #token: {186}, token usage: {0.0:.2f}, "
    msg += f"accept len: {A:.2f}, accept rate: {P_:.2f}, "
    if C is not None:
        msg += f"cap len: {C:.2f}, "
    if B is not None:
        msg += f"block accept len: {B:.2f}, "
    msg += f"cuda graph: {True}, gen throughput (token/s): {95.31:.2f}, #queue-req: {0}"
    if occ:
        msg += f", fwd occupancy: {91.2:.1f}%, fwd+idle occupancy: {88.0:.1f}%"
    return P + msg


def test_decode_0523_with_cap_and_block_accept_len():
    rec = parse_line(decode_0523(2.85, 0.93, C=3.0, B=2.5, occ=True))
    assert rec["kind"] == "decode" and rec["accept_len"] == 2.85 and rec["accept_rate"] == 0.93
    assert rec["cap_len"] == 3.0 and rec["block_accept_len"] == 2.5 and rec["cuda_graph"] is True
    assert rec["gen_throughput"] == 95.31 and rec["queue_req"] == 0 and rec["fwd_occupancy_pct"] == 91.2
    assert rec["accept_rate_def"] == "0.5.23"


def test_plain_decode_line_does_not_guess_the_rate_definition():
    rec = parse_line(decode_0523(2.85, 0.93))
    assert rec["accept_len"] == 2.85 and "accept_rate_def" not in rec


def test_prefill_0523_pending_token_and_moved_cuda_graph():
    # metrics_reporter.py:754-779: "... #running-req: R, #queue-req: Q, #pending-token: N, cuda graph: G,
    # input throughput (token/s): X" (no trailing comma)
    msg = (f"Prefill batch, #new-seq: {1}, #new-token: {28}, #cached-token: {0}, token usage: {0.0:.2f}, "
           f"#running-req: {0}, #queue-req: {0}, #pending-token: {4096}, cuda graph: {False}, "
           f"input throughput (token/s): {1234.5:.2f}")
    rec = parse_line(P + msg)
    assert rec["kind"] == "prefill" and rec["pending_token"] == 4096 and rec["cuda_graph"] is False
    assert rec["input_throughput"] == 1234.5 and rec["new_token"] == 28


def test_capture_lines_0523():
    begin = P + "Capture target verify CUDA graph begin. backend=full, num_tokens_per_req=3, avail mem=70.12 GB"
    end = P + "Capture target verify CUDA graph end. bs=[1, 2, 4, 8], elapsed=3.21 s, mem usage=1.02 GB, avail mem=69.10 GB"
    draft = P + "Capture draft decode CUDA graph begin. avail mem=69.00 GB"
    b, e, d = parse_line(begin), parse_line(end), parse_line(draft)
    assert (b["phase"], b["graph"], b["graph_phase"], b["graph_mode"], b["avail_mem_gb"]) == (
        "graph_begin", "target", "verify", "full", 70.12)
    assert (e["phase"], e["elapsed_s"], e["mem_usage_gb"]) == ("graph_end", 3.21, 1.02)
    assert (d["phase"], d["graph"]) == ("graph_begin", "draft")
    # live progress: the reworded lines announce the same load sub-phase as 0.5.9's
    assert contract.load_phase(begin) == "capturing graphs" == contract.load_phase(P + "Capture cuda graph begin")
    assert contract.load_phase(end) == "graphs captured"
    assert contract.load_phase(P + "Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1") \
        == "capturing graphs"


def test_summary_reports_tau_and_names_the_rate_definition():
    lines = [decode_0523(2.8, 0.9, C=3.0), decode_0523(3.0, 1.0, C=3.0)]
    s = summarize(iter_records(lines))
    assert abs(s["accept_len_mean"] - 2.9) < 1e-9 and s["accept_rate_def"] == "0.5.23"


def test_ambiguous_option_is_fatal():
    line = ("launch_server.py: error: ambiguous option: --cuda-graph-max-bs could match "
            "--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill")
    assert any(rx.search(line) for _, rx in contract.FATAL_LINES)
