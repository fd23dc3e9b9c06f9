"""Reading a store in the states a user meets it: an experiment still running, a store on read-only media, a store
another program holds."""
from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from specab.config.plan import make_plan
from specab.driver import cli
from specab.results import store as st
from tests.stores import copy_store

REPO = Path(__file__).resolve().parents[2]
H200 = REPO / "tests/fixtures/known-truth/h200/known-truth-h200-20261205-121517"


def running_store(exp_dir: Path) -> st.Store:
    """The store of an experiment whose first run is in progress (as the driver leaves it mid-run)."""
    s = st.Store.create(exp_dir / st.FILENAME)
    s.write_experiment(id="t-1", name="t", seed=1, repeats=1, order_mode="interleaved", experiment_file="/e.yml",
                       inventory_file="/i.yml", config={"name": "t"}, matrix=[], argv=[], hosts=["sim0"],
                       specab_version="0", git_sha=None)
    s.write_arms([{"name": "baseline", "is_baseline": True, "baseline": "baseline", "server_args": {"tp_size": 8},
                   "env": {}, "matrix": {}},
                  {"name": "eagle3", "is_baseline": False, "baseline": "baseline",
                   "server_args": {"speculative_algorithm": "EAGLE3", "speculative_num_steps": 2}, "env": {},
                   "matrix": {}}])
    s.write_plan([r.to_json() for r in make_plan(["baseline", "eagle3"], 1, seed=1)])
    first = s.plan()[0]
    s.start_run(seq=1, run_id=first["run_id"], arm=first["arm"], block=1, host="sim0", run_dir=str(exp_dir / "x"),
                runner_ident="a")
    return s


def test_report_on_a_running_experiment_says_it_is_running(tmp_path: Path) -> None:
    """It said the store was "written before specab recorded what runs cost"."""
    exp_dir = tmp_path / "t-1"
    running_store(exp_dir).close()
    out = io.StringIO()
    assert cli.main(["report", str(exp_dir)], out=out) == 0
    text = out.getvalue()
    assert text.startswith("The experiment is still running (its store's status): this report covers the 0 run(s) "
                           "finished so far."), text
    md = (exp_dir / "report.md").read_text()
    assert "Verdict cost: not known yet: the experiment is still running and none of its runs has finished" in md
    assert "written before" not in md


@pytest.fixture
def read_only(tmp_path: Path):
    """A directory made read-only as media are (a read-only bind mount: root ignores file modes)."""
    ro = tmp_path / "ro"
    ro.mkdir()
    yield ro
    subprocess.run(["umount", str(ro)], capture_output=True, check=False)


def make_read_only(ro: Path) -> None:
    if os.geteuid() != 0 or subprocess.run(["mount", "--bind", "-o", "ro", str(ro), str(ro)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot make a read-only directory as root here")
    subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], check=False)
    assert not os.access(ro, os.W_OK)


def test_a_finished_store_on_read_only_media_is_exported_and_reported(read_only: Path, tmp_path: Path) -> None:
    """It was "not a specab results store": a WAL database opened where SQLite cannot write its index. Now export
    and report read it as it is, also one whose last writes are still in its WAL (copied while the driver ran)."""
    clean = copy_store(H200, read_only / H200.name)
    live_src = copy_store(H200, tmp_path / "live")
    writer = st.Store.open(live_src)
    writer.set_experiment_status("stopped")         # written last: still in the WAL, not in the main file
    assert Path(f"{live_src / st.FILENAME}-wal").stat().st_size > 0
    (read_only / "live").mkdir()
    for name in (st.FILENAME, st.FILENAME + "-wal"):
        shutil.copy(live_src / name, read_only / "live" / name)
    writer.close()
    make_read_only(read_only)
    for exp_dir, status in ((clean, "finished"), (read_only / "live", "stopped")):
        out = io.StringIO()
        assert cli.main(["export", str(exp_dir), "--format", "json"], out=out) == 0
        data = json.loads(out.getvalue())
        assert data["experiment"]["id"] == "known-truth-h200-20261205-121517"
        assert len(data["runs"]) == 4 and data["experiment"]["status"] == status
    out = io.StringIO()
    assert cli.main(["report", str(clean)], out=out) == 2
    assert f"{clean} cannot be written (read-only media?): the report reads the store there as it is; give --out " \
           f"DIR for the report files." in out.getvalue()
    out = io.StringIO()
    assert cli.main(["report", str(clean), "--out", str(tmp_path / "report")], out=out) == 0, out.getvalue()
    assert (tmp_path / "report" / "report.md").is_file() and "markdown:" in out.getvalue()
