"""Node tools on a real GPU machine (tier 4, not collected by pytest): real nvidia-smi, real CUDA
contexts (libcuda through ctypes, no torch needed).

    python3 tests/node/gpu_smoke.py --out DIR [--gpu 0] [--mib 4096]

Scenarios: sampling and manifest with the real nvidia-smi; a "server" (launch script → parent +
2 workers holding CUDA memory) started by start.py; gpufree waiting on our own processes (times
out with the GPU table); a foreign holder refused by name and left alone by stop; stop of the
server with time-to-free measured; orphaned workers (parent SIGKILLed) swept by stop. Writes
DIR/results.json and prints it. Exit 1 when a check fails.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NODE = Path(__file__).resolve().parents[2] / "specab" / "node"
PY = sys.executable

HOLDER = r'''
import ctypes, os, signal, subprocess, sys, time
gpu, mib, workers = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
if workers:
    kids = [subprocess.Popen([sys.executable, __file__, str(gpu), str(mib), "0"], stdout=subprocess.PIPE)
            for _ in range(workers)]
    for k in kids:
        k.stdout.readline()
    print("holding", flush=True)
    signal.signal(signal.SIGTERM, lambda *a: os._exit(0))  # the parent exits; workers have no death signal
    while True:
        signal.pause()
cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0
dev = ctypes.c_int()
assert cuda.cuDeviceGet(ctypes.byref(dev), gpu) == 0
ctx = ctypes.c_void_p()
assert cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev) == 0
ptr = ctypes.c_uint64()
rc = cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(mib << 20))
assert rc == 0, rc
print("holding", flush=True)
while True:
    signal.pause()
'''


def tool(name: str, *args: str, timeout: float = 120) -> dict:
    t0 = time.monotonic()
    p = subprocess.run([PY, str(NODE), name] + [str(a) for a in args], capture_output=True, text=True,
                       timeout=timeout)
    out = json.loads(p.stdout.strip().splitlines()[-1]) if p.stdout.strip() else {}
    out["_rc"], out["_wall_s"] = p.returncode, round(time.monotonic() - t0, 3)
    if p.returncode not in (0, 1):
        out["_stderr"] = p.stderr[-2000:]
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--mib", type=int, default=4096)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="specab-gpu-smoke-"))
    smi = json.dumps(["nvidia-smi"])
    res: dict = {"checks": {}}
    checks = res["checks"]
    holder = work / "holder.py"
    holder.write_text(HOLDER)
    node_dir, run_dir = work / "node", work / "node" / "runs" / "001-smoke"
    run_dir.mkdir(parents=True)
    port = 39123
    launch = run_dir / "launch.sh"
    launch.write_text("#!/bin/bash\nexec %s %s %d %d 2\n" % (PY, holder, a.gpu, a.mib))
    os.chmod(launch, 0o755)
    foreign = None
    try:
        res["nvidia_smi_version"] = subprocess.run(["nvidia-smi", "--version"], capture_output=True,
                                                   text=True).stdout.strip()
        s = tool("gpusample", "--smi", smi, "--interval", "0.2", "--count", "3", "--out", out / "gpu_samples.csv")
        res["gpusample"] = s
        checks["gpusample_rows"] = s["_rc"] == 0 and s["rows"] > 0
        m = tool("manifest", "--run-dir", run_dir, "--node-dir", node_dir, "--smi", smi, "--python", PY,
                 "--out", out / "manifest.json")
        res["manifest_gpu"] = m.get("gpu")
        res["manifest_versions"] = m.get("versions")
        checks["manifest_driver"] = bool(m.get("gpu", {}).get("driver_version"))
        f0 = tool("gpufree", "--smi", smi, "--gpus", str(a.gpu), "--threshold-mib", "64", "--timeout", "30", "--node-dir", node_dir)
        res["gpufree_idle"] = f0
        checks["idle_gpu_free"] = f0["_rc"] == 0

        # our server: parent + 2 CUDA workers
        st = tool("start", "--node-dir", node_dir, "--run-dir", run_dir, "--script", launch, "--host", "127.0.0.1",
                  "--port", str(port))
        checks["start"] = st["_rc"] == 0
        log = run_dir / "server.log"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and "holding" not in log.read_text():
            time.sleep(0.1)
        busy = tool("gpufree", "--smi", smi, "--gpus", str(a.gpu), "--threshold-mib", "64", "--timeout", "2", "--node-dir", node_dir)
        res["gpufree_busy_ours"] = {k: busy.get(k) for k in ("_rc", "error", "final")}
        checks["busy_ours_times_out_with_table"] = busy["_rc"] == 1 and "GPUs not free" in busy.get("error", "")

        # a foreign holder: refused by name, never killed by stop
        foreign = subprocess.Popen([PY, str(holder), str(a.gpu), "512", "0"], stdout=subprocess.PIPE,
                                   start_new_session=True)
        foreign.stdout.readline()
        stop = tool("stop", "--node-dir", node_dir, "--smi", smi, "--grace", "10")
        res["stop"] = stop
        checks["stop_ok"] = stop["_rc"] == 0 and not stop.get("escalated")
        checks["stop_left_foreign_alone"] = foreign.poll() is None and \
            [f["pid"] for f in stop.get("gpu_foreign", [])] == [foreign.pid]
        ff = tool("gpufree", "--smi", smi, "--gpus", str(a.gpu), "--threshold-mib", "64", "--timeout", "30", "--node-dir", node_dir)
        res["gpufree_foreign"] = {k: ff.get(k) for k in ("_rc", "error", "foreign")}
        checks["foreign_refused_by_name"] = ff["_rc"] == 1 and "PID %d" % foreign.pid in ff.get("error", "")
        foreign.kill()
        foreign.wait()
        free = tool("gpufree", "--smi", smi, "--gpus", str(a.gpu), "--threshold-mib", "64", "--timeout", "60", "--node-dir", node_dir,
                    "--interval", "0.05")
        res["gpufree_after_stop"] = free
        checks["free_after_stop"] = free["_rc"] == 0

        # orphaned workers: the parent is SIGKILLed, the workers keep their memory
        (node_dir / "last_server.json").unlink()
        st = tool("start", "--node-dir", node_dir, "--run-dir", run_dir, "--script", launch, "--host", "127.0.0.1",
                  "--port", str(port))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and "holding" not in log.read_text():
            time.sleep(0.1)
        os.kill(st["pid"], signal.SIGKILL)
        time.sleep(1.0)  # measuring: the orphans still hold memory a second later
        held = subprocess.run(["nvidia-smi", "-i", str(a.gpu), "--query-gpu=memory.used",
                               "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout.strip()
        res["orphans_memory_used_mib_1s_after_parent_kill"] = held
        # gpufree polls (every 50 ms) while stop runs: SIGTERM → GPU free, as the node sees it
        watcher = subprocess.Popen([PY, str(NODE), "gpufree", "--smi", smi, "--gpus", str(a.gpu),
                                    "--threshold-mib", "64", "--timeout", "60", "--node-dir", str(node_dir),
                                    "--interval", "0.05"], stdout=subprocess.PIPE, text=True)
        time.sleep(0.5)  # let it take its first polls while the orphans still hold the GPU
        stop2 = tool("stop", "--node-dir", node_dir, "--smi", smi, "--grace", "5")
        res["stop_orphans"] = stop2
        w_out = watcher.communicate(timeout=90)[0]
        during = json.loads(w_out.strip().splitlines()[-1]) if w_out.strip() else {}
        res["gpufree_during_stop"] = {k: during.get(k) for k in ("ok", "error", "polls", "free_at", "time_to_free_s",
                                                                 "initial")}
        if during.get("free_at") and stop2.get("signals"):
            res["sigterm_to_gpu_free_s"] = round(during["free_at"] - stop2["signals"][0]["t"], 3)
        checks["gpufree_waited_through_stop"] = bool(during.get("ok")) and during.get("polls", 0) > 1
        checks["orphans_stopped"] = stop2["_rc"] == 0
        t_stop = time.time()
        free2 = tool("gpufree", "--smi", smi, "--gpus", str(a.gpu), "--threshold-mib", "64", "--timeout", "60", "--node-dir", node_dir,
                     "--interval", "0.05")
        res["gpufree_after_orphans"] = free2
        res["free_at_minus_stop_end_s"] = round(free2.get("free_at", 0) - t_stop, 3) if free2.get("free_at") else None
        checks["free_after_orphans"] = free2["_rc"] == 0

        # nvidia-smi hang: a wrapper that never answers
        hang = tool("gpufree", "--smi", json.dumps([PY, "-c", "import time; time.sleep(3600)"]), "--gpus", "all",
                    "--threshold-mib", "64",
                    "--timeout", "5",
                    "--smi-timeout", "2")
        res["hang"] = {k: hang.get(k) for k in ("_rc", "_wall_s", "error")}
        checks["hang_reported"] = hang["_rc"] == 1 and "did not answer within 2 s" in hang.get("error", "")
    finally:
        if foreign is not None and foreign.poll() is None:
            foreign.kill()
        for name in ("server.json", "last_server.json"):
            p = node_dir / name
            if p.exists():
                sid = json.loads(p.read_text()).get("sid")
                if sid and sid > 1:
                    try:
                        os.killpg(sid, signal.SIGKILL)
                    except OSError:
                        pass
    res["ok"] = all(checks.values())
    (out / "results.json").write_text(json.dumps(res, indent=2, default=str))
    print(json.dumps({"ok": res["ok"], "checks": checks}, indent=2))
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
