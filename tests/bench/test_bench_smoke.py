"""Small runs of the benchmarks (dead time, verdict cost, report scale, footprint) so they cannot rot.

Each test runs the benchmark's own entry point at a tiny size and checks what a reader of
docs/performance.md relies on: the numbers exist, are consistent with each other, and the parts
that decide a verdict (stopping rule, coverage, sampling of the right processes) behave.
"""
from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).with_name("data")

pytestmark = pytest.mark.timeout(120)


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _run(mod, argv: list[str], capsys) -> dict:
    assert mod.main(argv) == 0
    return json.loads(capsys.readouterr().out)


# ------------------------------------------------------------------------------- dead time

def test_dead_time_slices_real_job_events_into_roles_and_the_gap_between_playbooks():
    dt = _load("dead_time")
    events = json.loads((DATA / "job_events_head.json").read_text())   # the head of a real arm.yml run
    start, end, marks = dt.playbook_slices(events)
    assert start == dt._ts(events[0]["created"]) and end == dt._ts(events[-1]["created"])
    labels = [m[1] for m in marks]
    assert "role node_prepare" in labels and "role server_stop" in labels and "role gpu_free" in labels
    assert any(label.startswith("play task: Start | Check the run's variables") for label in labels)
    # a window that starts 1 s before the playbook and ends 2 s after it: every second is charged once
    part = dt.breakdown(start - 1.0, end + 2.0, [(start, end, marks)])
    assert sum(part.values()) == pytest.approx(end - start + 3.0, abs=1e-6)
    assert part["between playbooks: driver bookkeeping + ansible-playbook start-up"] == pytest.approx(3.0, abs=1e-6)
    prep = [t for t, label in marks if label == "role node_prepare"]
    assert part["role node_prepare"] > 0 and part["role node_prepare"] <= (max(prep) - min(prep)) + (end - start)
    # per-task detail has every task as its own bucket
    _, _, detail = dt.playbook_slices(events, detail=True)
    assert any(label.startswith("server_stop : Stop | Stop the server recorded in server.json") for _, label in detail)


def test_dead_time_bench_window_reads_first_send_and_last_finish(tmp_path):
    dt = _load("dead_time")
    p = tmp_path / "bench.jsonl"
    p.write_text('{"i": 0, "warmup": true, "start_ts": 100.0, "e2e_s": 1.5}\n'
                 '{"i": 0, "warmup": false, "start_ts": 101.6, "e2e_s": 2.0}\n\n')
    assert dt.bench_window(p) == (100.0, 103.6)
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(dt.BenchError, match="no request"):
        dt.bench_window(tmp_path / "empty.jsonl")


def test_dead_time_watcher_sees_spawn_and_ready_line(tmp_path):
    dt = _load("dead_time")
    (tmp_path / "runs" / "001-a").mkdir(parents=True)
    w = dt.Watcher([tmp_path / "server.json"], [(tmp_path / "runs", "*/server.log")]).start()
    try:
        (tmp_path / "server.json").write_text(json.dumps({"run_id": "001-a", "started_at": 123.5}))
        log = tmp_path / "runs" / "001-a" / "server.log"
        log.write_text("[2026-11-29 08:00:00 TP0] Load weight begin.\n")
        time.sleep(0.2)
        assert str(log) not in w.ready
        t_write = time.time()
        with open(log, "a") as f:
            f.write("[2026-11-29 08:00:01] The server is fired up and ready to roll!\n")
        deadline = time.monotonic() + 10
        while str(log) not in w.ready and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        w.stop()
    assert w.spawned == {"001-a": 123.5}
    assert t_write <= w.ready[str(log)] <= t_write + 5


def test_dead_time_tools_and_naive_sequences_one_transition_each(tmp_path, capsys):
    dt = _load("dead_time")
    res = _run(dt, ["--where", "local", "--what", "tools", "naive", "--transitions", "1", "--naive-transitions", "1",
                    "--naive-sleeps", "0.2", "--naive-poll", "0.2", "--workdir", str(tmp_path)], capsys)
    [mode] = res["modes"]
    [tools] = mode["tools"]["transitions"]
    [naive] = mode["naive"][0]["transitions"]
    for row in (tools, naive):
        assert row["engine_load_s"] > 0 and row["wall_s"] > row["engine_load_s"]
        assert row["dead_s"] == pytest.approx(row["wall_s"] - row["engine_load_s"], abs=0.002)
    assert naive["dead_s"] >= 0.2                    # the fixed sleep is dead time by construction
    # the tools sequence really stopped the previous server and waited for free GPUs
    assert tools["stop_tool_total_s"] is not None and tools["time_to_free_s"] is not None
    assert 0 < tools["stop_to_spawn_s"] < tools["wall_s"]
    assert "met" not in mode                         # no harness measured, no verdict
    # nothing of the servers is left running
    for pid_file in (tmp_path / "local" / "naive" / "naive-sleep0.2" / "001" / "pid",):
        pid = int(pid_file.read_text())
        deadline = time.monotonic() + 20
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid), f"the naive server (pid {pid}) survived the benchmark"
    tools_server = json.loads((tmp_path / "local" / "tools" / "node" / "server.json").read_text())
    deadline = time.monotonic() + 20
    while _alive(tools_server["pid"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(tools_server["pid"]), "the tools sequence's last server survived the benchmark"


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# ------------------------------------------------------------------------------- verdict cost

def test_verdict_cost_sequential_stops_within_target_or_at_the_cap(capsys):
    vc = _load("verdict_cost")
    res = _run(vc, ["--mode", "restarts", "--seeds", "12", "--max-repeats", "8", "--fixed", "3", "5"], capsys)
    assert res["benchmark"] == "verdict cost (restarts per arm for a +-2% 95% CI)"
    seq = res["sequential"]
    assert sum(seq["distribution"].values()) == 12
    assert min(int(k) for k in seq["distribution"]) >= 3          # specab.analysis.measures.stats.MIN_BLOCKS
    assert seq["restarts_per_arm_max"] <= 8
    capped = seq["stopped_at_cap_without_target"]
    assert seq["within_target"] == pytest.approx(1 - capped / 12, abs=1e-3)
    assert 0 < res["true_speedup"] < 1                            # the seed: EAGLE-3 2-step is slower
    f3, f5 = res["fixed"]["3"], res["fixed"]["5"]
    assert f5["half_width_pct_median"] < f3["half_width_pct_median"]   # more blocks, narrower interval
    assert 0 <= f3["coverage"] <= 1 and isinstance(res["met"], bool)


# ------------------------------------------------------------------------------- report scale

def test_report_scale_small_experiment_writes_the_report(tmp_path, capsys):
    rs = _load("report_scale")
    res = _run(rs, ["--runs", "8", "--repeat", "1", "--stages", "--workdir", str(tmp_path)], capsys)
    assert res["experiment"]["runs"] == 8 and res["experiment"]["arms"] == ["baseline", "eagle3-s1", "eagle3-s2",
                                                                              "eagle3-s3"]
    exp_dir = next(tmp_path.iterdir())
    report = json.loads((exp_dir / "report.json").read_text())
    assert set(report["stats"]["speedups"]) == {"eagle3-s1", "eagle3-s2", "eagle3-s3"}
    assert report["stats"]["blocks"] == 2
    assert len(res["wall_s"]) == 1 and res["wall_s_median"] > 0
    assert any("eagle3-s2 vs baseline" in line for line in res["report_summary"])
    stages = res["stages_cpu_s"]
    assert {"load_store: store rows", "server logs", "statistics", "doctor", "plot GPU clocks"} <= set(stages)
    assert all(v >= 0 for v in stages.values()) and len(res["loadavg_before"]) == 3


def test_report_scale_synthesis_is_repeatable_with_a_fixed_clock(tmp_path):
    """The golden-report test relies on it: the same seed and t0 write the same experiment."""
    import sqlite3
    rs = _load("report_scale")
    rows = []
    for k in (1, 2):
        d = tmp_path / f"e{k}" / "scale-20261129-000000"
        rs.synthesise(d, 4, [2], 3, 1, 64, seed=5, t0=1.79e9)
        con = sqlite3.connect(d / "results.sqlite")
        rows.append([con.execute(f"SELECT * FROM {t} ORDER BY rowid").fetchall()
                     for t in ("requests", "gpu_samples", "manifests", "run_phases")])
        con.close()
        rows[-1].append(sorted((p.parent.name, p.read_text()) for p in d.glob("*/server.log")))
    assert rows[0] == rows[1] and rows[0][0] and rows[0][1]


# ------------------------------------------------------------------------------- footprint

def test_footprint_node_sums_every_process_of_the_server_session(tmp_path, capsys):
    fp = _load("footprint")
    res = _run(fp, ["--what", "node", "--tp", "2", "--requests", "4", "--concurrency", "2", "--time-scale", "50",
                    "--workdir", str(tmp_path)], capsys)
    node = res["node"]
    names = [p["name"] for p in node["per_process"]]
    # every process of the server at TP 2, each once: the untitled main (HTTP + tokenizer, its command line),
    # detokenizer, one scheduler per rank
    assert sorted(n for n in names if n.startswith("sglang::")) == ["sglang::detokenizer", "sglang::scheduler_TP0",
                                                                    "sglang::scheduler_TP1"]
    assert len(names) == 4                                        # + the main process, named by its command
    assert node["processes"] == node["after_bench"]["processes"] == len(names)
    assert node["peak_processes"] >= len(names)                  # the sampler saw them all (and maybe a transient fork)
    assert 0 < node["peak_pss_mb"] <= node["peak_rss_mb"]
    total = sum(p["rss_mb"] for p in node["per_process"])
    assert node["after_bench"]["rss_mb"] == pytest.approx(total, rel=0.1)


def test_footprint_driver_with_stand_in_runner_runs_the_whole_experiment(tmp_path, capsys):
    fp = _load("footprint")
    res = _run(fp, ["--what", "driver-1000", "--runs", "4", "--workdir", str(tmp_path)], capsys)
    d = res["driver_1000"]
    assert d["runs"] == 4
    assert set(d["rss_mb_after_runs"]) >= {"1", "end"}
    assert d["driver_process"]["peak_rss_mb"] >= d["rss_mb_after_runs"]["1"] > 10
    # the experiment's directory (runs/history/ holds the per-node history the driver appends at the end)
    exp_dir = next(d for d in (tmp_path / "driver-1000" / "runs").iterdir() if (d / "results.sqlite").exists())
    assert (exp_dir / "report.md").is_file()                     # the driver's own end-of-experiment report
    assert d["report_written"].endswith("report.md")


def test_verdict_cost_economics_mode_reports_both_designs_per_regime(capsys):
    vc = _load("verdict_cost")
    res = _run(vc, ["--mode", "economics", "--experiments", "40", "--max-repeats", "20"], capsys)
    assert set(res["regimes"]) == {"instance-dominated", "request-dominated"}
    for name, r in res["regimes"].items():
        for k in ("gpu_minutes_mean", "gpu_minutes_mean_sequential", "coverage", "restarts_mean"):
            assert k in r, (name, k)
        assert r["restarts_mean"] >= 3 and 0 <= r["coverage"] <= 1
        assert r["by_cost"]["within_target"] == 1.0 or r["by_cost"]["restarts_max"] >= 60
    rd, idom = res["regimes"]["request-dominated"], res["regimes"]["instance-dominated"]
    # request noise: the design buys longer runs and fewer restarts than the sequential design's 8 requests per run
    assert rd["by_cost"]["requests_per_run_mean"] > 8 and rd["restarts_mean"] < rd["restarts_mean_sequential"]
    assert rd["gpu_minutes_mean"] < rd["gpu_minutes_mean_sequential"]
    assert idom["within_share_at_sequential_requests"] < 0.5 < rd["within_share_at_sequential_requests"]
    assert isinstance(res["met"], bool)
