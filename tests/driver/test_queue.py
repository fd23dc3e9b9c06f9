"""The queue executor end to end (dead time between runs; docs/architecture.md "Run queue"): the node's
sequencer runs the queued runs back to back, the driver's Ansible work overlaps the benchmarks."""
from __future__ import annotations

import json
import signal
import statistics
import subprocess
from pathlib import Path

import pytest

from specab.results import store as st
from tests.driver.simnode import reap_driver, SimNode, driver, free_port, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]
NODE_SECRET = "node-planted-secret-4711"


@pytest.fixture
def node(tmp_path: Path):
    n = SimNode(root=tmp_path, port=free_port(), profile="instant")
    yield n
    n.cleanup()
    _kill_sequencer(n)


def _sequencer(node: SimNode) -> dict | None:
    try:
        return json.loads((node.node_dir / "sequencer.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _sequencer_alive(node: SimNode) -> bool:
    """Whether the process sequencer.json names still runs (pid and start time, not a reused pid)."""
    rec = _sequencer(node)
    if not rec:
        return False
    try:
        stat = Path(f"/proc/{rec['pid']}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return stat[0] not in ("Z", "X") and int(stat[19]) == int(rec["starttime"])


def _kill_sequencer(node: SimNode) -> None:
    """A failed test must not leave the sequencer it started (its session is its own)."""
    import os
    if _sequencer_alive(node):
        try:
            os.killpg(int(_sequencer(node)["pid"]), signal.SIGKILL)   # type: ignore[index]
        except ProcessLookupError:
            pass


def _exp_dir(runs_dir: Path) -> Path:
    [d] = [d for d in runs_dir.iterdir() if (d / st.FILENAME).exists()]
    return d


def _bench_window(path: Path) -> tuple[float, float]:
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return min(r["start_ts"] for r in recs), max(r["start_ts"] + r["e2e_s"] for r in recs)


def _phase_t(run_dir: Path, phase: str) -> float:
    for line in (run_dir / "phases.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["phase"] == phase:
            return float(rec["t"])
    raise AssertionError(f"{run_dir}/phases.jsonl has no phase {phase!r}")


def test_queue_runs_every_run_in_one_sequencer_and_fetches_what_the_analysis_reads(node: SimNode):
    """6 runs on the queue executor: every run ok, in plan order, all six and their five transitions inside ONE
    sequencer process (its own count of runs done), so no Ansible task runs between two runs; the sequencer exits
    at the end. The dead time of each transition (last request of run k -> first request of run k+1, minus the
    engine's start -> ready) is printed, not asserted: a wall-clock figure on a shared box belongs to the benchmark
    (bench/dead_time.py, its table in docs/performance.md §1), where load and machine are recorded with it."""
    exp = node.write_experiment("dq", num_requests=2, output_len=16)   # instant profile: no load sub-phases
    host_vars = node.host_vars()
    host_vars["specab_node_env"] = {**node.node_env(), "MY_NODE_TOKEN": NODE_SECRET}   # reaches the queue entry
    inv = node.write_inventory(host_vars)
    proc = driver("--repeats", "3", "-e", str(exp), "-i", str(inv), "--runs-dir", str(node.runs_dir))
    out, _ = proc.communicate(timeout=1000)
    assert proc.returncode == 0, out[-4000:]
    exp_dir = _exp_dir(node.runs_dir)
    with st.Store.open(exp_dir) as s:
        runs = s.runs()
        assert [r["status"] for r in runs] == ["ok"] * 6
        assert [r["seq"] for r in sorted(runs, key=lambda r: r["started"])] == list(range(1, 7))
        assert len(s.requests()) == 6 * 2 and s.manifests()
        for r in runs:      # the node's phases are stored, in the per-run path's names and order
            names = [p["phase"] for p in s.phases(r["seq"])]
            assert names.index("stopping") < names.index("waiting for GPUs") < names.index("starting") \
                < names.index("loading") < names.index("benchmarking") < names.index("final stop"), names
    dirs = [Path(r["run_dir"]) for r in runs]
    dead = []
    for prev, nxt in zip(dirs, dirs[1:]):
        _, t_end = _bench_window(prev / "bench.jsonl")
        t_first, _ = _bench_window(nxt / "bench.jsonl")
        load = _phase_t(nxt, "ready") - _phase_t(nxt, "starting")
        dead.append(t_first - t_end - load)
    median = statistics.median(dead)
    print(f"\nqueue executor: dead time per transition median {median:.2f} s "
          f"(min {min(dead):.2f}, max {max(dead):.2f}) over {len(dead)} transitions; bench/dead_time.py measures it")
    # every file the analysis reads came back, and the manifest was written by the sequencer
    for d in dirs:
        for name in ("manifest.json", "bench_summary.json", "env_check.json", "stop.json", "gpu_free.json",
                     "server.log", "launch.sh", "nccl.env", "done.json"):
            assert (d / name).exists(), d / name
    # the queue entry carries the node env (a secret there stays in 0600 files, out of the store)
    for d in dirs:
        assert (d / "queue_entry.json").stat().st_mode & 0o077 == 0
    for f in exp_dir.glob(st.FILENAME + "*"):      # the store and its WAL
        assert NODE_SECRET.encode() not in f.read_bytes(), f
    # END was sent: the sequencer exited by itself, nothing of ours runs, the queue is empty
    wait_for(lambda: not _sequencer_alive(node), timeout=60, what="the sequencer to exit after the END marker")
    assert not node.server_alive() and node.gpus_busy() == []
    assert not [p for p in (node.node_dir / "queue").iterdir() if p.suffix == ".json"]
    # one sequencer ran every run back to back (a restarted one would count only the runs since its start)
    rec = json.loads((node.node_dir / "sequencer.json").read_text())
    assert rec["state"] == "exited" and rec["runs_done"] == 6 and "end marker" in rec["reason"], rec


def test_queue_sigint_mid_experiment_stops_sequencer_and_server_then_resume(node: SimNode):
    """SIGINT while run 2 of 4 benchmarks (runs 3 and 4 queued on the node): exit 130, no sequencer, no
    server, no GPU memory; run 1 kept ok (also when the driver had not collected it yet: it is fetched
    after the stop), run 2 interrupted, runs 3 and 4 missing; --resume runs exactly those three through
    a fresh queue."""
    # the default profile's load phases (their names are asserted below) at real time, and a benchmark of ~7 s a run
    # (6 + 1 requests of 96 tokens at ~82 tok/s): the window the SIGINT must hit, with the stop's Ansible start-up
    node.profile = "default"
    exp = node.write_experiment("qi", num_requests=6, output_len=96)
    inv = node.write_inventory()
    common = ["-e", str(exp), "-i", str(inv), "--runs-dir", str(node.runs_dir)]
    proc = driver("--repeats", "2", "--order", "blocked", *common)
    try:
        def second_benchmarking() -> bool:
            s = node.server()
            bench = node.node_dir / "runs" / "002-baseline" / "bench.jsonl"
            return bool(s and s.get("run_id") == "002-baseline" and node.server_alive() and bench.exists())
        wait_for(second_benchmarking, timeout=600, what="run 002 benchmarking", proc=proc)
        assert _sequencer_alive(node)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=600)
    finally:
        reap_driver(proc, 300)
    assert proc.returncode == 130, out[-4000:]
    assert "--resume" in out
    assert not _sequencer_alive(node), _sequencer(node)
    assert not node.server_alive() and node.gpus_busy() == []
    exp_dir = _exp_dir(node.runs_dir)
    with st.Store.open(exp_dir) as s:
        runs = {r["seq"]: r for r in s.runs()}
        assert runs[1]["status"] == "ok" and runs[1]["n_requests"] == 6
        assert runs[2]["status"] == "interrupted"
        # run 3 never started, or (a stop that reached the node only after run 2 had ended, on a loaded
        # machine) was cut while loading: the signal's time decides, so run 2 is interrupted either way and
        # run 3, when it has a row, is interrupted too; run 4 never ran
        assert runs.get(3, {"status": "interrupted"})["status"] == "interrupted" and 4 not in runs, runs
        attempts3 = 2 if 3 in runs else 1
        assert [r["seq"] for r in s.missing()] == [2, 3, 4]
        assert s.experiment()["status"] == "interrupted"
        first = (runs[1]["started"], runs[1]["runner_ident"])
        # the default profile's load sub-phases, from the node's ready.json, in the per-run path's names
        names = [p["phase"] for p in s.phases(1)]
        assert names.index("loading") < names.index("loading weights") < names.index("capturing graphs") \
            < names.index("ready") < names.index("verifying env"), names
    proc = driver("--resume", exp_dir.name, "--runs-dir", str(node.runs_dir))
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-4000:]
    assert "3 of 4 runs to do" in out
    with st.Store.open(exp_dir) as s:
        runs = {r["seq"]: r for r in s.runs()}
        assert [runs[k]["status"] for k in (1, 2, 3, 4)] == ["ok"] * 4
        assert (runs[1]["started"], runs[1]["runner_ident"]) == first
        assert runs[2]["attempt"] == 2 and runs[3]["attempt"] == attempts3
        assert all(runs[k]["n_requests"] == 6 for k in (1, 2, 3, 4))
        assert s.experiment()["status"] == "finished"
    wait_for(lambda: not _sequencer_alive(node), timeout=60, what="the sequencer to exit after the END marker")
    assert not node.server_alive() and node.gpus_busy() == []
