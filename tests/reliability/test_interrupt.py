"""The driver is terminated (SIGTERM, as a batch system or `kill` sends it) while the model loads
(SIGINT mid-benchmark is tests/driver/test_e2e_sim.py)."""
from __future__ import annotations

import signal
from pathlib import Path

import pytest

from specab.results import store as st
from tests.driver.simnode import SimNode, driver, free_port, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ONE_ARM = "arms:\n  - name: baseline\n"


def test_item09_sigterm_while_loading_leaves_no_server_and_resume_completes(tmp_path: Path):
    # the default profile loads for seconds (weights, graphs); time scale 0.5 doubles that: a window to hit
    node = SimNode(root=tmp_path, port=free_port(), time_scale="0.5")
    exp = node.write_experiment("term", arms=ONE_ARM, num_requests=2, output_len=16)
    common = ["-e", str(exp), "-i", str(node.write_inventory()), "--runs-dir", str(node.runs_dir)]
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    proc = driver("--repeats", "1", *common, env=env)
    try:
        log = node.node_dir / "runs" / "001-baseline" / "server.log"

        def loading() -> bool:
            s = node.server()
            if not (s and s.get("run_id") == "001-baseline" and node.server_alive() and log.exists()):
                return False
            text = log.read_text(errors="replace")
            return "Load weight begin" in text and "fired up and ready" not in text
        wait_for(loading, timeout=300, interval=0.05, what="run 001 loading the model", proc=proc)
        at_signal = log.read_text(errors="replace")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        node.cleanup()
    assert proc.returncode == 130, out[-3000:]
    assert "--resume" in out
    assert "fired up and ready" not in at_signal, "the signal came after the load"
    assert not node.server_alive() and node.gpus_busy() == []          # nothing of ours left running
    exp_dir = next(d for d in node.runs_dir.iterdir() if (d / st.FILENAME).exists())
    with st.Store.open(exp_dir) as s:                                   # the store is consistent
        assert s.experiment()["status"] == "interrupted"
        assert [(r["seq"], r["status"]) for r in s.runs()] == [(1, "interrupted")]
        assert len(s.plan()) == 1 and [r["seq"] for r in s.missing()] == [1]
    proc = driver("--resume", exp_dir.name, "--runs-dir", str(node.runs_dir), env=env)
    try:
        out, _ = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        node.cleanup()
    assert proc.returncode == 0, out[-3000:]
    assert "1 of 1 runs to do" in out
    with st.Store.open(exp_dir) as s:
        runs = s.runs()
        assert [(r["seq"], r["status"]) for r in runs] == [(1, "ok")]
        assert runs[0]["attempt"] == 2 and s.experiment()["status"] == "finished"
        assert len(s.requests()) == 2
    assert not node.server_alive() and node.gpus_busy() == []
