"""`status` and the live log tail against a host reached over real SSH (a network namespace with sshd)."""
from __future__ import annotations

import io
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from specab.config.inventory import load_inventory
from specab.driver.cli import main
from specab.driver.remote import LogTail
from specab.vocab.contract import load_phase
from tests.driver.simnode import PYTHON, SimNode, free_port, wait_for
from tests.netns import netns_host  # noqa: F401  (fixture)

pytestmark = [pytest.mark.ssh, pytest.mark.timeout(300)]


@pytest.fixture
def ssh_node(tmp_path: Path, netns_host):  # noqa: F811
    node = SimNode(root=tmp_path / "sim", port=free_port(), time_scale="0.5", host="nsnode")
    node.root.mkdir()
    host_vars = {**node.host_vars(), **netns_host.ansible_vars()}
    inv = node.write_inventory(host_vars)
    procs: list[subprocess.Popen] = []
    yield node, inv, procs
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, 9)
            p.wait()
    node.cleanup()


def _start_server(node: SimNode, procs: list, run_id: str, arm: str) -> tuple[subprocess.Popen, Path]:
    """A simulated server with a server.json, as the start role leaves it (started here to keep the test short)."""
    run_dir = node.node_dir / "runs" / run_id
    run_dir.mkdir(parents=True)
    log = run_dir / "server.log"
    env = dict(os.environ, **node.node_env())
    p = subprocess.Popen([PYTHON, "-m", "specab.sim.launch_server", "--model-path", "/models/m", "--tp-size", "2",
                          "--host", "127.0.0.1", "--port", str(node.port)],
                         stdout=open(log, "wb"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                         start_new_session=True)
    procs.append(p)
    (node.node_dir / "server.json").write_text(json.dumps(
        {"pid": p.pid, "pgid": p.pid, "sid": p.pid, "port": node.port, "host": "127.0.0.1", "run_id": run_id,
         "arm": arm, "started_at": time.time(), "launch": str(run_dir / "launch.sh")}))
    return p, log


def test_live_log_tail_over_ssh_sees_the_load_phases_as_they_happen(ssh_node):
    node, inv, procs = ssh_node
    host = load_inventory(inv).hosts[0]
    assert not host.is_local and host.address != "127.0.0.1"
    seen: list[tuple[float, str]] = []
    log_path = node.node_dir / "runs" / "001-baseline" / "server.log"
    tail = LogTail(host, str(log_path), lambda line: seen.append((time.monotonic(), line)), interval=0.1).start()
    try:
        _start_server(node, procs, "001-baseline", "baseline")
        wait_for(lambda: any(load_phase(l) == "ready" for _, l in seen), timeout=120, what="the ready line")
    finally:
        tail.stop()
    assert tail.error is None
    phases = [(t, load_phase(l)) for t, l in seen if load_phase(l)]
    names = [p for _, p in phases]
    assert names.index("loading weights") < names.index("capturing graphs") < names.index("ready")
    t_weights = next(t for t, p in phases if p == "loading weights")
    t_ready = next(t for t, p in phases if p == "ready")
    assert t_ready - t_weights > 0.5          # seen live, while the model was loading, not at the end
    lines = [l for _, l in seen]
    assert lines == log_path.read_text().splitlines()[:len(lines)]   # every line once, in order


def test_status_over_ssh_shows_gpus_and_our_server(ssh_node):
    node, inv, procs = ssh_node
    _, log = _start_server(node, procs, "004-eagle3-s2-k1-d3", "eagle3-s2-k1-d3")
    wait_for(lambda: "fired up and ready" in log.read_text(), timeout=120, what="the server")
    out = io.StringIO()
    assert main(["status", "-i", str(inv), "--format", "json"], out=out) == 0
    [row] = json.loads(out.getvalue())
    assert row["ok"] and row["host"] == "nsnode"
    assert row["server_running"] and row["server"]["arm"] == "eagle3-s2-k1-d3"
    used = [g for g in row["gpus"] if int(g["memory_used_mib"]) > 64]
    assert len(used) == 2 and all(g["processes"] for g in used)       # TP 2: two GPUs held, one process each
    out = io.StringIO()
    assert main(["status", "-i", str(inv)], out=out) == 0
    text = out.getvalue()
    assert "nsnode" in text and "running (pid" in text and "eagle3-s2-k1-d3" in text
    # after the server is gone: GPUs free, server.json stale
    for p in procs:
        os.killpg(p.pid, 9)
        p.wait()
    wait_for(lambda: node.gpus_busy() == [], timeout=30, what="GPU memory release")
    out = io.StringIO()
    main(["status", "-i", str(inv), "--format", "json"], out=out)
    [row] = json.loads(out.getvalue())
    assert not row["server_running"] and all(int(g["memory_used_mib"]) <= 64 for g in row["gpus"])


def test_status_names_an_unreachable_host(tmp_path):
    inv = tmp_path / "inv.yml"
    inv.write_text(json.dumps({"all": {"children": {"gpu_nodes": {"hosts": {"gone": {
        "ansible_host": "127.0.0.1", "ansible_port": free_port(), "ansible_user": "root"}}}}}}))
    out = io.StringIO()
    assert main(["status", "-i", str(inv), "--format", "json"], out=out) == 1
    [row] = json.loads(out.getvalue())
    assert not row["ok"] and "gone" == row["host"] and row["error"]


BASELINE_ONLY = """\
arms:
  - name: baseline
"""


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_run_over_ssh_shows_load_phases_from_the_live_tail(ssh_node):
    """One run through arm.yml over SSH: the load sub-phases in the store come only from the fabric log tail.
    (--executor per-run: on the run queue the stored sub-phases come from the node's ready.json instead.)"""
    from specab.results import store as st
    from tests.driver.simnode import driver
    node, inv, _ = ssh_node
    node.time_scale = "1"
    host_vars = dict(load_inventory(inv).hosts[0].vars)           # the SSH host's vars, rendered
    host_vars["specab_node_env"] = node.node_env()                 # default profile at time scale 1
    inv = node.write_inventory(host_vars)
    exp = node.write_experiment("ssh1", arms=BASELINE_ONLY, num_requests=2, output_len=32)
    proc = driver("-e", str(exp), "-i", str(inv), "--repeats", "1", "--runs-dir", str(node.runs_dir),
                  "--executor", "per-run")
    out, _ = proc.communicate(timeout=1100)
    assert proc.returncode == 0, out[-4000:]
    [exp_dir] = [d for d in node.runs_dir.iterdir() if d.is_dir()]
    with st.Store.open(exp_dir) as s:
        [run] = s.runs()
        assert run["status"] == "ok" and run["n_requests"] == 2
        phases = [p["phase"] for p in s.phases(run["seq"])]
    assert "loading weights" in phases and "capturing graphs" in phases, phases
    assert phases.index("loading weights") < phases.index("capturing graphs") < phases.index("verifying env")
    assert not node.server_alive()
