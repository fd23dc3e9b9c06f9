"""The GPU validation script's logic on CPU (scripts/gpu_validation.py): nvidia-smi CSV and NCCL
line parsing on real lines (shared/reference, shared/facts), the junit task extraction, the release
timeline, and the (a)-(e) verdicts, which must fail when the machine misbehaves."""
from __future__ import annotations

import copy
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("gpu_validation", REPO / "scripts" / "gpu_validation.py")
assert _spec is not None and _spec.loader is not None
gv = importlib.util.module_from_spec(_spec)
sys.modules["gpu_validation"] = gv
_spec.loader.exec_module(gv)

# real lines: shared/reference/vllm-sim-nvidia-smi-nccl.md C1 and D1, shared/facts/seed-measurements.md
UUID = "GPU-2592755b-9f24-f5f7-a815-34d27fe0aa35"
GPU_IDLE = "0, GPU-2592755b-9f24-f5f7-a815-34d27fe0aa35, NVIDIA H200, 0, 143771\n"
GPU_BUSY = "0, GPU-2592755b-9f24-f5f7-a815-34d27fe0aa35, NVIDIA H200, 8719, 143771\n"
APP_LINE = "430, python3, 8710, GPU-2592755b-9f24-f5f7-a815-34d27fe0aa35\n"
APP_EXITING = "430, [No data], 8710, GPU-2592755b-9f24-f5f7-a815-34d27fe0aa35\n"
NCCL_REF = "node-01:1896826:1896838 [0] NCCL INFO NCCL_SHM_DISABLE set by environment to 1."
TUNED = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_P2P_LEVEL": "SYS", "NCCL_MAX_NCHANNELS": "16",
         "NCCL_BUFFSIZE": "16777216", "NCCL_NTHREADS": "512"}


def nccl_line(pid: int, dev: int, var: str, value: str) -> str:
    """A NCCL env echo in NCCL's format (debug.cc prefix; integers end in '.', strings do not)."""
    text = value if var in ("NCCL_PROTO", "NCCL_ALGO", "NCCL_P2P_LEVEL") else value + "."
    return "vm:%d:%d [%d] NCCL INFO %s set by environment to %s" % (pid, pid, dev, var, text)


def snap(t: float, gpu_csv: str, apps_csv: str = "", t0: float | None = None) -> Dict[str, Any]:
    return {"t0": t - 0.05 if t0 is None else t0, "t": t, "gpu_csv": gpu_csv, "apps_csv": apps_csv}


# --------------------------------------------------------------------------- parsers

def test_csv_rows_from_real_nvidia_smi_lines():
    rows = gv.parse_csv(GPU_IDLE, gv.GPU_QUERY)
    assert rows == [{"index": 0, "uuid": UUID, "name": "NVIDIA H200", "memory.used": 0, "memory.total": 143771}]
    apps = gv.parse_csv(APP_LINE + APP_EXITING, gv.APP_QUERY)
    assert [a["pid"] for a in apps] == [430, 430] and apps[0]["used_memory"] == 8710
    assert apps[1]["process_name"] is None, "'[No data]' (an exiting process) is no name"
    with pytest.raises(ValueError, match="columns"):
        gv.parse_csv("0, GPU-x, NVIDIA H200\n", gv.GPU_QUERY)


def test_free_needs_no_compute_process_and_memory_under_threshold():
    assert gv.snapshot_free(snap(1, GPU_IDLE))
    assert not gv.snapshot_free(snap(1, GPU_IDLE, APP_LINE)), "a compute process with 0 MiB shown is not free"
    assert not gv.snapshot_free(snap(1, GPU_BUSY)), "memory still held after the app list emptied"
    two = GPU_IDLE + "1, GPU-ffffffff-9f24-f5f7-a815-34d27fe0aa35, NVIDIA H200, 5000, 143771\n"
    assert gv.snapshot_free(snap(1, two), gpus=[0]) and not gv.snapshot_free(snap(1, two), gpus=[0, 1])


def test_nccl_env_lines_parse_reference_and_seed_lines():
    seed = ["vm:476:476 [0] NCCL INFO NCCL_P2P_LEVEL set by environment to SYS",
            "vm:476:476 [0] NCCL INFO NCCL_MAX_NCHANNELS set by environment to 16.",
            "vm:476:476 [0] NCCL INFO NCCL version 2.28.9+cuda13.0"]
    got = gv.nccl_env_lines("\n".join([NCCL_REF] + seed))
    assert [(r["var"], r["value"], r["pid"], r["dev"]) for r in got] == [
        ("NCCL_SHM_DISABLE", "1.", 1896826, 0), ("NCCL_P2P_LEVEL", "SYS", 476, 0),
        ("NCCL_MAX_NCHANNELS", "16.", 476, 0)]
    assert gv.nccl_matches("16", "16.") and gv.nccl_matches("SYS", "SYS") and gv.nccl_matches("0x10", "16.")
    assert not gv.nccl_matches("LL", "Simple") and not gv.nccl_matches("16", "8.")


# --------------------------------------------------------------------------- junit + timeline

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites disabled="0" errors="0" failures="1" tests="3" time="9.1">
  <testsuite name="ab_test" tests="3" failures="1">
    <testcase classname="playbooks.tasks.run_arm" name="[gpu0] A/B round: gpu_free : GPUs free | Wait for no compute process and memory.used under the threshold in MiB, 64" time="0.3">
      <system-out>{"changed": false, "rc": 0, "start": "2026-11-29 07:59:20.100000", "end": "2026-11-29 07:59:20.400000", "stdout": "{\\"time_to_free_s\\": 0.0, \\"final\\": []}"}</system-out>
    </testcase>
    <testcase classname="x" name="[gpu0] A/B round: server_stop : Stop | Stop the server recorded in server.json (TERM, grace, KILL, sweep), grace in s 15" time="0.2">
      <system-out>{"rc": 0, "stdout": "{\\"was_running\\": false}"}</system-out>
    </testcase>
    <testcase classname="x" name="[gpu0] A/B round: gpu_free : GPUs free | Wait for no compute process and memory.used under the threshold in MiB, 64" time="0.3">
      <system-out>{"rc": 1, "start": "2026-11-29 07:59:30.000000", "end": "2026-11-29 07:59:30.500000", "stdout": "{\\"error\\": \\"GPU 0 is used by a process that is not ours\\"}"}</system-out>
    </testcase>
    <testcase classname="x" name="[gpu0] A/B round: gpu_free : GPUs free | Wait for no compute process and memory.used under the threshold in MiB, 64" time="0.4">
      <failure message="The GPUs of gpu0 are not free: GPU 1 is used">{"changed": false, "rc": 1, "start": "2026-11-29 07:59:40.000000", "end": "2026-11-29 07:59:40.400000", "msg": "The GPUs of gpu0 are not free: GPU 1 is used", "error": "GPU 1 is used", "ok": false, "polls": 3}</failure>
    </testcase>
  </testsuite>
</testsuites>
"""


def test_junit_tool_outputs_in_run_order(tmp_path):
    (tmp_path / "ab_test-1.xml").write_text(JUNIT)
    tasks = gv.junit_tasks(tmp_path)
    assert [t["status"] for t in tasks] == ["ok", "ok", "ok", "failure"] and tasks[0]["host"] == "gpu0"
    frees = gv.tool_outputs(tasks, "GPUs free | Wait for no compute process")
    assert [f["rc"] for f in frees] == [0, 1, 1]
    assert frees[1]["data"]["error"].startswith("GPU 0 is used")
    # module specab_node's result: the tool's keys are the task's, Ansible's own keys are not the tool's
    assert frees[2]["data"] == {"error": "GPU 1 is used", "ok": False, "polls": 3}
    assert frees[2]["end"] - frees[2]["start"] == pytest.approx(0.4, abs=1e-6)
    assert frees[0]["end"] - frees[0]["start"] == pytest.approx(0.3, abs=1e-6)
    assert gv.tool_outputs(tasks, "Stop | Stop the server recorded")[0]["data"] == {"was_running": False}


def test_release_timeline_uses_only_samples_read_after_the_signal():
    samples = [snap(99.9, GPU_BUSY, APP_LINE), snap(100.05, GPU_IDLE, "", t0=99.98),  # read across the signal
               snap(100.15, GPU_BUSY, APP_EXITING), snap(100.25, GPU_BUSY), snap(100.35, GPU_IDLE)]
    assert gv.first_no_apps_sample(samples, 100.0)["t"] == 100.25
    assert gv.first_free_sample(samples, 100.0)["t"] == 100.35
    assert gv.last_sample_before(samples, 100.0)["t"] == 99.9
    assert gv.first_free_sample(samples[:4], 100.0) is None


# --------------------------------------------------------------------------- verdicts

def env_check(pids: list[int], missing: str | None = None) -> Dict[str, Any]:
    procs = [{"pid": 10, "name": "sglang::http_server/tokenizer_manager", "skipped": None}]
    procs += [{"pid": p, "name": "sglang::scheduler_TP%d" % i, "skipped": None} for i, p in enumerate(pids)]
    variables = {}
    for v in TUNED:
        mism = ["%s: expected %r in every engine process, but sglang::scheduler_TP0 (pid %d) does not have it"
                % (v, TUNED[v], pids[0])] if v == missing else []
        variables[v] = {"expected": TUNED[v], "evidence": [] if mism else ["environ:%d" % p for p in [10] + pids],
                        "mismatches": mism, "unverified": []}
    return {"ok": missing is None, "variables": variables, "processes": procs}


def write_run(work: Path, run_dir: str, pids: list[int], log_vars: Dict[int, list[str]], t_term: float) -> None:
    rd = work / run_dir
    rd.mkdir(parents=True)
    lines = [nccl_line(p, dev, v, TUNED[v]) for dev, p in enumerate(pids) for v in log_vars.get(p, [])]
    (rd / "server.log").write_text("\n".join(["[2026-11-29 07:59:26] Init torch distributed begin."] + lines) + "\n")
    (rd / "env_check.json").write_text(json.dumps(env_check(pids)))
    (rd / "stop.json").write_text(json.dumps({"signals": [{"signal": "SIGTERM", "t": t_term}], "term_to_gone_s": 0.17,
                                              "total_s": 0.22}))
    (rd / "gpu_free.json").write_text(json.dumps({"ok": True, "time_to_free_s": 0.05}))


def good_results(work: Path, tp: int) -> Dict[str, Any]:
    """A results.json and work dir as a passing TP=tp run leaves them."""
    gpu_csv = "".join("%d, GPU-%08d-9f24-f5f7-a815-34d27fe0aa35, NVIDIA H200, {m}, 143771\n" % (i, i) for i in range(tp))
    samples, arms = [], []
    for k, arm in enumerate(("baseline", "eagle3-s2")):
        t_term = 1000.0 + 100 * k
        pids = [2000 + 10 * k + r for r in range(tp)]
        every = list(TUNED) if tp > 1 else [v for v in TUNED if v not in gv.TUNING_VARS]
        write_run(work, "runs/ab/%03d-%s" % (k + 1, arm), pids, {p: every for p in pids}, t_term)
        samples += [snap(t_term - 0.1, gpu_csv.format(m=87185)), snap(t_term + 0.3, gpu_csv.format(m=0))]
        free = {"rc": 0, "start": t_term - 30, "end": t_term - 29.9,
                "data": {"final": [{"index": i, "memory_used_mib": 0, "compute_processes": []} for i in range(tp)]}}
        arms.append({"arm": arm, "run_dir": "runs/ab/%03d-%s" % (k + 1, arm), "free_before": free,
                     "free_after": dict(free, start=t_term + 0.3, end=t_term + 0.35)})
    (work / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    missing = env_check([3000 + r for r in range(tp)], missing="NCCL_ALGO")
    return {
        "work": str(work), "wall_s": 120, "expected_env": dict(TUNED, NCCL_DEBUG="INFO"),
        "preflight": {"tp": tp, "cpu_sim": False, "gpus": [{"index": i, "name": "NVIDIA H200",
                                                            "memory_total_mib": 143771} for i in range(tp)]},
        "ab_test": {"rc": 0, "arms": arms},
        "orphans": {"server_pid": 4931, "server_sid": 4931, "main_gone_after_s": 0.1,
                    "orphans_found": [{"pid": 4988 + r, "process_name": "sglang::scheduler", "used_memory": 87176}
                                      for r in range(tp)],
                    "window": [{"t": 5.0 + i, "orphans": tp, "used_mib": 87185.0 * tp} for i in range(3)],
                    "stop_rc": 0, "stop": {"signals": [{"signal": "SIGTERM", "target": "pgid", "id": 4931}]},
                    "free_rc": 0, "free": {"time_to_free_s": 0.33}, "orphans_alive_after": []},
        "missing_var": {"playbook_rc": 2, "env_check": missing, "free_rc": 0},
        "foreign": {"pid": 7665, "gpu": tp - 1, "playbook_rc": 2, "alive_after": True, "still_listed_after": True,
                    "free_after_cleanup": True,
                    "refusal_lines": ["GPU %d is used by a process that is not ours: PID 7665, user root" % (tp - 1)]},
    }


def verdicts(res: Dict[str, Any], work: Path) -> Dict[str, bool]:
    return {c.key: c.ok for c in gv.evaluate(res, work)}


@pytest.mark.parametrize("tp", [1, 2])
def test_a_passing_run_passes_every_check(tmp_path, tp):
    res = good_results(tmp_path, tp)
    assert verdicts(res, tmp_path) == dict.fromkeys("abcde", True)
    (tmp_path / "results.json").write_text(json.dumps(res))
    assert gv.summarize(tmp_path) == 0
    text = (tmp_path / "summary.txt").read_text()
    assert "RESULT: ALL PASS" in text and "real nvidia-smi CSV" in text


def test_each_misbehaviour_fails_its_check(tmp_path):
    base = good_results(tmp_path, 2)

    def fails(key: str, mutate) -> None:
        res = copy.deepcopy(base)
        mutate(res)
        got = verdicts(res, tmp_path)
        assert got[key] is False, (key, got)

    fails("a", lambda r: r["ab_test"]["arms"][1]["free_after"].update(rc=1))
    fails("b", lambda r: r["ab_test"]["arms"].__setitem__(0, dict(r["ab_test"]["arms"][0], run_dir="runs/none")))
    fails("c", lambda r: r["orphans"]["window"].__setitem__(1, {"t": 6.0, "orphans": 0, "used_mib": 0.0}))
    fails("c", lambda r: r["orphans"].update(orphans_alive_after=[4988]))
    fails("d", lambda r: r["missing_var"].update(playbook_rc=0, env_check=env_check([3000, 3001])))
    fails("e", lambda r: r["foreign"].update(alive_after=False))
    fails("e", lambda r: r["foreign"].update(refusal_lines=[]))


def test_tp2_needs_proto_and_algo_lines_from_every_rank(tmp_path):
    res = good_results(tmp_path, 2)
    rd = tmp_path / res["ab_test"]["arms"][0]["run_dir"]
    log = rd / "server.log"
    kept = [ln for ln in log.read_text().splitlines() if not ("NCCL_ALGO" in ln and ":2001:" in ln)]
    log.write_text("\n".join(kept) + "\n")
    assert verdicts(res, tmp_path)["d"] is False, "rank 1 never echoed NCCL_ALGO"
    res1 = good_results(tmp_path / "tp1", 1)
    assert verdicts(res1, tmp_path / "tp1")["d"] is True, "one rank: NCCL_PROTO/ALGO confirmed by environ only"


# --------------------------------------------------------------------------- config and guards

def test_inventory_and_experiment_fit_a_gpu_node():
    from specab.config.inventory import load_inventory
    from specab.config.spec import load_experiment
    host = load_inventory(REPO / "inventory" / "gpu-local.yml").hosts[0]
    assert host.smi_cmd == ["nvidia-smi"]
    env = host.node_env
    assert env["SPECAB_SIM_GPU"] == "cuda" and all(env[k] == v for k, v in gv.MULTICAST_OFF.items())
    exp = load_experiment(REPO / "experiments" / "gpu-validation.yml")
    raw = yaml.safe_load((REPO / "experiments" / "gpu-validation.yml").read_text())["specab_experiment"]
    assert raw["env"]["NCCL_DEBUG"] == "INFO" and all(str(raw["env"][k]) == v for k, v in TUNED.items())
    assert raw["server_args"]["tp_size"] == 1 and exp.name == "gpu-validation"
    # the arm's share + ~1 GiB CUDA context + the foreign process fit on one 143771 MiB card
    assert raw["server_args"]["mem_fraction_static"] * 143771 + 1024 + gv.FOREIGN_MIB + 1024 < 143771


def test_run_refuses_without_multicast_off(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in gv.MULTICAST_OFF}
    p = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_validation.py"), "run", "--cpu-sim",
                        "--work", str(tmp_path / "w")], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "NCCL_NVLS_ENABLE=0 must be exported" in p.stderr


def test_native_stdout_goes_to_the_log_and_the_pipe_keeps_python_stdout():
    code = ("import os, sys; sys.path.insert(0, %r)\n"
            "from specab.sim.gpu_mode import route_native_stdout_to_stderr as r\n"
            "r(); r()\n"
            "os.write(1, b'vm:1:1 [0] NCCL INFO NCCL_NTHREADS set by environment to 512.\\n')\n"
            "sys.stdout.write('{\"status\": \"ready\"}\\n'); sys.stdout.flush()\n" % str(REPO))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout == '{"status": "ready"}\n'
    assert "NCCL INFO NCCL_NTHREADS" in p.stderr


def _cuda_available() -> bool:
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not _cuda_available(), reason="needs an NVIDIA GPU (nvidia-smi) and torch with CUDA")
def test_gpu_mode_rank_holds_memory_and_nccl_lines_go_to_stderr():
    pytest.importorskip("torch")
    code = ("import sys, json; sys.path.insert(0, %r)\n"
            "from specab.sim.gpu_mode import init_rank\n"
            "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); port = s.getsockname()[1]; s.close()\n"
            "h = init_rank(0, 1, 0, '127.0.0.1:%%d' %% port, 256)\n"
            "print(json.dumps({'device': h.device}), flush=True)\n" % str(REPO))
    env = dict(os.environ, NCCL_DEBUG="INFO", NCCL_NTHREADS="512", **gv.MULTICAST_OFF)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout) == {"device": "cuda:0"}, "only the JSON reaches stdout"
    assert "NCCL_NTHREADS set by environment to 512." in p.stderr


# --------------------------------------------------------------------------- (f) the real engine

REAL_RUN = REPO / "tests" / "fixtures" / "sglang-0.5.17" / "specab-run"   # specab's ab_test.yml, real 0.5.17, H200


def real_stop_json(arm: str, with_record: bool = True, log_filter=None) -> Dict[str, Any]:
    """The real stop.json of that run (written before stop.py recorded the shutdown), plus the record
    stop.py makes of the log the real engine wrote during that stop (the per-run stop: exit not observable)."""
    from specab.node import procfs, stop
    rec = json.loads((REAL_RUN / f"{arm}.stop.json").read_text())
    if with_record:
        text = (REAL_RUN / f"{arm}.stop.log").read_text()
        if log_filter:
            text = "".join(ln for ln in text.splitlines(True) if log_filter(ln))
        procs = [procfs.ProcStat(p["pid"], "python3", "S", 1, rec["pgid"], rec["sid"], 0)
                 for p in rec["processes_at_start"]]
        rec["shutdown"] = stop.shutdown_record(text, procs, rec["pid"], False,
                                               {"observable": False, "why": "not a child"})
    return rec


def real_engine_work(work: Path, version: str = "0.5.17", **stop_kw: Any) -> Dict[str, Any]:
    arms = []
    for arm, spec in (("baseline", False), ("eagle3-s2", True)):
        rd = work / "runs" / arm
        rd.mkdir(parents=True)
        (rd / "ready.json").write_text(json.dumps({"ok": True, "elapsed_s": 62.5}))
        (rd / "stop.json").write_text(json.dumps(real_stop_json(arm, **stop_kw)))
        (rd / "args.json").write_text(json.dumps(dict({"tp_size": 1}, **({"speculative_algorithm": "EAGLE3"}
                                                                         if spec else {}))))
        (rd / "server_info.json").write_text(json.dumps({"version": version}))
        (rd / "bench.jsonl").write_text("".join(json.dumps({"ok": True, "warmup": False,
                                                            "accept_len": 128 / 127 if spec else None}) + "\n"
                                                for _ in range(4)))
        arms.append({"arm": arm, "run_dir": "runs/" + arm})
    return {"arms": arms}


def test_real_engine_check_passes_on_the_real_0517_shutdown_record(tmp_path):
    check = gv.real_engine_check(real_engine_work(tmp_path), tmp_path)
    assert check.ok, check.lines
    assert "tree-kill (version 0.5.17: tree-kill)" in check.lines[1]
    assert "kill_process_tree parent_pid=2037 include_parent=True" in check.lines[1]
    assert "scheduler_0 -15" in check.lines[1] and "SIGTERM -> kill_process_tree 6.0 s" in check.lines[1]


@pytest.mark.parametrize("why, kw", [
    ("the stop.json of that run as it was: no shutdown record", {"with_record": False}),
    ("no kill_process_tree line: not shown to be the engine's own tree-kill",
     {"log_filter": lambda ln: "kill_process_tree" not in ln}),
    ("no drain begun", {"log_filter": lambda ln: "Draining requests" not in ln}),
    ("0.5.23 ends by ShutdownReq, not by killing its tree", {"version": "0.5.23"}),
])
def test_real_engine_check_fails_without_the_shutdown_its_version_does(tmp_path, why, kw):
    check = gv.real_engine_check(real_engine_work(tmp_path, **kw), tmp_path)
    assert not check.ok, why


# --------------------------------------------------------------------------- (g) driver.py to a report

REAL_EXP = REPO / "tests" / "fixtures" / "sglang-0.5.17" / "experiment-real"   # driver.py on the H200, real 0.5.17


def driver_work(work: Path, **result: Any) -> Dict[str, Any]:
    exp = work / "driver-runs" / "real-sglang-20261201-045032"
    exp.mkdir(parents=True)
    for name in ("results.sqlite", "report.json", "report.md"):
        shutil.copy(REAL_EXP / name, exp / name)
    return dict({"rc": 0, "wall_s": 283.0, "log": str(work / "driver.log"), "expected_runs": 4,
                 "experiment_dirs": [str(exp.relative_to(work))]}, **result)


def test_driver_check_passes_on_the_real_driver_run_to_a_report(tmp_path):
    check = gv.driver_check(driver_work(tmp_path), tmp_path)
    assert check.ok and check.key == "g", check.lines
    text = "\n".join(check.lines)
    assert "4/4 runs ok; report.md written, report.json written" in text
    assert "report: eagle3-s2 293.6 tok/s (median of runs), accept length 1.0079" in text
    assert "speedup eagle3-s2 vs baseline 0.477" in text
    # that run predates stop.py's shutdown record: shown as such, not invented
    assert "001-eagle3-s2 (eagle3-s2): ok; shutdown not recorded" in text


def test_driver_check_fails_when_the_driver_run_does_not_reach_a_report(tmp_path):
    import sqlite3
    assert not gv.driver_check(driver_work(tmp_path / "rc", rc=1), tmp_path / "rc").ok
    assert not gv.driver_check(driver_work(tmp_path / "n", expected_runs=6), tmp_path / "n").ok
    assert not gv.driver_check({"rc": 0, "expected_runs": 4, "experiment_dirs": []}, tmp_path).ok
    d = driver_work(tmp_path / "md")
    (tmp_path / "md" / d["experiment_dirs"][0] / "report.md").unlink()
    assert not gv.driver_check(d, tmp_path / "md").ok
    d = driver_work(tmp_path / "failed")
    con = sqlite3.connect(tmp_path / "failed" / d["experiment_dirs"][0] / "results.sqlite")
    con.execute("UPDATE runs SET status = 'failed' WHERE seq = 3")
    con.commit()
    con.close()
    check = gv.driver_check(d, tmp_path / "failed")
    assert not check.ok and "3/4 runs ok" in check.lines[0]


def test_the_driver_runs_on_the_validations_node_dir_and_bundle(tmp_path):
    """driver.py takes no extra vars: the inventory it gets carries the validation's node dir, bundle and
    PYTHONPATH as group vars, rendered by specab's own inventory loader."""
    from specab.config.inventory import load_inventory
    ctx = gv.Ctx(tp=1, work=tmp_path, python=sys.executable, cpu_sim=False, time_scale="4", engine="real-sglang",
                 real_site="/tmp/bundle")
    host = load_inventory(gv.driver_inventory(ctx)).hosts[0]
    assert host.node_dir == str(tmp_path / "node")
    assert host.node_env["PYTHONPATH"].split(":")[0] == "/tmp/bundle"
    assert host.engine_cmd == gv.REAL_ENGINE and host.smi_cmd == ["nvidia-smi"]


def test_a_real_engine_summary_has_g_unless_the_driver_run_was_skipped(tmp_path):
    res = good_results(tmp_path, 1)
    res["engine"] = "real-sglang"
    res["driver"] = driver_work(tmp_path)
    assert [c.key for c in gv.evaluate(res, tmp_path)] == list("abcdefg")
    res["driver"] = {"skipped": "--no-driver"}
    assert [c.key for c in gv.evaluate(res, tmp_path)] == list("abcdef")
    assert "driver.py run to a report: skipped (--no-driver)" in gv.render_summary(res, gv.evaluate(res, tmp_path))


# Stands in for the python that runs driver.py: records its argv and answers SIGINT as the driver does
# (specab/driver/signals.py installs its own handler, whatever SIGINT's disposition was when it started: a bash trap
# cannot, where the shell that started the run left SIGINT ignored, e.g. `nohup ... &` or a script's `cmd &`).
STUB_DRIVER = f"""#!{sys.executable}
import os, signal, sys, time
from pathlib import Path
here, args = Path(sys.argv[0]).parent, sys.argv[1:]
(here / "argv.txt").write_text("".join(a + "\\n" for a in args))
exp = Path(args[args.index("--runs-dir") + 1]) / "real-sglang-1"
exp.mkdir(parents=True, exist_ok=True)
(exp / "results.sqlite").touch()
if os.environ.get("STUB_HANG"):
    def interrupted(signum, frame):
        (here / "sigint.txt").write_text("interrupted\\n")
        sys.exit(130)
    signal.signal(signal.SIGINT, interrupted)
    (here / "trap-set").touch()
    time.sleep(60)
"""


class _TimeoutOnceTrapSet(subprocess.Popen):
    """step_driver's Popen, whose first timed wait starts only once the stub has set its SIGINT trap: the
    timeout then interrupts a driver that answers SIGINT, however long the stub took to start (on a loaded
    box a 1 s timeout fired before bash reached its trap, and SIGINT killed it with no sigint.txt)."""

    def wait(self, timeout=None):
        if timeout is not None and not getattr(self, "_trap_waited", False):
            self._trap_waited = True
            marker = Path(self.args[0]).parent / "trap-set"
            deadline = time.monotonic() + 60
            while not marker.exists() and self.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            assert marker.exists(), "the stub driver never set its SIGINT trap"
        return super().wait(timeout)


@pytest.mark.parametrize("hang, sigint_ignored", [(False, False), (True, False), (True, True)])
def test_the_driver_step_runs_driver_py_and_interrupts_it_at_its_timeout(tmp_path, monkeypatch, hang, sigint_ignored):
    """sigint_ignored: gpu_validation started where SIGINT is ignored (`nohup ... &`): the driver inherits that, and
    the timeout's SIGINT still interrupts it, because the driver installs its own handler."""
    stub = tmp_path / "python"
    stub.write_text(STUB_DRIVER)
    stub.chmod(0o755)
    if hang:
        monkeypatch.setenv("STUB_HANG", "1")
        monkeypatch.setattr(gv.subprocess, "Popen", _TimeoutOnceTrapSet)
    ctx = gv.Ctx(tp=1, work=tmp_path, python=str(stub), cpu_sim=False, time_scale="4", engine="real-sglang",
                 real_site="/tmp/bundle", driver_timeout_s=1.0 if hang else 60.0)
    gv.load_experiment(ctx)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if sigint_ignored else None    # the child inherits it
    try:
        out = gv.step_driver(ctx)
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    argv = (tmp_path / "argv.txt").read_text().splitlines()
    assert argv == [str(REPO / "driver.py"), "-i", str(tmp_path / "driver-inventory.yml"), "-e",
                    str(REPO / "experiments" / "real-sglang.yml"), "--repeats", "2", "--runs-dir",
                    str(tmp_path / "driver-runs")]
    assert out["experiment_dirs"] == ["driver-runs/real-sglang-1"] and out["expected_runs"] == 4
    if hang:
        assert out["rc"] == 124 and (tmp_path / "sigint.txt").read_text().strip() == "interrupted"
    else:
        assert out["rc"] == 0
