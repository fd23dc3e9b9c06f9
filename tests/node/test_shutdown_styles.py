"""Both SGLang shutdown styles are recorded by stop.py (engines-2026.md A7), with the same guarantees:
nothing of the server's session left, GPUs verified free; envcheck reads the graph config back per version.
The real 0.5.17's shutdown, replayed from its recorded log and timeline, is recorded as tree-kill."""
from __future__ import annotations

import json

import pytest

from specab.node import start, stop
from tests.node.helpers import (HERE, NODE_DIR_SRC, PY, REPO, run_tool, server, session_pids,  # noqa: F401
                                sim, wait_for)

@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_stop_records_the_engine_shutdown_style_and_leaves_nothing(server, sim, version, monkeypatch):  # noqa: F811
    for k, v in sim.env.items():
        monkeypatch.setenv(k, v)
    # the node's spelling of cuda_graph_max_bs: 16 (specab/vocab/engines.py spell_args)
    graph = {"cuda_graph_max_bs_decode": 16} if version == "0.5.23" else {"cuda_graph_max_bs": 16}
    script = server.write_sim_launch(env_lines=f"SPECAB_SIM_SGLANG_VERSION={version}\n", scale=20, args=graph)
    # started in-process, as the run queue's sequencer does: this process is the server's parent, so stop.py
    # can read the main process's exit status
    rec = start.main(["--node-dir", str(server.node_dir), "--run-dir", str(server.run_dir), "--script", str(script),
                      "--host", "127.0.0.1", "--port", str(server.port)])
    assert server.ready(120).rc == 0
    r = run_tool("envcheck", "--node-dir", server.node_dir, "--env-file", server.run_dir / "nccl.env",
                 "--url", server.url, "--expected-args", server.run_dir / "args.json",
                 "--log", server.run_dir / "server.log", env=sim.env)
    assert r.rc == 0, r.error
    assert r.data["engine"]["version"] == version and r.data["engine"]["generation"] == version
    assert r.data["engine"]["decode_graph_max_bs"] == 16
    if version == "0.5.23":
        assert r.data["server_info_endpoint"] == "/server_info"
        assert r.data["args"]["cuda_graph_max_bs_decode"]["read_from"] == "cuda_graph_config.decode.max_bs"
    else:
        assert r.data["engine"]["graph_readback"] == "flat"

    out = stop.main(["--node-dir", str(server.node_dir), "--smi", sim.smi_json, "--grace", "30",
                     "--out", str(server.run_dir / "stop.json")])
    sd = out["shutdown"]
    assert not out["escalated"] and sd["children_gone_before_our_kill"] and len(sd["children"]) >= 2
    assert [s["signal"] for s in out["signals"]] == ["SIGTERM"], "the engine ended itself: no SIGKILL of ours"
    if version == "0.5.23":
        assert sd["style"] == "shutdown-req" and sd["shutdown_req_seen"]
        assert sd["main_exit"] == {"observable": True, "code": 0, "status": 0}
    else:
        assert sd["style"] == "tree-kill" and not sd["shutdown_req_seen"]
        assert sd["main_exit"] == {"observable": True, "signal": 9, "status": -9}
    assert json.loads((server.run_dir / "stop.json").read_text())["shutdown"]["style"] == sd["style"]
    assert json.loads((server.node_dir / "last_server.json").read_text())["stop"]["shutdown"]["style"] == sd["style"]
    # the same guarantees for both styles: nothing of our session left, GPUs verified free
    assert not session_pids(rec["sid"])
    free = server.gpufree(60)
    assert free.rc == 0, free.error


def test_a_stop_that_is_not_the_servers_parent_says_the_exit_status_is_not_observable(server, sim):  # noqa: F811
    server.write_sim_launch(env_lines="SPECAB_SIM_SGLANG_VERSION=0.5.23\n", scale=20)
    assert server.start().rc == 0 and server.ready(120).rc == 0     # start.py exits: the server is orphaned
    r = server.stop(30)
    assert r.rc == 0, r.error
    sd = r.data["shutdown"]
    assert sd["style"] == "shutdown-req" and sd["main_exit"]["observable"] is False
    assert "not a child" in sd["main_exit"]["why"]


def test_stop_records_the_real_0517_shutdown_replayed_on_its_own_timeline(server, sim, monkeypatch):  # noqa: F811
    """specab's stop of the real 0.5.17 EAGLE-3 arm on the H200, replayed: the engine's own log lines after the
    group SIGTERM (drain begun, the scheduler dead of the SIGTERM, SIGQUIT, 5 s of crash diagnostics,
    kill_process_tree(include_parent=True)) at their log times x 0.25, then the SIGKILL of its tree and itself."""
    for k, v in sim.env.items():
        monkeypatch.setenv(k, v)
    fix = REPO / "tests" / "fixtures" / "sglang-0.5.17" / "specab-run"
    scale = 0.25
    script = server.run_dir / "launch.sh"
    script.write_text("#!/bin/bash\nexec %s %s --stop-log %s --stop-json %s --scale %s\n" % (
        PY, HERE / "replay_shutdown.py", fix / "eagle3-s2.stop.log", fix / "eagle3-s2.stop.json", scale))
    script.chmod(0o755)
    rec = start.main(["--node-dir", str(server.node_dir), "--run-dir", str(server.run_dir), "--script", str(script),
                      "--host", "127.0.0.1", "--port", str(server.port)])
    log = server.run_dir / "server.log"
    assert wait_for(lambda: "ready to roll" in log.read_text(), 30), log.read_text()

    out = stop.main(["--node-dir", str(server.node_dir), "--smi", sim.smi_json, "--grace", "30",
                     "--out", str(server.run_dir / "stop.json")])
    sd = json.loads((server.run_dir / "stop.json").read_text())["shutdown"]
    assert sd == out["shutdown"]
    assert sd["style"] == "tree-kill" and not out["escalated"]
    assert [s["signal"] for s in out["signals"]] == ["SIGTERM"], "the engine ended itself: no SIGKILL of ours"
    # this process started it (as the sequencer does): the status is the SIGKILL kill_process_tree sent itself
    assert sd["main_exit"] == {"observable": True, "signal": 9, "status": -9}
    assert sd["kill_tree"] == {"parent_pid": rec["pid"], "include_parent": True, "pid": rec["pid"]}
    assert sd["drain_begun"] and sd["drain_lines"] == 0 and sd["sigquit_seen"]
    assert [(c["name"], c["exit_code"]) for c in sd["children_crashed"]] == [("scheduler_0", -15)]
    assert len(sd["children"]) == 3 and sd["children_crashed"][0]["pid"] in sd["children"]
    # the real timeline: 6 s of the engine's log clock from its SIGTERM line to kill_process_tree (6.19 s to
    # all gone on the H200), replayed at x 0.25
    assert sd["log_sigterm_to_kill_tree_s"] == 6.0
    assert 6.0 * scale <= out["term_to_gone_s"] < 6.0 * scale + 2.0, out["term_to_gone_s"]
    assert not session_pids(rec["sid"])
