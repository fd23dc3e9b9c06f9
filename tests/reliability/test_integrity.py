"""Integrity on one simulated node: one experiment per node (the node lease), a resume
must be comparable (the experiment fingerprint), and an interrupt keeps what was measured."""
from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from specab.results import store as st
from tests.driver.simnode import SPEC_ARMS, SimNode, driver, free_port, reap_driver, wait_for
from tests.driver.test_queue import _kill_sequencer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture
def node(tmp_path: Path):
    n = SimNode(root=tmp_path, port=free_port())
    yield n
    n.cleanup()
    _kill_sequencer(n)


def _env(node: SimNode) -> dict[str, str]:
    return {"XDG_CACHE_HOME": str(node.root / "cache")}


def _exp_dirs(runs_dir: Path) -> list[Path]:
    return sorted(d for d in runs_dir.iterdir() if (d / st.FILENAME).exists()) if runs_dir.exists() else []


def test_item20_second_experiment_on_a_busy_node_is_refused_and_the_first_finishes(node: SimNode):
    exp = node.write_experiment("first", num_requests=2, output_len=16)
    inv = node.write_inventory()
    first = driver("--repeats", "1", "-e", str(exp), "-i", str(inv), "--runs-dir", str(node.runs_dir),
                   env=_env(node))
    second = None
    try:
        # the first holds the node's lease and its sequencer runs
        wait_for(lambda: (node.node_dir / "experiment.lease").exists() and (node.node_dir / "sequencer.json").exists(),
                 timeout=300, what="the first experiment's lease and sequencer", proc=first)
        holder = json.loads((node.node_dir / "experiment.lease").read_text())
        second_exp = node.write_experiment("second", num_requests=2, output_len=16)
        second = driver("--repeats", "1", "-e", str(second_exp), "-i", str(inv), "--runs-dir",
                        str(node.root / "runs2"), env=_env(node))
        out2, _ = second.communicate(timeout=300)
        assert first.poll() is None, "the first experiment ended before the second was refused: no overlap"
        out1, _ = first.communicate(timeout=600)
    finally:
        reap_driver(first, 120)
        if second is not None:
            reap_driver(second, 120)
    assert second.returncode == 2, out2[-3000:]
    assert holder["experiment_id"] in out2 and f"pid {holder['controller_pid']}" in out2, out2[-3000:]
    assert "Traceback" not in out2
    assert _exp_dirs(node.root / "runs2") == [], "the refused experiment left an experiment directory"
    assert first.returncode == 0, out1[-4000:]
    assert "interrupted by the user" not in out1 and "Interrupted." not in out1, out1[-4000:]
    [exp_dir] = _exp_dirs(node.runs_dir)
    with st.Store.open(exp_dir) as s:
        assert [r["status"] for r in s.runs()] == ["ok", "ok"]
        assert s.experiment()["status"] == "finished"
    assert not (node.node_dir / "experiment.lease").exists(), "the lease was not released"
    assert not node.server_alive() and node.gpus_busy() == []
    # every collected manifest carries the fingerprint, the bench settings and the timeouts (driver.py diff)
    manifest = json.loads(next(exp_dir.glob("001-*/manifest.json")).read_text())
    assert manifest["bench"]["num_requests"] == 2 and manifest["timeouts"]["ready_s"] == 120
    with st.Store.open(exp_dir) as s:
        assert manifest["fingerprint"] == s.fingerprint()[0] == s.run_fingerprints()[1]

    # a resume whose experiment changed (the bench: 6 requests instead of 2) is refused, naming the change,
    # before anything on the node is touched
    exp.write_text(exp.read_text().replace("num_requests: 2", "num_requests: 6"))
    resumed = driver("--resume", exp_dir.name, "--retry-failed", "-e", str(exp), "--runs-dir", str(node.runs_dir),
                     env=_env(node))
    out3, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 2, out3[-3000:]
    assert "bench.num_requests: 2 -> 6" in out3 and "--force-changed" in out3, out3[-3000:]
    assert not (node.node_dir / "experiment.lease").exists()


def test_item20_sequencer_stopped_by_someone_else_is_a_failure_naming_the_cause_not_an_interruption(node: SimNode):
    """Only a signal the driver received is an interruption: the node's sequencer SIGTERMed by another process
    mid-benchmark (stop.py by hand, another controller, the system) makes that run failed with the cause named,
    the queue is started anew and the next run is measured; nothing says "interrupted by the user"."""
    import os
    from tests.driver.test_queue import _sequencer, _sequencer_alive
    node.profile = "instant"
    exp = node.write_experiment("foreign", num_requests=3, output_len=256)     # ~3 s a request: a window to hit
    proc = driver("--repeats", "1", "-e", str(exp), "-i", str(node.write_inventory()), "--runs-dir",
                  str(node.runs_dir), env=_env(node))
    node_runs = node.node_dir / "runs"

    def benchmarking() -> bool:       # run 001's warm-up answered, its measured requests not yet
        try:
            recs = [json.loads(x) for x in next(node_runs.glob("001-*/bench.jsonl")).read_text().splitlines()
                    if x.strip()]
        except (OSError, ValueError, StopIteration):
            return False
        return bool(recs) and all(r["warmup"] for r in recs) and _sequencer_alive(node)
    try:
        wait_for(benchmarking, timeout=300, interval=0.05, what="run 001 benchmarking", proc=proc)
        seq_pid = int(_sequencer(node)["pid"])                    # type: ignore[index]
        os.kill(seq_pid, signal.SIGTERM)                          # not the driver's signal
        out, _ = proc.communicate(timeout=600)
    finally:
        reap_driver(proc, 120)
    assert proc.returncode == 1, out[-4000:]                      # a failed run, not 130 (interrupted)
    assert "interrupted by the user" not in out and "Interrupted." not in out, out[-4000:]
    [exp_dir] = _exp_dirs(node.runs_dir)
    with st.Store.open(exp_dir) as s:
        runs = {r["seq"]: r for r in s.runs()}
        assert [runs[q]["status"] for q in (1, 2)] == ["failed", "ok"], runs
        why = runs[1]["failure_reason"]
        assert why.startswith("the node's sequencer was stopped by a signal this driver did not send"), why
        assert "interrupted by SIGTERM" in why, why                # the cause, from the node's done.json
        phase = runs[1]["failure_phase"]
        assert phase in ("warming up", "benchmarking"), runs[1]
        assert s.runs(status="interrupted") == [] and s.missing() == []
        assert len([q for q in s.requests() if q["seq"] == 2 and not q["warmup"]]) == 3
    assert f"FAILED {runs[1]['run_id']} ({phase}): the node's sequencer was stopped by a signal" in \
        " ".join(out.split()), out[-4000:]
    assert not node.server_alive() and node.gpus_busy() == []
    assert not (node.node_dir / "experiment.lease").exists()


def test_item20_ctrl_c_after_a_finished_benchmark_keeps_that_run_and_starts_no_next_server(node: SimNode):
    exp = node.write_experiment("keep", num_requests=2, output_len=16)
    inv = node.write_inventory()
    proc = driver("--repeats", "1", "-e", str(exp), "-i", str(inv), "--runs-dir", str(node.runs_dir),
                  env=_env(node))
    node_runs = node.node_dir / "runs"

    def finished() -> bool:    # warm-up + both measured requests of run 001 answered
        try:
            bench = next(node_runs.glob("001-*/bench.jsonl"))
            recs = [json.loads(x) for x in bench.read_text().splitlines() if x.strip()]
        except (OSError, ValueError, StopIteration):
            return False
        return sum(1 for r in recs if not r["warmup"] and r["ok"]) == 2
    try:
        wait_for(finished, timeout=300, interval=0.05, what="run 001's benchmark to finish", proc=proc)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=300)
    finally:
        reap_driver(proc, 120)
    assert proc.returncode == 130, out[-4000:]
    [exp_dir] = _exp_dirs(node.runs_dir)
    with st.Store.open(exp_dir) as s:
        runs = {r["seq"]: r for r in s.runs()}
        assert runs[1]["status"] == "ok", runs[1]
        assert len([q for q in s.requests() if q["seq"] == 1 and not q["warmup"]]) == 2
        assert runs.get(2) is None or runs[2]["status"] == "interrupted"
        assert [m["seq"] for m in s.missing()] == [2]
    # the node never started the next arm's server after the signal
    assert list(node_runs.glob("002-*/server.log")) == [], out[-3000:]
    assert not node.server_alive() and node.gpus_busy() == []
    assert not (node.node_dir / "experiment.lease").exists()
    # the summary counts interrupted runs apart from failed ones
    assert "interrupted" in out and "FAILED" not in out

    # the missing run, resumed under a changed experiment (bench 3 requests instead of 2, ready_s 150 instead of
    # 120) with --force-changed: accepted, the change said, the run done under the new fingerprint; the report marks
    # the runs of each fingerprint, and `diff` shows the bench and timeout differences between the two runs
    with st.Store.open(exp_dir) as s:
        old_fp = s.fingerprint()[0]
    exp.write_text(exp.read_text().replace("num_requests: 2", "num_requests: 3").replace("ready_s: 120", "ready_s: 150"))
    resumed = driver("--resume", exp_dir.name, "--force-changed", "-e", str(exp), "--runs-dir", str(node.runs_dir),
                     env=_env(node))
    try:
        out2, _ = resumed.communicate(timeout=300)
    finally:
        reap_driver(resumed, 120)
    assert resumed.returncode == 0, out2[-4000:]
    assert "notice: --force-changed" in out2 and "bench.num_requests: 2 -> 3" in out2, out2[-3000:]
    assert "timeouts.ready_s: 120 -> 150" in out2, out2[-3000:]
    with st.Store.open(exp_dir) as s:
        runs = {r["seq"]: r for r in s.runs()}
        assert [runs[q]["status"] for q in (1, 2)] == ["ok", "ok"] and s.missing() == []
        assert len([q for q in s.requests() if q["seq"] == 2 and not q["warmup"]]) == 3
        new_fp = s.run_fingerprints()[2]
        assert new_fp != old_fp and s.run_fingerprints() == {1: old_fp, 2: new_fp}
        assert s.fingerprint()[0] == old_fp           # the experiment keeps the fingerprint it was started with
    ids = {q: runs[q]["run_id"] for q in (1, 2)}
    marked = (f"Runs of 2 different experiment fingerprints (resumed with --force-changed; they may not be "
              f"comparable): ")
    md = (exp_dir / "report.md").read_text()
    line = next((x for x in md.splitlines() if marked in x), None)
    assert line is not None, md[:3000]
    assert f"{old_fp}: {ids[1]}" in line and f"{new_fp}: {ids[2]}" in line, line
    from specab.driver.cli import main as cli_main
    import io
    text = io.StringIO()
    assert cli_main(["diff", f"{exp_dir.name}/1", f"{exp_dir.name}/2", "--runs-dir", str(node.runs_dir)],
                    out=text) == 0
    diff = text.getvalue().splitlines()
    section = lambda name: diff[diff.index(f"{name}:") + 1:]      # noqa: E731 (the lines after a category)
    assert "  num_requests: 2 -> 3" in section("bench"), diff
    assert "  ready_s: 120 -> 150" in section("timeouts"), diff
    assert f"  fingerprint: {old_fp} -> {new_fp}" in section("experiment"), diff


THREE_ARMS = SPEC_ARMS + """\
  - name: eagle3-s3
    server_args:
      speculative_algorithm: EAGLE3
      speculative_draft_model_path: /models/Kimi-K2.5-EAGLE3
      speculative_num_steps: 3
      speculative_eagle_topk: 1
      speculative_num_draft_tokens: 4
"""


def _faulty_inventory(node: SimNode, fault: str) -> Path:
    hv = node.host_vars()
    hv["specab_node_env"] = dict(node.node_env(), SPECAB_SIM_FAULT=fault)
    return node.write_inventory(hv)


@pytest.mark.parametrize("executor", ["queue", "per-run"])
def test_item20_every_arm_failing_at_start_up_alike_stops_the_experiment(node: SimNode, executor: str):
    """A node problem that makes every server exit at start (here: the simulator's OOM at load on every
    start): the experiment stops after the first failure of each arm, the rest is not run, and a resume
    after the fix runs exactly the rest."""
    exp = node.write_experiment("systematic", arms=THREE_ARMS, num_requests=1, output_len=8)
    inv = _faulty_inventory(node, "oom_at_start")
    proc = driver("--repeats", "3", "--executor", executor, "-e", str(exp), "-i", str(inv),
                  "--runs-dir", str(node.runs_dir), env=_env(node))
    try:
        out, _ = proc.communicate(timeout=600)
    finally:
        reap_driver(proc, 120)
    assert proc.returncode == 1, out[-4000:]
    assert "Stopped: every arm failed at start-up with the same cause" in out, out[-4000:]
    assert "the 6 remaining run(s) were not run" in out and "hit 3 run(s)" in out, out[-4000:]
    assert "CUDA out of memory" in out.split("Stopped:", 1)[1].split("hit 3", 1)[0]
    assert "Traceback" not in out
    [exp_dir] = _exp_dirs(node.runs_dir)
    assert f"python driver.py --resume {exp_dir.name}" in out
    with st.Store.open(exp_dir) as s:
        runs = s.runs()
        assert [(r["seq"], r["status"]) for r in runs] == [(1, "failed"), (2, "failed"), (3, "failed")]
        assert {r["arm"] for r in runs} == {"baseline", "eagle3-s2", "eagle3-s3"}
        assert [m["seq"] for m in s.missing()] == [4, 5, 6, 7, 8, 9]     # not run, not failed
        assert s.experiment()["status"] == "stopped"
    assert "3 planned run(s) not done" not in out and "6 planned run(s) not done" in out
    if executor == "per-run":
        assert sorted(p.name for p in (node.node_dir / "runs").iterdir())[3:] == [], "a run after the stop started"
    assert not node.server_alive() and node.gpus_busy() == []
    assert not (node.node_dir / "experiment.lease").exists()
    if executor == "per-run":
        return
    # the cause fixed (the fault gone from the node), --resume runs the six runs not run
    node.write_inventory()
    resumed = driver("--resume", exp_dir.name, "-i", str(inv), "--runs-dir", str(node.runs_dir), env=_env(node))
    try:
        out2, _ = resumed.communicate(timeout=600)
    finally:
        reap_driver(resumed, 120)
    assert "resuming" in out2 and "6 of 9 runs to do" in out2, out2[-4000:]
    with st.Store.open(exp_dir) as s:
        assert [r["status"] for r in s.runs()] == ["failed"] * 3 + ["ok"] * 6, out2[-4000:]
        assert s.missing() == []


def test_item20_different_start_up_failures_do_not_stop_the_experiment(node: SimNode):
    arms = THREE_ARMS.replace("  - name: baseline\n", "  - name: baseline\n    env: {SPECAB_SIM_FAULT: oom_at_start}\n")
    arms = arms.replace("speculative_num_draft_tokens: 3\n",
                        "speculative_num_draft_tokens: 3\n    env: {SPECAB_SIM_FAULT: port_in_use}\n")
    arms = arms.replace("speculative_num_draft_tokens: 4\n",
                        "speculative_num_draft_tokens: 4\n    env: {SPECAB_SIM_FAULT: oom_at_start}\n")
    exp = node.write_experiment("mixed", arms=arms, num_requests=1, output_len=8)
    proc = driver("--repeats", "2", "-e", str(exp), "-i", str(node.write_inventory()),
                  "--runs-dir", str(node.runs_dir), env=_env(node))
    try:
        out, _ = proc.communicate(timeout=600)
    finally:
        reap_driver(proc, 120)
    assert proc.returncode == 1, out[-4000:]
    assert "Stopped:" not in out, out[-4000:]
    [exp_dir] = _exp_dirs(node.runs_dir)
    with st.Store.open(exp_dir) as s:
        runs = s.runs()
        assert [r["status"] for r in runs] == ["failed"] * 6 and s.missing() == []
        assert {r["arm"]: r["failure_reason"] for r in runs}["eagle3-s2"].count("address already in use") >= 1
        assert s.experiment()["status"] == "finished"
