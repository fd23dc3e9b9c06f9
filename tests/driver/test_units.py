"""Runner event mapping, secret scrubbing, progress display, export, run directory checks."""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from specab.driver.cli import main
from specab.driver.options import ExperimentError
from specab.driver.record import check_writable
from specab.driver.progress import Progress
from specab.driver.playbook import failure_message, phase_of, scrub_tree
from tests.driver.test_store import _store


@pytest.mark.parametrize("task, phase", [
    ("Stop | Stop any server of ours left on the node", "stopping"),
    ("GPUs free | Wait until the GPUs are free before starting", "waiting for GPUs"),
    ("Start | Launch detached in its own session, arm x", "starting"),
    ("Ready | Loading weights and capturing graphs until the server answers", "loading"),
    ("Env | Compare every engine process's environment", "verifying env"),
    ("Bench | Run the benchmark client", "benchmarking"),
    ("Collect | Fetch the run's files", "collecting"),
    ("server_stop : Stop | Read the stop result", "stopping"),
    ("Validating arguments against arg spec 'main'", None),
    ("Run | Remember why the run failed", None),
    (None, None),
])
def test_task_names_map_to_phases(task, phase):
    assert phase_of(task) == phase


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
    """Issue 19: the live progress says what the experiment has cost so far and what the rest will cost at the
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


def test_run_directory_must_be_writable(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ExperimentError, match="not writable"):
        check_writable(f / "runs")
    with pytest.raises(ExperimentError, match="MB free"):
        check_writable(tmp_path / "ok", min_free_mb=10 ** 12)
    check_writable(tmp_path / "ok")


def test_unwritable_runs_dir_refused_before_any_run(tmp_path, experiment_file, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    assert main(["-e", str(experiment_file), "--runs-dir", str(f / "runs")], out=io.StringIO()) == 2
    assert "not writable" in capsys.readouterr().err


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


# --------------------------------------------------------------------------- issue 20, item 5: what the user sees

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
                 "failure_reason": "port taken"} for i, a in ((1, "baseline"), (2, "eagle3"))]
        return [r for r in rows if status is None or r["status"] == status]

    def requests(self):
        return []

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


def test_conclude_appends_the_experiment_to_its_nodes_history(tmp_path, monkeypatch):
    import io as _io

    from specab.analysis import history
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
        assert history.prior(tmp_path / "runs", host, "fp-of-test").between_df == 3
