"""NCCL env-echo lines: only with NCCL_DEBUG=INFO, only for the variables each scheduler has, in NCCL's format."""
from __future__ import annotations

import re

from specab.sim.nccl import nccl_info_lines
from tests.sim.conftest import TUNED, compute_pids

# real lines: NCCL docs (troubleshooting/logging.rst) and the H200 observation (seed-measurements.md)
REAL = ["node-01:1896826:1896838 [0] NCCL INFO NCCL_SHM_DISABLE set by environment to 1.",
        "vm:476:476 [0] NCCL INFO NCCL_P2P_LEVEL set by environment to SYS"]
LINE = re.compile(r"^(?P<host>[^:\s]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] NCCL INFO "
                  r"(?P<var>NCCL_\w+) set by environment to (?P<value>\S+?)(?P<dot>\.?)$")


def env_lines(text: str) -> list[re.Match]:
    return [m for m in map(LINE.match, text.splitlines()) if m]


def test_pattern_matches_real_nccl_lines():
    a, b = (LINE.match(l) for l in REAL)
    assert a and a["var"] == "NCCL_SHM_DISABLE" and a["value"] == "1" and a["dot"] == "."
    assert b and b["var"] == "NCCL_P2P_LEVEL" and b["value"] == "SYS" and b["dot"] == ""


def test_format_of_integer_and_string_params():
    lines = nccl_info_lines({"NCCL_DEBUG": "INFO", **TUNED}, 2, 0, 476, 476, 0, host="vm")
    assert "vm:476:476 [0] NCCL INFO NCCL_P2P_LEVEL set by environment to SYS" in lines
    assert "vm:476:476 [0] NCCL INFO NCCL_MAX_NCHANNELS set by environment to 16." in lines
    assert "vm:476:476 [0] NCCL INFO NCCL_BUFFSIZE set by environment to 16777216." in lines
    assert "vm:476:476 [0] NCCL INFO NCCL_PROTO set by environment to LL" in lines
    one_rank = nccl_info_lines({"NCCL_DEBUG": "INFO", **TUNED}, 1, 0, 476, 476, 0, host="vm")
    assert not any("NCCL_PROTO" in l or "NCCL_ALGO" in l for l in one_rank), "PROTO/ALGO need > 1 rank"
    assert nccl_info_lines(TUNED, 2, 0, 1, 1, 0) == []
    quiet = nccl_info_lines({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT", **TUNED}, 2, 0, 1, 1, 0)
    assert any("NCCL version" in l for l in quiet) and not any("set by environment" in l for l in quiet)
    env_only = nccl_info_lines({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "ENV", **TUNED}, 2, 0, 1, 1, 0)
    assert env_only and all("set by environment" in l for l in env_only)


def test_echoes_come_in_nccls_read_order_between_init_lines():
    env = {"NCCL_DEBUG": "INFO", "NCCL_CUMEM_ENABLE": "0", "NCCL_NVLS_ENABLE": "0", **TUNED}
    lines = nccl_info_lines(env, 2, 0, 649, 649, 0, host="vm")
    order = [m["var"] for m in map(LINE.match, lines) if m]
    assert order == ["NCCL_CUMEM_ENABLE", "NCCL_P2P_LEVEL", "NCCL_NVLS_ENABLE", "NCCL_MAX_NCHANNELS",
                     "NCCL_BUFFSIZE", "NCCL_NTHREADS", "NCCL_PROTO", "NCCL_ALGO"], "as on the H200"
    assert lines[0] == "vm:649:649 [0] NCCL INFO Bootstrap: Using lo:127.0.0.1<0>"
    assert lines[-1].endswith("- Init COMPLETE") and any(l.endswith("- Init START") for l in lines)
    assert any(" nRanks 2 nNodes 1 " in l for l in lines)


def test_each_scheduler_echoes_the_variables_it_has(launch):
    srv = launch([], env={**TUNED, "NCCL_DEBUG": "INFO"}, scale=20, tp=2)
    found = env_lines(srv.log_text())
    pids = set(compute_pids(srv.state))
    assert {int(m["pid"]) for m in found} == pids, "one set of lines per scheduler process"
    for pid in pids:
        vars_ = {m["var"]: m["value"] for m in found if int(m["pid"]) == pid}
        for k, v in TUNED.items():
            assert vars_[k] == v
        assert "NCCL_DEBUG" not in vars_
    srv1 = launch([], env={"NCCL_DEBUG": "INFO", "NCCL_P2P_LEVEL": "SYS"}, scale=20, tp=1)
    vars1 = {m["var"] for m in env_lines(srv1.log_text())}
    assert "NCCL_P2P_LEVEL" in vars1 and "NCCL_PROTO" not in vars1 and "NCCL_NTHREADS" not in vars1


def test_debug_file_receives_the_lines(launch, tmp_path):
    target = tmp_path / "nccl.%h.%p.log"
    srv = launch([], env={**TUNED, "NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": str(target)}, scale=20, tp=2)
    assert not env_lines(srv.log_text())
    files = sorted(tmp_path.glob("nccl.*.log"))
    assert len(files) == 2
    assert all(any(m["var"] == "NCCL_PROTO" for m in env_lines(f.read_text())) for f in files)
