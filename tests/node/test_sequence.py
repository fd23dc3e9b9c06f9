"""The node-side sequencer (specab/node/sequence.py) on a simulated node: queued runs back to back,
failures recorded per run, interruption, a dead sequencer, foreign GPU holders, the commands.

Each test lays out its node as the enqueue playbook does (tests/node/seqnode.py: the deployed
tools, rendered launch.sh / nccl.env / args.json, queue entries) and drives sequence.py through its
CLI, as the controller does. Simulated engine: `instant` profile, TP 2, time scale 10.
"""
from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from specab.vocab import phases as vocab_phases
from tests.node.seqnode import PY, SeqNode, proc_session, session_pids, wait_for

# Files the per-run path (playbooks/tasks/run_arm.yml) leaves in a run directory
# (docs/architecture.md "Node layout"), plus the queue's own three.
PER_RUN_FILES = {"launch.sh", "nccl.env", "args.json", "server.log", "ready.json", "ready_progress.json",
                 "env_check.json", "server_info.json", "gpu_before.csv", "gpu_samples.csv", "gpu_samples.json",
                 "gpu_samples.log", "gpu_after.csv", "bench.jsonl", "bench_summary.json", "stop.json",
                 "gpu_free.json", "gpu_free.csv", "manifest.json", "phase_metrics.json"}
STEP_PHASES = {s.phase for s in vocab_phases.RUN_STEPS}
QUEUE_FILES = {"phases.jsonl", "done.json", "queue_entry.json"}
SAMPLE_HEADER = ["timestamp", "index", "uuid", "clocks.sm", "clocks.mem", "clocks.max.sm", "power.draw",
                 "temperature.gpu", "utilization.gpu", "clocks_event_reasons.active", "memory.used"]
LONG_BENCH = {"api": "generate", "num_requests": 3, "warmup_requests": 1, "input_len": 8, "output_len": 4000,
              "concurrency": 1, "seed": 1, "timeout_s": 120, "ignore_eos": True,
              "request_rate": 0, "client_procs": "auto", "temperature": 0, "top_p": 1}
SPEC = {"speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "/models/eagle3-head",
        "speculative_num_steps": 2, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 3}


@pytest.fixture
def node(tmp_path: Path):
    n = SeqNode(tmp_path)
    yield n
    n.cleanup()


def alive(pid: int) -> bool:
    return proc_session(pid) is not None


def wait_phase(node: SeqNode, run_id: str, phase: str, timeout: float = 90) -> None:
    def reached() -> bool:
        try:
            return any(p["phase"] == phase for p in node.phases(run_id))
        except (OSError, ValueError):
            return False
    assert wait_for(reached, timeout), "run %s never reached phase %r" % (run_id, phase)


def test_queued_runs_all_done_with_the_per_run_files(node):
    ids = [node.enqueue(1, node.arm("baseline")), node.enqueue(2, node.arm("eagle3-s2", **SPEC)),
           node.enqueue(3, node.arm("baseline"))]
    r = node.ensure()
    assert r.rc == 0, r.error
    assert r.data["experiment_id"] == node.experiment_id and r.data["startup"]["ok"]
    seq_pid = r.data["pid"]
    for rid in ids:
        w = node.wait(rid)
        assert w.rc == 0, w.error
        assert (w.data["ok"], w.data["status"], w.data["phase"], w.data["error"]) == (True, "ok", None, None)
        assert w.data["time_to_ready_s"] > 0 and w.data["stop_s"] > 0 and w.data["time_to_free_s"] >= 0
        assert w.data["finished_at"] > w.data["started_at"]
    assert node.seq("finish", "--experiment-id", node.experiment_id).rc == 0
    assert wait_for(lambda: not alive(seq_pid), 30), "the sequencer exits after END and an empty queue"
    rec = node.record()
    assert rec["state"] == "exited" and rec["runs_done"] == 3 and "end marker" in rec["reason"]
    assert all(n.startswith("END-") or n == ".staging" for n in os.listdir(node.node_dir / "queue"))

    for rid in ids:
        files = {p.name for p in (node.node_dir / "runs" / rid).iterdir()}
        assert files == PER_RUN_FILES | QUEUE_FILES, rid
        f = lambda name: node.run_file(rid, name)  # noqa: E731
        phases = [p["phase"] for p in node.phases(rid)]
        assert phases == ["claimed", "stopping-leftover", "gpus-free-before", "starting", "loading", "ready", "env",
                          "warming up", "benchmarking", "stopping", "gpus free", "manifest", "done"]
        # the run order of the shared vocabulary, the one the per-run playbook follows too (test_architecture.py)
        assert [p for p in phases if p in STEP_PHASES] == [s.phase for s in vocab_phases.RUN_STEPS]
        times = [p["t"] for p in node.phases(rid)]
        assert times == sorted(times)
        # the formats of the per-run path: the node tools' own outputs
        assert json.loads(f("ready.json").read_text())["ok"] and json.loads(f("ready.json").read_text())["ready"]
        assert json.loads(f("ready_progress.json").read_text())["phase"] == "ready"
        env = json.loads(f("env_check.json").read_text())
        assert env["ok"] and not env["variables"]["NCCL_PROTO"]["mismatches"]
        assert json.loads(f("server_info.json").read_text())["tp_size"] == 2
        stop = json.loads(f("stop.json").read_text())
        assert stop["ok"] and stop["was_running"] and not stop["escalated"] and "sequencer" not in stop
        free = json.loads(f("gpu_free.json").read_text())
        assert free["ok"] and all(g["memory_used_mib"] <= 64 for g in free["final"])
        assert f("gpu_free.csv").read_text().startswith("timestamp,index,uuid,name,memory.used")
        for name in ("gpu_before.csv", "gpu_after.csv", "gpu_samples.csv"):
            rows = list(csv.reader(f(name).open()))
            assert rows[0] == SAMPLE_HEADER and len(rows) >= 1 + 8, name   # 8 simulated GPUs per sample
        samples = json.loads(f("gpu_samples.json").read_text())
        assert samples["ok"] and samples["samples"] >= 1 and samples["stopped_by"] == "SIGTERM"
        bench = [json.loads(l) for l in f("bench.jsonl").read_text().splitlines()]
        assert [b["warmup"] for b in bench] == [True, False, False] and all(b["ok"] for b in bench)
        summary = json.loads(f("bench_summary.json").read_text())
        assert (summary["requests"], summary["ok"]) == (2, 2)
        m = json.loads(f("manifest.json").read_text())
        assert m["kind"] == "specab-node-manifest" and m["run_id"] == rid
        assert m["server"]["record"]["run_id"] == rid and m["server"]["record"]["stopped_at"]
        assert m["gpu"]["gpus"] and m["versions"]["python_for_engine"] == PY
        assert m["extra"]["run_id"] == rid and m["extra"]["experiment_id"] == node.experiment_id
        assert float(m["extra"]["time_to_ready_s"]) > 0 and "stop_s" in m["extra"]
        assert json.loads(f("queue_entry.json").read_text())["run_id"] == rid
        assert oct(f("nccl.env").stat().st_mode & 0o777) == "0o600"
    assert not (node.node_dir / "server.json").exists(), "the last run's server is stopped"
    assert not session_pids(seq_pid)


def test_a_failing_run_is_recorded_with_its_phase_and_the_next_run_still_runs(node):
    bad_arg = node.enqueue(1, node.arm("badarg", no_such_flag=1))
    crash = node.enqueue(2, node.arm("crash"), node_env_extra={"SPECAB_SIM_FAULT": "crash_after=1"})
    good = node.enqueue(3, node.arm("baseline"))
    assert node.ensure().rc == 0
    w = node.wait(bad_arg)
    assert w.rc == 0, "wait succeeds: the run's outcome is in the JSON"
    assert (w.data["ok"], w.data["status"], w.data["phase"]) == (False, "failed", "loading")
    assert w.data["task"] == "Ready | Wait until the server is ready"
    assert w.data["headline"] == "The server on simnode did not become ready", w.data
    assert "unrecognized arguments" in w.data["error"] and "--no-such-flag" in w.data["error"]
    assert json.loads(node.run_file(bad_arg, "ready.json").read_text())["ok"] is False
    assert json.loads(node.run_file(bad_arg, "gpu_free.json").read_text())["ok"], "GPUs verified free after a failure"
    assert (node.run_file(bad_arg, "manifest.json")).exists() and node.run_file(bad_arg, "stop.json").exists()
    assert json.loads(node.run_file(bad_arg, "manifest.json").read_text())["extra"]["failed_task"] == w.data["task"]

    tar_path = node.node_dir / "collect.tar"          # what collect_run.yml asks for: the run packed as it is done
    w = node.seq("wait", "--run-id", crash, "--timeout", "90", "--pack", str(tar_path), timeout=120)
    assert (w.data["ok"], w.data["status"], w.data["phase"]) == (False, "failed", "benchmarking"), w.data
    run_dir = node.node_dir / "runs" / crash
    with tarfile.open(tar_path) as tar:               # a failed run is packed too: its files are the evidence
        members = {m.name: m for m in tar.getmembers()}
        assert {n.split("/", 1)[1] for n in members if n != crash} == {p.name for p in run_dir.iterdir()}
        assert oct(members[f"{crash}/nccl.env"].mode & 0o777) == "0o600"
        assert tar.extractfile(f"{crash}/done.json").read() == (run_dir / "done.json").read_bytes()
    assert oct(tar_path.stat().st_mode & 0o777) == "0o600", "the tar holds the env file: ours alone"
    assert not list(node.node_dir.glob("collect.tar.*")), "no temporary tar left"
    assert w.data["task"] == "Bench | Benchmark arm crash" and "loadgen exit 1" in w.data["error"]
    assert json.loads(node.run_file(crash, "gpu_free.json").read_text())["ok"]

    w = node.wait(good)
    assert (w.data["ok"], w.data["status"]) == (True, "ok"), w.data
    assert node.record()["state"] in ("idle", "running")

    # one collect for every run done by then (collect_run.yml's specab_also_run_ids): the later runs in queue
    # order, up to the first one not done (here one never queued), each under its run id
    w = node.seq("wait", "--run-id", bad_arg, "--timeout", "5", "--pack", str(tar_path),
                 "--also", crash, "--also", "099-never", "--also", good, timeout=60)
    assert w.rc == 0 and w.data["status"] == "failed", "the output is still the waited-for run's done.json"
    with tarfile.open(tar_path) as tar:
        assert {m.name.split("/", 1)[0] for m in tar.getmembers()} == {bad_arg, crash}
        assert tar.extractfile(f"{crash}/done.json").read() == (run_dir / "done.json").read_bytes()
    w = node.seq("wait", "--run-id", bad_arg, "--timeout", "5", "--pack", str(tar_path), "--also", "../x",
                 timeout=60)
    assert w.rc != 0 and "--also '../x' is not a run id" in json.dumps(w.data) + w.stderr


def test_wait_reports_a_sequencer_killed_without_done_json(node):
    rid = node.enqueue(1, node.arm("baseline"), bench=LONG_BENCH)
    r = node.ensure()
    assert r.rc == 0
    wait_phase(node, rid, "benchmarking")
    server = json.loads((node.node_dir / "server.json").read_text())
    os.kill(r.data["pid"], signal.SIGKILL)
    t0 = time.monotonic()
    w = node.wait(rid, timeout=60)
    assert w.rc == 1 and time.monotonic() - t0 < 15, "wait notices the dead sequencer, not the timeout"
    err = w.error
    assert "run %s has no done.json" % rid in err and "last phase: benchmarking" in err
    assert "gone" in err and str(r.data["pid"]) in err and "sequencer.log" in err and "stop.py" in err
    assert not node.run_file(rid, "done.json").exists()
    # what the error says to do: stop.py stops the server the dead sequencer left
    s = subprocess.run([PY, str(node.tools), "stop", "--node-dir", str(node.node_dir), "--smi",
                        json.dumps(node.smi), "--grace", "15"], env=node.env, capture_output=True, text=True,
                       timeout=120)
    out = json.loads(s.stdout)
    assert s.returncode == 0 and out["was_running"] and out["sequencer"]["was_running"] is False
    assert wait_for(lambda: not session_pids(server["sid"]), 30)


@pytest.mark.parametrize("how", ["stop.py", "SIGTERM"])
def test_interrupt_during_a_benchmark_stops_the_server_and_marks_the_run(node, how):
    rid = node.enqueue(1, node.arm("baseline"), bench=LONG_BENCH)
    nxt = node.enqueue(2, node.arm("baseline"))
    r = node.ensure()
    assert r.rc == 0
    seq_pid = r.data["pid"]
    wait_phase(node, rid, "benchmarking")
    server = json.loads((node.node_dir / "server.json").read_text())
    assert session_pids(server["sid"]) and len(session_pids(seq_pid)) >= 3, "sequencer + client + sampler"
    if how == "stop.py":
        s = subprocess.run([PY, str(node.tools), "stop", "--node-dir", str(node.node_dir), "--smi",
                            json.dumps(node.smi), "--grace", "15"], env=node.env, capture_output=True, text=True,
                           timeout=120)
        assert s.returncode == 0, s.stdout + s.stderr
        out = json.loads(s.stdout)
        assert out["sequencer"]["was_running"] and out["sequencer"]["pid"] == seq_pid
        assert not out["sequencer"]["escalated"], "the sequencer stops on SIGTERM, within the grace"
        assert out["was_running"] is False, "the sequencer had already stopped its server"
    else:
        os.kill(seq_pid, signal.SIGTERM)
        assert wait_for(lambda: not alive(seq_pid), 60)
    done = json.loads(node.run_file(rid, "done.json").read_text())
    assert (done["ok"], done["status"], done["phase"]) == (False, "interrupted", "benchmarking")
    assert "SIGTERM" in done["error"] and done["stop_s"] is not None
    assert json.loads(node.run_file(rid, "stop.json").read_text())["was_running"]
    assert node.run_file(rid, "manifest.json").exists()
    assert node.record()["state"] == "exited" and not alive(seq_pid)
    assert not session_pids(server["sid"]), "no engine process left"
    assert not session_pids(seq_pid), "no client or sampler left"
    assert not (node.node_dir / "server.json").exists()
    assert (node.node_dir / "queue" / ("000002-%s.json" % nxt)).exists(), "the next run stays queued"
    w = node.wait(nxt, timeout=10)
    assert w.rc == 1 and "exited" in w.error


def test_a_foreign_gpu_holder_is_refused_by_name_and_left_alone(node):
    holder = subprocess.Popen([PY, "-m", "specab.sim.hold", "--gpu", "1", "--mib", "4000", "--title",
                               "someone-elses-job"], env=node.env, stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        holder.stdout.readline()
        rid = node.enqueue(1, node.arm("baseline"))
        r = node.ensure()
        assert r.rc == 1
        assert "not ours" in r.error and "PID %d" % holder.pid in r.error and "someone-elses-job" in r.error
        assert node.record()["state"] == "halted"
        w = node.wait(rid, timeout=20)
        assert w.rc == 1 and "halted" in w.error and "PID %d" % holder.pid in w.error
        # without --smi at startup, the run's own pre-start check refuses it: the run fails, the sequencer halts
        r = node.ensure(smi=False)
        assert r.rc == 0, r.error
        w = node.wait(rid, timeout=60)
        assert w.rc == 0 and w.data["status"] == "failed" and w.data["phase"] == "gpus-free-before"
        assert "PID %d" % holder.pid in w.data["error"] and "someone-elses-job" in w.data["error"]
        assert wait_for(lambda: node.record()["state"] == "halted", 30)
        assert holder.poll() is None, "the foreign holder was never killed"
    finally:
        holder.kill()
        holder.wait()


def test_the_gpu_checks_use_the_inventorys_threshold_from_the_entry_not_a_literal(node):
    """The queue executor honours an inventory's GPU-free threshold (specab_gpu_free_threshold_mib, which the
    per-run gpu_free role defaults from): enqueue.yml passes it to `ensure` and writes it into every entry.
    A GPU that keeps 200 MiB used after its process died is free under a 256 MiB threshold and not free
    under the default 64."""
    holder = subprocess.Popen([PY, "-m", "specab.sim.hold", "--gpu", "0", "--mib", "200", "--release-lag", "3600"],
                              env=node.env, stdout=subprocess.PIPE, text=True, start_new_session=True)
    holder.stdout.readline()
    holder.kill()           # dead: no compute process listed, its 200 MiB stay used for an hour
    holder.wait()
    r = node.ensure("--gpu-free-timeout", "1")
    assert r.rc == 1 and "not free" in r.error and "threshold 64" in r.error, r.error
    r = node.ensure("--gpu-free-threshold-mib", "256")
    assert r.rc == 0, r.error
    start = json.loads((node.node_dir / "sequencer_start.json").read_text())
    assert start["gpu_free"]["threshold_mib"] == 256

    high = node.enqueue(1, node.arm("baseline"), gpu_free_threshold_mib=256)
    w = node.wait(high)
    assert (w.data["ok"], w.data["status"]) == (True, "ok"), w.data
    free = json.loads(node.run_file(high, "gpu_free.json").read_text())
    assert free["ok"] and free["threshold_mib"] == 256

    default = node.enqueue(2, node.arm("baseline"), gpu_free_s=1)      # the default threshold, 64 MiB
    w = node.wait(default)
    assert (w.data["ok"], w.data["phase"]) == (False, "gpus free"), w.data
    assert w.data["headline"] == "The GPUs of simnode are not free" and "threshold 64" in w.data["error"], w.data
    assert json.loads(node.run_file(default, "gpu_free.json").read_text())["threshold_mib"] == 64
    assert wait_for(lambda: node.record()["state"] == "halted", 30)


def test_ensure_is_idempotent_replaces_another_experiment_and_reset_clears_the_queue(node):
    first = node.ensure()
    assert first.rc == 0 and first.data["ensured"] == "started"
    again = node.ensure()
    assert again.rc == 0 and again.data["ensured"] == "running" and again.data["pid"] == first.data["pid"]

    other = node.ensure(experiment_id="other-20261129-110000")
    assert other.rc == 0 and other.data["ensured"] == "started" and other.data["pid"] != first.data["pid"]
    assert other.data["replaced"]["was_running"] and other.data["replaced"]["pid"] == first.data["pid"]
    assert not alive(first.data["pid"])
    assert node.record()["experiment_id"] == "other-20261129-110000"

    # entries of the first experiment are not the other sequencer's to run
    queued = [node.enqueue(1, node.arm("baseline")), node.enqueue(2, node.arm("eagle3-s2", **SPEC))]
    time.sleep(0.5)   # several of the sequencer's 50 ms polls
    assert sorted(os.listdir(node.node_dir / "queue")) == [".staging"] + ["%06d-%s.json" % (i + 1, q)
                                                                           for i, q in enumerate(queued)]
    node.seq("finish", "--experiment-id", node.experiment_id)
    # an entry enqueue.yml had staged but not handed over (a controller that died in between)
    staging = node.node_dir / "queue" / ".staging"
    staging.mkdir(exist_ok=True)          # made by `stage`
    (staging / "000003-003-baseline.json").write_text("{}")
    r = node.reset()
    assert r.rc == 0, r.error
    assert r.data["sequencer"]["was_running"] and r.data["sequencer"]["pid"] == other.data["pid"]
    assert sorted(r.data["removed"]) == sorted(["000001-%s.json" % queued[0], "000002-%s.json" % queued[1],
                                                "END-%s" % node.experiment_id, ".staging/000003-003-baseline.json"])
    assert os.listdir(node.node_dir / "queue") == [".staging"] and os.listdir(staging) == []
    assert not alive(other.data["pid"])
    assert node.reset().data["removed"] == []


def test_idle_timeout_ends_a_sequencer_nobody_feeds(node):
    r = node.ensure("--idle-timeout", "1")
    assert r.rc == 0
    assert wait_for(lambda: not alive(r.data["pid"]), 30)
    rec = node.record()
    assert rec["state"] == "exited" and "idle" in rec["reason"]


def test_wait_times_out_or_refuses_a_run_that_was_never_queued(node):
    r = node.ensure()
    assert r.rc == 0
    node.enqueue(1, node.arm("baseline"), experiment_id="someone-else-20261129-000000")
    w = node.wait("001-baseline", timeout=1)
    assert w.rc == 1 and "not done after 1s" in w.error and "not claimed yet" in w.error
    w = node.wait("007-never", timeout=20)
    assert w.rc == 1 and "neither queued" in w.error and "enqueue it again" in w.error
    assert node.seq("wait", "--run-id", "../x", "--timeout", "1").rc == 2


def _fake_sequencer(node: SeqNode, ignore_term: bool) -> subprocess.Popen:
    """A process recorded in sequencer.json as the node's sequencer (pid + start time, own session)."""
    code = ("import signal, time\n" + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignore_term else "")
            + "print('up', flush=True)\ntime.sleep(120)\n")
    p = subprocess.Popen([PY, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    p.stdout.readline()
    node.sessions.append(p.pid)
    raw = open("/proc/%d/stat" % p.pid).read()
    starttime = int(raw[raw.rfind(")") + 2:].split()[19])
    (node.node_dir / "sequencer.json").write_text(json.dumps(
        {"pid": p.pid, "starttime": starttime, "sid": p.pid, "experiment_id": "x", "state": "running",
         "run_id": None}))
    return p


def test_stop_escalates_to_sigkill_for_a_sequencer_that_ignores_sigterm(node):
    p = _fake_sequencer(node, ignore_term=True)
    s = subprocess.run([PY, str(node.tools), "stop", "--node-dir", str(node.node_dir), "--smi",
                        json.dumps(node.smi), "--grace", "5", "--sequencer-grace", "0.5"], env=node.env,
                       capture_output=True, text=True, timeout=60)
    assert s.returncode == 0, s.stdout + s.stderr
    seq = json.loads(s.stdout)["sequencer"]
    assert seq["was_running"] and seq["escalated"]
    assert [x["signal"] for x in seq["signals"]] == ["SIGTERM", "SIGKILL"] and seq["signals"][1]["target"] == "pgid"
    assert p.wait(timeout=10) == -signal.SIGKILL


def test_stop_never_signals_a_process_that_only_reuses_the_recorded_pid(node):
    p = _fake_sequencer(node, ignore_term=False)
    rec = json.loads((node.node_dir / "sequencer.json").read_text())
    rec["starttime"] -= 1          # the recorded sequencer is gone; this pid is someone else's now
    (node.node_dir / "sequencer.json").write_text(json.dumps(rec))
    s = subprocess.run([PY, str(node.tools), "stop", "--node-dir", str(node.node_dir), "--smi",
                        json.dumps(node.smi), "--grace", "5"], env=node.env, capture_output=True, text=True,
                       timeout=60)
    assert s.returncode == 0, s.stdout + s.stderr
    seq = json.loads(s.stdout)["sequencer"]
    assert seq["was_running"] is False and seq["signals"] == []
    assert p.poll() is None, "not ours: left alone"
    r = node.ensure()
    assert r.rc == 0 and r.data["pid"] != p.pid and p.poll() is None, "ensure starts its own, kills nothing"
    p.kill()
    p.wait()


def test_a_malformed_entry_is_refused_and_the_next_runs(node):
    bad = node.enqueue(1, node.arm("baseline"))
    entry_path = node.node_dir / "queue" / ("000001-%s.json" % bad)
    entry = json.loads(entry_path.read_text())
    entry["run_dir"] = "/etc"        # never written outside the node's run directory
    entry_path.write_text(json.dumps(entry))
    good = node.enqueue(2, node.arm("baseline"))
    assert node.ensure().rc == 0
    w = node.wait(bad, timeout=30)
    assert w.rc == 0 and (w.data["status"], w.data["phase"]) == ("failed", "claimed")
    assert "run_dir '/etc' is not this node's run directory" in w.data["error"]
    assert (node.node_dir / "queue" / ("000001-%s.json.refused" % bad)).exists()
    assert node.wait(good).data["status"] == "ok"


def test_a_sequencer_without_its_controller_claims_no_new_run(node):
    """A killed driver must not leave its queued runs burning GPU time for hours: once its node lease (the lease
    file's mtime, the driver's heartbeat) gave no sign of life for --lease-s, the sequencer claims nothing more and
    exits, leaving the entries queued for a resume (which resets the queue)."""
    from specab.node import lease
    lease.take(str(node.node_dir), {"experiment_id": node.experiment_id, "controller_host": "ctl", "controller_pid": 1,
                                    "started_at": 1.0, "token": "t"}, 600)
    r = node.ensure("--lease-s", "30")
    assert r.rc == 0, r
    old = time.time() - 120
    os.utime(node.node_dir / "experiment.lease", (old, old))    # the controller's last heartbeat: 2 minutes ago
    node.enqueue(1, node.arm("baseline"))
    assert wait_for(lambda: not alive(r.data["pid"]), 30)
    rec = node.record()
    assert rec["state"] == "exited" and "no sign of the controller" in rec["reason"], rec
    assert "resume" in rec["reason"]
    assert (node.node_dir / "queue" / "000001-001-baseline.json").exists()     # still queued, never run
    assert not (node.node_dir / "runs" / "001-baseline" / "done.json").exists()


def test_a_sequencer_claims_no_run_once_another_experiment_holds_the_node_lease(node):
    """The lease broken and taken by another experiment: this experiment's controller is gone from the node."""
    from specab.node import lease
    r = node.ensure()
    assert r.rc == 0, r
    lease.take(str(node.node_dir), {"experiment_id": "someone-else", "controller_host": "ctl", "controller_pid": 1,
                                    "started_at": 1.0, "token": "t"}, 600)
    node.enqueue(1, node.arm("baseline"))
    assert wait_for(lambda: not alive(r.data["pid"]), 30)
    rec = node.record()
    assert rec["state"] == "exited" and "held by experiment someone-else" in rec["reason"], rec
    assert not (node.node_dir / "runs" / "001-baseline" / "done.json").exists()


def test_the_controllers_hold_on_the_node_lease_stops_the_sequencer_before_its_next_run(node):
    """An interrupted driver puts its node lease on hold (lease.py hold): the sequencer claims nothing more."""
    from specab.node import lease
    lease.take(str(node.node_dir), {"experiment_id": node.experiment_id, "controller_host": "ctl",
                                    "controller_pid": 1, "started_at": 1.0, "token": "t"}, 600)
    r = node.ensure()
    assert r.rc == 0, r
    with pytest.raises(lease.LeaseError, match="no longer ours"):
        lease.hold(str(node.node_dir), "not-the-token")
    assert not lease.on_hold(str(node.node_dir), node.experiment_id)
    assert lease.hold(str(node.node_dir), "t")["holder"]["hold_at"]
    assert lease.on_hold(str(node.node_dir), node.experiment_id)
    assert wait_for(lambda: not alive(r.data["pid"]), 30)
    node.enqueue(1, node.arm("baseline"))
    rec = node.record()
    # the idle loop or the hold watcher (its own SIGTERM) saw it first: either says so in the log
    assert rec["state"] == "exited" and rec["reason"] in ("signal SIGTERM", "the node lease %s is on hold: the driver "
                                                          "was interrupted" % lease.lease_path(str(node.node_dir))), rec
    assert "is on hold: the driver was interrupted" in (node.node_dir / "sequencer.log").read_text()
    assert not (node.node_dir / "runs" / "001-baseline" / "queue_entry.json").exists()


def test_the_commands_take_their_typed_spec_and_a_bad_spec_is_a_usage_error(node):
    """`sequence --spec-json -` (enqueue.yml and collect_run.yml through the specab_node module): the object's
    "command" picks the dataclass; its keys are that dataclass's fields."""
    def by_spec(spec: dict) -> tuple[int, dict]:
        p = subprocess.run([PY, str(node.tools), "sequence", "--spec-json", "-"], env=node.env, capture_output=True,
                           text=True, timeout=60, input=json.dumps(spec))
        return p.returncode, json.loads(p.stdout.strip().splitlines()[-1])

    rc, out = by_spec({"command": "finish", "node_dir": str(node.node_dir), "experiment_id": node.experiment_id})
    assert rc == 0 and out["end_marker"] == str(node.node_dir / "queue" / ("END-" + node.experiment_id)), out
    assert Path(out["end_marker"]).exists()
    rc, out = by_spec({"command": "wait", "node_dir": str(node.node_dir), "run_id": "001-baseline"})
    assert rc == 2 and "a WaitSpec takes the keys" in out["error"] and "missing: timeout" in out["error"], out
    rc, out = by_spec({"command": "launch", "node_dir": str(node.node_dir)})
    assert rc == 2 and "must be one of ensure, serve, reset, wait, finish, stage" in out["error"], out
    rc, out = by_spec({"command": "finish", "node_dir": str(node.node_dir), "experiment_id": "../x"})
    assert rc == 2 and "experiment_id must match" in out["error"], out


def _mode(p: Path) -> int:
    return p.stat().st_mode & 0o777


def test_stage_writes_every_run_directory_then_queues_the_batch_in_run_order(node):
    """`sequence.py stage` (enqueue.yml's one call per batch): each run directory recreated (an earlier
    attempt's files gone) with the files in their modes, the entries renamed into queue/ in run order
    after all of them (.staging left empty); a later batch staged while the sequencer runs, with --finish
    (END after its runs, as enqueue.yml sends the last runs), and the sequencer runs them all and exits."""
    stale = node.node_dir / "runs" / "002-eagle3-s2"
    stale.mkdir(parents=True)
    (stale / "done.json").write_text('{"ok": false}')        # a failed earlier attempt (resume)
    runs = [node.batch_run(1, node.arm("baseline")), node.batch_run(2, node.arm("eagle3-s2", **SPEC))]
    r = node.stage(runs)
    assert r.rc == 0, (r.data, r.stderr)
    names = ["000001-001-baseline.json", "000002-002-eagle3-s2.json"]
    assert r.data["queued"] == names and "end_marker" not in r.data
    queue = node.node_dir / "queue"
    assert sorted(os.listdir(queue)) == [".staging"] + names
    assert os.listdir(queue / ".staging") == [] and _mode(queue) == 0o700 and _mode(queue / ".staging") == 0o700
    for run in runs:
        d = node.node_dir / "runs" / run["run_id"]
        assert sorted(os.listdir(d)) == ["args.json", "launch.sh", "nccl.env"] and _mode(d) == 0o700
        assert (_mode(d / "launch.sh"), _mode(d / "nccl.env"), _mode(d / "args.json")) == (0o755, 0o600, 0o644)
        for f in run["files"]:
            assert (d / f["name"]).read_text() == f["content"]
        entry = queue / ("%06d-%s.json" % (run["seq"], run["run_id"]))
        assert _mode(entry) == 0o600 and json.loads(entry.read_text()) == run["entry"]
    assert node.ensure().rc == 0
    last = node.batch_run(3, node.arm("baseline"))
    r = node.stage([last], "--finish")
    assert r.rc == 0 and r.data["queued"] == ["000003-003-baseline.json"], (r.data, r.stderr)
    assert r.data["end_marker"] == str(queue / ("END-%s" % node.experiment_id))
    for run in runs + [last]:
        done = node.wait(run["run_id"]).data
        assert done["status"] == "ok", done
    assert wait_for(lambda: node.record()["state"] == "exited", 30)       # the END marker came with the batch
    assert "END" in node.record().get("reason", ""), node.record()


def test_stage_refuses_a_launch_script_bash_rejects_and_writes_nothing(node):
    """What the template module's `validate: bash -n` did, for the whole batch before anything is written:
    the error names the run and file, shows bash's words with a secret flag's value redacted, and neither
    run directory nor any entry of the batch is touched."""
    good, bad = node.batch_run(1, node.arm("baseline")), node.batch_run(2, node.arm("baseline"))
    launch = bad["files"][0]
    assert launch["name"] == "launch.sh"
    launch["content"] = launch["content"].replace('  "$@"', '  --api-key SECRETVALUE42 ( \\\n  "$@"')
    earlier = node.node_dir / "runs" / good["run_id"]
    earlier.mkdir(parents=True)
    (earlier / "server.log").write_text("an earlier attempt's log\n")
    r = node.stage([good, bad])
    assert r.rc == 1
    assert "run 002-baseline: launch.sh fails `bash -n`" in r.error and "syntax error" in r.error, r.error
    assert "nothing of this batch of 2 run(s) was written or queued" in r.error
    assert "SECRETVALUE42" not in r.error + r.stderr and "--api-key" in r.error
    assert os.listdir(earlier) == ["server.log"] and not (node.node_dir / "runs" / bad["run_id"]).exists()
    queue = node.node_dir / "queue"
    assert not queue.exists() or [n for n in os.listdir(queue) if n != ".staging"] == []


@pytest.mark.parametrize("spoil, needle", [
    (lambda run: run["entry"].update(run_dir="/etc"), "run_dir '/etc' is not this node's run directory"),
    (lambda run: run["entry"].update(experiment_id="other-20261129-100000"), "of experiment 'other-20261129-100000'"),
    (lambda run: run["entry"].pop("timeouts"), "lacks 'timeouts'"),
    (lambda run: run["files"].append({"name": "../x", "mode": "0644", "content": ""}), "is not a plain file name"),
    (lambda run: run["files"][1].update(mode=0o600), "give it as an octal string"),
])
def test_stage_refuses_what_the_sequencer_or_the_run_directory_could_not_take(node, spoil, needle):
    """A batch the sequencer would refuse an entry of (Entry's own checks), or that would write outside the
    run directory, fails as a whole, naming the run, before anything is written."""
    first, second = node.batch_run(1, node.arm("baseline")), node.batch_run(2, node.arm("eagle3-s2", **SPEC))
    spoil(second)
    r = node.stage([first, second])
    assert r.rc == 1 and "run 002-eagle3-s2" in r.error and needle in r.error, r.error
    assert not (node.node_dir / "runs").exists() and not (node.node_dir / "queue").exists()
