"""The benchmark client over several processes (bench.client_procs): the same requests and records as with one, every
request recorded exactly once, a killed worker's requests recorded failed while the run still writes its summary, the
setting's checks, and how many processes ``auto`` gives."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from specab.node import loadgen
from tests.node.helpers import client_config, client_default_argv
from tests.unit.test_loadgen import make_server  # noqa: F401  (fixture)
from tests.unit.test_loadgen_sim import NODE, sim  # noqa: F401  (fixture)


def _run(url: str, tmp: Path, *extra: str, timeout: float = 300) -> tuple[int, str, dict, list[dict]]:
    out, summ = tmp / "bench.jsonl", tmp / "bench_summary.json"
    proc = subprocess.run([sys.executable, str(NODE), "loadgen", *client_default_argv(), "--url", url,
                           "--out", str(out), "--summary", str(summ), *extra],
                          capture_output=True, text=True, timeout=timeout)
    records = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    return proc.returncode, proc.stderr, json.loads(summ.read_text()) if summ.exists() else {}, records


def _known_truth_run_dir(tmp: Path) -> Path:
    """A run directory whose args.json names a known-truth target: the client sends token-id prompts and records each
    request's prompt_last_token and output_ids."""
    target = tmp / "target"
    target.mkdir(parents=True)
    (target / "known_truth.json").write_text(json.dumps({"vocab_size": 5000, "first": 4, "rule": "t+1"}))
    run_dir = tmp / "run"
    run_dir.mkdir()
    (run_dir / "args.json").write_text(json.dumps({"model_path": str(target)}))
    return run_dir


def test_several_processes_send_the_same_requests_as_one_on_the_simulator(sim, tmp_path: Path) -> None:  # noqa: F811
    s = sim([])
    seen = {}
    for procs in ("1", "3"):
        run_dir = _known_truth_run_dir(tmp_path / procs)
        rc, err, summary, records = _run(s.url, run_dir, "--num-requests", "30", "--warmup", "3", "--concurrency", "12",
                                         "--input-len", "16", "--output-len", "24", "--seed", "5", "--timeout", "120",
                                         "--client-procs", procs)
        assert rc == 0, err
        keys = [(r["warmup"], r["i"]) for r in records]
        assert sorted(keys) == sorted(set(keys)) == [(False, i) for i in range(30)] + [(True, i) for i in range(3)]
        assert all(r["ok"] for r in records)
        seen[procs] = {(r["warmup"], r["i"]): (r["output_tokens"], r["prompt_last_token"], len(r["output_ids"]))
                       for r in records}
        assert summary["client_procs"] == int(procs) and summary["client_procs_setting"] == int(procs)
        # this process first, then each worker's own CPU
        assert len(summary["client_cpu_per_proc_s"]) == (1 if procs == "1" else 1 + int(procs))
        assert summary["client_cpu_s"] == pytest.approx(sum(summary["client_cpu_per_proc_s"]))
        assert summary["client_cpu_max_proc_s"] == max(summary["client_cpu_per_proc_s"]) > 0
    assert seen["1"] == seen["3"]
    assert {v[0] for v in seen["3"].values()} == {24}
    # the prompts differ from request to request: the same last tokens mean request i carried prompt i both times
    assert len({v[1] for v in seen["3"].values()}) > 20


def _workers_of(pid: int) -> list[int]:
    """The client's worker processes (their command line runs loadgen.worker_process)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = open("/proc/%s/stat" % d).read()
            cmd = open("/proc/%s/cmdline" % d, "rb").read()
        except OSError:
            continue
        if int(stat[stat.rfind(")") + 2:].split()[1]) == pid and b"loadgen.worker_process" in cmd:
            out.append(int(d))
    return sorted(out)


def _running(pid: int) -> bool:
    try:
        stat = open("/proc/%d/stat" % pid).read()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def _until(cond: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.01)
    raise AssertionError("condition not met within %.0f s" % timeout)


def _kill_a_worker_once_four_are_in_flight(srv: Any, tmp: Path, num: int, warmup: int
                                           ) -> tuple[int, str, list[int], Path, Path]:
    """The client (4 in flight over 2 worker processes) started; once the server holds four requests, the first
    worker is SIGKILLed. Returns (exit status, stderr, the two workers' pids, the killed one first, bench.jsonl,
    bench_summary.json)."""
    out, summ = tmp / "bench.jsonl", tmp / "bench_summary.json"
    proc = subprocess.Popen([sys.executable, str(NODE), "loadgen", *client_default_argv(), "--url", srv.url,
                             "--num-requests", str(num), "--warmup", str(warmup), "--concurrency", "4",
                             "--client-procs", "2", "--out", str(out), "--summary", str(summ), "--timeout", "60"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        workers = _until(lambda: len(_workers_of(proc.pid)) == 2 and _workers_of(proc.pid))
        _until(lambda: len(srv.bodies) == 4)
        assert not out.read_text()                   # nothing finished yet: both workers hold two requests
        os.kill(workers[0], signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, err, workers, out, summ


def test_a_killed_worker_fails_its_requests_and_the_run_still_writes_its_summary(make_server,  # noqa: F811
                                                                                  tmp_path: Path) -> None:
    """Two workers of two slots each; each request streams for ~1.2 s. Once all four first requests are at the
    server, one worker is SIGKILLed: its two requests in flight are recorded failed naming it, no further request is
    sent (those are recorded failed as not sent), the other worker's two finish, the summary is written, exit 1."""
    srv = make_server(first_delay_s=0.2, gap_s=0.2)
    rc, err, workers, out, summ = _kill_a_worker_once_four_are_in_flight(srv, tmp_path, 10, 0)
    assert rc == 1, err
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["i"] for r in records) == list(range(10))          # each exactly once
    lost = [r for r in records if not r["ok"] and "in flight there" in r["error"]]
    unsent = [r for r in records if not r["ok"] and r["error"].startswith("not sent: ")]
    ok = [r for r in records if r["ok"]]
    assert len(lost) == 2 and len(ok) == 2 and len(unsent) == 6, [r.get("error") for r in records]
    assert all("client worker process" in r["error"] and "pid %d" % workers[0] in r["error"]
               and "killed by SIGKILL" in r["error"] for r in lost + unsent)
    assert all("no longer 4 in flight" in r["error"] for r in unsent)
    summary = json.loads(summ.read_text())
    assert summary["failed"] == 8 and summary["ok"] == 2 and summary["client_procs"] == 2
    assert "client worker process" in summary["errors"][0]
    assert not [pid for pid in workers if _running(pid)]               # the other worker ended with the run
    assert len(srv.bodies) == 4                          # nothing was sent after the worker died


def test_the_warm_up_and_the_measured_requests_share_one_set_of_worker_processes(make_server, tmp_path: Path,  # noqa: F811
                                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A run starts its client's worker processes once, before its warm-up, and the same processes serve the measured
    requests: one set of interpreter starts per run (dead time between a server's readiness and its measurement), and
    the measured phase's CPU is still that phase's alone."""
    srv = make_server()
    started = []
    real_popen = subprocess.Popen

    def popen(argv: Any, *args: Any, **kwargs: Any) -> Any:
        proc = real_popen(argv, *args, **kwargs)
        if loadgen.WORKER_BOOT in argv:
            started.append(proc.pid)
        return proc
    monkeypatch.setattr(loadgen.subprocess, "Popen", popen)
    cfg = client_config(srv.url, str(tmp_path / "bench.jsonl"), None, num_requests=8, warmup=3, concurrency=4,
                        client_procs=2, timeout=60)
    summary = loadgen.run_benchmark(cfg)
    records = [json.loads(line) for line in (tmp_path / "bench.jsonl").read_text().splitlines()]
    assert len(started) == 2, started
    assert sorted((r["warmup"], r["i"]) for r in records) == [(False, i) for i in range(8)] + [(True, i) for i in range(3)]
    assert all(r["ok"] for r in records) and summary["ok"] == 8 and summary["warmup_requests"] == 3
    assert len(srv.bodies) == 11
    assert len(summary["client_cpu_per_proc_s"]) == 3 and summary["client_procs"] == 2


def test_a_worker_lost_in_the_warm_up_is_replaced_before_the_measured_requests(make_server,  # noqa: F811
                                                                                tmp_path: Path) -> None:
    """A worker killed while it holds warm-up requests: those are recorded failed as warm-ups, the whole set of
    workers is started again, and the measured requests run at their full load on the new ones (exit 0)."""
    srv = make_server(first_delay_s=0.2, gap_s=0.2)
    rc, err, workers, out, summ = _kill_a_worker_once_four_are_in_flight(srv, tmp_path, 4, 4)
    assert rc == 0, err
    records = [json.loads(line) for line in out.read_text().splitlines()]
    warm = [r for r in records if r["warmup"]]
    measured = [r for r in records if not r["warmup"]]
    assert sorted(r["i"] for r in warm) == sorted(r["i"] for r in measured) == list(range(4))
    lost = [r for r in warm if not r["ok"]]
    assert len(lost) == 2 and all("pid %d" % workers[0] in r["error"] and "in flight there" in r["error"] for r in lost)
    assert all(r["ok"] for r in measured)
    summary = json.loads(summ.read_text())
    assert summary["ok"] == 4 and summary["failed"] == 0 and summary["warmup_failed"] == 2
    assert len(srv.bodies) == 8                         # each measured request sent once, on the new workers


def test_a_worker_that_ended_between_the_phases_is_replaced_too(make_server, tmp_path: Path) -> None:  # noqa: F811
    """A worker that dies after the warm-up finished (nothing of it lost, nothing in flight) is seen before the
    measured requests: the set is started again and every measured request is sent and answered."""
    srv = make_server()
    cfg = client_config(srv.url, str(tmp_path / "bench.jsonl"), None, concurrency=4, client_procs=2, timeout=60)
    with open(cfg.out, "w", encoding="utf-8") as fh:
        recorder = loadgen._Recorder(fh)
        with loadgen._ProcPool(cfg, None, 2, 4) as pool:
            pool.run(["w0", "w1"], True, recorder)
            first = [p.pid for p in pool.procs]
            os.kill(first[0], signal.SIGKILL)
            pool.procs[0].wait()
            pool.renew()
            assert not {p.pid for p in pool.procs} & set(first) and len(pool.procs) == 2
            cpu = pool.run(["m%d" % i for i in range(6)], False, recorder)
    assert len(cpu) == 2
    measured = [r for r in recorder.records if not r["warmup"]]
    assert sorted(r["i"] for r in measured) == list(range(6)) and all(r["ok"] for r in measured)


@pytest.mark.parametrize("value", ["0", "-1", "1.5", "many"])
def test_a_bad_client_procs_is_bad_usage(make_server, tmp_path: Path, value: str) -> None:  # noqa: F811
    srv = make_server()
    rc, err, _, records = _run(srv.url, tmp_path, "--num-requests", "1", "--warmup", "0", "--client-procs", value)
    assert rc == 2 and "--client-procs) must be auto" in err and repr(value) in err and records == []
    assert srv.bodies == []
    with pytest.raises(loadgen.UsageError, match="client_procs"):
        loadgen.BenchConfig.from_settings(srv.url, dict(_settings(), client_procs=value), out="b.jsonl", summary=None,
                                          phase_metrics=None)


def _settings() -> dict:
    from specab.config import defaults
    return defaults.bench({})


@pytest.mark.parametrize("setting,concurrency,cpus,procs", [
    ("auto", 1, 16, 1), ("auto", 8, 16, 1), ("auto", 9, 16, 2), ("auto", 32, 16, 4), ("auto", 64, 16, 8),
    ("auto", 64, 3, 3),             # at most one per CPU
    (4, 2, 16, 2),                  # never more processes than slots
    (3, 32, 1, 3),                  # a number is taken as given
])
def test_auto_is_one_process_per_8_in_flight_at_most_one_per_cpu(setting: Any, concurrency: int, cpus: int,
                                                                 procs: int) -> None:
    assert loadgen.client_procs_for(setting, concurrency, cpus) == procs


def test_the_setting_round_trips_through_the_command_line() -> None:
    for value in ("auto", 3):
        cfg = loadgen.BenchConfig.from_settings("http://127.0.0.1:1", dict(_settings(), client_procs=value),
                                                out="b.jsonl", summary="s.json", phase_metrics=None)
        assert loadgen.parse_args(cfg.to_argv()) == cfg and cfg.client_procs == value
