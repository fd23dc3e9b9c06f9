"""Parsers of the node tools on real text (lines copied from shared/reference and real /proc files)."""
from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

from specab.node import cli, envcheck, envfile, nvsmi, ports, procfs, ready
from specab.vocab import contract

NODE = Path(__file__).resolve().parents[2] / "specab" / "node"

# shared/reference/vllm-sim-nvidia-smi-nccl.md C1 (H200, driver 580.159.04)
H200_QUERY = "0, GPU-2592755b-9f24-f5f7-a815-34d27fe0aa35, NVIDIA H200, 0, 143771, 0, 37, 375, 3201, 117.18, 0x0000000000000001\n"
H200_FIELDS = ["index", "uuid", "name", "memory.used", "memory.total", "utilization.gpu", "temperature.gpu",
               "clocks.sm", "clocks.mem", "power.draw", "clocks_event_reasons.active"]
# shared/facts/seed-measurements.md (H200 test machine)
SEED_QUERY = ("0, GPU-d09b8d4e-daef-237f-dd2d-1f194bd911ab, NVIDIA H200, 0, 143771, 0, 39, 345, 3201, 1980, 78.95, "
              "700.00, 0x0000000000000001, P0, Enabled, 0\n")
SEED_FIELDS = ["index", "uuid", "name", "memory.used", "memory.total", "utilization.gpu", "temperature.gpu",
               "clocks.sm", "clocks.mem", "clocks.max.sm", "power.draw", "power.limit", "clocks_event_reasons.active",
               "pstate", "persistence_mode", "ecc.errors.uncorrected.volatile.total"]


def test_every_tool_parses_as_python38():
    """Real nodes may have an older python3: no 3.9+ syntax in the node tools."""
    files = sorted(NODE.glob("*.py"))
    assert len(files) >= 8
    for f in files:
        ast.parse(f.read_text(), filename=str(f), feature_version=(3, 8))


def test_every_spec_annotation_evaluates_on_python38():
    """A tool's flags are built from its spec dataclass's evaluated type hints (cli.spec_flags), so on a node
    those annotations run: no list[...]/dict[...] or X | Y there, which python3.8 cannot evaluate."""
    found = []
    for f in sorted(NODE.glob("*.py")):
        for cls in ast.walk(ast.parse(f.read_text())):
            if isinstance(cls, ast.ClassDef):
                found += [f"{f.name}: {cls.name}.{st.target.id}: {ast.unparse(st.annotation)}" for st in cls.body
                          if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)
                          and re.search(r"\b(list|dict|tuple|set|frozenset|type)\[|\|", ast.unparse(st.annotation))]
    assert found == [], found


def test_smi_query_gpu_real_h200_line():
    rows = nvsmi.parse_smi_csv(H200_QUERY, H200_FIELDS)
    assert rows == [{"index": 0, "uuid": "GPU-2592755b-9f24-f5f7-a815-34d27fe0aa35", "name": "NVIDIA H200",
                     "memory.used": 0, "memory.total": 143771, "utilization.gpu": 0, "temperature.gpu": 37,
                     "clocks.sm": 375, "clocks.mem": 3201, "power.draw": 117.18,
                     "clocks_event_reasons.active": "0x0000000000000001"}]
    seed = nvsmi.parse_smi_csv(SEED_QUERY, SEED_FIELDS)[0]
    assert seed["clocks.max.sm"] == 1980 and seed["power.limit"] == 700.0 and seed["pstate"] == "P0"


def test_smi_units_and_not_available():
    # "without nounits" form and an [N/A] cell, both from the reference
    rows = nvsmi.parse_smi_csv("430, python3, 8710 MiB, GPU-2592755b-9f24-f5f7-a815-34d27fe0aa35\n",
                                nvsmi.APP_FIELDS)
    assert rows[0]["pid"] == 430 and rows[0]["used_memory"] == 8710
    rows = nvsmi.parse_smi_csv("616 MiB, 80.91 W, [N/A], 39\n",
                                ["memory.reserved", "power.draw.instant", "fan.speed", "temperature.memory"])
    assert rows[0] == {"memory.reserved": 616, "power.draw.instant": 80.91, "fan.speed": None,
                       "temperature.memory": 39}


def test_smi_compute_apps_idle_is_empty_and_garbage_is_refused():
    assert nvsmi.parse_smi_csv("", nvsmi.APP_FIELDS) == []
    with pytest.raises(nvsmi.SmiError, match="unexpected nvidia-smi output"):
        nvsmi.parse_smi_csv("Failed to initialize NVML\n", nvsmi.APP_FIELDS)


def test_proc_stat_with_spaces_and_parens_in_comm():
    text = "4242 (sglang::sch (x) y) S 1 4240 4240 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 987654 0 0\n"
    st = procfs.parse_proc_stat(4242, text)
    assert (st.comm, st.state, st.ppid, st.pgrp, st.session, st.starttime) == ("sglang::sch (x) y", "S", 1, 4240,
                                                                              4240, 987654)
    real = procfs.proc_stat(os.getpid())
    assert real is not None and real.session == os.getsid(0) and real.pgrp == os.getpgid(0)


def test_proc_net_tcp_listen_parse():
    text = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
            "   0: 0100007F:7530 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 123456 1 0 20 4 30 10 -1\n"
            "   1: 0100007F:7530 0100007F:D2F0 01 00000000:00000000 00:00000000 00000000     0        0 123999 1 0 20 4 30 10 -1\n"
            "   2: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 777 1 0 20 4 30 10 -1\n")
    assert ports._parse_proc_net(text, 30000) == [("0100007F", 123456)]
    assert ports._parse_proc_net(text, 8000) == [("00000000", 777)]
    assert ports._parse_proc_net(text, 8001) == []


def test_env_file_parse_shell_quoting():
    text = ("# rendered by specab\nset -a\nNCCL_PROTO=LL\nexport NCCL_ALGO='Ring'\n"
            "WEIRD='x; touch /tmp/pwned'\nSPACED=\"a b\"  # comment\nEMPTY=\n")
    env = envfile.parse_env_text(text)
    assert env == {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "WEIRD": "x; touch /tmp/pwned", "SPACED": "a b",
                   "EMPTY": ""}
    with pytest.raises(cli.ToolError, match="not valid shell"):
        envfile.parse_env_text("A='unterminated\n")
    with pytest.raises(cli.ToolError, match="line 2: unexpected word 'touch'"):
        envfile.parse_env_text("A=1\ntouch /tmp/x\n")


def test_env_file_round_trips_what_the_template_renders():
    """nccl.env.j2 writes ``{{ key | quote }}={{ value | quote }}`` (shlex.quote): every value,
    newlines and metacharacters included, must come back exactly."""
    import shlex
    values = {"NCCL_PROTO": "LL", "A": "x; touch /tmp/pwned", "B": "two\nlines", "C": "it's $HOME `id`",
              "D": "", "E": "a=b", "F": "#not-a-comment"}
    text = "# header\n" + "".join("%s=%s\n" % (shlex.quote(k), shlex.quote(v)) for k, v in values.items())
    assert envfile.parse_env_text(text) == values


def test_secret_names_and_redaction():
    for name in ("HF_TOKEN", "OPENAI_API_KEY", "AWS_SECRET", "DB_PASSWORD", "mypassword_x", "api_key", "--api-key"):
        assert contract.is_secret_name(name), name
    for name in ("NCCL_PROTO", "TOKENIZER_PATH", "KEYBOARD", "SGLANG_SIMULATE_ACC_LEN"):
        assert not contract.is_secret_name(name), name
    assert contract.redact_mapping({"env": {"HF_TOKEN": "hf_abc", "A": "1"}, "api_key": "sk"}) == \
        {"env": {"HF_TOKEN": "<redacted>", "A": "1"}, "api_key": "<redacted>"}
    text = "export HF_TOKEN=hf_abcdef\nexec python -m sglang.launch_server --api-key 'sk-123' --port 8000\n"
    red = contract.redact_text(text)
    assert "hf_abcdef" not in red and "sk-123" not in red and "--port 8000" in red


def test_nccl_env_lines_real_formats():
    log = ("node-01:1896826:1896838 [0] NCCL INFO NCCL_SHM_DISABLE set by environment to 1.\n"
           "vm:476:476 [0] NCCL INFO NCCL_P2P_LEVEL set by environment to SYS\n"
           "vm:476:476 [0] NCCL INFO NCCL_MAX_NCHANNELS set by environment to 16.\n"
           "vm:476:476 [0] NCCL INFO NCCL_BUFFSIZE set by environment to 16777216.\n"
           "node-01:1896826:1896838 [3] NCCL INFO NCCL_PROTO set by environment to LL\n"
           "vm:476:476 [0] NCCL INFO NCCL version 2.28.9+cuda13.0\n")
    lines = envcheck.parse_nccl_lines(log)
    assert [(l["var"], l["value"], l["pid"], l["dev"]) for l in lines] == [
        ("NCCL_SHM_DISABLE", "1.", 1896826, 0), ("NCCL_P2P_LEVEL", "SYS", 476, 0),
        ("NCCL_MAX_NCHANNELS", "16.", 476, 0), ("NCCL_BUFFSIZE", "16777216.", 476, 0),
        ("NCCL_PROTO", "LL", 1896826, 3)]
    assert envcheck.nccl_value_matches("16", "16.")
    assert envcheck.nccl_value_matches("0x1000000", "16777216.")
    assert envcheck.nccl_value_matches("LL", "LL")
    assert not envcheck.nccl_value_matches("LL", "Simple")
    assert not envcheck.nccl_value_matches("16", "8.")


def test_server_arg_comparison_tolerates_representation_only():
    eq = envcheck.values_equal
    assert eq(8, 8.0) and eq("8", 8) and eq(0.88, "0.88") and eq(True, "true") and eq("EAGLE3", "EAGLE3")
    assert eq([1, 2], [1.0, "2"])
    assert not eq(0.88, 0.85) and not eq(3, 4) and not eq(True, False) and not eq("EAGLE3", "EAGLE")
    report, problems = envcheck.check_args(
        {"tp_size": 8, "speculative_num_steps": 2, "trust_remote_code": True, "disable_x": False,
         "chunked_prefill_size": None, "api_key": "sk-secret", "no_such_arg": 1},
        {"tp_size": 8, "speculative_num_steps": 3, "trust_remote_code": True, "disable_x": False,
         "chunked_prefill_size": 8192, "api_key": "sk-other"})
    assert report["tp_size"]["ok"] and report["trust_remote_code"]["ok"] and report["chunked_prefill_size"]["ok"]
    assert not report["speculative_num_steps"]["ok"]
    assert any("speculative_num_steps: expected 2, but the server runs with 3" in p for p in problems)
    assert any("no_such_arg" in p and "does not report it" in p for p in problems)
    assert all("sk-secret" not in p and "sk-other" not in p for p in problems)
    assert report["api_key"]["expected"] == "<redacted>"


# shared/reference/engines-2026.md A4: 0.5.23 reads the graph settings back from cuda_graph_config (no flat
# cuda_graph_max_bs/_bs keys); what the node's spelling (--cuda-graph-max-bs-decode 16 and the per-phase
# backends for disable_cuda_graph) must be compared with
INFO_0523 = {"tp_size": 8, "version": "0.5.23", "cuda_graph_config": {
    "decode": {"backend": "disabled", "max_bs": 16, "bs": [1, 2, 4, 8, 16]},
    "prefill": {"backend": "disabled", "max_bs": None, "bs": None}}}


def test_server_args_of_0523_graph_flags_are_read_back_from_cuda_graph_config():
    report, problems = envcheck.check_args({"tp_size": 8, "cuda_graph_max_bs_decode": 16,
                                            "cuda_graph_backend_decode": "disabled",
                                            "cuda_graph_backend_prefill": "disabled", "disable_cuda_graph": True},
                                           INFO_0523)
    assert problems == [], problems
    assert report["cuda_graph_max_bs_decode"]["read_from"] == "cuda_graph_config.decode.max_bs"
    assert "read_from" not in report["tp_size"]
    # a wrong value is named with where it was read
    _, problems = envcheck.check_args({"cuda_graph_max_bs_decode": 32, "cuda_graph_bs_prefill": [1]},
                                      {**INFO_0523, "cuda_graph_config": {"decode": {"max_bs": 16}}})
    assert any("cuda_graph_max_bs_decode: expected 32, but the server runs with 16" in p for p in problems)
    assert any("cuda_graph_bs_prefill" in p and "at cuda_graph_config.prefill.bs" in p for p in problems)
    # 0.5.9: flat keys, as before
    _, problems = envcheck.check_args({"cuda_graph_max_bs": 16, "disable_cuda_graph": True},
                                      {"cuda_graph_max_bs": 16, "disable_cuda_graph": True, "version": "0.5.9"})
    assert problems == []
    assert envcheck.engine_readback(INFO_0523) == {
        "version": "0.5.23", "generation": "0.5.23", "graph_readback": "cuda_graph_config",
        "decode_graph_max_bs": 16, "decode_graph_disabled": True}
    assert envcheck.engine_readback({"cuda_graph_max_bs": 8, "version": "0.5.9"})["graph_readback"] == "flat"


@pytest.mark.parametrize("line,kind", [
    ("launch_server.py: error: unrecognized arguments: --bogus-flag", "unrecognized arguments"),
    ("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.", "out of memory"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.", "out of memory"),
    ("OSError: [Errno 98] Address already in use", "address in use"),
    ("[2025-10-22 10:27:57] Received sigquit from a child process. It usually means the child failed.",
     "child failed"),
])
def test_ready_fatal_lines(tmp_path, line, kind):
    w = ready.LogWatcher(str(tmp_path / "x.log"))
    w.feed("[2025-10-22 10:27:56 TP0] Load weight begin. avail mem=78.50 GB")
    w.feed(line)
    assert w.fatal == (kind, line)


def test_ready_phases_from_sglang_lines(tmp_path):
    w = ready.LogWatcher(str(tmp_path / "x.log"))
    assert w.phase() == "starting"
    w.feed("[2025-10-22 10:20:01 TP0] Load weight begin. avail mem=78.50 GB")
    w.feed("[2025-10-22 10:20:01 TP1] Load weight begin. avail mem=78.50 GB")
    assert w.phase() == "loading weights"
    w.feed("[2025-10-22 10:21:41 TP1] Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, "
           "avail mem=20.10 GB, mem usage=58.40 GB.")
    w.feed("[2025-10-22 10:21:42 TP0] Capture cuda graph begin. This can take up to several minutes. "
           "avail mem=19.80 GB")
    assert w.phase() == "capturing graphs"
    w.feed("[2025-10-22 10:22:12 TP0] Capture cuda graph end. Time elapsed: 30.02 s. mem usage=1.10 GB. "
           "avail mem=18.70 GB.")
    w.feed("[2025-10-22 10:27:56 TP0] Prefill batch. #new-seq: 1, #new-token: 28, #cached-token: 0, "
           "token usage: 0.00, #running-req: 0, #queue-req: 0,")
    w.feed("[2025-10-22 10:22:20] The server is fired up and ready to roll!")
    assert w.phase() == "ready line logged"
    d = w.durations()
    assert d == {"load_weights_s": 100.0, "capture_cuda_graph_s": 30.0, "weights_to_ready_s": 139.0}
    assert w.phases["load_weight_begin"]["rank"] == "TP0" and w.fatal is None


def test_ready_traceback_names_the_exception_line(tmp_path):
    w = ready.LogWatcher(str(tmp_path / "x.log"))
    for line in ["Traceback (most recent call last):", '  File "/x/model_runner.py", line 3, in load',
                 "    raise ValueError(msg)", "ValueError: Unsupported architecture Foo"]:
        w.feed(line)
    assert w.fatal is None and w.traceback_at is not None
    assert w.best_fatal_line() == "ValueError: Unsupported architecture Foo"


def test_env_file_parse_agrees_with_bash(tmp_path):
    import json
    import shlex
    import subprocess
    values = {"A": "x; touch %s/pwned" % tmp_path, "B": "two\nlines", "C": "it's $HOME `id`", "D": "a=b"}
    f = tmp_path / "nccl.env"
    f.write_text("set -a\n" + "".join("%s=%s\n" % (k, shlex.quote(v)) for k, v in values.items()) + "set +a\n")
    out = subprocess.run(["bash", "-c", '. "$1"; python3 -c "import json,os; print(json.dumps({k: os.environ[k] '
                          'for k in \'ABCD\'}))"', "x", str(f)], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == values == envfile.parse_env_file(str(f))
    assert not (tmp_path / "pwned").exists()


def test_ready_observed_durations_only_for_lines_seen_live(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("[2025-10-22 10:20:01 TP0] Load weight begin. avail mem=78.50 GB\n")
    w = ready.LogWatcher(str(log))
    w.poll()  # first read: the begin line was already there, its read time says nothing
    assert w.phases["load_weight_begin"]["live"] is False
    with open(log, "a") as fh:
        fh.write("[2025-10-22 10:20:02 TP0] Load weight end. type=X, dtype=torch.bfloat16, avail mem=1 GB, "
                 "mem usage=7 GB.\n[2025-10-22 10:20:02 TP0] Capture cuda graph begin. This can take up to "
                 "several minutes. avail mem=1 GB\n")
    w.poll()
    with open(log, "a") as fh:
        fh.write("[2025-10-22 10:20:03 TP0] Capture cuda graph end. Time elapsed: 0.50 s. mem usage=0.1 GB. "
                 "avail mem=0.9 GB.\n[2025-10-22 10:20:03] The server is fired up and ready to roll!\n")
    w.poll()
    obs = w.durations(observed=True)
    assert obs["load_weights_s"] is None and obs["weights_to_ready_s"] is None
    assert obs["capture_cuda_graph_s"] is not None and obs["capture_cuda_graph_s"] >= 0
    assert w.durations()["load_weights_s"] == 1.0
