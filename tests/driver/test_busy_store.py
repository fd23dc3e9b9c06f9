"""A database browser holds results.sqlite through an experiment: the driver waits a bounded time, stops with a
clear message (no traceback) and a non-zero status, keeps every run the node finished (fetched into the experiment
directory, not lost), and `--resume` records those runs and runs only the missing ones.

The same experiment (one setup for three behaviours) runs its arms on a model of their own (`server_args.model_path`:
their launch, args.json, manifest and the store's arm rows say it) and more requests in flight than its server runs
at once, asked for with bench.allow_queueing (the report's load label says what the server ran, the doctor's
`server-queued` names the queue)."""
from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from specab.results import store as st
from tests.driver.simnode import SPEC_ARMS, SimNode, driver, free_port, reap_driver, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
MODEL = "/models/Kimi-K2.5-INT4-arm"          # the arms' own model, not the experiment's
HOLD = ("import sqlite3, sys\n"
        "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "c.execute('BEGIN IMMEDIATE')          # a browser's edit in progress: the write lock, held\n"
        "print('held', flush=True)\n"
        "sys.stdin.read()\n")


@pytest.fixture
def node(tmp_path: Path):
    n = SimNode(root=tmp_path, port=free_port(), profile="instant")
    yield n
    n.cleanup()


def node_finished(node: SimNode, exp_id: str) -> dict[str, float]:
    """The runs of the experiment the node finished (done.json ok or failed): run id -> done.json's finished_at."""
    out = {}
    for d in (node.node_dir / "runs").iterdir():
        try:
            entry, done = (json.loads((d / f).read_text()) for f in ("queue_entry.json", "done.json"))
        except (OSError, ValueError):
            continue
        if entry.get("experiment_id") == exp_id and done.get("status") in ("ok", "failed"):
            out[d.name] = done["finished_at"]
    return out


def recorded(exp_dir: Path) -> dict[str, str]:
    """Run id -> status of the store's rows ({} while the driver is still creating it)."""
    try:
        with st.Store.open(exp_dir) as s:
            return {r["run_id"]: r["status"] for r in s.runs()}
    except st.StoreError:
        return {}


def test_a_store_held_by_a_browser_stops_the_experiment_keeps_every_finished_run_and_resume_runs_the_rest(
        node: SimNode) -> None:
    arms = yaml.safe_load(SPEC_ARMS)["arms"]
    for arm in arms:
        arm.setdefault("server_args", {})["model_path"] = MODEL
    exp = node.write_experiment("busy", arms=yaml.safe_dump({"arms": arms}), num_requests=4, output_len=64)
    # 4 requests in flight on a server that runs 2 at once, asked for: the report says what the server ran
    doc = yaml.safe_load(exp.read_text())
    doc["specab_experiment"]["server_args"]["max_running_requests"] = 2
    doc["specab_experiment"]["bench"].update(concurrency=4, allow_queueing=True)
    exp.write_text(yaml.safe_dump(doc, sort_keys=False))
    inv, runs = node.write_inventory(), node.runs_dir
    env = {"SPECAB_STORE_BUSY_S": "4"}
    proc = driver("-e", str(exp), "-i", str(inv), "--runs-dir", str(runs), "--repeats", "3", env=env)
    holder = None
    try:
        wait_for(lambda: any(runs.glob(f"*/{st.FILENAME}")), 120, what="the store", proc=proc)
        exp_dir = next(runs.glob(f"*/{st.FILENAME}")).parent
        wait_for(lambda: "ok" in recorded(exp_dir).values(), 300, what="the first recorded run", proc=proc)
        holder = subprocess.Popen([sys.executable, "-c", HOLD, str(exp_dir / st.FILENAME)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        assert holder.stdout.readline().strip() == "held"
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 1, out[-4000:]
        assert "Traceback" not in out, out[-4000:]
        assert "Stopped: the store could not be written." in out and f"PID {holder.pid} (python" in out, out[-3000:]
        assert f"waited 4 s (SPECAB_STORE_BUSY_S)" in out and "Resume once the store is free" in out
        before = recorded(exp_dir)                                # read while the browser still holds it
        finished = node_finished(node, exp_dir.name)
        unrecorded = sorted(set(finished) - {r for r, s in before.items() if s in ("ok", "failed")})
        print(f"recorded before the stop: {before}; finished on the node: {sorted(finished)}; fetched: {unrecorded}")
        assert unrecorded, (finished, before)        # the node went on while the store was held: kept, not lost
        for run_id in unrecorded:
            assert json.loads((exp_dir / run_id / "done.json").read_text())["status"] in ("ok", "failed")
        assert f"{len(unrecorded)} run(s) the node finished were fetched into {exp_dir} but not recorded: " \
               f"{', '.join(unrecorded)}." in out, out[-3000:]
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()
        reap_driver(proc, 60)
    # the browser is closed: the resume records what the node finished and runs only the rest
    t_resume = time.time()
    res = driver("--resume", exp_dir.name, "--runs-dir", str(runs), env=env)
    out, _ = res.communicate(timeout=600)
    assert res.returncode == 0, out[-4000:]
    after = recorded(exp_dir)
    assert sorted(after) == sorted(f"{i:03d}-{a}" for i, a in
                                   ((r["seq"], r["arm"]) for r in json.loads(export_plan(exp_dir))))
    assert set(after.values()) == {"ok"}, after
    for run_id in unrecorded:
        assert f"{run_id}: finished on the node before this resume: recorded, not run again" in out
    again = node_finished(node, exp_dir.name)
    for run_id, t in finished.items():           # not one finished run ran again
        assert again[run_id] == t < t_resume, run_id
    assert sum("recorded, not run again" in line for line in out.splitlines()) == len(unrecorded)
    # the queue asked for: the verdict's load says what the server ran, the doctor names the queue (not the CPU)
    report = json.loads((exp_dir / "report.json").read_text())
    assert any("per user at 4 in flight, of which the server ran at most 2 at once and queued up to 2 (its own log)"
               in line for line in report["summary"]), report["summary"]
    queued = {f["arm"] for f in report["findings"] if f["rule"] == "server-queued"}
    assert queued == {"baseline", "eagle3-s2"}, report["findings"]
    assert not [f for f in report["findings"] if f["rule"] == "cycle-time-unstable"]
    # the arms' own model: launched, applied, recorded
    with st.Store.open(exp_dir) as s:
        assert {json.loads(a["server_args_json"])["model_path"] for a in
                s.conn.execute("SELECT server_args_json FROM arms")} == {MODEL}
    for run_id in after:
        args = json.loads((exp_dir / run_id / "args.json").read_text())
        manifest = json.loads((exp_dir / run_id / "manifest.json").read_text())
        assert args["model_path"] == MODEL and f"--model-path {MODEL}" in (exp_dir / run_id / "launch.sh").read_text()
        assert MODEL in json.dumps(manifest.get("server_args") or manifest)


def export_plan(exp_dir: Path) -> str:
    with st.Store.open(exp_dir) as s:
        return json.dumps(s.plan())
