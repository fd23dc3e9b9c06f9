"""Reading a store in the states a user meets it: an experiment still running, a store on read-only media, a store
another program holds."""
from __future__ import annotations

import io
from pathlib import Path

from specab.config.plan import make_plan
from specab.driver import cli
from specab.results import store as st


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
