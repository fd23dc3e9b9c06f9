"""The benchmark log generator and the block scan agree with the per-line parser on a realistic
log, and bench/logparse_speed.py runs end to end (tiny size)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from specab.analysis.evidence import logparse

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("logparse_speed", REPO / "bench" / "logparse_speed.py")
logparse_speed = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(logparse_speed)


def test_block_scan_equals_line_parser_on_generated_log(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    logparse_speed.generate(path, 2, seed=7)
    slow = logparse.summarize(logparse.iter_records(path.read_text().splitlines()))
    with open(path, "rb") as fh:
        fast = logparse.decode_stats(fh, block_size=1 << 16)
    assert fast["decode_lines"] > 5000
    for k, v in fast.items():
        assert v == pytest.approx(slow[k], rel=1e-12), k
    assert 0.85 < fast["cuda_graph_share"] < 0.95 and 2.2 < fast["accept_len_mean"] < 2.5


def test_bench_script_runs(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "logparse_speed.py"), "--size-mb", "2",
                           "--also-mb", "1", "--records-mb", "1", "--dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, check=True)
    res = json.loads(proc.stdout)
    big, records = res["fast_large_2mb"], res["records_1mb"]
    assert big["bytes"] >= 2 << 20 and big["mb_per_s"] > 0 and big["max_rss_mib"] > 0
    assert records["decode_lines"] > 0
    assert list(tmp_path.iterdir()) == []   # generated logs removed
