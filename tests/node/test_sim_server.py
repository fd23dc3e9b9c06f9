"""The node tools against the simulated SGLang server (``python -m specab.sim.launch_server``):
real process tree (schedulers, detokenizer, parent-death signal, setproctitle titles), SGLang's
log lines, NCCL echo lines, /get_server_info, and the simulator's faults."""
from __future__ import annotations

import json
import os
import signal


from tests.node.helpers import run_tool, session_pids, wait_for

TUNED = ("NCCL_PROTO=LL\nNCCL_ALGO=Ring\nNCCL_P2P_LEVEL=SYS\nNCCL_MAX_NCHANNELS=16\nNCCL_BUFFSIZE=16777216\n"
         "NCCL_NTHREADS=512\nNCCL_DEBUG=INFO\nSGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1\n")


def _envcheck(server, *extra):
    return run_tool("envcheck", "--node-dir", server.node_dir, "--env-file", server.run_dir / "nccl.env",
                    "--url", server.url, "--expected-args", server.run_dir / "args.json",
                    "--log", server.run_dir / "server.log", *extra, env=server.sim.env)


def test_sim_full_cycle(server, sim):
    server.write_sim_launch(env_lines=TUNED, args={"trust_remote_code": True, "disable_custom_all_reduce": True})
    assert server.start().rc == 0
    r = server.ready(120, "--progress", str(server.run_dir / "progress.json"))
    assert r.rc == 0, r.error
    assert {"load_weight_begin", "load_weight_end", "capture_cuda_graph_begin", "capture_cuda_graph_end",
            "ready_line"} <= set(r.data["phases"])
    obs = r.data["durations_observed"]
    if r.data["phases"]["load_weight_begin"]["live"]:  # ready.py was watching before weights began
        assert obs["weights_to_ready_s"] is not None and 0 < obs["weights_to_ready_s"] < 30
    rec = json.loads((server.node_dir / "server.json").read_text())

    r = _envcheck(server)
    assert r.rc == 0, r.error
    names = sorted(p["name"] for p in r.data["processes"] if not p["skipped"])
    # SGLang leaves its main process untitled (its command line), titles the children (0.5.23, as the real 0.5.17)
    assert [n for n in names if n.startswith("sglang::")] == ["sglang::detokenizer", "sglang::scheduler_TP0",
                                                              "sglang::scheduler_TP1"]
    assert len(names) == 4 and any("specab.sim.launch_server" in n for n in names)
    for var in ("NCCL_PROTO", "NCCL_BUFFSIZE", "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"):
        assert len([e for e in r.data["variables"][var]["evidence"] if e.startswith("environ:")]) == 4, var
    assert {"nccl_log:TP0", "nccl_log:TP1"} <= set(r.data["variables"]["NCCL_BUFFSIZE"]["evidence"])
    assert all(a["ok"] for a in r.data["args"].values()), r.data["args"]

    before = sim.memory_used()
    assert before[0] > 0 and before[1] > 0
    r = server.stop(30)
    assert r.rc == 0, r.error
    assert not r.data["escalated"] and not session_pids(rec["sid"])
    r = server.gpufree(60)
    assert r.rc == 0, r.error
    assert r.data["final"][0]["memory_used_mib"] == 0


def test_sim_envcheck_catches_a_missing_worker_variable_via_nccl(server, sim):
    """Without SPT_NOENV the titled processes' environ is wiped: NCCL's own lines are the evidence,
    and a launch that did not source the env file is caught anyway."""
    server.write_sim_launch(env_lines=TUNED, spt_noenv=False)
    script = server.run_dir / "launch.sh"
    script.write_text(script.read_text().replace(". ./nccl.env", "export NCCL_DEBUG=INFO"))
    assert server.start().rc == 0
    assert server.ready(120).rc == 0
    r = _envcheck(server)
    assert r.rc == 1
    # the untitled main process (SGLang does not title it) keeps a readable environ, without the variable: that is
    # the evidence now; the titled schedulers' environ is wiped (the message says how to keep it readable)
    problems = r.data["variables"]["NCCL_PROTO"]["mismatches"]
    assert any("specab.sim.launch_server" in m and "does not have it" in m for m in problems), problems
    assert "SPT_NOENV=1" in r.error


def test_sim_oom_at_start_fails_fast(server, sim):
    server.write_sim_launch(fault="oom_at_start")
    assert server.start().rc == 0
    r = server.ready(300)
    assert r.rc == 1 and r.wall_s < 60
    assert "out of memory" in r.error and "CUDA out of memory" in r.data["fatal_line"]


def test_sim_unknown_flag_fails_fast(server, sim):
    server.write_sim_launch(extra_args="--no-such-flag 3")
    assert server.start().rc == 0
    r = server.ready(300)
    assert r.rc == 1 and r.wall_s < 60
    assert "unrecognized arguments: --no-such-flag" in r.error


def test_sim_port_in_use_fails_fast(server, sim):
    server.write_sim_launch(fault="port_in_use")
    assert server.start().rc == 0
    r = server.ready(300)
    assert r.rc == 1 and r.wall_s < 60
    assert "address already in use" in r.error.lower()


def test_sim_ignore_sigterm_escalates(server, sim):
    server.write_sim_launch(fault="ignore_sigterm")
    assert server.start().rc == 0 and server.ready(120).rc == 0
    r = server.stop(1.0)
    assert r.rc == 0, r.error
    assert r.data["escalated"] is True
    assert [s["signal"] for s in r.data["signals"]][:2] == ["SIGTERM", "SIGKILL"]
    assert server.gpufree(60).rc == 0


def test_sim_orphan_workers_swept_after_parent_death(server, sim):
    server.write_sim_launch(fault="orphan_workers")
    assert server.start().rc == 0 and server.ready(120).rc == 0
    rec = json.loads((server.node_dir / "server.json").read_text())
    os.kill(rec["pid"], signal.SIGKILL)
    assert wait_for(lambda: rec["pid"] not in session_pids(rec["sid"]))
    assert len(session_pids(rec["sid"])) == 3, "TP0, TP1, detokenizer orphaned"
    assert sim.memory_used()[0] > 0
    r = server.stop(2.0)
    assert r.rc == 0, r.error
    assert not session_pids(rec["sid"])
    r = server.gpufree(60)
    assert r.rc == 0, r.error


def test_sim_slow_release_time_to_free(server, sim):
    server.write_sim_launch(fault="slow_release=30", scale=10)  # 30 simulated s / 10 = 3 s
    assert server.start().rc == 0 and server.ready(120).rc == 0
    stop = server.stop()
    assert stop.rc == 0
    r = server.gpufree(60)
    assert r.rc == 0, r.error
    assert r.data["free_at"] >= stop.data["signals"][0]["t"] + 3.0 - 0.2
    if r.data["initial"][0]["memory_used_mib"]:  # first poll within the lag: the list emptied first
        assert not r.data["initial"][0]["compute_processes"]
    r2 = server.gpufree(60)
    assert r2.data["was_free_at_first_poll"] is True
