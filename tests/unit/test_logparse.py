"""The log parser on real log lines.

Sources of the lines, quoted verbatim:
* REF_SGLANG: /work/shared/reference/sglang.md (the v0.5.3.post3 log of sglang issue #11948);
* REF_NCCL: /work/shared/reference/vllm-sim-nvidia-smi-nccl.md §D1 and shared/facts/seed-measurements.md;
* PUBLIC: logs pasted in public sglang issues (#2468, #3892) and repositories, as found by code search;
* RENDERED: what the f-strings quoted in sglang.md §2 and vllm-sim-nvidia-smi-nccl.md §A4 print for
  given values (the reference quotes the format strings of those versions, not log output).
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from specab.analysis.evidence import logparse

# --- REF_SGLANG (issue #11948, v0.5.3.post3) ------------------------------------------------------
REF_PREFILL = ("[2025-10-22 10:27:56 TP0] Prefill batch. #new-seq: 1, #new-token: 28, #cached-token: 0, "
               "token usage: 0.00, #running-req: 0, #queue-req: 0,")
REF_DECODE = ("[2025-10-22 10:27:57 TP0] Decode batch. #running-req: 1, #token: 186, token usage: 0.00, "
              "accept len: 1.95, accept rate: 0.49, cuda graph: True, gen throughput (token/s): 178.86, "
              "#queue-req: 0,")

# --- REF_NCCL -------------------------------------------------------------------------------------
REF_NCCL_SHM = "node-01:1896826:1896838 [0] NCCL INFO NCCL_SHM_DISABLE set by environment to 1."
REF_NCCL_DRIVER = "vm:476:476 [0] NCCL INFO cudaDriverVersion 13000"
REF_NCCL_VERSION = "vm:476:476 [0] NCCL INFO NCCL version 2.28.9+cuda13.0"
REF_NCCL_P2P = "NCCL INFO NCCL_P2P_LEVEL set by environment to SYS"
REF_NCCL_NCH = "NCCL_MAX_NCHANNELS set by environment to 16."

# --- PUBLIC ---------------------------------------------------------------------------------------
PUB_PREFILL_DP = ("[2025-02-26 13:18:19 DP3 TP3] Prefill batch. #new-seq: 1, #new-token: 4096, "
                  "#cached-token: 0, cache hit rate: 0.00%, token usage: 0.00, #running-req: 0, #queue-req: 7")
PUB_LOAD = [
    "[2025-12-29 18:33:03 TP0] Load weight begin. avail mem=15.33 GB",
    "Loading safetensors checkpoint shards: 100% Completed | 1/1 [00:00<00:00,  4.32it/s]",
    "[2025-12-29 18:33:03 TP0] Load weight end. type=Lfm2ForCausalLM, dtype=torch.bfloat16, "
    "avail mem=13.81 GB, mem usage=1.52 GB.",
    "[2025-12-29 18:33:03 TP0] KV Cache is allocated. #tokens: 473854, K size: 2.71 GB, V size: 2.71 GB",
    "[2025-11-04 05:27:13 DP0 TP0 EP0] KV Cache is allocated. #tokens: 524288, KV size: 17.16 GB",
    "[2024-12-13 01:44:59 TP0] Memory pool end. avail mem=2.44 GB",
    "[2024-12-13 01:44:59 TP0] Capture cuda graph begin. This can take up to several minutes.",
    "[2024-12-13 01:45:01 TP0] Capture cuda graph end. Time elapsed: 2.19 s",
    "[2024-12-13 01:45:02 TP0] max_total_num_tokens=56524, max_prefill_tokens=16384, "
    "max_running_requests=2049, context_len=32768",
    "[2024-12-13 01:45:02] INFO:     Uvicorn running on http://0.0.0.0:30000 (Press CTRL+C to quit)",
]


def one(line: str) -> dict:
    rec = logparse.parse_line(line)
    assert rec is not None, line
    return rec


def test_reference_prefill_line_v053() -> None:
    r = one(REF_PREFILL)
    assert r == {"kind": "prefill", "ts": "2025-10-22 10:27:56", "rank": "TP0", "new_seq": 1,
                 "new_token": 28, "cached_token": 0, "token_usage": 0.0, "running_req": 0, "queue_req": 0}


def test_reference_decode_line_v053() -> None:
    r = one(REF_DECODE)
    assert r == {"kind": "decode", "ts": "2025-10-22 10:27:57", "rank": "TP0", "running_req": 1,
                 "token": 186, "token_usage": 0.0, "accept_len": 1.95, "accept_rate": 0.49,
                 "cuda_graph": True, "graph_backend": "cuda", "gen_throughput": 178.86, "queue_req": 0}


# Rendered from the f-strings of sglang.md §2, one per version family.
RENDERED_SGLANG = {
    "0.4.6 decode, spec": (
        "[2025-03-01 08:00:00 TP0] Decode batch. #running-req: 4, #token: 2048, token usage: 0.02, "
        "accept len: 2.10, cuda graph: False, gen throughput (token/s): 60.50, #queue-req: 0",
        {"running_req": 4, "token": 2048, "token_usage": 0.02, "accept_len": 2.1, "cuda_graph": False,
         "gen_throughput": 60.5, "queue_req": 0}),
    "0.5.2 decode, no spec, cpu graph, trailing comma": (
        "[2025-09-01 08:00:00 TP0] Decode batch. #running-req: 1, #token: 300, token usage: 0.00, "
        "cpu graph: True, gen throughput (token/s): 82.20, #queue-req: 0, ",
        {"running_req": 1, "token": 300, "token_usage": 0.0, "cuda_graph": True, "graph_backend": "cpu",
         "gen_throughput": 82.2, "queue_req": 0}),
    "0.5.5 decode, iter, trailing comma": (
        "[2025-11-01 08:00:00 TP0] Decode batch [1234], #running-req: 2, #token: 512, token usage: 0.01, "
        "accept len: 2.45, accept rate: 0.48, cuda graph: True, gen throughput (token/s): 150.00, "
        "#queue-req: 1, ",
        {"iter": 1234, "running_req": 2, "accept_len": 2.45, "accept_rate": 0.48, "cuda_graph": True,
         "gen_throughput": 150.0, "queue_req": 1}),
    "0.5.9 decode, PP rank, no trailing comma": (
        "[2026-01-10 08:00:00 PP0 TP3] Decode batch, #running-req: 8, #token: 4096, token usage: 0.05, "
        "accept len: 3.01, accept rate: 0.75, cuda graph: True, gen throughput (token/s): 812.34, "
        "#queue-req: 0",
        {"rank": "PP0 TP3", "running_req": 8, "accept_len": 3.01, "accept_rate": 0.75,
         "gen_throughput": 812.34}),
    "0.5.9 prefill, input throughput": (
        "[2026-01-10 08:00:00 DP0 TP0] Prefill batch, #new-seq: 2, #new-token: 256, #cached-token: 64, "
        "token usage: 0.01, #running-req: 1, #queue-req: 0, input throughput (token/s): 5120.50, ",
        {"kind": "prefill", "rank": "DP0 TP0", "new_seq": 2, "new_token": 256, "cached_token": 64,
         "input_throughput": 5120.5}),
    "0.5.23 prefill, pending-token, graph": (
        "[2026-09-01 08:00:00 TP0] Prefill batch, #new-seq: 1, #new-token: 131, #cached-token: 0, "
        "token usage: 0.00, #running-req: 0, #queue-req: 0, #pending-token: 0, cuda graph: False, "
        "input throughput (token/s): 2000.00",
        {"kind": "prefill", "pending_token": 0, "cuda_graph": False, "input_throughput": 2000.0}),
    "0.5.23 decode, hybrid SWA, iter": (
        "[2026-09-01 08:00:01 TP0] Decode batch [77], #running-req: 1, #full token: 400, "
        "full token usage: 0.01, #swa token: 128, swa token usage: 0.02, accept len: 1.80, "
        "accept rate: 0.40, cuda graph: True, gen throughput (token/s): 95.10, #queue-req: 0",
        {"iter": 77, "full_token": 400, "full_token_usage": 0.01, "swa_token": 128,
         "swa_token_usage": 0.02, "accept_len": 1.8, "accept_rate": 0.4, "gen_throughput": 95.1}),
}


@pytest.mark.parametrize("name", sorted(RENDERED_SGLANG))
def test_rendered_sglang_formats(name: str) -> None:
    line, expected = RENDERED_SGLANG[name]
    r = one(line)
    assert r["kind"] == expected.get("kind", "decode")
    for k, v in expected.items():
        assert r[k] == v, (k, r)


def test_public_prefill_with_dp_rank_and_percent_field() -> None:
    r = one(PUB_PREFILL_DP)
    assert r["rank"] == "DP3 TP3" and r["new_token"] == 4096 and r["queue_req"] == 7
    assert r["cache_hit_rate_pct"] == 0.0


def test_ready_line_and_load_phases() -> None:
    ready = one("[2025-10-22 10:27:50] The server is fired up and ready to roll!")
    assert ready == {"kind": "ready", "ts": "2025-10-22 10:27:50", "rank": None}
    recs = [logparse.parse_line(line) for line in PUB_LOAD]
    assert recs[-1] is None
    wb, shards, we, kv, kv2, pool, gb, ge, cap = recs[:-1]
    assert wb["phase"] == "weights_begin" and wb["avail_mem_gb"] == 15.33 and wb["ts"] == "2025-12-29 18:33:03"
    assert shards["phase"] == "weights_progress" and (shards["done"], shards["total"], shards["pct"]) == (1, 1, 100)
    assert we["phase"] == "weights_end" and we["model_type"] == "Lfm2ForCausalLM"
    assert we["dtype"] == "torch.bfloat16" and we["avail_mem_gb"] == 13.81 and we["mem_usage_gb"] == 1.52
    assert kv["tokens"] == 473854 and kv["k_size_gb"] == 2.71 and kv["v_size_gb"] == 2.71
    assert kv2["tokens"] == 524288 and kv2["kv_size_gb"] == 17.16 and kv2["rank"] == "DP0 TP0 EP0"
    assert pool["phase"] == "memory_pool_end" and pool["avail_mem_gb"] == 2.44
    assert gb["phase"] == "graph_begin" and gb["graph"] == "target"
    assert ge["phase"] == "graph_end" and ge["elapsed_s"] == 2.19
    assert cap["kind"] == "capacity" and cap["max_running_requests"] == 2049 and cap["context_len"] == 32768


def test_draft_graph_capture_lines() -> None:
    # sglang.md: "Capture draft cuda graph begin/end ...", "Capture draft extend cuda graph ..."
    b = one("[2025-10-22 10:27:40 TP0] Capture draft cuda graph begin. This can take up to several minutes. "
            "avail mem=10.00 GB")
    e = one("[2025-10-22 10:27:45 TP0] Capture draft extend cuda graph end. Time elapsed: 4.50 s. "
            "mem usage=0.20 GB. avail mem=9.80 GB.")
    assert (b["phase"], b["graph"], b["avail_mem_gb"]) == ("graph_begin", "draft", 10.0)
    assert (e["phase"], e["graph"], e["elapsed_s"], e["mem_usage_gb"]) == ("graph_end", "draft_extend", 4.5, 0.2)


def test_reference_nccl_lines() -> None:
    shm = one(REF_NCCL_SHM)
    assert shm == {"kind": "nccl_env", "var": "NCCL_SHM_DISABLE", "value": 1, "host": "node-01",
                   "pid": 1896826, "cuda_dev": 0}
    proto = one("vm:476:476 [0] NCCL INFO NCCL_PROTO set by environment to LL")
    assert proto["var"] == "NCCL_PROTO" and proto["value"] == "LL" and proto["pid"] == 476
    assert one(REF_NCCL_P2P)["value"] == "SYS"
    assert logparse.parse_line(REF_NCCL_NCH) is None   # no "NCCL INFO": not an NCCL log line
    assert one("vm:476:476 [0] NCCL INFO " + REF_NCCL_NCH)["value"] == 16
    assert one("vm:476:476 [0] NCCL INFO NCCL_BUFFSIZE set by environment to 16777216.")["value"] == 16777216
    assert one(REF_NCCL_VERSION) == {"kind": "nccl_version", "version": "2.28.9+cuda13.0", "host": "vm",
                                     "pid": 476, "cuda_dev": 0}
    assert logparse.parse_line(REF_NCCL_DRIVER) is None
    inv = one("n1:5:5 [3] NCCL INFO Invalid value abc for NCCL_NTHREADS, using default 512.")
    assert (inv["kind"], inv["var"], inv["value"], inv["default"], inv["cuda_dev"]) == (
        "nccl_env_invalid", "NCCL_NTHREADS", "abc", 512, 3)


# Rendered from vllm-sim-nvidia-smi-nccl.md §A4 (three format revisions) and the stats line.
VLLM_SPEC_CURRENT = (
    "INFO 10-22 10:27:57 [metrics.py:96] SpecDecoding metrics: Mean acceptance length: 2.45, "
    "Accepted throughput: 30.12 tokens/s, Drafted throughput: 61.50 tokens/s, Accepted: 301 tokens, "
    "Drafted: 615 tokens, Per-position acceptance rate: 0.800, 0.450, 0.200, Avg Draft acceptance rate: 48.9%")
VLLM_SPEC_HISTOGRAM = (
    "(APIServer pid=12) INFO 11-02 01:02:03 [metrics.py:120] SpecDecoding metrics: Mean acceptance length: 1.90, "
    "Accepted throughput: 9.00 tokens/s, Drafted throughput: 30.00 tokens/s, Accepted: 90 tokens, "
    "Drafted: 300 tokens, Per-position acceptance rate: 0.600, 0.300, 0.000, "
    "Draft length histogram: [0, 0, 100], Avg Draft acceptance rate: 30.0%")
VLLM_SPEC_V08 = ("INFO 03-01 12:00:00 metrics.py:460] SpecDecoding metrics: Draft acceptance rate: 62.5%, "
                 "Accepted: 50 tokens, Drafted: 80 tokens")
VLLM_STATS = ("INFO 10-22 10:27:57 [loggers.py:123] Engine 000: Avg prompt throughput: 12.5 tokens/s, "
              "Avg generation throughput: 45.1 tokens/s, Running: 1 reqs, Waiting: 0 reqs, "
              "GPU KV cache usage: 0.1%, Prefix cache hit rate: 0.0%")


def test_vllm_spec_lines_every_revision() -> None:
    cur = one(VLLM_SPEC_CURRENT)
    assert cur == {"kind": "vllm_spec", "ts": "10-22 10:27:57", "mean_accept_len": 2.45, "accepted_tok_s": 30.12,
                   "drafted_tok_s": 61.5, "accepted_tokens": 301, "drafted_tokens": 615,
                   "accept_rate_pct": 48.9, "per_position_accept_rate": [0.8, 0.45, 0.2]}
    hist = one(VLLM_SPEC_HISTOGRAM)
    assert hist["draft_length_histogram"] == "[0, 0, 100]" and hist["per_position_accept_rate"] == [0.6, 0.3, 0.0]
    assert hist["accept_rate_pct"] == 30.0 and hist["ts"] == "11-02 01:02:03"
    old = one(VLLM_SPEC_V08)
    assert old == {"kind": "vllm_spec", "ts": "03-01 12:00:00", "accept_rate_pct": 62.5,
                   "accepted_tokens": 50, "drafted_tokens": 80}
    st = one(VLLM_STATS)
    assert (st["engine"], st["gen_throughput"], st["running"], st["waiting"], st["kv_cache_usage_pct"]) == (
        0, 45.1, 1, 0, 0.1)


def test_unrelated_lines_are_ignored() -> None:
    for line in ["", "Traceback (most recent call last):", "[2025-10-22 10:27:57] INFO:     127.0.0.1:5 - "
                 '"POST /generate HTTP/1.1" 200 OK', "the batch size is 8", REF_NCCL_DRIVER,
                 "ValueError: Free memory on device (31.44/47.38 GiB) on startup is less than desired GPU "
                 "memory utilization (0.95, 45.01 GiB)."]:
        assert logparse.parse_line(line) is None, line


def _mixed_log() -> str:
    lines = [*PUB_LOAD, "[2025-10-22 10:27:55] The server is fired up and ready to roll!", REF_NCCL_SHM,
             "node-02:7:7 [1] NCCL INFO NCCL_SHM_DISABLE set by environment to 0.", REF_NCCL_VERSION,
             REF_PREFILL, REF_DECODE, PUB_PREFILL_DP, "garbage line", VLLM_SPEC_CURRENT, VLLM_SPEC_V08,
             VLLM_STATS]
    lines += [line for line, _ in RENDERED_SGLANG.values()]
    return "\n".join(lines) + "\n"


def test_summary_over_a_mixed_log() -> None:
    s = logparse.summarize(logparse.iter_records(io.StringIO(_mixed_log())))
    decodes = [one(REF_DECODE)] + [one(v[0]) for v in RENDERED_SGLANG.values() if "decode" in v[0].lower()
                                   and "Decode" in v[0]]
    assert s["decode_lines"] == len(decodes) == 6
    acc = [d["accept_len"] for d in decodes if "accept_len" in d]
    assert s["accept_len_mean"] == pytest.approx(sum(acc) / len(acc)) and s["accept_len_lines"] == 5
    gen = [d["gen_throughput"] for d in decodes]
    assert s["gen_throughput_mean"] == pytest.approx(sum(gen) / len(gen))
    assert (s["cuda_graph_true"], s["cuda_graph_false"]) == (5, 1)
    assert s["cuda_graph_share"] == pytest.approx(5 / 6)
    assert s["prefill_lines"] == 4 and s["running_req_max"] == 8
    assert s["ready_ts"] == "2025-10-22 10:27:55"
    assert s["load_phases"]["weights_end"] == "2025-12-29 18:33:03"
    assert s["load_phases"]["graph_end_target"] == "2024-12-13 01:45:01"
    assert s["capacity"]["max_running_requests"] == 2049
    assert s["nccl_env"] == {"NCCL_SHM_DISABLE": 1} and s["nccl_env_conflicts"] == {"NCCL_SHM_DISABLE": [1, 0]}
    assert s["nccl_versions"] == ["2.28.9+cuda13.0"]
    assert {"DP3 TP3", "PP0 TP3", "TP0", "DP0 TP0"} <= set(s["ranks"])
    v = s["vllm"]
    assert v["spec_lines"] == 2 and v["accepted_tokens"] == 351 and v["drafted_tokens"] == 695
    assert v["accept_rate"] == pytest.approx(351 / 695) and v["mean_accept_len_mean"] == 2.45


@pytest.mark.parametrize("block_size", [64, 1000, 1 << 20])
def test_fast_decode_stats_equal_the_line_parser(block_size: int) -> None:
    text = _mixed_log() * 3 + REF_DECODE   # last line without a newline
    slow = logparse.summarize(logparse.iter_records(io.StringIO(text)))
    fast = logparse.decode_stats(io.BytesIO(text.encode()), block_size=block_size)
    for k, v in fast.items():
        assert v == pytest.approx(slow[k]), k
    assert fast["decode_lines"] == 19


def test_cli_json_and_text(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(_mixed_log())
    proc = subprocess.run([sys.executable, "-m", "specab.analysis.evidence.logparse", str(log), "--format", "json"],
                          capture_output=True, text=True, timeout=60, check=True)
    out = [json.loads(line) for line in proc.stdout.splitlines()]
    assert out[-1]["kind"] == "summary" and out[-1]["decode_lines"] == 6
    lines = {r["line"]: r for r in out[:-1]}
    n = _mixed_log().splitlines().index(REF_DECODE) + 1
    assert lines[n]["accept_len"] == 1.95 and lines[n]["kind"] == "decode"

    proc = subprocess.run([sys.executable, "-m", "specab.analysis.evidence.logparse", "parse-log", str(log), "--summary-only",
                           "--fast", "--format", "json"], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(proc.stdout)["cuda_graph_true"] == 5

    proc = subprocess.run([sys.executable, "-m", "specab.analysis.evidence.logparse", str(log)], capture_output=True, text=True,
                          timeout=60, check=True)
    assert "accept_len=1.95" in proc.stdout and "cuda_graph_share: 0.833" in proc.stdout

    proc = subprocess.run([sys.executable, "-m", "specab.analysis.evidence.logparse", str(tmp_path / "missing.log")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "cannot read" in proc.stderr


def test_register_adds_parse_log_subcommand(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="command", required=True)
    logparse.register(sub)
    log = tmp_path / "s.log"
    log.write_text(REF_DECODE + "\n")
    ns = ap.parse_args(["parse-log", str(log), "--format", "json", "--summary-only"])
    assert ns.func(ns) == 0
    assert json.loads(capsys.readouterr().out)["accept_len_mean"] == 1.95
    buf = io.StringIO()   # the driver's CLI calls func(args, out)
    assert ns.func(ns, buf) == 0
    assert json.loads(buf.getvalue())["cuda_graph_share"] == 1.0


@pytest.mark.parametrize("content", [b"", bytes(range(256)) * 64], ids=["empty", "binary"])
def test_parse_log_of_nothing_recognised_exits_non_zero_with_the_hint_first(
        tmp_path: Path, capsys: pytest.CaptureFixture, content: bytes) -> None:
    """No summary of None values, exit 1, the hint the first line on stderr."""
    from specab.driver.cli import main
    log = tmp_path / "x.log"
    log.write_bytes(content)
    out = io.StringIO()
    assert main(["parse-log", str(log)], out=out) == 1
    err = capsys.readouterr().err
    assert err.splitlines()[0].startswith(f"parse-log: no line of {log} was recognised"), err
    assert out.getvalue() == "" and "None" not in err


@pytest.mark.parametrize("entry", [["driver.py", "parse-log"], ["-m", "specab.analysis.evidence.logparse"]])
def test_a_reader_that_goes_away_ends_parse_log_quietly_not_blaming_the_log(tmp_path: Path, entry: list[str]) -> None:
    """`parse-log LOG | head -1`: once the reader has closed the pipe the next write fails; that is the reader's
    doing, so nothing is said and the status is a SIGPIPE ending's (141), never "cannot read LOG". The output
    (megabytes) is far above a pipe's buffer, so the write after the close cannot have been buffered already."""
    log = tmp_path / "server.log"
    log.write_text(_mixed_log() * 2000)
    repo = Path(__file__).resolve().parents[2]
    argv = [sys.executable, *([str(repo / entry[0]), entry[1]] if entry[0] == "driver.py" else entry), str(log)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=repo)
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()                       # what `head -1` does after its line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141, err
    assert first.strip() and err == ""


def test_a_broken_pipe_in_the_driver_is_its_reader_s_not_a_usage_error(tmp_path: Path) -> None:
    from specab.driver import cli

    class Gone(io.StringIO):
        def write(self, s: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")
    log = tmp_path / "server.log"
    log.write_text(_mixed_log())
    err = io.StringIO()
    from contextlib import redirect_stderr
    with redirect_stderr(err):
        assert cli.main(["parse-log", str(log)], out=Gone()) == 141
    assert err.getvalue() == ""


def test_parse_log_leaves_out_values_out_of_range_and_counts_the_lines_it_could_not_read(tmp_path: Path) -> None:
    """A garbage `gen throughput (token/s): -40.59` was folded into the mean and a garbled line went uncounted: the
    mean is now over the sane values, and both are counted and named (stderr and the summary)."""
    good = ["[2026-01-05 10:00:0%d TP0] Decode batch, #running-req: 1, #token: 300, token usage: 0.01, "
            "accept len: 2.00, cuda graph: True, gen throughput (token/s): %.2f, #queue-req: 0" % (i, v)
            for i, v in enumerate((80.0, 90.0))]
    negative = ("[2026-01-05 10:00:05 TP0] Decode batch, #running-req: 1, #token: 300, token usage: 0.01, "
                "accept len: 2.00, cuda graph: True, gen throughput (token/s): -40.59, #queue-req: 0")
    garbled = "[2026-01-05 10:00:06 TP0] Decode batch, #running-req: one, gen throughput (token/s): 9x9.1"
    log = tmp_path / "server.log"
    log.write_text("\n".join([good[0], negative, garbled, good[1]]) + "\n")
    proc = subprocess.run([sys.executable, "-m", "specab.analysis.evidence.logparse", str(log), "--summary-only",
                           "--format", "json"], capture_output=True, text=True, timeout=60, check=True)
    s = json.loads(proc.stdout)
    assert s["gen_throughput_mean"] == pytest.approx(85.0)
    assert s["accept_len_mean"] == pytest.approx(2.0) and s["accept_len_lines"] == 3
    assert s["unreadable_lines"] == 1 and s["unreadable_at"] == ["line 3 (running_req, gen_throughput)"]
    assert s["out_of_range"] == {"gen_throughput": 1} and s["out_of_range_at"] == ["line 2: gen_throughput=-40.59"]
    assert "1 line(s) of a summarised kind could not be read and are left out (line 3" in proc.stderr
    assert "1 value(s) out of range are left out of the means (line 2: gen_throughput=-40.59)" in proc.stderr
