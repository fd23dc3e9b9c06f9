"""Faults as the node tools see them (a start that fails or hangs, SIGTERM ignored, orphans,
slow memory release, a foreign GPU process, nvidia-smi hanging) and env verification failures,
each provoked for real on a simulated node."""
from __future__ import annotations

import json
import os
import signal
import time

from tests.node.helpers import HERE, PY, run_tool, session_pids, wait_for

FAKE_SMI_HANG = json.dumps([PY, str(HERE / "fake_smi.py"), "--mode", "hang"])


# ------------------------------------------------------------------ OOM at start / bad args: fail fast

def test_ready_fails_fast_on_oom_quoting_sglang_line(server):
    server.config["fault"] = "oom"
    server.config["load_s"] = 0.3
    assert server.start().rc == 0
    r = server.ready(300)
    assert r.rc == 1
    assert r.wall_s < 60, "fail fast, not at the 300 s timeout"
    assert "out of memory" in r.error
    assert "Not enough memory. Please try to increase --mem-fraction-static." in r.error
    assert r.data["fatal_line"] and "Not enough memory" in r.data["fatal_line"]
    assert any("Load weight begin" in l for l in r.data["log_tail"])


def test_ready_fails_fast_on_unrecognized_arguments(server):
    server.write_launch(extra_args="--bogus-flag 1")
    assert server.start().rc == 0
    r = server.ready(300)
    assert r.rc == 1 and r.wall_s < 60
    assert "unrecognized arguments: --bogus-flag" in r.error


def test_ready_fails_fast_when_the_process_exits(server):
    server.config["fault"] = "die_during_load"
    server.config["load_s"] = 1.0
    assert server.start().rc == 0
    r = server.ready(300)
    assert r.rc == 1 and r.wall_s < 60
    assert "exited before it was ready" in r.error and "phase 'loading weights'" in r.error
    assert "Load weight begin" in r.error, "the log tail is quoted"


def test_ready_times_out_with_phase_and_tail(server):
    server.config["load_s"] = 30
    assert server.start().rc == 0
    log = server.run_dir / "server.log"
    assert wait_for(lambda: "Load weight begin" in log.read_text(), 30)
    r = server.ready(1.5)
    assert r.rc == 1
    assert "not ready after 1.5s" in r.error and "loading weights" in r.error


# ------------------------------------------------------------------ SIGTERM ignored: escalate

def test_stop_escalates_to_sigkill_after_grace(server, sim):
    server.config["fault"] = "ignore_sigterm"
    assert server.start().rc == 0
    assert server.ready().rc == 0
    rec = json.loads((server.node_dir / "server.json").read_text())
    r = server.stop(1.0)
    assert r.rc == 0, r.error
    assert r.data["escalated"] is True
    sigs = [(s["signal"], s["target"]) for s in r.data["signals"]]
    assert sigs[0] == ("SIGTERM", "pgid") and ("SIGKILL", "pgid") in sigs
    term_t = r.data["signals"][0]["t"]
    kill_t = next(s["t"] for s in r.data["signals"] if s["signal"] == "SIGKILL")
    assert kill_t - term_t >= 1.0, "SIGKILL only after the grace period"
    assert r.data["kill_to_gone_s"] is not None and r.data["total_s"] >= 1.0
    assert rec["pid"] in [x["pid"] for x in r.data["survivors_after_grace"]]
    assert not session_pids(rec["sid"])
    assert server.gpufree().rc == 0


# ------------------------------------------------------------------ orphaned workers keep GPU memory

def test_stop_sweeps_orphaned_workers_outside_the_group(server, sim):
    """Workers in their own process group (renamed, so `pkill -f` would miss them) would miss the
    SIGTERM to the server's group and keep their GPU memory: stop finds them through our session,
    signals them too, and the GPUs become free."""
    server.config["fault"] = "orphan_workers"
    assert server.start().rc == 0
    assert server.ready().rc == 0
    rec = json.loads((server.node_dir / "server.json").read_text())
    apps = [int(l.split(",")[0]) for l in sim.query("apps").splitlines()]
    assert len(apps) == 2 and all(os.getpgid(p) != rec["pgid"] and os.getsid(p) == rec["sid"] for p in apps)
    r = server.stop(30.0)
    assert r.rc == 0, r.error
    termed = {s["id"] for s in r.data["signals"] if s["signal"] == "SIGTERM" and s["target"] == "pid"}
    assert set(apps) == termed, "the workers outside the group got their own SIGTERM"
    assert not r.data["escalated"] and r.data["term_to_gone_s"] < 25, "no wait for the grace period"
    assert not session_pids(rec["sid"])
    r = server.gpufree(60)
    assert r.rc == 0, r.error
    assert all(g["memory_used_mib"] == 0 for g in r.data["final"])


def test_stop_finds_orphans_after_the_main_process_died(server, sim):
    server.config["fault"] = "orphan_workers"
    assert server.start().rc == 0
    assert server.ready().rc == 0
    rec = json.loads((server.node_dir / "server.json").read_text())
    os.kill(rec["pid"], signal.SIGKILL)  # the parent dies; workers are orphaned, memory held
    assert wait_for(lambda: len(session_pids(rec["sid"])) == 2)
    assert sum(sim.memory_used().values()) == 2000
    r = server.stop(2.0)
    assert r.rc == 0, r.error
    assert r.data["was_running"] is True
    assert not session_pids(rec["sid"])
    assert server.gpufree().rc == 0


# ------------------------------------------------------------------ slow memory release

def test_gpufree_waits_for_slow_release_and_records_time(server, sim):
    lag = 3.0
    server.config["release_lag"] = lag
    assert server.start().rc == 0
    assert server.ready().rc == 0
    stop = server.stop()
    assert stop.rc == 0
    died = stop.data["signals"][0]["t"]  # SIGTERM; the workers exit on it
    r = server.gpufree(60)
    assert r.rc == 0, r.error
    assert r.data["free_at"] >= died + lag - 0.2, "did not report free while the memory was still held"
    first = r.data["initial"][0]
    if first["memory_used_mib"]:  # the first poll came within the lag (always, unless the machine crawls)
        assert first["compute_processes"] == [] and first["memory_used_mib"] == 1000, \
            "compute apps empty before memory drops: both conditions are needed"
        assert r.data["polls"] >= 2 and r.data["time_to_free_s"] > 0


def test_gpufree_needs_both_conditions():
    import sys
    from specab.node import gpufree

    def snap(mem, procs):
        return {"gpus": [{"index": 0, "memory_used_mib": 0, "compute_processes": []},
                         {"index": 1, "memory_used_mib": mem, "compute_processes": procs}]}
    assert gpufree.is_free(snap(0, []), 64)
    assert gpufree.is_free(snap(64, []), 64)
    assert not gpufree.is_free(snap(8719, []), 64), "list empty, memory not yet released"
    assert not gpufree.is_free(snap(0, [{"pid": 430}]), 64), "memory 0 but a compute process"
    assert not gpufree.is_free(snap(None, []), 64), "[N/A] memory is never free"


def test_gpufree_timeout_prints_the_gpu_table(server, sim):
    holder = sim.hold(1, 3000, title="sglang::scheduler_TP1")
    st = open("/proc/%d/stat" % holder.pid).read()
    start_ticks = int(st[st.rfind(")") + 2:].split()[19])
    server.node_dir.mkdir(parents=True, exist_ok=True)  # a record that makes the holder ours
    (server.node_dir / "server.json").write_text(json.dumps(
        {"pid": holder.pid, "pgid": holder.pid, "sid": holder.pid, "starttime": start_ticks}))
    r = server.gpufree(1.0)
    assert r.rc == 1
    assert "GPUs not free after 1s" in r.error
    assert "GPU 1: memory.used 3000 MiB (threshold 64) BUSY" in r.error
    assert "PID %d" % holder.pid in r.error and "(ours, 3000 MiB)" in r.error
    assert "GPU 0: memory.used 0 MiB (threshold 64) OK, compute processes: none" in r.error


# ------------------------------------------------------------------ a foreign process on our GPU

def test_foreign_gpu_process_refused_at_once_and_never_killed(server, sim):
    foreign = sim.hold(0, 4000, title="someone-elses-training")
    t0 = time.monotonic()
    r = server.gpufree(60)
    assert r.rc == 1 and time.monotonic() - t0 < 15, "refused at once, not after the timeout"
    assert "GPU 0 is used by a process that is not ours" in r.error
    assert "PID %d" % foreign.pid in r.error and "user root" in r.error
    assert "someone-elses-training" in r.error and "--force-foreign" in r.error
    assert r.data["foreign"] == {"gpu": 0, "pid": foreign.pid, "user": "root",
                                 "command": "someone-elses-training", "used_memory_mib": 4000}
    # our own server comes and goes: stop leaves the foreign process alone
    assert server.start().rc == 0 and server.ready().rc == 0
    r = server.stop()
    assert r.rc == 0
    assert [f["pid"] for f in r.data["gpu_foreign"]] == [foreign.pid]
    assert all(s["id"] != foreign.pid for s in r.data["signals"])
    assert foreign.poll() is None, "the foreign process is alive"
    # only the explicit force option kills it
    r = run_tool("stop", "--node-dir", server.node_dir, "--smi", sim.smi_json, "--grace", "15", "--force-foreign",
                 env=sim.env)
    assert r.rc == 0
    assert foreign.wait(10) == -signal.SIGKILL


# ------------------------------------------------------------------ nvidia-smi hangs

def test_nvidia_smi_hang_is_bounded_and_reported(server, sim):
    r = run_tool("gpufree", "--smi", FAKE_SMI_HANG, "--gpus", "all", "--threshold-mib", "64", "--timeout", "30",
                 "--smi-timeout", "1", env=sim.env)
    assert r.rc == 1 and r.wall_s < 15
    assert "nvidia-smi did not answer within 1 s" in r.error and "fake_smi.py" in r.error
    assert server.start().rc == 0 and server.ready().rc == 0
    rec = json.loads((server.node_dir / "server.json").read_text())
    r = run_tool("stop", "--node-dir", server.node_dir, "--smi", FAKE_SMI_HANG, "--grace", "15", "--smi-timeout", "1",
                 env=sim.env)
    assert r.rc == 1 and "nvidia-smi did not answer within 1 s" in r.error
    assert "server's processes are gone" in r.error
    assert not session_pids(rec["sid"])
    assert (server.node_dir / "server.json").exists(), "kept: the orphan check must be retried"
    r = server.stop()
    assert r.rc == 0


def test_nvidia_smi_failure_message(sim):
    smi = json.dumps([PY, str(HERE / "fake_smi.py"), "--mode", "fail"])
    r = run_tool("gpufree", "--smi", smi, "--gpus", "all", "--threshold-mib", "64", "--timeout", "5", env=sim.env)
    assert r.rc == 1 and "nvidia-smi failed (rc 9): Failed to initialize NVML" in r.error


# ------------------------------------------------------------------ env verification failures

def _envcheck(server, *extra):
    return run_tool("envcheck", "--node-dir", server.node_dir, "--env-file", server.run_dir / "nccl.env",
                    "--url", server.url, "--expected-args", server.run_dir / "args.json",
                    "--log", server.run_dir / "server.log", *extra, env=server.sim.env)


def test_envcheck_names_variable_process_and_value_when_a_worker_lacks_it(server):
    server.config["drop_env_in_worker"] = {"1": ["NCCL_PROTO"]}
    server.write_launch()
    assert server.start().rc == 0 and server.ready().rc == 0
    r = _envcheck(server)
    assert r.rc == 1
    assert "NCCL_PROTO: expected 'LL' in every engine process, but sglang::scheduler_TP1 (pid" in r.error
    assert "does not have it" in r.error
    assert r.data["ok"] is False and len(r.data["variables"]["NCCL_PROTO"]["mismatches"]) == 1
    assert not r.data["variables"]["NCCL_DEBUG"]["mismatches"]


def test_envcheck_catches_a_launch_that_does_not_source_the_env_file(server):
    server.write_launch(source_env=False)
    assert server.start().rc == 0 and server.ready().rc == 0
    r = _envcheck(server)
    assert r.rc == 1
    for proc in ("sglang::scheduler_TP0", "sglang::scheduler_TP1"):
        assert "NCCL_PROTO: expected 'LL' in every engine process, but %s" % proc in r.error


def test_envcheck_fails_on_a_server_arg_that_differs(server):
    server.config["server_info_override"] = {"mem_fraction_static": 0.8, "tp_size": 2.0}
    server.write_launch()
    assert server.start().rc == 0 and server.ready().rc == 0
    r = _envcheck(server)
    assert r.rc == 1
    assert "server arg mem_fraction_static: expected 0.88, but the server runs with 0.8" in r.error
    assert r.data["args"]["tp_size"]["ok"] is True, "2 == 2.0"


def test_envcheck_falls_back_to_server_info(server):
    server.config["missing"] = ["/get_server_info"]
    server.write_launch()
    assert server.start().rc == 0 and server.ready().rc == 0
    r = _envcheck(server)
    assert r.rc == 0, r.error
    assert r.data["server_info_endpoint"] == "/server_info"


def test_envcheck_wiped_environ_needs_nccl_evidence(server):
    """Without SPT_NOENV, setproctitle wipes the titled workers' /proc environ: NCCL's own lines
    still prove NCCL_PROTO per rank; NCCL_DEBUG (never echoed) stays unverified and fails."""
    server.write_launch(spt_noenv=False)
    assert server.start().rc == 0 and server.ready().rc == 0
    r = _envcheck(server)
    assert r.rc == 1
    proto, debug = r.data["variables"]["NCCL_PROTO"], r.data["variables"]["NCCL_DEBUG"]
    assert not proto["mismatches"] and not proto["unverified"]
    assert {"nccl_log:TP0", "nccl_log:TP1"} <= set(proto["evidence"])
    assert len(debug["unverified"]) == 2 and "SPT_NOENV=1" in r.error
    assert _envcheck(server, "--allow-unverified").rc == 0


def test_envcheck_never_prints_secret_values(server):
    server.write_launch(env_lines="NCCL_PROTO=LL\nHF_TOKEN=hf_planted_secret_123\n",
                        args={"api_key": "sk-planted-456"})
    server.config["server_info_override"] = {"api_key": "sk-other-789"}
    server.write_launch(env_lines="NCCL_PROTO=LL\nHF_TOKEN=hf_planted_secret_123\n",
                        args={"api_key": "sk-planted-456"})
    assert server.start().rc == 0 and server.ready().rc == 0
    out = server.run_dir / "env_check.json"
    info = server.run_dir / "server_info.json"
    r = _envcheck(server, "--out", str(out), "--server-info-out", str(info))
    assert r.rc == 1  # the api key differs
    text = json.dumps(r.data) + r.stderr + out.read_text() + info.read_text()
    for secret in ("hf_planted_secret_123", "sk-planted-456", "sk-other-789"):
        assert secret not in text
    assert r.data["variables"]["HF_TOKEN"]["expected"] == "<redacted>"
    assert "server arg api_key: expected <redacted>, but the server runs with <redacted>" in r.error


def test_gpu_sweep_kills_compute_processes_of_our_session_only(sim, monkeypatch):
    """The orphan rule itself: a GPU compute process whose session id is our recorded session is
    killed by the sweep; one in another session is only reported."""
    import sys
    from specab.node import stop as stop_tool

    ours = sim.hold(0, 500, title="renamed-by-prctl")      # its own session: sid == its pid
    other = sim.hold(1, 700, title="someone-else")
    st = open("/proc/%d/stat" % ours.pid).read()
    rec = {"pid": ours.pid, "pgid": ours.pid, "sid": ours.pid, "starttime": int(st[st.rfind(")") + 2:].split()[19])}
    monkeypatch.setenv("SPECAB_SIM_STATE", sim.env["SPECAB_SIM_STATE"])
    monkeypatch.setenv("PYTHONPATH", sim.env["PYTHONPATH"])
    stopper = stop_tool.Stopper(rec)
    res = stop_tool.sweep_gpu(stopper, sim.smi, 10, force_foreign=False)
    assert [o["pid"] for o in res["gpu_orphans"]] == [ours.pid]
    assert [(f["pid"], f["command"]) for f in res["gpu_foreign"]] == [(other.pid, "someone-else")]
    assert ours.wait(10) == -signal.SIGKILL
    assert other.poll() is None
    assert [(s["signal"], s["id"]) for s in stopper.signals] == [("SIGKILL", ours.pid)]
