"""The bench tool (specab/node/benchstep.py, what the bench role runs through specab_node and RunSteps runs in the
queue): its artefacts, its failure headline and exit status, and the sampler stopped in every case; and the sampler
of a non-head rank of a multi-node server (ranksampler)."""
from __future__ import annotations

import csv
import os
import json
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, List

from specab.config import defaults
from specab.node import procfs
from specab.node import stop as stop_tool
from tests.node.helpers import NODE_DIR_SRC, PY, ServerSetup, SimNode, ToolResult, free_port, wait_for

ARTEFACTS = {"gpu_before.csv", "gpu_samples.csv", "gpu_samples.json", "gpu_samples.log", "gpu_after.csv",
             "bench.jsonl", "bench_summary.json", "phase_metrics.json"}


def spec(run_dir: Path, url: str, smi: List[str], **bench: Any) -> Dict[str, Any]:
    return {"run_dir": str(run_dir), "url": url, "python": PY, "smi": smi, "gpus": [0, 1],
            "sample_interval_s": 0.05,
            "bench": defaults.bench(dict({"num_requests": 3, "warmup_requests": 1, "input_len": 16, "output_len": 8,
                                          "timeout_s": 30}, **bench))}


def bench_tool(spec_obj: Dict[str, Any], env: Dict[str, str]) -> ToolResult:
    """``bench --spec-json -`` with the spec on stdin, as the module specab_node runs it."""
    t0 = time.monotonic()
    p = subprocess.run([PY, str(NODE_DIR_SRC), "bench", "--spec-json", "-"], input=json.dumps(spec_obj), env=env,
                       capture_output=True, text=True, timeout=120)
    lines = p.stdout.strip().splitlines()
    return ToolResult(p.returncode, json.loads(lines[-1]) if lines else {}, p.stderr, time.monotonic() - t0)


def sampler_summary(run_dir: Path) -> Dict[str, Any]:
    """What the sampler printed as it ended (gpu_samples.json): present once the tool returned, so the tool waited
    for its exit; stopped_by SIGTERM: stopped by the tool, not by a limit or its parent's exit."""
    return json.loads((run_dir / "gpu_samples.json").read_text())


def test_a_benchmark_writes_every_artefact_and_returns_the_summary(server: ServerSetup, sim: SimNode) -> None:
    server.write_sim_launch(scale=20)
    assert server.start().rc == 0 and server.ready(120).rc == 0
    r = bench_tool(spec(server.run_dir, server.url, sim.smi), sim.env)
    assert r.rc == 0, (r.data, r.stderr)
    summary = json.loads((server.run_dir / "bench_summary.json").read_text())
    assert r.data["summary"] == summary and summary["ok"] == summary["requests"] == 3
    assert ARTEFACTS <= {p.name for p in server.run_dir.iterdir()}
    assert sampler_summary(server.run_dir)["stopped_by"] == "SIGTERM"
    for name in ("gpu_before.csv", "gpu_after.csv", "gpu_samples.csv"):
        rows = list(csv.reader((server.run_dir / name).open()))
        assert rows[0][0] == "timestamp" and {row[1] for row in rows[1:]} == {"0", "1"}, (name, rows)
    records = [json.loads(x) for x in (server.run_dir / "bench.jsonl").read_text().splitlines()]
    assert [rec["warmup"] for rec in records] == [True, False, False, False]


def test_a_failing_client_gives_the_headline_and_exit_1_and_the_sampler_is_stopped(tmp_path: Path,
                                                                                  sim: SimNode) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    r = bench_tool(spec(run_dir, "http://127.0.0.1:%d" % free_port(), sim.smi), sim.env)   # nothing listens
    assert r.rc == 1 and r.data["ok"] is False, r.data
    assert r.error.startswith("loadgen exit 1: 3 of 3 measured requests failed; first errors: "
                              "ConnectionRefusedError"), r.error
    # the client's last log line, quoted in the headline
    assert r.error.endswith("Client log: loadgen: 3 measured request(s) failed, first errors: "
                            "['ConnectionRefusedError talking to 127.0.0.1:%s/generate: [Errno 111] Connection "
                            "refused']" % r.data["summary"]["url"].rsplit(":", 1)[1]), r.error
    assert r.data["summary"]["failed"] == 3
    # told to stop as the client ended: a sampler left to the last resort (SIGTERM after 10 s) would show here
    assert sampler_summary(run_dir)["stopped_by"] == "SIGTERM" and r.wall_s < 8, r.wall_s
    assert ARTEFACTS <= {p.name for p in run_dir.iterdir()}


def test_a_spec_with_an_unknown_key_is_a_usage_error(tmp_path: Path, sim: SimNode) -> None:
    bad = dict(spec(tmp_path, "http://127.0.0.1:1", sim.smi), num_requests=3)
    r = bench_tool(bad, sim.env)
    assert r.rc == 2 and "unknown: num_requests" in r.error, r.data
    assert not list(tmp_path.iterdir())            # nothing ran


def test_bench_settings_the_controller_did_not_resolve_are_refused(tmp_path: Path, sim: SimNode) -> None:
    partial = spec(tmp_path, "http://127.0.0.1:1", sim.smi)
    del partial["bench"]["seed"]
    r = bench_tool(partial, sim.env)
    assert r.rc == 2 and "the bench settings lack seed" in r.error, r.data


def ranksampler(spec_obj: Dict[str, Any], env: Dict[str, str]) -> ToolResult:
    p = subprocess.run([PY, str(NODE_DIR_SRC), "ranksampler", "--spec-json", "-"], input=json.dumps(spec_obj),
                       env=env, capture_output=True, text=True, timeout=60)
    lines = p.stdout.strip().splitlines()
    return ToolResult(p.returncode, json.loads(lines[-1]) if lines else {}, p.stderr, 0.0)


def test_a_ranks_sampler_runs_detached_until_stopped(tmp_path: Path, sim: SimNode) -> None:
    """A non-head rank's sampler (multi-node): started, it outlives the tool in a session of its own, recorded in
    helpers.json with its start time; stopped, it ends by SIGTERM and its record is gone; a second stop finds
    none."""
    start = ranksampler({"action": "start", "run_dir": str(tmp_path), "python": PY, "smi": sim.smi, "gpus": [0, 1],
                         "sample_interval_s": 0.05, "duration_s": 600}, sim.env)
    assert start.rc == 0 and start.data["started"] is True, start.data
    pid = start.data["pid"]
    try:
        record = json.loads((tmp_path / "helpers.json").read_text())["helpers"]
        assert record == [{"tool": "gpusample", "pid": pid, "starttime": procfs.proc_stat(pid).starttime}], record
        assert os.getsid(pid) == pid                                     # its own session, none of our pipes
        csv_file = tmp_path / "gpu_samples.csv"
        assert wait_for(lambda: csv_file.exists() and len(csv_file.read_text().splitlines()) >= 3, 30)
    finally:
        stop = ranksampler({"action": "stop", "run_dir": str(tmp_path)}, sim.env)
    assert stop.rc == 0 and stop.data == {"stopped": True, "pid": pid, "ok": True}, stop.data
    assert not (tmp_path / "helpers.json").exists()
    assert sampler_summary(tmp_path)["stopped_by"] == "SIGTERM"
    again = ranksampler({"action": "stop", "run_dir": str(tmp_path)}, sim.env)
    assert again.rc == 0 and again.data["stopped"] is False and again.data["note"] == "no sampler"


def test_stopping_a_ranks_sampler_leaves_a_reused_pid_alone(tmp_path: Path, sim: SimNode) -> None:
    """The recorded pid now runs another process (another start time), even one whose command line names the
    sampler's tool: the stop leaves it alone and the stale record goes."""
    other = subprocess.Popen([PY, "-c", "import time; time.sleep(60)", "gpusample"])
    try:
        reused = {"tool": "gpusample", "pid": other.pid, "starttime": procfs.proc_stat(other.pid).starttime - 1}
        (tmp_path / "helpers.json").write_text(json.dumps({"helpers": [reused]}))
        r = ranksampler({"action": "stop", "run_dir": str(tmp_path)}, sim.env)
        assert r.rc == 0 and r.data["stopped"] is False and r.data["note"] == "sampler already ended", r.data
        assert other.poll() is None and not (tmp_path / "helpers.json").exists()
    finally:
        other.kill()
        other.wait()


def test_the_stop_ends_a_recorded_helper_that_is_still_ours_and_nothing_else(tmp_path: Path, sim: SimNode) -> None:
    """A rank's sampler whose playbook was cut off (the driver's Ctrl-C) runs on in a session of its own: the stop
    of its run's server ends it through helpers.json (specab/node/stop.py end_helpers). A recorded pid is ended only
    while it is the recorded process: a process of the recorded start time whose command line does not name the
    tool, or one whose start time differs (a reused pid), is left alone."""
    start = ranksampler({"action": "start", "run_dir": str(tmp_path), "python": PY, "smi": sim.smi, "gpus": [0, 1],
                         "sample_interval_s": 0.05, "duration_s": 600}, sim.env)
    assert start.rc == 0, start.data
    sampler = start.data["pid"]
    other = subprocess.Popen([PY, "-c", "import time; time.sleep(60)"])
    try:
        record = json.loads((tmp_path / "helpers.json").read_text())["helpers"]
        assert [(h["tool"], h["pid"]) for h in record] == [("gpusample", sampler)], record
        other_start = procfs.proc_stat(other.pid).starttime
        record += [{"tool": "gpusample", "pid": other.pid, "starttime": other_start},
                   {"tool": "python", "pid": other.pid, "starttime": other_start + 1}]
        (tmp_path / "helpers.json").write_text(json.dumps({"helpers": record}))
        assert wait_for(lambda: (tmp_path / "gpu_samples.csv").exists(), 30)
        ended = stop_tool.end_helpers({"run_dir": str(tmp_path)}, stop_tool.Stopper(None), kill_wait=5.0)
        assert ended == ([{"tool": "gpusample", "pid": sampler}], ""), ended
        assert not procfs.is_alive(sampler) and other.poll() is None
        assert sampler_summary(tmp_path)["stopped_by"] == "SIGTERM"     # ended by the stop's SIGTERM, CSV whole
        assert not (tmp_path / "helpers.json").exists()
    finally:
        other.kill()
        other.wait()
        ranksampler({"action": "stop", "run_dir": str(tmp_path)}, sim.env)


def test_the_stop_ends_a_bench_tool_whose_playbook_was_cut_off_before_its_server(server: ServerSetup,
                                                                                sim: SimNode) -> None:
    """The bench tool goes on when the driver's Ctrl-C cancels its playbook (nothing of Ansible ends it). The stop
    of the run's server ends it, its client and its sampler first (helpers.json, pid + start time), so the client
    sends nothing to the draining server: no measured request fails, and none of them is left when stop returns."""
    server.write_sim_launch(scale=20)
    assert server.start().rc == 0 and server.ready(120).rc == 0
    tool = subprocess.Popen([PY, str(NODE_DIR_SRC), "bench", "--spec-json", "-"], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=sim.env, text=True)
    assert tool.stdin is not None
    tool.stdin.write(json.dumps(spec(server.run_dir, server.url, sim.smi, num_requests=400)))
    tool.stdin.close()
    try:
        bench = server.run_dir / "bench.jsonl"
        assert wait_for(lambda: bench.exists() and '"warmup":false' in bench.read_text(), 60)
        record = json.loads((server.run_dir / "helpers.json").read_text())["helpers"]
        assert [(h["tool"], h["pid"] == tool.pid) for h in record] == [("bench", True), ("loadgen", False),
                                                                       ("gpusample", False)], record
        r = server.stop(30)
        assert r.rc == 0, r.error
        assert [(h["tool"], h["pid"]) for h in r.data["helpers_ended"]] == [(h["tool"], h["pid"]) for h in record]
        assert all(not procfs.is_alive(h["pid"]) for h in record) and tool.poll() is not None
        assert not (server.run_dir / "helpers.json").exists()
        lines = [json.loads(x) for x in bench.read_text().splitlines() if x.endswith("}")]
        assert [x for x in lines if not x["ok"]] == [] and len(lines) < 401, lines[-3:]
    finally:
        if tool.poll() is None:
            tool.kill()
        tool.wait()


def test_a_helper_that_outlives_sigkill_keeps_no_server_running(server: ServerSetup, sim: SimNode,
                                                                 monkeypatch) -> None:
    """A recorded helper that survives SIGKILL (uninterruptible sleep) fails the stop, but only after the server is
    stopped; its record stays for a retry."""
    server.write_sim_launch(scale=20)
    assert server.start().rc == 0
    rec = json.loads((server.node_dir / "server.json").read_text())
    monkeypatch.setattr(stop_tool, "end_helpers", lambda rec, st, kill_wait: (
        [{"tool": "loadgen", "pid": 12345}], "the run's helpers survived SIGKILL for 15s: pid 12345"))
    a = stop_tool.StopSpec(node_dir=str(server.node_dir), smi=list(sim.smi), grace=30)
    try:
        stop_tool.stop_server(a)
    except stop_tool.ToolError as exc:
        assert exc.message == "the run's helpers survived SIGKILL for 15s: pid 12345"
        assert exc.result["helpers_ended"] == [{"tool": "loadgen", "pid": 12345}] and exc.result["was_running"]
    else:
        raise AssertionError("the stop did not fail")
    assert not procfs.is_alive(rec["pid"]) and not (server.node_dir / "server.json").exists()
