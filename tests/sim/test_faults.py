"""Each SPECAB_SIM_FAULT, and the natural failures (port taken, GPU full, memory fraction too low)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

from specab.sim.gpustate import GpuNode
from tests.sim.client import request_json
from tests.sim.conftest import (PY, REPO, alive, base_env, children_of, compute_pids, free_port,
                                memory_used, wait_for)

GEN = {"text": "hello", "sampling_params": {"max_new_tokens": 8, "ignore_eos": True}}


def test_oom_at_start_prints_cudas_error_and_the_server_dies(launch):
    srv = launch([], env={"SPECAB_SIM_FAULT": "oom_at_start"}, scale=20, tp=2, wait=False)
    rc = srv.wait_exit(60)
    assert rc != 0
    log = srv.log_text()
    assert "Scheduler hit an exception: Traceback (most recent call last):" in log
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate" in log
    assert "Received sigquit from a child process. It usually means the child failed." in log
    assert "The server is fired up" not in log
    wait_for(lambda: compute_pids(srv.state) == [] and memory_used(srv.state) == [0] * 8, 10, "GPUs free")


def test_a_foreign_process_filling_the_gpu_makes_the_scheduler_oom(launch, tmp_path):
    state = tmp_path / "busy"
    hold = subprocess.Popen([PY, "-m", "specab.sim.hold", "--gpu", "1", "--mib", "100000"],
                            env=base_env(state, 1), cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        hold.stdout.readline()
        srv = launch([], scale=20, tp=2, state=state, wait=False)
        assert srv.wait_exit(60) != 0
        assert "GPU 1 has a total capacity of 140.40 GiB" in srv.log_text()
        assert compute_pids(state) == [hold.pid], "the foreign holder is untouched"
    finally:
        hold.kill()
        hold.wait()


def test_too_small_memory_fraction_is_sglangs_not_enough_memory(launch):
    srv = launch(["--mem-fraction-static", "0.4"], scale=20, tp=1, wait=False)
    assert srv.wait_exit(60) != 0
    assert "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static." in srv.log_text()


def test_crash_after_n_requests_takes_the_server_down(launch):
    srv = launch([], env={"SPECAB_SIM_FAULT": "crash_after=2"}, scale=20, tp=2)
    kids = children_of(srv.proc.pid)
    assert request_json(srv.port, "POST", "/generate", GEN)[0] == 200
    assert request_json(srv.port, "POST", "/generate", GEN)[0] == 200
    rc = srv.wait_exit(30)
    assert rc == -signal.SIGKILL
    log = srv.log_text()
    assert "Scheduler hit an exception" in log and "RuntimeError: CUDA error: an illegal memory access" in log
    assert "Received sigquit from a child process. It usually means the child failed." in log
    wait_for(lambda: not any(alive(k) for k in kids), 10, "children gone")
    assert srv.health() == 0


def test_ignore_sigterm_keeps_serving_until_sigkill(launch):
    srv = launch([], env={"SPECAB_SIM_FAULT": "ignore_sigterm"}, scale=20, tp=2)
    kids = children_of(srv.proc.pid)
    os.killpg(srv.proc.pid, signal.SIGTERM)      # as the stop role does: the whole process group
    wait_for(lambda: "Received SIGTERM; ignored" in srv.log_text(), 10, "the SIGTERM to arrive")
    for _ in range(10):                       # observed over a window: still alive and healthy
        assert srv.proc.poll() is None and srv.health() == 200
    assert all(alive(k) for k in kids) and len(compute_pids(srv.state)) == 2, "the workers ignore it too"
    os.killpg(srv.proc.pid, signal.SIGKILL)
    assert srv.wait_exit(10) == -signal.SIGKILL


def test_orphan_workers_keep_gpu_memory_after_the_parent_dies(launch):
    srv = launch([], env={"SPECAB_SIM_FAULT": "orphan_workers"}, scale=20, tp=2)
    kids = children_of(srv.proc.pid)
    schedulers = sorted(compute_pids(srv.state))
    os.kill(srv.proc.pid, signal.SIGKILL)
    srv.wait_exit(10)
    t_dead = time.monotonic()
    while time.monotonic() - t_dead < 1.0:   # workers outlive the parent (no parent-death signal)
        assert all(alive(k) for k in kids)
        time.sleep(0.05)
    assert sorted(compute_pids(srv.state)) == schedulers
    assert memory_used(srv.state)[:2] == [round(0.888 * 143771)] * 2
    for k in kids:
        sid = int(open(f"/proc/{k}/stat").read().rsplit(")", 1)[1].split()[3])
        assert sid == srv.proc.pid, "orphans keep the server's session id (the stop sweep finds them)"
    os.killpg(srv.proc.pid, signal.SIGKILL)
    wait_for(lambda: compute_pids(srv.state) == [], 10, "orphans killed")


def test_slow_release_holds_memory_after_death(launch):
    srv = launch([], env={"SPECAB_SIM_FAULT": "slow_release=60"}, scale=20, tp=2)   # 60 s / scale 20 = 3 s
    node = GpuNode(srv.state)
    os.killpg(srv.proc.pid, signal.SIGKILL)
    t_kill = time.time()
    srv.wait_exit(10)
    wait_for(lambda: node.compute_apps() == [], 5, "compute apps gone")
    t_apps = time.time()
    held = node.memory_used()
    assert held[0] > 0 and t_apps - t_kill < 2.5, "memory still held after the compute apps disappeared"
    wait_for(lambda: node.memory_used() == {i: 0 for i in range(8)}, 15, "memory released")
    assert time.time() - t_kill >= 2.9
    wait_for(lambda: memory_used(srv.state) == [0] * 8, 10, "smi agrees")


def test_port_in_use_prints_uvicorns_bind_error(launch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        srv = launch([], scale=20, tp=1, port=port, wait=False)
        assert srv.wait_exit(60) == 1
    assert (f"ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', {port}): "
            "address already in use") in srv.log_text()
    wait_for(lambda: compute_pids(srv.state) == [], 10, "children killed")
    forced = launch([], env={"SPECAB_SIM_FAULT": "port_in_use"}, scale=20, tp=1, port=free_port(), wait=False)
    assert forced.wait_exit(60) == 1 and "address already in use" in forced.log_text()


def test_unknown_fault_is_refused(tmp_path):
    r = subprocess.run([PY, "-m", "specab.sim.launch_server", "--model-path", "/m"],
                       env=base_env(tmp_path, 1, {"SPECAB_SIM_FAULT": "explode"}), cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "unknown fault 'explode'" in r.stderr and "crash_after=N" in r.stderr
