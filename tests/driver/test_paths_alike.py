"""The two run paths give a user the same record of a run: the per-run playbooks (`--executor per-run`,
playbooks/tasks/run_arm.yml) and the node's run queue (`--executor queue`, specab/node/runsteps.py) run one
experiment on one simulated node, and what each leaves is compared: the phases stored per run, the files of each
run directory (and the keys of its JSON records), the failure record of a failed start (phase, headline, the
tool's own error), and after Ctrl-C mid-benchmark the node (no server, GPUs free), the interrupted run's record and
files (torn down alike: stopped, its GPUs verified free, its manifest written) and a resume that completes it.

The experiment, in this order (--order blocked, one block): `oom` (its engine dies with CUDA's out-of-memory error
while loading: a failed start), `cut` (the driver gets SIGINT while it benchmarks its measured requests); then
--resume runs `cut` again, a run that succeeds."""
from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest

from specab.results import store as st
from tests.driver.simnode import SimNode, driver, free_port, reap_driver, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ARMS = """\
arms:
  - name: oom
    env:
      SPECAB_SIM_FAULT: oom_at_start
  - name: cut
    server_args:
      speculative_algorithm: EAGLE3
      speculative_draft_model_path: /models/Kimi-K2.5-EAGLE3
      speculative_num_steps: 2
      speculative_eagle_topk: 1
      speculative_num_draft_tokens: 3
"""
RUNS = ("001-oom", "002-cut")

# Files only one path writes, and why they may differ:
# - the run queue's own records of a run: its queue entry (what enqueue.yml queued: the run's settings for the
#   sequencer), phases.jsonl (the phases as the sequencer began them; the per-run path's come from the Ansible
#   events) and done.json (the sequencer's outcome, which the driver reads; the per-run path's outcome is the
#   playbook's).
QUEUE_ONLY = {"queue_entry.json", "phases.jsonl", "done.json"}
# The phase only the run queue shows: the sequencer writes the manifest as a step of its own before the driver
# collects the run; the per-run path's collect role writes it in the task that packs the run (one node round
# trip), so its time is inside "collecting" (specab.vocab.phases.PHASES).
QUEUE_ONLY_PHASES = frozenset({"writing manifest"})
# The load sub-phases refine "loading" from the engine's log (the per-run path tails it live, the queue reads
# ready.json's marks): with the instant profile's zero-second load they tie with the start of loading, where either
# path may drop one; the phases are compared without them.
LOAD_SUBPHASES = {"loading weights", "capturing graphs"}


@pytest.fixture
def node(tmp_path: Path):
    n = SimNode(root=tmp_path, port=free_port(), profile="instant")
    yield n
    n.cleanup()
    _kill_sequencer(n)


def _kill_sequencer(node: SimNode) -> None:
    """A failed test must not leave the sequencer it started (its session is its own): the process sequencer.json
    names, when it still runs (its pid and start time, not a reused pid)."""
    try:
        rec = json.loads((node.node_dir / "sequencer.json").read_text())
        stat = Path(f"/proc/{int(rec['pid'])}/stat").read_text().rsplit(")", 1)[1].split()
        if stat[0] not in ("Z", "X") and int(stat[19]) == int(rec["starttime"]):
            os.killpg(int(rec["pid"]), signal.SIGKILL)
    except (OSError, ValueError, KeyError, IndexError):
        pass


def _helpers(node: SimNode) -> list[str]:
    """The bench helpers running from this node's tools (the bench tool, its client, its GPU sampler): their command
    lines name the node's package and the tool."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            words = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").replace("\0", " ").split()
        except OSError:
            continue
        if any(str(node.node_dir) in w for w in words) and {"bench", "loadgen", "gpusample"} & set(words):
            found.append(f"{pid}: {' '.join(words)[-120:]}")
    return found


def _exp_dir(runs_dir: Path) -> Path:
    [d] = [d for d in runs_dir.iterdir() if (d / st.FILENAME).exists()]
    return d


def _masked(text: str | None) -> str | None:
    """A failure text's first line (the log tail after it is what the engine had written by then) with its numbers
    (pids, durations, exit codes) masked: they differ from run to run."""
    return None if text is None else re.sub(r"\d+(\.\d+)?", "N", text.splitlines()[0])


def _first_line(text: str | None) -> str | None:
    """The manifest's failure up to its first line break: the collect role passes a string `extra` as JSON text
    without its quotes, so a line break reads as the two characters \\n in the per-run path's manifest."""
    return None if text is None else text.split("\\n", 1)[0]


def _files(run_dir: Path) -> set[str]:
    return {p.name for p in run_dir.iterdir() if p.is_file()}


def _keys(path: Path) -> dict[str, list[str]]:
    """The keys of a JSON record (and of its `extra`, for a manifest); a file cut short (a helper killed by the
    interrupt) has none."""
    try:
        data = json.loads(path.read_text())
    except ValueError:
        return {"": ["(not JSON)"]}
    if not isinstance(data, dict):
        return {"": [type(data).__name__]}
    out = {"": sorted(data)}
    if isinstance(data.get("extra"), dict):
        out["extra"] = sorted(data["extra"])
    return out


def _experiment(node: SimNode, executor: str) -> dict:
    """Run the experiment on `executor`, SIGINT while `cut` benchmarks, check the node, resume; what it left."""
    runs_dir = node.root / f"runs-{executor}"
    # twenty measured requests (~0.5 s each): the signal comes at the first, and the per-run path's client is
    # stopped by the driver's stop (stop.yml) seconds later, while it still has requests to send (a run whose every
    # measured request was answered is kept ok)
    exp = node.write_experiment("alike", arms=ARMS, num_requests=20, output_len=32)
    common = ["--executor", executor, "-i", str(node.write_inventory()), "--runs-dir", str(runs_dir)]
    proc = driver("--order", "blocked", "--repeats", "1", "-e", str(exp), *common)
    try:
        def cut_benchmarking() -> bool:
            s = node.server()
            bench = node.node_dir / "runs" / RUNS[1] / "bench.jsonl"
            return bool(s and s.get("run_id") == RUNS[1] and node.server_alive() and bench.exists()
                        and '"warmup":false' in bench.read_text())
        wait_for(cut_benchmarking, timeout=300, interval=0.05, what=f"{RUNS[1]} benchmarking", proc=proc)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=300)
    finally:
        reap_driver(proc, 120)
    assert proc.returncode == 130, out[-4000:]
    # the interrupt stopped the server and the GPUs are free
    assert not node.server_alive() and node.gpus_busy() == [], out[-4000:]
    # and ended the run's bench helpers before its server (the per-run path's playbook, which ran them, was cancelled;
    # the sequencer ends its own): none is left, and none sent a request to the stopping server, so no measured
    # request failed (what had not been answered by then has no record)
    assert _helpers(node) == [], out[-4000:]
    node_bench = (node.node_dir / "runs" / RUNS[1] / "bench.jsonl").read_text().splitlines()
    assert [line for line in node_bench if not json.loads(line)["ok"]] == [], node_bench
    exp_dir = _exp_dir(runs_dir)
    got: dict = {"files": {}, "keys": {}}
    with st.Store.open(exp_dir) as s:
        rows = {r["run_id"]: r for r in s.runs()}
        got["record"] = {rid: (r["status"], r["failure_phase"], _masked(r["failure_reason"]))
                         for rid, r in rows.items()}
        got["phases"] = {r["run_id"]: [p["phase"] for p in s.phases(r["seq"])] for r in rows.values()}
        # the interrupted run's teardown as its stored row and manifest hold it (the per-run path's stop comes after
        # the row is written)
        cut = rows[RUNS[1]]
        [manifest] = [m["manifest"] for m in s.manifests() if m["seq"] == cut["seq"]]
        got["teardown"] = {"stop_s": (cut["stop"] or {}).get("total_s"),
                           "time_to_free_s": (cut["gpu_free"] or {}).get("time_to_free_s"),
                           "manifest": {k: manifest["extra"].get(k) for k in ("stop_s", "time_to_free_s")},
                           "files": {n for n in s.files(cut["seq"]) if n in ("stop.json", "gpu_free.json")}}
    for rid in RUNS:
        d = exp_dir / rid
        got["files"][rid] = _files(d) if d.is_dir() else set()
        got["keys"][rid] = {f.name: _keys(f) for f in d.glob("*.json") if f.name not in QUEUE_ONLY}
        man = json.loads((d / "manifest.json").read_text()) if (d / "manifest.json").exists() else {}
        extra = man.get("extra", {})
        got.setdefault("seed", {})[rid] = man.get("seed")
        if rid == RUNS[1]:      # the helpers the interrupted run's stop ended itself
            got["helpers_ended"] = sorted(h["tool"] for h in json.loads((d / "stop.json").read_text())["helpers_ended"])
        got["manifest_failure"] = {**got.get("manifest_failure", {}),
                                   rid: (extra.get("failed_task"), _masked(_first_line(extra.get("failure"))))}
    got["out"] = out
    resumed = driver("--resume", exp_dir.name, *common)
    out2, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 1, out2[-4000:]       # the failed start keeps the exit status non-zero
    assert "1 of 2 runs to do" in out2, out2[-4000:]
    with st.Store.open(exp_dir) as s:
        rows = {r["run_id"]: r for r in s.runs()}
        assert rows[RUNS[1]]["status"] == "ok" and rows[RUNS[1]]["attempt"] == 2, rows[RUNS[1]]
        assert s.experiment()["status"] == "finished"
        got["resumed_phases"] = [p["phase"] for p in s.phases(rows[RUNS[1]]["seq"])]
    got["resumed_files"] = _files(exp_dir / RUNS[1])
    got["resumed_keys"] = {f.name: _keys(f) for f in (exp_dir / RUNS[1]).glob("*.json") if f.name not in QUEUE_ONLY}
    assert not node.server_alive() and node.gpus_busy() == []
    return got


def test_per_run_and_queue_leave_the_same_record(node: SimNode):
    per_run = _experiment(node, "per-run")
    queue = _experiment(node, "queue")
    # the outcome of each run, and the failure record: phase, headline and the tool's own error
    assert per_run["record"] == queue["record"], (per_run["record"], queue["record"])
    oom, cut = (queue["record"][r] for r in RUNS)
    assert oom[:2] == ("failed", "loading") and oom[2].startswith("The server on simT did not become ready: "), oom
    assert "CUDA out of memory" in oom[2], oom
    assert cut == ("interrupted", "benchmarking", "interrupted by the user (SIGINT/SIGTERM)"), cut

    # the interrupted run's stored row carries its teardown's stop and GPUs-free records, the values its manifest
    # holds (stop.json's total_s, gpu_free.json's time_to_free_s; the manifest's extra keeps each value as the text
    # it was given), on both paths
    for got in (per_run, queue):
        t = got["teardown"]
        assert isinstance(t["stop_s"], float) and isinstance(t["time_to_free_s"], float), t
        assert t["manifest"] == {"stop_s": str(t["stop_s"]), "time_to_free_s": str(t["time_to_free_s"])}, t
        assert t["files"] == {"stop.json", "gpu_free.json"}, t
    # every manifest records the run's bench seed, the interrupted run's (written by the per-run path's stop) too
    assert per_run["seed"] == queue["seed"] == {r: "1" for r in RUNS}, (per_run["seed"], queue["seed"])
    # the per-run path's stop ended the interrupted run's bench tool, client and sampler (its playbook, which ran
    # them, was cancelled); the run queue's sequencer ended its own before its stop
    assert per_run["helpers_ended"] == ["bench", "gpusample", "loadgen"] and queue["helpers_ended"] == [], \
        (per_run["helpers_ended"], queue["helpers_ended"])
    # the same phases, in the same order: the failed start's (torn down alike) and the resumed run's
    def steps(names: list[str], hide: frozenset[str] = frozenset()) -> list[str]:
        return [n for n in names if n not in LOAD_SUBPHASES | hide]
    p_oom, q_oom = steps(per_run["phases"][RUNS[0]]), steps(queue["phases"][RUNS[0]], QUEUE_ONLY_PHASES)
    assert p_oom == q_oom and p_oom[-3:] == ["final stop", "waiting for GPUs after stop", "collecting"], (p_oom, q_oom)
    p_ok, q_ok = steps(per_run["resumed_phases"]), steps(queue["resumed_phases"], QUEUE_ONLY_PHASES)
    assert p_ok == q_ok, (p_ok, q_ok)
    # the interrupted run: the same phases up to the one it was interrupted in
    p_cut, q_cut = steps(per_run["phases"][RUNS[1]]), steps(queue["phases"][RUNS[1]])
    assert p_cut[-1] == "benchmarking" and q_cut[:len(p_cut)] == p_cut, (p_cut, q_cut)

    # the same files in every run directory (the interrupted run's too: torn down alike), but for the queue's own
    # records
    for p_files, q_files in ((per_run["files"][RUNS[0]], queue["files"][RUNS[0]]),
                             (per_run["files"][RUNS[1]], queue["files"][RUNS[1]]),
                             (per_run["resumed_files"], queue["resumed_files"])):
        assert p_files == q_files - QUEUE_ONLY, p_files ^ (q_files - QUEUE_ONLY)
    assert {"stop.json", "gpu_free.json", "gpu_free.csv", "manifest.json"} <= per_run["files"][RUNS[1]], \
        per_run["files"][RUNS[1]]
    # the same keys in every JSON record both write (the manifest's `extra` too), the same failure in the manifest;
    # of the interrupted run, the records of its teardown: the bench's own records are what each path had by the
    # interrupt (the sequencer stops its bench helpers at the signal; the per-run path's go on until the driver's
    # stop.yml ends them, after the driver fetched the run, so a sampler's summary may be cut short)
    teardown = ("manifest.json", "stop.json", "gpu_free.json")
    p_cut_keys, q_cut_keys = ({n: k for n, k in got["keys"][RUNS[1]].items() if n in teardown}
                              for got in (per_run, queue))
    assert sorted(p_cut_keys) == sorted(q_cut_keys) == sorted(teardown), (p_cut_keys, q_cut_keys)
    for p_keys, q_keys in ((per_run["keys"][RUNS[0]], queue["keys"][RUNS[0]]), (p_cut_keys, q_cut_keys),
                           (per_run["resumed_keys"], queue["resumed_keys"])):
        assert p_keys == q_keys, [(n, p_keys.get(n), q_keys.get(n)) for n in p_keys.keys() | q_keys.keys()
                                  if p_keys.get(n) != q_keys.get(n)]
    assert per_run["manifest_failure"][RUNS[0]] == queue["manifest_failure"][RUNS[0]] == \
        ("Ready | Wait until the server is ready", oom[2]), (per_run["manifest_failure"], queue["manifest_failure"])
    # the interrupted run's manifest: the phase's task and the headline alike (the error is each path's own words)
    p_task, p_failure = per_run["manifest_failure"][RUNS[1]]
    q_task, q_failure = queue["manifest_failure"][RUNS[1]]
    assert p_task == q_task == "Bench | Benchmark arm cut", (p_task, q_task)
    assert p_failure.split(": ", 1)[0] == q_failure.split(": ", 1)[0] == "The run on simT was interrupted", \
        (p_failure, q_failure)
