"""Process tree, titles, death with the parent, graceful SIGTERM, the loading phase and the log lines."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml

from specab.sim.profile import load_profile
from tests.sim.client import request_json, stream
from tests.sim.conftest import (EAGLE_S2, TUNED, alive, children_of, compute_pids, free_port, memory_used, smi,
                                wait_for)

# Real SGLang lines (shared/reference/sglang.md, issue #11948 log, v0.5.3.post3) and a 0.5.9-style line.
REAL_LINES = [
    "[2025-10-22 10:27:56 TP0] Prefill batch. #new-seq: 1, #new-token: 28, #cached-token: 0, token usage: 0.00, "
    "#running-req: 0, #queue-req: 0,",
    "[2025-10-22 10:27:57 TP0] Decode batch. #running-req: 1, #token: 186, token usage: 0.00, accept len: 1.95, "
    "accept rate: 0.49, cuda graph: True, gen throughput (token/s): 178.86, #queue-req: 0,",
]
_PREFIX = re.compile(r"^\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?P<rank>(?: [A-Z]+\d+)*)\] (?P<msg>.*)$")
_BATCH = re.compile(r"^(?P<kind>Prefill|Decode) batch(?: \[\d+\])?[.,] (?P<rest>.*)$")


def parse_batch_line(line: str) -> dict | None:
    """Version-agnostic: `batch.` or `batch,`, optional [iter], `key: value` pairs, trailing comma or not."""
    m = _PREFIX.match(line.rstrip())
    if not m:
        return None
    b = _BATCH.match(m.group("msg"))
    if not b:
        return None
    rec: dict = {"kind": b.group("kind").lower(), "rank": m.group("rank").strip()}
    for part in b.group("rest").split(", "):
        part = part.strip().rstrip(",")
        if ": " in part:
            k, v = part.split(": ", 1)
            rec[k] = v
    return rec


def test_parser_reads_real_sglang_lines():
    pre, dec = (parse_batch_line(l) for l in REAL_LINES)
    assert pre == {"kind": "prefill", "rank": "TP0", "#new-seq": "1", "#new-token": "28", "#cached-token": "0",
                   "token usage": "0.00", "#running-req": "0", "#queue-req": "0"}
    assert dec["accept len"] == "1.95" and dec["cuda graph"] == "True" and dec["#queue-req"] == "0"
    assert dec["gen throughput (token/s)"] == "178.86"


def test_process_tree_titles_memory_and_death_with_parent(launch):
    srv = launch([], env=TUNED, scale=20, tp=8)
    main = srv.proc.pid
    kids = children_of(main)
    titles = {Path(f"/proc/{k}/cmdline").read_bytes().split(b"\0")[0].decode() for k in kids}
    assert titles == {f"sglang::scheduler_TP{r}" for r in range(8)} | {"sglang::detokenizer"}
    # SGLang leaves the main process untitled, both versions (engines-2026.md A7)
    assert not Path(f"/proc/{main}/cmdline").read_bytes().startswith(b"sglang::")
    found = subprocess.run(["pgrep", "-f", "sglang::scheduler_TP7"], capture_output=True, text=True).stdout.split()
    assert any(int(p) in kids for p in found), "pgrep -f finds the renamed scheduler"
    rss_kb = sum(int(Path(f"/proc/{p}/status").read_text().split("VmRSS:")[1].split()[0]) for p in [main, *kids])
    assert rss_kb < 500 * 1024, f"a TP8 node should stay light, RSS {rss_kb} kB"
    lines = smi(srv.state, "--query-compute-apps=pid,process_name,used_memory,gpu_uuid",
                "--format=csv,noheader,nounits").stdout.splitlines()
    assert len(lines) == 8 and {int(l.split(", ")[0]) for l in lines} <= set(kids)
    assert {l.split(", ")[2] for l in lines} == {str(round(0.888 * 143771))}, "auto mem fraction"
    assert memory_used(srv.state) == [round(0.888 * 143771)] * 8
    os.kill(main, signal.SIGKILL)
    srv.proc.wait(timeout=10)
    wait_for(lambda: not any(alive(k) for k in kids), 10, "the children to die with the parent")
    wait_for(lambda: compute_pids(srv.state) == [], 10, "no compute processes")
    wait_for(lambda: memory_used(srv.state) == [0] * 8, 10, "memory released")


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_sigterm_drains_requests_then_exits_with_children(launch, version):
    srv = launch(["--mem-fraction-static", "0.7"], env={**TUNED, "CUDA_VISIBLE_DEVICES": "4,5",
                                                         "SPECAB_SIM_SGLANG_VERSION": version}, scale=20, tp=2)
    kids = children_of(srv.proc.pid)
    used = memory_used(srv.state)
    assert used[4] == used[5] == round(0.7 * 143771) and used[0] == 0, "GPUs follow CUDA_VISIBLE_DEVICES"
    result: dict = {}
    t = threading.Thread(target=lambda: result.update(res=stream(
        srv.port, "/generate", {"text": "x " * 50, "sampling_params": {"max_new_tokens": 600, "ignore_eos": True},
                                "stream": True})))
    t.start()
    wait_for(lambda: request_json(srv.port, "GET", "/server_info")[1]["internal_states"][0]["load"] > 0, 20,
             "the request to run")
    os.kill(srv.proc.pid, signal.SIGTERM)
    wait_for(lambda: srv.health() in (0, 503), 10, "health to turn 503 after SIGTERM")
    t.join(timeout=60)
    assert result["res"].done and result["res"].final["meta_info"]["completion_tokens"] == 600, "drained"
    rc = srv.wait_exit(30)
    if version == "0.5.9":
        assert rc == -signal.SIGKILL, "SGLang 0.5.9's kill_process_tree ends with SIGKILL to itself"
    else:
        assert rc == 0, "SGLang 0.5.23: ShutdownReq, children killed, the main process exits normally"
        assert "ShutdownReq" in srv.log_text()
    wait_for(lambda: not any(alive(k) for k in kids), 10, "children gone")
    assert "Gracefully exiting... Remaining number of requests 1" in srv.log_text()
    wait_for(lambda: memory_used(srv.state) == [0] * 8, 10, "memory released")


def test_port_closed_while_loading_then_503_then_ready(launch, tmp_path):
    data = yaml.safe_load(open(load_profile("default").source).read())
    data["load"]["weights_s"] = 0.8
    data["prefill"]["base_ms"] = 800.0          # the warm-up request keeps /health_generate at 503 a while
    prof = tmp_path / "slow.yml"
    prof.write_text(yaml.safe_dump(data))
    srv = launch([], env={"SPECAB_SIM_PROFILE": str(prof)}, scale=1, tp=1, wait=False)
    seen: list[int] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        code = srv.health()
        if not seen or seen[-1] != code:
            seen.append(code)
        if code == 200:
            break
        time.sleep(0.02)
    assert seen[0] == 0 and 503 in seen and seen[-1] == 200, seen
    assert seen.index(503) > seen.index(0), "connection refused while loading, then 503 while warming up"
    log = srv.log_text()
    assert log.index("Load weight end") < log.index("Uvicorn running on") < log.index(
        "The server is fired up and ready to roll!")


def test_log_lines_in_sglang_format(module_launch):
    srv = module_launch([*EAGLE_S2, "--decode-log-interval", "4"], env=TUNED, scale=20, tp=2)
    request_json(srv.port, "POST", "/generate", {"text": "hello there", "sampling_params":
                                                 {"max_new_tokens": 64, "ignore_eos": True}})
    wait_for(lambda: "Decode batch," in srv.log_text(), 10, "decode lines")
    lines = srv.log_text().splitlines()
    assert any(re.fullmatch(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d TP0\] Load weight begin\. avail mem=\d+\.\d\d GB", l)
               for l in lines)
    # 0.5.23 (the default; cuda_graph_setup.py:750-792): "Capture target verify CUDA graph end. bs=[...], elapsed=X s, ..."
    assert any(re.fullmatch(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d TP1\] Capture target verify CUDA graph end\. "
                            r"bs=\[[\d, ]+\], elapsed=\d+\.\d\d s, mem usage=\d+\.\d\d GB, avail mem=\d+\.\d\d GB", l)
               for l in lines)
    assert any(re.fullmatch(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] The server is fired up and ready to roll!", l)
               for l in lines)
    decodes = [r for r in map(parse_batch_line, lines) if r and r["kind"] == "decode"]
    prefills = [r for r in map(parse_batch_line, lines) if r and r["kind"] == "prefill"]
    assert decodes and prefills
    real_dec = parse_batch_line(REAL_LINES[1])
    for rec in decodes:
        assert set(real_dec) <= set(rec), "every field of the real line is there"
        assert rec["rank"] == "TP0" and rec["cuda graph"] == "False", "verify runs without CUDA graph"
        assert 1.0 <= float(rec["accept len"]) <= 3.0
    assert set(parse_batch_line(REAL_LINES[0])) <= set(prefills[0])
    try:
        from specab.analysis.evidence.logparse import parse_line
    except ImportError:  # the project parser is another part; the local one above is the reference
        return
    recs = [r for r in map(parse_line, lines) if r]
    kinds = {r["kind"] for r in recs}
    assert {"decode", "prefill", "ready"} <= kinds


def test_sigterm_while_loading_kills_the_tree(launch, tmp_path):
    data = yaml.safe_load(open(load_profile("default").source).read())
    data["load"]["weights_s"] = 30.0
    prof = tmp_path / "slowload.yml"
    prof.write_text(yaml.safe_dump(data))
    srv = launch([], env={"SPECAB_SIM_PROFILE": str(prof)}, scale=1, tp=2, wait=False)
    wait_for(lambda: srv.log_text().count("Load weight begin") == 2, 30, "both ranks loading")
    kids = children_of(srv.proc.pid)
    assert srv.health() == 0, "the port is closed while loading"
    os.kill(srv.proc.pid, signal.SIGTERM)
    assert srv.wait_exit(10) == -signal.SIGTERM
    wait_for(lambda: not any(alive(k) for k in kids), 10, "children die with the parent")


def test_gpu_utilization_follows_the_work(module_launch):
    srv = module_launch([], env=TUNED, scale=4, tp=2)
    q = ["--query-gpu=utilization.gpu,clocks_event_reasons.active", "--format=csv,noheader,nounits"]
    t = threading.Thread(target=lambda: request_json(srv.port, "POST", "/generate", {
        "text": "x", "sampling_params": {"max_new_tokens": 500, "ignore_eos": True}}, timeout=60))
    t.start()
    busy = wait_for(lambda: (lambda rows: rows if rows[0] == "97, 0x0000000000000000" else None)(
        smi(srv.state, *q).stdout.splitlines()), 20, "utilization while decoding")
    assert busy[2] == "0, 0x0000000000000001", "GPUs the server does not use stay idle"
    t.join()
    wait_for(lambda: smi(srv.state, *q).stdout.splitlines()[0] == "0, 0x0000000000000001", 10, "idle again")


def _two_nodes(launch, tmp_path):
    link = f"127.0.0.1:{free_port()}"
    common = ["--nnodes", "2", "--dist-init-addr", link]
    head = launch([*common, "--node-rank", "0"], scale=20, tp=4, state=tmp_path / "head", wait=False)
    wait_for(lambda: "Waiting for 1 other node(s)" in head.log_text(), 60, "the head to wait for node 1")
    assert head.health() == 0, "the head's port stays closed until every node joined"
    other = launch([*common, "--node-rank", "1"], scale=20, tp=4, state=tmp_path / "other", wait=False)
    head.wait_ready()
    wait_for(lambda: other.health() == 200, 60, "the dummy health server of node rank 1")
    return head, other


def test_multi_node_ranks_join_the_head_and_split_tp(launch, tmp_path):
    head, other = _two_nodes(launch, tmp_path)
    titles = sorted(Path(f"/proc/{k}/cmdline").read_bytes().split(b"\0")[0].decode()
                    for k in children_of(other.proc.pid))
    assert titles == ["sglang::scheduler_TP2", "sglang::scheduler_TP3"], "no tokenizer/detokenizer on rank >= 1"
    assert memory_used(other.state)[:3] == [round(0.888 * 143771)] * 2 + [0]
    assert request_json(other.port, "POST", "/generate", {"text": "x"})[0] == 404
    assert request_json(head.port, "POST", "/generate", {"text": "x", "sampling_params":
                                                         {"max_new_tokens": 4}})[0] == 200
    assert "Node 1 joined from 127.0.0.1 (2/2 nodes)." in head.log_text()
    # a peer rank dies: the head goes down like SGLang (NCCL error in a scheduler, SIGQUIT path)
    os.kill(other.proc.pid, signal.SIGKILL)
    assert head.wait_exit(30) == -signal.SIGKILL
    log = head.log_text()
    assert "Lost the connection to node 1" in log and "remote process exited or there was a network error" in log
    assert "Received sigquit from a child process" in log
    wait_for(lambda: compute_pids(head.state) == [] and compute_pids(other.state) == [], 15, "every rank gone")


def test_multi_node_the_others_go_down_with_the_head(launch, tmp_path):
    head, other = _two_nodes(launch, tmp_path)
    os.killpg(head.proc.pid, signal.SIGKILL)
    assert other.wait_exit(30) == -signal.SIGKILL
    assert "Lost the connection to node 0" in other.log_text()
    wait_for(lambda: compute_pids(other.state) == [], 15, "the other node's ranks gone")


def test_log_level_warning_hides_info_lines(launch):
    srv = launch(["--log-level", "warning", "--decode-log-interval", "1"], scale=20, tp=2)
    assert request_json(srv.port, "POST", "/generate", {"text": "x", "sampling_params": {"max_new_tokens": 8}})[0] \
        == 200
    log = srv.log_text()
    assert "Decode batch" not in log and "Load weight begin" not in log and "ready to roll" not in log
    assert "Uvicorn running on" in log, "uvicorn's own lines are not SGLang's logger"


def test_group_sigterm_as_the_stop_role_sends_it(launch):
    srv = launch([], env=TUNED, scale=20, tp=2)
    kids = children_of(srv.proc.pid)
    os.killpg(srv.proc.pid, signal.SIGTERM)
    assert srv.wait_exit(30) in (-signal.SIGKILL, -signal.SIGTERM, 0)     # 0: 0.5.23's normal exit
    wait_for(lambda: not any(alive(k) for k in kids), 10, "workers gone")
    wait_for(lambda: compute_pids(srv.state) == [] and memory_used(srv.state) == [0] * 8, 10, "GPUs free")
