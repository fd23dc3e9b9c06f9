"""The simulated nvidia-smi against the real H200 output (format, not values) and the GPU state."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time

from specab.sim.gpustate import GpuNode
from tests.sim.conftest import PY, REPO, base_env, smi, wait_for

# Real lines, copied from shared/facts/seed-measurements.md and shared/reference/vllm-sim-nvidia-smi-nccl.md (C1)
REAL_QUERY = ("index,uuid,name,memory.used,memory.total,utilization.gpu,temperature.gpu,clocks.sm,clocks.mem,"
              "clocks.max.sm,power.draw,power.limit,clocks_event_reasons.active,pstate,persistence_mode,"
              "ecc.errors.uncorrected.volatile.total")
REAL_LINE = ("0, GPU-d09b8d4e-daef-237f-dd2d-1f194bd911ab, NVIDIA H200, 0, 143771, 0, 39, 345, 3201, 1980, 78.95, "
             "700.00, 0x0000000000000001, P0, Enabled, 0")
REAL_HEADER_QUERY = ("index,uuid,name,memory.used,memory.total,utilization.gpu,temperature.gpu,clocks.sm,clocks.mem,"
                     "power.draw,clocks_throttle_reasons.active")
REAL_HEADER = ("index, uuid, name, memory.used [MiB], memory.total [MiB], utilization.gpu [%], temperature.gpu, "
               "clocks.current.sm [MHz], clocks.current.memory [MHz], power.draw [W], clocks_event_reasons.active")
REAL_APP_LINE = "430, python3, 8710, GPU-2592755b-9f24-f5f7-a815-34d27fe0aa35"


def shape(value: str) -> str:
    """The lexical shape of one CSV cell: digits, decimals, hex masks, UUIDs; other text literally."""
    if re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", value):
        return "uuid"
    if re.fullmatch(r"0x[0-9a-f]{16}", value):
        return "mask64"
    if re.fullmatch(r"\d+\.\d\d", value):
        return "dec2"
    if re.fullmatch(r"\d+", value):
        return "int"
    if value.startswith("/") or value == "python3":
        return "path"
    return value


def test_query_gpu_has_the_real_h200_format(tmp_path):
    r = smi(tmp_path, f"--query-gpu={REAL_QUERY}", "--format=csv,noheader,nounits")
    assert r.returncode == 0 and r.stderr == ""
    lines = r.stdout.splitlines()
    assert len(lines) == 8 and r.stdout.endswith("\n")
    real = REAL_LINE.split(", ")
    for i, line in enumerate(lines):
        cells = line.split(", ")
        assert [shape(c) for c in cells] == [shape(c) for c in real], line
        assert cells[0] == str(i) and cells[2] == "NVIDIA H200" and cells[4] == "143771"
        assert cells[3] == "0" and cells[12] == "0x0000000000000001", "idle GPU: 0 MiB, GpuIdle"
    old = smi(tmp_path, f"--query-gpu={REAL_QUERY.replace('clocks_event_reasons', 'clocks_throttle_reasons')}",
              "--format=csv,noheader,nounits")
    assert [l.split(", ")[12] for l in old.stdout.splitlines()] == ["0x0000000000000001"] * 8


def test_header_units_and_selection(tmp_path):
    r = smi(tmp_path, f"--query-gpu={REAL_HEADER_QUERY}", "--format=csv")
    header, first = r.stdout.splitlines()[:2]
    assert header == REAL_HEADER
    assert re.fullmatch(r"0, GPU-[0-9a-f-]{36}, NVIDIA H200, 0 MiB, 143771 MiB, 0 %, \d+, \d+ MHz, \d+ MHz, "
                        r"\d+\.\d\d W, 0x0000000000000001", first), first
    one = smi(tmp_path, "--query-gpu=index,memory.used", "--format=csv,noheader,nounits", "-i", "3")
    assert one.stdout == "3, 0\n"
    extra = smi(tmp_path, "--query-gpu=memory.reserved,fan.speed", "--format=csv,noheader")
    assert extra.stdout.splitlines()[0] == "616 MiB, [N/A]"


def test_unknown_field_is_nvidia_smis_error(tmp_path):
    r = smi(tmp_path, "--query-gpu=index,bogus", "--format=csv")
    assert r.returncode == 2
    assert r.stdout == 'Field "bogus" is not a valid field to query.\n'
    r = smi(tmp_path, "--query-compute-apps=pid,bogus", "--format=csv,noheader,nounits")
    assert r.returncode == 2 and 'Field "bogus" is not a valid field to query.' in r.stdout


def test_compute_apps_empty_when_idle_and_lists_a_holder(tmp_path):
    q = ["--query-compute-apps=pid,process_name,used_memory,gpu_uuid", "--format=csv,noheader,nounits"]
    idle = smi(tmp_path, *q)
    assert idle.returncode == 0 and idle.stdout == ""
    hold = subprocess.Popen([PY, "-m", "specab.sim.hold", "--gpu", "2", "--mib", "8710"],
                            env=base_env(tmp_path, 1), cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert "holding 8710 MiB on GPU 2" in hold.stdout.readline()
        line = smi(tmp_path, *q).stdout
        cells = line.strip().split(", ")
        assert [shape(c) for c in cells] == [shape(c) for c in REAL_APP_LINE.split(", ")]
        uuid2 = smi(tmp_path, "--query-gpu=uuid", "--format=csv,noheader", "-i", "2").stdout.strip()
        assert cells[0] == str(hold.pid) and cells[2] == "8710" and cells[3] == uuid2
        assert os.path.basename(cells[1]).startswith("python"), "process_name is the python executable path"
        used = smi(tmp_path, "--query-gpu=memory.used", "--format=csv,noheader,nounits").stdout.split()
        assert used == ["0", "0", "8710", "0", "0", "0", "0", "0"]
    finally:
        hold.kill()
        hold.wait()


def test_nodes_are_isolated_and_uuids_stable(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    q = ["--query-gpu=uuid", "--format=csv,noheader,nounits"]
    ua, ub = smi(a, *q).stdout, smi(b, *q).stdout
    assert ua != ub and smi(a, *q).stdout == ua
    assert len(set(ua.split())) == 8
    hold = subprocess.Popen([PY, "-m", "specab.sim.hold", "--gpu", "0", "--mib", "100", "--state", str(a)],
                            env=base_env(b, 1), cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        hold.stdout.readline()
        assert smi(a, "--query-compute-apps=pid", "--format=csv,noheader").stdout.strip() == str(hold.pid)
        assert smi(b, "--query-compute-apps=pid", "--format=csv,noheader").stdout == ""
    finally:
        hold.kill()
        hold.wait()


def _release_timeline(state, lag: float) -> tuple[float, float, float]:
    """Kill a holder; return (kill time, compute-app gone, memory dropped), polled in-process every 2 ms."""
    args = [PY, "-m", "specab.sim.hold", "--gpu", "1", "--mib", "4000", "--release-lag", str(lag)]
    hold = subprocess.Popen(args, env=base_env(state, 1), cwd=REPO, stdout=subprocess.PIPE, text=True)
    hold.stdout.readline()
    node = GpuNode(state)
    wait_for(lambda: node.watcher_running(), 10, "the death watcher")
    assert node.memory_used()[1] == 4000
    t_kill = time.time()
    os.kill(hold.pid, signal.SIGKILL)
    hold.wait()
    t_app = t_mem = None
    deadline = time.time() + lag + 10
    while time.time() < deadline and t_mem is None:
        now = time.time()
        if t_app is None and not node.compute_apps():
            t_app = now
        if node.memory_used(now)[1] == 0:
            t_mem = now
        time.sleep(0.002)
    assert t_app is not None and t_mem is not None
    return t_kill, t_app, t_mem


def test_memory_is_released_after_the_lag_measured_from_death(tmp_path):
    t_kill, t_app, t_mem = _release_timeline(tmp_path, 0.15)
    assert t_app < t_mem, "the compute-app entry disappears before memory.used drops"
    assert 0.13 <= t_mem - t_kill <= 1.5
    t_kill, t_app, t_mem = _release_timeline(tmp_path, 1.0)
    assert t_app - t_kill < 0.5 and 0.95 <= t_mem - t_kill <= 2.5


def test_a_dead_holder_is_released_even_when_nobody_looks(tmp_path):
    """The watcher records the death: a first smi call long after the death sees the memory free."""
    args = [PY, "-m", "specab.sim.hold", "--gpu", "0", "--mib", "500", "--release-lag", "0.3"]
    hold = subprocess.Popen(args, env=base_env(tmp_path, 1), cwd=REPO, stdout=subprocess.PIPE, text=True)
    hold.stdout.readline()
    node = GpuNode(tmp_path)
    wait_for(lambda: node.watcher_running(), 10, "the death watcher")
    hold.kill()
    hold.wait()
    wait_for(lambda: not list((tmp_path / "allocs").glob("*.json")), 10, "the watcher to reap the allocation")
    assert smi(tmp_path, "--query-gpu=memory.used", "--format=csv,noheader,nounits").stdout.split()[0] == "0"


def test_hold_can_die_with_its_parent(tmp_path):
    code = ("import subprocess, sys, time\n"
            "p = subprocess.Popen([sys.executable, '-m', 'specab.sim.hold', '--gpu', '0', '--mib', '64', "
            "'--die-with-parent'], stdout=subprocess.PIPE, text=True)\n"
            "p.stdout.readline(); print(p.pid, flush=True); time.sleep(120)\n")
    parent = subprocess.Popen([PY, "-c", code], env=base_env(tmp_path, 1), cwd=REPO, stdout=subprocess.PIPE,
                              text=True)
    try:
        holder = int(parent.stdout.readline())
        node = GpuNode(tmp_path)
        assert [a.pid for a in node.compute_apps()] == [holder]
        parent.kill()
        parent.wait()
        wait_for(lambda: node.compute_apps() == [], 10, "the holder to die with its parent")
    finally:
        parent.kill()
        parent.wait()


def test_a_dying_holder_stays_listed_as_no_data_before_release(tmp_path):
    """The H200 behaviour of the realistic profile: listed as '[No data]' while the context tears down."""
    args = [PY, "-m", "specab.sim.hold", "--gpu", "3", "--mib", "2500", "--app-exit-lag", "0.4",
            "--release-lag", "0.8"]
    hold = subprocess.Popen(args, env=base_env(tmp_path, 1), cwd=REPO, stdout=subprocess.PIPE, text=True)
    hold.stdout.readline()
    node = GpuNode(tmp_path)
    wait_for(lambda: node.watcher_running(), 10, "the death watcher")
    t_kill = time.time()
    hold.kill()
    hold.wait()
    wait_for(lambda: any(a.dead_at for a in node.allocations()), 5, "the death to be recorded")
    q = ["--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader,nounits"]
    if time.time() - t_kill < 0.3:      # inside the window (skipped only on a very slow machine)
        assert smi(tmp_path, *q).stdout == f"{hold.pid}, [No data], 2500\n"
    wait_for(lambda: node.compute_apps() == [], 5, "the entry to disappear")
    t_apps = time.time()
    assert node.memory_used()[3] == 2500 or time.time() - t_kill >= 0.75
    wait_for(lambda: node.memory_used()[3] == 0, 5, "the memory to be released")
    t_mem = time.time()
    assert 0.35 <= t_apps - t_kill and 0.75 <= t_mem - t_kill and t_apps < t_mem
