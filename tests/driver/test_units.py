"""Runner event mapping, secret scrubbing, progress display, export, run directory checks."""
from __future__ import annotations

import csv
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from specab.driver.cli import main
from specab.driver.options import ExperimentError
from specab.driver.playbook import failure_message, phase_of_event, scrub_tree
from specab.driver.progress import Progress
from specab.driver.record import UnpackError, check_writable, unpack_fetched
from tests.driver.test_store import _store


@pytest.mark.parametrize("event_data, phase", [
    ({"role": "node_prepare", "task": "Prepare | Find the node tools on the controller"}, "preparing"),
    ({"role": "server_stop", "task": "Stop any server of ours left on the node"}, "stopping"),
    ({"role": "gpu_free", "task": "Wait until the GPUs are free before starting"}, "waiting for GPUs"),
    ({"role": "server_start", "task": "Launch detached in its own session, arm x"}, "starting"),
    ({"role": "server_ready", "task": "Loading weights and capturing graphs until the server answers"}, "loading"),
    ({"role": "env_verify", "task": "Compare every engine process's environment"}, "verifying env"),
    ({"role": "bench", "task": "Run the benchmark client"}, "benchmarking"),
    ({"role": "collect", "task": "Fetch the run's files"}, "collecting"),
    ({"role": "server_stop", "task": "Validating arguments against arg spec 'main'"}, "stopping"),
    ({"task": "Stop | a task of the playbook itself, outside every role"}, None),
    ({"role": "specab", "task": "a role of no run step"}, None),
    ({}, None),
])
def test_the_role_of_an_event_names_its_phase(event_data, phase):
    assert phase_of_event(event_data) == phase


def test_a_teardowns_phases_are_recorded_from_its_task_start_and_its_failure_stays_the_runs_first():
    """The per-run rescue's one teardown task goes through stop and the GPU wait: the phases its result reports are
    told in order, each at the task's start plus its offset; the run's failure (the ready step's) stays the first."""
    from specab.driver import playbook
    told: list[tuple[str, float | None]] = []
    ev = playbook._Events({}, [], lambda phase, at: told.append((phase, at)), None)
    ev.on_event({"event": "playbook_on_task_start", "event_data": {"role": "server_stop"}})
    ev.on_event({"event": "playbook_on_task_start", "event_data": {"role": "server_ready"}})
    ev.on_event({"event": "runner_on_failed", "event_data": {"role": "server_ready", "task": "Ready | wait",
                                                            "res": {"msg": "The server did not become ready: OOM"}}})
    ev.on_event({"event": "playbook_on_task_start", "event_data": {"task": "Stop | Tear down the failed run"}})
    started = ev.task_started
    ev.on_event({"event": "runner_on_ok", "event_data": {"task": "Stop | Tear down the failed run", "res": {
        "phases": [{"phase": "stopping", "t_rel_s": 0.0}, {"phase": "gpus free", "t_rel_s": 1.5}]}}})
    assert [p for p, _ in told] == ["stopping", "loading", "final stop", "waiting for GPUs"]
    assert told[-2:] == [("final stop", started), ("waiting for GPUs", started + 1.5)]
    assert [(f.phase, f.message) for f in ev.failures] == [("loading", "The server did not become ready: OOM")]


def test_failure_message_prefers_the_node_tools_error():
    assert failure_message({"stdout": json.dumps({"ok": False, "error": "GPU 0 held by pid 42 (bob): python train.py"}),
                     "msg": "non-zero return code", "rc": 1}) == "GPU 0 held by pid 42 (bob): python train.py"
    assert failure_message({"msg": "The server did not become ready: OOM"}) == "The server did not become ready: OOM"
    assert "boom" in failure_message({"msg": "non-zero return code", "stderr": "boom", "stdout": ""})


def test_scrub_tree_removes_secret_values_everywhere(tmp_path):
    (tmp_path / "a").mkdir()
    f1 = tmp_path / "a" / "command"
    f1.write_text(json.dumps({"env": {"HF_TOKEN": "hf_abc\"def", "X": "1"}}))
    f2 = tmp_path / "stdout"
    f2.write_text("token hf_abc\"def here\n")
    assert scrub_tree(tmp_path, ['hf_abc"def', "", "ab"]) == 2
    assert 'hf_abc' not in f1.read_text() and "hf_abc" not in f2.read_text()
    assert "<redacted>" in f2.read_text()


def test_scrub_tree_leaves_each_file_that_held_a_secret_private(tmp_path):
    """A copy fetched with the umask's mode (0644, a failed run's launch.sh 0755) that held a secret is its owner's
    alone once scrubbed; a file without one keeps its mode."""
    held, script, clean = tmp_path / "args.json", tmp_path / "launch.sh", tmp_path / "bench.jsonl"
    held.write_text('{"api_key": "k-secret-1"}')
    script.write_text("exec engine --api-key k-secret-1\n")
    clean.write_text("{}\n")
    for f, mode in ((held, 0o644), (script, 0o755), (clean, 0o644)):
        os.chmod(f, mode)
    assert scrub_tree(tmp_path, ["k-secret-1"]) == 2
    assert [f.stat().st_mode & 0o777 for f in (held, script, clean)] == [0o600, 0o700, 0o644]


def test_scrub_tree_learns_the_values_the_files_name_as_secret(tmp_path):
    """A node env value that only Ansible rendered (a file lookup) reaches the controller's copy under its secret
    name (launch.sh's export, the queue entry's JSON); scrub_tree finds it there and scrubs it from every file,
    the server log included, though the driver was given none of it. Learned only from the files that carry
    secrets by design: the log's own `*_token=` lines teach nothing (a token id is no secret), nor does a logged
    default (api_key=None) or a bare number."""
    (tmp_path / "launch.sh").write_text("export HUB_API_KEY=file-secret-1\nexec engine --api-key 'flag secret 2'\n")
    (tmp_path / "queue_entry.json").write_text('{"node_env": {"OTHER_TOKEN": "json-secret-3", "EOS_TOKEN": 151643}}')
    log = tmp_path / "server.log"
    log.write_text("env: file-secret-1 flag secret 2 json-secret-3; ServerArgs(api_key=None) pad_token=<pad>0 "
                   "eos 151643\n")
    assert scrub_tree(tmp_path, []) == 3
    text = "".join(f.read_text() for f in tmp_path.iterdir())
    assert not [v for v in ("file-secret-1", "flag secret 2", "json-secret-3") if v in text], text
    assert log.read_text() == "env: <redacted> <redacted> <redacted>; ServerArgs(api_key=None) pad_token=<pad>0 " \
                              "eos 151643\n"


def test_progress_plain_lines_and_eta():
    out = io.StringIO()
    p = Progress(out=out, live=False)
    p.start("exp-1", total=4)
    p.run_started(1, "001-baseline", "baseline", 1)
    p.phase("loading weights")
    p.run_finished("ok", 10.0)
    p.run_started(2, "002-x", "x", 1)
    p.run_finished("failed", 20.0, reason="Ready | the server died: OOM\nmore")
    text = out.getvalue()
    assert "[1/4] 001-baseline" in text and "loading weights" in text
    assert "failed in 20.0 s: Ready | the server died: OOM" in text
    assert p.eta() == pytest.approx(2 * 15.0)
    p.close()


def test_progress_shows_gpu_minutes_spent_and_projected():
    """The live progress says what the experiment has cost so far and what the rest will cost at the
    mean per run (wall time x the GPUs the arm's server holds)."""
    out = io.StringIO()
    p = Progress(out=out, live=False)
    p.start("exp-1", total=4)
    p.run_started(1, "001-baseline", "baseline", 1)
    assert p.gpu_minutes() is None
    p.run_finished("ok", 60.0, gpus=8)
    assert p.gpu_minutes() == pytest.approx((8.0, 24.0))
    p.run_started(2, "002-x", "x", 1)
    p.run_finished("failed", 30.0, reason="boom", gpus=8)       # a failed run costs too
    assert p.gpu_minutes() == pytest.approx((12.0, 12.0))
    assert "12.0 GPU-min spent, ~12.0 to go" in out.getvalue()
    # the design by cost said what it expects from here to the verdict, the blocks it will add included: that
    # replaces the planned runs' extrapolation, less what is spent since
    p.projection(30 * 60.0, gpus=8)
    assert p.gpu_minutes() == pytest.approx((12.0, 30.0)) and p.eta() == pytest.approx(30 * 60 / 8)
    p.run_started(3, "003-baseline", "baseline", 2)
    p.run_finished("ok", 60.0, gpus=8)
    assert p.gpu_minutes() == pytest.approx((20.0, 22.0)) and p.eta() == pytest.approx(22 * 60 / 8)
    live = io.StringIO()
    q = Progress(out=live, live=True)
    q.start("exp-2", total=2)
    q.run_started(1, "001-baseline", "baseline", 1)
    q.run_finished("ok", 30.0, gpus=2)
    q.close()
    assert "1.0 spent, ~1.0 projected for the rest" in live.getvalue()


def test_progress_live_renders():
    out = io.StringIO()
    p = Progress(out=out, live=True)
    p.start("exp-1", total=2)
    p.run_started(1, "001-baseline", "baseline", 1)
    p.phase("capturing graphs")
    p.log_line("[2026-01-01 00:00:00 TP0] Capture cuda graph begin.")
    p.close()
    text = out.getvalue()
    assert "run         1 of 2" in text and "baseline  (block 1)" in text
    assert "capturing graphs" in text and "Capture cuda graph begin." in text


def test_run_directory_must_be_writable(tmp_path, monkeypatch):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ExperimentError, match=r"runs: not a directory \(.*file is a file\)"):
        check_writable(f / "runs")
    # root writes through any mode: an unwritable directory is a write that fails (EACCES), made here
    real_write = Path.write_text

    def denied(self, *a, **k):
        if self.name.startswith(".write-test-"):
            raise PermissionError(13, "Permission denied", str(self))
        return real_write(self, *a, **k)
    monkeypatch.setattr(Path, "write_text", denied)
    with pytest.raises(ExperimentError, match="not writable \\(Permission denied\\)"):
        check_writable(tmp_path / "ro")
    monkeypatch.undo()
    with pytest.raises(ExperimentError, match="MB free"):
        check_writable(tmp_path / "ok", min_free_mb=10 ** 12)
    check_writable(tmp_path / "ok")


def test_a_fleets_host_threads_check_the_run_directory_at_once(tmp_path):
    """--fleet: every host's thread checks the experiment directory before each run; one thread's check never
    removes another's probe (which read as "not writable (No such file or directory)" and stopped the fleet)."""
    import threading
    start = threading.Barrier(4)
    errors: list[BaseException] = []

    def check() -> None:
        start.wait()
        try:
            for _ in range(300):
                check_writable(tmp_path)
        except BaseException as exc:      # reported below
            errors.append(exc)
    threads = [threading.Thread(target=check) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert [p.name for p in tmp_path.iterdir()] == []


def test_unwritable_runs_dir_refused_before_any_run(tmp_path, experiment_file, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    assert main(["-e", str(experiment_file), "--runs-dir", str(f / "runs")], out=io.StringIO()) == 2
    assert "runs: not a directory" in capsys.readouterr().err


def test_export_csv_and_json(tmp_path):
    s = _store(tmp_path)
    s.start_run(seq=1, run_id=s.plan()[0]["run_id"], arm=s.plan()[0]["arm"], block=1, host="h", run_dir="/r",
                runner_ident="i")
    s.add_requests(1, "h", [{"i": 0, "warmup": False, "ok": True, "decode_tok_s": 81.5, "chunk_tokens": [1, 2]}])
    s.finish_run(1, status="ok")
    s.close()
    out = io.StringIO()
    assert main(["export", str(tmp_path), "--format", "csv"], out=out) == 0
    rows = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert rows[0]["decode_tok_s"] == "81.5" and rows[0]["run_status"] == "ok" and rows[0]["arm"]
    out = io.StringIO()
    assert main(["export", str(tmp_path), "--format", "csv", "--table", "runs"], out=out) == 0
    assert list(csv.DictReader(io.StringIO(out.getvalue())))[0]["status"] == "ok"
    out = io.StringIO()
    assert main(["export", str(tmp_path), "--format", "json"], out=out) == 0
    data = json.loads(out.getvalue())
    assert data["experiment"]["id"] == "t-1" and data["requests"][0]["chunk_tokens"] == [1, 2]
    assert len(data["plan"]) == 4


def test_export_phase_metrics_csv_and_json(tmp_path):
    """The per-phase counters a run stored (phase_metrics.json, made by the client's parser from /metrics
    text in SGLang 0.5.23 and 0.5.17 format, or "not available") come out of `export` as one flattened row per run
    (csv --table phase_metrics, to stdout and to -o) and under the json key phase_metrics."""
    from specab.node import phasemetrics
    from tests.unit.test_phasemetrics import REAL_0517_AFTER, REAL_0517_BEFORE, _v0523
    s = _store(tmp_path)
    plan = s.plan()
    files = {1: phasemetrics.result(_v0523(1, 0.2, 7, 250, 250), _v0523(1.8, 0.36, 12.8, 450, 450), 6.5, 10.0, 16.5),
             2: phasemetrics.result(REAL_0517_BEFORE, REAL_0517_AFTER, 5.0, 20.0, 25.0),
             3: phasemetrics.unavailable("GET /metrics: HTTP 404 (the server runs without --enable-metrics)")}
    for seq, pm in files.items():
        p = plan[seq - 1]
        s.start_run(seq=seq, run_id=p["run_id"], arm=p["arm"], block=p["block"], host="sim0", run_dir="/r",
                    runner_ident=str(seq))
        s.add_file(seq, "sim0", "phase_metrics.json", json.dumps(pm))
        s.finish_run(seq, status="ok")
    s.start_run(seq=4, run_id=plan[3]["run_id"], arm=plan[3]["arm"], block=plan[3]["block"], host="sim0",
                run_dir="/r", runner_ident="4")          # a run without the file (an older store, a failed start)
    s.finish_run(4, status="failed")
    s.close()
    out = io.StringIO()
    assert main(["export", str(tmp_path), "--format", "csv", "--table", "phase_metrics"], out=out) == 0
    rows = {int(r["seq"]): r for r in csv.DictReader(io.StringIO(out.getvalue()))}
    assert sorted(rows) == [1, 2, 3]
    r1, r2, r3 = rows[1], rows[2], rows[3]
    assert (r1["run_id"], r1["arm"], r1["block"]) == (plan[0]["run_id"], plan[0]["arm"], str(plan[0]["block"]))
    assert r1["available"] == "True" and float(r1["window_s"]) == 6.5
    assert float(r1["spec_verify_calls"]) == 200 and float(r1["generation_tokens"]) == 400
    assert float(r1["forward_s.eagle_draft"]) == pytest.approx(0.8)
    assert float(r1["forward_s.eagle_draft_extend"]) == pytest.approx(0.16)
    assert float(r1["forward_s.target_verify"]) == pytest.approx(5.8)            # tp_rank 1 left out
    assert float(r1["graph_passes.decode_none"]) == 200 and r1["graph_passes.decode_cuda_graph"] == ""
    # the real 0.5.17 lines: decode/extend only, no verify calls
    assert float(r2["forward_s.decode"]) == pytest.approx(0.31265, abs=1e-5) and r2["forward_s.target_verify"] == ""
    assert r2["spec_verify_calls"] == "" and float(r2["graph_passes.decode_cuda_graph"]) == 400
    assert r3["available"] == "False" and "HTTP 404" in r3["reason"] and r3["forward_s.decode"] == ""
    dest = tmp_path / "pm.csv"
    assert main(["export", str(tmp_path), "--format", "csv", "--table", "phase_metrics", "-o", str(dest)],
                out=io.StringIO()) == 0
    assert dest.read_bytes() == out.getvalue().encode()          # the same rows, the same CSV line ends
    out = io.StringIO()
    assert main(["export", str(tmp_path), "--format", "json"], out=out) == 0
    pm = {r["seq"]: r for r in json.loads(out.getvalue())["phase_metrics"]}
    assert sorted(pm) == [1, 2, 3] and pm[1]["forward_s.target_verify"] == pytest.approx(5.8)
    assert pm[3]["available"] is False and pm[2]["spec_verify_calls"] is None


def test_export_unknown_experiment(tmp_path, capsys):
    assert main(["export", "nope", "--runs-dir", str(tmp_path)], out=io.StringIO()) == 2
    assert "not found" in capsys.readouterr().err


def test_log_excerpt_keeps_the_buried_fatal_line():
    from specab.driver.record import log_excerpt
    lines = ["[2026-01-01 00:00:00 TP0] Load weight begin."] + \
        ["[2026-01-01 00:00:01 TP0] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."] + \
        [f"[2026-01-01 00:00:02 TP{r}] Capture cuda graph end." for r in range(1, 60)]
    text = "\n".join(lines)
    out = log_excerpt(text, lines=40).splitlines()
    assert "OutOfMemoryError" in out[0] and "[...]" in out and out[-1] == lines[-1]
    assert len(out) <= 40 + 6 + 1
    short = "\n".join(lines[:5])
    assert log_excerpt(short) == short


# --------------------------------------------------------------------------- what the user sees

def test_live_failure_line_is_never_cut():
    import io as _io
    from specab.driver.progress import Progress
    buf = _io.StringIO()
    p = Progress(out=buf, live=False)
    p.start("e-1", 2)
    p.run_started(1, "001-baseline", "baseline", 1)
    reason = ("port 30123 is already taken (LISTEN) by PID 3762, user alice, command " + "'x' " * 80
              + "; stop that process or choose another port (server_args.port)")
    p.run_finished("failed", 3.0, reason=reason + "\nsecond line")
    text = " ".join(buf.getvalue().split())
    assert " ".join(reason.split()) in text and "second line" not in text


class _NoOkStore:
    """A store whose every run failed (the few methods conclude and the summary read)."""
    path = "/nonexistent/results.sqlite"

    def arms(self):
        return [{"name": "baseline", "baseline": "baseline"}, {"name": "eagle3", "baseline": "baseline"}]

    def runs(self, status=None):
        rows = [{"seq": i, "run_id": f"00{i}-{a}", "arm": a, "status": "failed", "failure_phase": "start",
                 "failure_reason": "port taken", "burn_in": 0} for i, a in ((1, "baseline"), (2, "eagle3"))]
        return [r for r in rows if status is None or r["status"] == status]

    def requests(self):
        return []

    def experiment(self):
        return {"config": {"bench": {"concurrency": 1}}}

    def missing(self):
        return []


def test_no_report_for_zero_ok_runs(tmp_path, monkeypatch):
    import io as _io
    from specab.driver import session
    written = []
    monkeypatch.setattr(session, "write_report", lambda d: written.append(d) or {})
    out = _io.StringIO()
    assert session.conclude(0, _NoOkStore(), tmp_path, out) == 1
    assert written == [] and "no report: no run finished ok" in out.getvalue()


def _all_failed(run, arm):
    run.status, run.requests, run.gpu_samples = "failed", [], []


def _all_buffered(run, arm):
    """Every response held back and delivered at once (the buffered_stream fault, a CPU-starved front end): the run is
    ok but no request has a decode pace, so no run has a tok/s."""
    for q in run.requests:
        q.decode_tok_s, q.tpot_s, q.ttft_s = None, None, q.e2e_s


LEGEND_WARNING = "No artists with labels found to put in legend"


def test_no_library_warning_reaches_the_terminal(tmp_path):
    """matplotlib's UserWarning leaked into the terminal under a report of runs without a tok/s.
    The condition is provoked for real (every run failed; every run ok but delivered in bursts: the drift plot has
    no point to label) and shown to warn without the guard; through the end-of-experiment path (summary table and
    report) and `driver.py report` in a fresh interpreter with Python's default warning filters, nothing but
    specab's own lines reaches stdout and stderr is empty."""
    import io as _io
    import os
    import subprocess
    import sys
    import warnings

    from specab.analysis.render import report
    from specab.driver import session
    from specab.results import store as st
    from tests.analysis import factory
    from tests.driver.simnode import REPO
    dirs = {name: factory.write_store(factory.experiment({"baseline": 82.2, "eagle3-s2": 60.5}, blocks=1, tweak=tw),
                                      tmp_path / name)
            for name, tw in (("failed", _all_failed), ("buffered", _all_buffered))}
    for name, d in dirs.items():       # the condition is real: the unguarded report warns
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            report._write(d, None, None)
        assert any(LEGEND_WARNING in str(w.message) and w.category is UserWarning for w in caught), \
            (name, [str(w.message) for w in caught], "the provocation no longer warns: find what does now")
    # the driver's end of an experiment (the buffered runs are ok: a report is written), every warning surfacing
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with st.Store.open(dirs["buffered"]) as s:
            out = _io.StringIO()
            session.conclude(0, s, dirs["buffered"], out)
    assert caught == [] and "Warning" not in out.getvalue(), ([str(w.message) for w in caught], out.getvalue())
    assert "report: " in out.getvalue() and (dirs["buffered"] / "report.md").is_file()
    # `driver.py report` as the user runs it
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    for name, d in dirs.items():
        p = subprocess.run([sys.executable, str(REPO / "driver.py"), "report", str(d)], cwd=str(REPO), env=env,
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, (name, p.stdout[-2000:], p.stderr[-2000:])
        assert p.stderr == "", (name, p.stderr)
        assert "Warning" not in p.stdout and "markdown: " in p.stdout, (name, p.stdout)


def test_conclude_appends_the_experiment_to_its_nodes_history(tmp_path, monkeypatch):
    import io as _io

    from specab.analysis.cost import design, history
    from specab.driver import session
    from specab.results import store as st
    from tests.analysis import factory

    exp = factory.experiment({"baseline": 80.0, "eagle3-s2": 100.0}, blocks=4)
    exp_dir = factory.write_store(exp, tmp_path / "runs")
    monkeypatch.setattr(session, "write_report", lambda d: {})
    store = st.Store.open(exp_dir)
    try:
        store.set_session_fingerprint("fp-of-test", {"bench": {}})
        out = _io.StringIO()
        session.conclude(0, store, exp_dir, out)
    finally:
        store.close()
    hosts = sorted({r.host for r in exp.runs})
    for host in hosts:
        assert f"history: {history.path_for(tmp_path / 'runs', host)}" in out.getvalue()
        [entry] = history.read(tmp_path / "runs", host)
        assert entry["fingerprint"] == "fp-of-test" and entry["experiment"] == exp.id
        assert history.prior(tmp_path / "runs", host, "fp-of-test").between_df == 3 + design.DEFAULT_BETWEEN_DF


# ------------------------------------------------------------------ unpacking a fetched run (collect_run.yml)
def _archive(path: Path, members: dict[str, tuple[bytes, int]], link: str | None = None) -> None:
    with tarfile.open(path, "w") as tar:
        for name, (data, mode) in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.uid, info.gid = len(data), mode, 4242, 4242
            tar.addfile(info, io.BytesIO(data))
        if link:
            info = tarfile.TarInfo("001-baseline/log-link")
            info.type, info.linkname = tarfile.SYMTYPE, link
            tar.addfile(info)


def test_unpack_fetched_keeps_modes_takes_ownership_and_removes_the_archive(tmp_path: Path) -> None:
    archive = tmp_path / "001-baseline.tar"
    assert unpack_fetched(archive, tmp_path, ["001-baseline"]) == [] and not (tmp_path / "001-baseline").exists()
    _archive(archive, {"001-baseline/done.json": (b'{"ok": true}', 0o644),
                       "001-baseline/server.env": (b"HF_TOKEN=x\n", 0o600),
                       "002-eagle/done.json": (b'{"ok": false}', 0o644)})      # a later run, done meanwhile
    assert unpack_fetched(archive, tmp_path, ["001-baseline", "002-eagle", "003-baseline"]) == ["001-baseline",
                                                                                              "002-eagle"]
    run_dir = tmp_path / "001-baseline"
    assert (run_dir / "done.json").read_text() == '{"ok": true}'
    assert (tmp_path / "002-eagle" / "done.json").read_text() == '{"ok": false}'
    assert (run_dir / "server.env").stat().st_mode & 0o777 == 0o600      # the env file stays owner-only
    assert (run_dir / "server.env").stat().st_uid == os.getuid()         # as tar --no-same-owner
    assert not archive.exists()


@pytest.mark.parametrize("members,link", [({"../outside.txt": (b"x", 0o644)}, None),
                                          ({"/tmp/absolute.txt": (b"x", 0o644)}, None),
                                          ({"001-baseline/../002-other/x": (b"x", 0o644)}, None),
                                          ({"009-not-asked/done.json": (b"{}", 0o644)}, None),
                                          ({"001-baseline/done.json": (b"{}", 0o644)}, "/etc/passwd")])
def test_unpack_fetched_refuses_members_outside_the_run_dirs_or_not_plain(
        tmp_path: Path, members: dict[str, tuple[bytes, int]], link: str | None) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    _archive(runs / "001-baseline.tar", members, link)
    with pytest.raises(UnpackError, match="refusing member"):
        unpack_fetched(runs / "001-baseline.tar", runs, ["001-baseline", "002-eagle"])
    assert list(runs.iterdir()) == [] and not (tmp_path / "outside.txt").exists()


def test_the_ansible_child_imports_the_drivers_specab_without_an_install(tmp_path):
    """The roles' filter and the playbooks' lookup plugins import specab inside ansible-playbook. A controller that
    runs driver.py from a checkout without installing it (the device scripts do) has specab only through the
    child's PYTHONPATH: a Python without site-packages (-S) and outside the checkout finds the driver's own."""
    import subprocess
    import sys

    import specab
    from specab.driver.playbook import PlaybookRunner

    env = PlaybookRunner(tmp_path, tmp_path / "inv.yml", tmp_path / "private").child_env()
    out = subprocess.run([sys.executable, "-S", "-c", "import specab.vocab.contract, specab; print(specab.__file__)"],
                         env={"PATH": env["PATH"], "PYTHONPATH": env["PYTHONPATH"]}, cwd=tmp_path,
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == specab.__file__
