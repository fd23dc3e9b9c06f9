"""The GPUs of every node are free and nothing of ours is left running.

    pytest tests/infra --hosts=ansible://gpu_nodes --ansible-inventory=inventory/local.yml

Checks, per host: no GPU compute process; memory.used of every GPU of the node at most the
threshold (specab_gpu_free_threshold_mib, default 64 MiB); no engine process of ours (the pid
recorded in server.json is not alive, no process is left in the session of our last server, no
``sglang::`` process of this node); the server's port is closed. The nvidia-smi command comes from
the host's ``specab_smi_cmd`` inventory variable.
"""
from __future__ import annotations

import json
import shlex
from typing import Any

from tests.infra.conftest import NodeVars


def _smi(host: Any, node: NodeVars, *args: str) -> list[list[str]]:
    env = " ".join(shlex.quote(f"{k}={v}") for k, v in node.env.items())
    cmd = " ".join(shlex.quote(a) for a in [*node.smi, *args])
    res = host.run(f"env {env} timeout 30 {cmd}" if env else f"timeout 30 {cmd}")
    assert res.rc == 0, f"{' '.join(node.smi)} {' '.join(args)} failed on {node.name} (exit {res.rc}): {res.stderr.strip()}"
    rows = []
    for line in res.stdout.splitlines():
        if not line.strip() or line.startswith("No running"):
            continue
        rows.append([c.strip() for c in line.split(",")])
    return rows


def _selected(node: NodeVars, index: str) -> bool:
    if node.gpus == "all":
        return True
    return int(index) in {int(i) for i in node.gpus}


def _records(host: Any, node: NodeVars) -> dict[str, dict[str, Any]]:
    out = {}
    for name in ("server.json", "last_server.json"):
        f = host.file(f"{node.node_dir}/{name}")
        if f.exists:
            out[name] = json.loads(f.content_string)
    return out


def _processes(host: Any) -> list[tuple[int, int, str]]:
    """(pid, session id, args) of every live process on the host (zombies are already dead)."""
    res = host.run("ps -eo pid=,sid=,stat=,args=")
    assert res.rc == 0, f"ps failed: {res.stderr}"
    procs = []
    for line in res.stdout.splitlines():
        parts = line.split(None, 3)
        if len(parts) >= 3 and parts[0].isdigit() and parts[1].isdigit() and not parts[2].startswith("Z"):
            procs.append((int(parts[0]), int(parts[1]), parts[3] if len(parts) > 3 else ""))
    return procs


def test_no_gpu_compute_process(host: Any, node: NodeVars) -> None:
    gpus = {row[1]: row[0] for row in _smi(host, node, "--query-gpu=index,uuid", "--format=csv,noheader,nounits")}
    apps = _smi(host, node, "--query-compute-apps=gpu_uuid,pid,process_name,used_memory",
                "--format=csv,noheader,nounits")
    busy = [a for a in apps if _selected(node, gpus.get(a[0], "-1")) or a[0] not in gpus]
    assert not busy, f"{node.name}: GPU compute processes still running: " + "; ".join(
        f"GPU {gpus.get(a[0], a[0])}: pid {a[1]} ({a[2]}) holds {a[3]} MiB" for a in busy)


def test_gpu_memory_released(host: Any, node: NodeVars) -> None:
    rows = _smi(host, node, "--query-gpu=index,uuid,memory.used,memory.total", "--format=csv,noheader,nounits")
    assert rows, f"{node.name}: {' '.join(node.smi)} listed no GPU"
    held = [r for r in rows if _selected(node, r[0]) and float(r[2]) > node.threshold_mib]
    assert not held, f"{node.name}: GPU memory not released (threshold {node.threshold_mib:g} MiB): " + "; ".join(
        f"GPU {r[0]} ({r[1]}) uses {r[2]} of {r[3]} MiB" for r in held)


def test_no_engine_process_of_ours(host: Any, node: NodeVars) -> None:
    records = _records(host, node)
    procs = _processes(host)
    alive = {pid for pid, _, _ in procs}
    problems = []
    current = records.get("server.json")
    if current and int(current["pid"]) in alive:
        problems.append(f"server.json names pid {current['pid']} (arm {current.get('arm')}, run {current.get('run_id')}, "
                        f"port {current.get('port')}) and it is still running")
    sessions = {int(r["sid"]): n for n, r in records.items() if r.get("sid")}
    for pid, sid, args in procs:
        if sid in sessions:
            problems.append(f"pid {pid} ({args[:80]}) is still alive in the session of our server ({sessions[sid]})")
    sim_state = node.env.get("SPECAB_SIM_STATE")
    for pid, _, args in procs:
        if not args.startswith("sglang::"):
            continue
        if sim_state:   # a simulated node: only engines of this node's state directory count
            environ = host.run("tr '\\0' '\\n' < /proc/%s/environ", str(pid)).stdout.splitlines()
            if f"SPECAB_SIM_STATE={sim_state}" not in environ:
                continue
        problems.append(f"engine process pid {pid} ({args[:80]}) is still running")
    assert not problems, f"{node.name}: engine processes left: " + "; ".join(sorted(set(problems)))


def test_server_port_closed(host: Any, node: NodeVars) -> None:
    targets = set()
    for rec in _records(host, node).values():
        h = str(rec.get("host") or "127.0.0.1")
        targets.add(("127.0.0.1" if h in ("0.0.0.0", "::", "") else h, int(rec["port"])))
    targets |= {("127.0.0.1", p) for p in node.ports}
    if not targets:
        targets.add(("127.0.0.1", 30000))   # SGLang's default port
    open_ports = []
    for h, p in sorted(targets):
        res = host.run("timeout 5 bash -c %s", f"exec 3<>/dev/tcp/{h}/{p}")
        if res.rc == 0:
            open_ports.append(f"{h}:{p}")
    assert not open_ports, f"{node.name}: server port still open: {', '.join(open_ports)}"
