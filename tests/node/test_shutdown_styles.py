"""Both SGLang shutdown styles are recorded by stop.py (engines-2026.md A7), with the same guarantees:
nothing of the server's session left, GPUs verified free; envcheck reads the graph config back per version."""
from __future__ import annotations

import json
import sys

import pytest

from tests.node.helpers import NODE_DIR_SRC, run_tool, server, session_pids, sim  # noqa: F401  (fixtures)

sys.path.insert(0, str(NODE_DIR_SRC))
import start  # noqa: E402
import stop  # noqa: E402


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_stop_records_the_engine_shutdown_style_and_leaves_nothing(server, sim, version, monkeypatch):  # noqa: F811
    for k, v in sim.env.items():
        monkeypatch.setenv(k, v)
    # the node's spelling of cuda_graph_max_bs: 16 (specab/node/engines.py spell_args)
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
