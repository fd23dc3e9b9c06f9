"""One server's life through the node tools, as the roles run them: start → ready → envcheck →
stop → gpufree, on a simulated GPU node (``specab.sim.smi``), plus the refusals of start."""
from __future__ import annotations

import json
import os
import socket
import subprocess

from tests.node.helpers import PY, run_tool, session_pids, ship_node_package, wait_for


def test_full_cycle_start_ready_envcheck_stop_gpufree(server, sim):
    r = server.start()
    assert r.rc == 0, r.error
    rec = json.loads((server.node_dir / "server.json").read_text())
    assert rec["pid"] == r.data["pid"] == rec["pgid"] == rec["sid"], "server must lead its own session"
    assert rec["pid"] != os.getsid(0)
    for key in ("port", "host", "run_id", "arm", "started_at", "launch"):
        assert key in rec
    assert (rec["run_id"], rec["arm"], rec["port"]) == ("001-baseline", "baseline", server.port)
    assert r.wall_s < 10, "start returns at once"

    progress = server.run_dir / "progress.json"
    r = server.ready(120, "--progress", str(progress), "--phases-out", str(server.run_dir / "ready.json"))
    assert r.rc == 0, r.error
    assert r.data["ready"] and r.data["endpoint"] == "/health_generate"
    assert {"load_weight_begin", "load_weight_end", "capture_cuda_graph_begin", "capture_cuda_graph_end",
            "ready_line"} <= set(r.data["phases"])
    assert json.loads(progress.read_text())["phase"] == "ready"
    assert json.loads((server.run_dir / "ready.json").read_text())["ok"] is True
    assert len(sim.query("apps").splitlines()) == 2, "two TP workers hold GPU memory"

    r = run_tool("envcheck", "--node-dir", server.node_dir, "--env-file", server.run_dir / "nccl.env",
                 "--url", server.url, "--expected-args", server.run_dir / "args.json",
                 "--log", server.run_dir / "server.log", "--out", server.run_dir / "env_check.json",
                 "--server-info-out", server.run_dir / "server_info.json", env=sim.env)
    assert r.rc == 0, r.error
    proto = r.data["variables"]["NCCL_PROTO"]
    assert not proto["mismatches"]
    assert len([e for e in proto["evidence"] if e.startswith("environ:")]) == 3  # main + TP0 + TP1
    assert {"nccl_log:TP0", "nccl_log:TP1"} <= set(proto["evidence"])
    assert all(a["ok"] for a in r.data["args"].values())
    assert json.loads((server.run_dir / "server_info.json").read_text())["tp_size"] == 2

    r = server.stop(30, "--out", str(server.run_dir / "stop.json"))
    assert r.rc == 0, r.error
    assert r.data["was_running"] and not r.data["escalated"]
    assert [s["signal"] for s in r.data["signals"]] == ["SIGTERM"]
    assert r.data["signals"][0]["target"] == "pgid" and r.data["signals"][0]["id"] == rec["pgid"]
    assert not session_pids(rec["sid"]), "nothing of the server's session is left"
    assert not (server.node_dir / "server.json").exists()
    assert json.loads((server.node_dir / "last_server.json").read_text())["pid"] == rec["pid"]

    r = server.gpufree(60, "--out", str(server.run_dir / "gpu_free.json"), "--csv", str(server.run_dir / "gpu_after.csv"))
    assert r.rc == 0, r.error
    assert r.data["time_to_free_s"] >= 0 and all(g["memory_used_mib"] <= 64 for g in r.data["final"])
    assert (server.run_dir / "gpu_after.csv").read_text().startswith("timestamp,index,uuid")

    # the port is free again: a second start on it succeeds
    assert server.start().rc == 0


def test_stop_is_idempotent_and_records_nothing_when_nothing_ran(server, sim):
    r = server.stop()
    assert (r.rc, r.data["was_running"], r.data["signals"]) == (0, False, [])
    assert server.start().rc == 0
    assert server.ready().rc == 0
    assert server.stop().data["was_running"] is True
    r = server.stop()
    assert (r.rc, r.data["was_running"], r.data["signals"]) == (0, False, [])


def test_start_refuses_while_our_server_lives(server, sim):
    first = server.start()
    assert first.rc == 0
    r = server.start()
    assert r.rc == 1
    assert "live server of ours" in r.error and str(first.data["pid"]) in r.error and "stop" in r.error
    assert json.loads((server.node_dir / "server.json").read_text())["pid"] == first.data["pid"]


def test_start_writes_the_server_log_for_its_owner_alone_even_over_an_earlier_log(server, sim):
    """The engine's log may print its args, a secret --api-key among them: 0600 when new, and an earlier run's
    log (0644, written before) is truncated and made 0600 too, whatever the umask."""
    (server.run_dir / "server.log").write_text("an earlier start's log\n")
    os.chmod(server.run_dir / "server.log", 0o644)
    old_umask = os.umask(0)
    try:
        r = server.start()
    finally:
        os.umask(old_umask)
    assert r.rc == 0, r.error
    log = server.run_dir / "server.log"
    assert log.stat().st_mode & 0o777 == 0o600
    assert "an earlier start's log" not in log.read_text()


def test_start_refuses_a_taken_port_naming_the_holder(server, sim):
    holder = subprocess.Popen([PY, "-c", "import socket,time,sys; s=socket.socket(); "
                               "s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); print('up', flush=True); "
                               "time.sleep(600)", str(server.port)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "up"
        r = server.start()
        assert r.rc == 1
        assert "port %d is already taken" % server.port in r.error
        assert "PID %d" % holder.pid in r.error and "user root" in r.error and "time.sleep(600)" in r.error
        assert r.data["holders"][0]["pid"] == holder.pid
        assert not (server.node_dir / "server.json").exists(), "nothing started"
        assert not (server.run_dir / "server.log").exists()
    finally:
        holder.kill()
        holder.wait()


def test_start_replaces_a_stale_record_of_a_dead_server(server, sim):
    dead = subprocess.Popen([PY, "-c", "pass"])
    dead.wait()
    (server.node_dir).mkdir(parents=True, exist_ok=True)
    (server.node_dir / "server.json").write_text(json.dumps({"pid": dead.pid, "pgid": dead.pid, "sid": dead.pid,
                                                             "run_id": "000-old"}))
    r = server.start()
    assert r.rc == 0, r.error
    assert r.data["replaced_stale_record"]["run_id"] == "000-old"


def test_start_refuses_a_non_executable_script(server, sim):
    script = server.write_launch()
    os.chmod(script, 0o644)
    r = server.start()
    assert r.rc == 1 and "not executable" in r.error


def test_tools_run_from_the_package_shipped_to_a_bin_dir(tmp_path, server, sim):
    """The roles ship the package (specab/__init__.py, specab/node/*.py) into {{ specab_node_dir }}/bin and run
    `python <bin>/specab/node TOOL` there."""
    tools = ship_node_package(tmp_path / "bin")
    env = {"PATH": os.environ["PATH"], "SPECAB_SIM_STATE": sim.env["SPECAB_SIM_STATE"],
           "PYTHONPATH": sim.env["PYTHONPATH"]}  # PYTHONPATH only for the simulated smi
    r = run_tool("gpufree", "--smi", sim.smi_json, "--gpus", "0,1", "--threshold-mib", "64", "--timeout", "10", env=env,
                 tools=tools)
    assert r.rc == 0, r.error
    assert r.data["gpus"] == [0, 1]
    r = run_tool("stop", "--node-dir", server.node_dir, "--smi", sim.smi_json, "--grace", "15", env=env,
                 tools=tools)
    assert r.rc == 0 and r.data["was_running"] is False


def test_bad_usage_exits_2(sim):
    r = run_tool("gpufree", "--smi", "nvidia-smi", "--gpus", "all", "--threshold-mib", "64", "--timeout", "1",
                 env=sim.env)
    assert r.rc == 2 and "JSON list" in r.stderr
    r = run_tool("gpufree", "--smi", sim.smi_json, "--gpus", "zero", "--threshold-mib", "64", "--timeout", "1",
                 env=sim.env)
    assert r.rc == 2 and "--gpus must be" in r.error
    r = run_tool("stop", env=sim.env)
    assert r.rc == 2


def test_survivors_of_a_dead_server_block_start_and_are_swept_by_stop(server, sim):
    """The main process died but workers of its session live on (holding GPU memory): start
    refuses, naming them; stop (nothing of the main left) kills them through the session."""
    server.config["fault"] = "orphan_workers"
    assert server.start().rc == 0 and server.ready().rc == 0
    rec = json.loads((server.node_dir / "server.json").read_text())
    os.kill(rec["pid"], 9)
    assert wait_for(lambda: len(session_pids(rec["sid"])) == 2)
    r = server.start()
    assert r.rc == 1 and "2 process(es) of its session are still alive" in r.error
    assert "sglang::scheduler_TP0" in r.error and "stop.py" in r.error
    r = server.stop(1)
    assert r.rc == 0, r.error
    assert not session_pids(rec["sid"])
    assert server.gpufree().rc == 0
    assert server.start().rc == 0


def test_stop_without_record_sweeps_leftovers_of_the_last_server(server, sim):
    """A worker that survived (e.g. it was in uninterruptible sleep during the last stop) is still
    ours through last_server.json: the next stop kills it, nothing else."""
    bystander = sim.hold(3, 100)  # own session: not ours
    assert server.start().rc == 0 and server.ready().rc == 0
    rec = json.loads((server.node_dir / "server.json").read_text())
    (server.node_dir / "last_server.json").write_text(json.dumps(rec))
    (server.node_dir / "server.json").unlink()  # as if a previous stop had recorded it as stopped
    r = server.stop()
    assert r.rc == 0 and r.data["was_running"] is False
    assert len(r.data["leftovers_killed"]) == 3
    assert not session_pids(rec["sid"])
    assert bystander.poll() is None


def test_teardown_stops_the_server_waits_for_free_gpus_and_says_when_each_phase_began(server, sim):
    """The per-run playbook's rescue tears a failed run down with one tool (teardown.py, the run queue's own
    sequence): the server stopped, the GPUs verified free, both recorded in the run directory, and the phases it
    went through with their offsets from its start, in the run queue's names."""
    assert server.start().rc == 0 and server.ready().rc == 0
    rec = json.loads((server.node_dir / "server.json").read_text())
    r = run_tool("teardown", "--node-dir", server.node_dir, "--smi", sim.smi_json, "--gpus", "all",
                 "--grace", "30", "--gpu-free-timeout", "60", "--threshold-mib", "64", "--run-dir", server.run_dir,
                 env=sim.env)
    assert r.rc == 0, r.error
    assert r.data["stop"]["was_running"] and not session_pids(rec["sid"])
    assert r.data["gpu_free"]["time_to_free_s"] >= 0 and all(g["memory_used_mib"] <= 64 for g in r.data["gpu_free"]["final"])
    assert [p["phase"] for p in r.data["phases"]] == ["stopping", "gpus free"]
    stop_rec = json.loads((server.run_dir / "stop.json").read_text())
    # the GPU wait began once stop had seen our processes gone, before stop's end
    assert 0 <= r.data["phases"][1]["t_rel_s"] <= stop_rec["total_s"] + 0.5, (r.data["phases"], stop_rec["total_s"])
    assert json.loads((server.run_dir / "gpu_free.json").read_text())["ok"] is True
    assert (server.run_dir / "gpu_free.csv").read_text().startswith("timestamp,index,uuid")
    # nothing left to stop: the teardown records an idle stop and still verifies the GPUs free
    again = run_tool("teardown", "--node-dir", server.node_dir, "--smi", sim.smi_json, "--gpus", "all",
                     "--grace", "30", "--gpu-free-timeout", "60", "--threshold-mib", "64", env=sim.env)
    assert again.rc == 0 and not again.data["stop"]["was_running"], again.data
