"""`driver.py plan --target-ci`: the design by cost and today's design with expected GPU-minutes, before any run."""
from __future__ import annotations

import io
import re

from specab.driver import cli


def test_plan_with_target_ci_prints_both_designs_with_a_range():
    out = io.StringIO()
    assert cli.main(["plan", "--target-ci", "2%"], out=out) == 0
    text = out.getvalue()
    assert "design by cost for --target-ci 2.0%" in text and "simulator profile default" in text
    ranges = re.findall(r"expected ([\d.]+) GPU-minutes \(range ([\d.]+)-([\d.]+)\)", text)
    assert len(ranges) == 2                     # the design by cost, and what `run --target-ci` does now
    for est, lo, hi in ranges:
        assert float(lo) <= float(est) <= float(hi)
    assert "today's sequential design" in text


def test_plan_without_target_ci_prints_no_cost_design():
    out = io.StringIO()
    assert cli.main(["plan"], out=out) == 0
    assert "design by cost" not in out.getvalue()


def test_plan_takes_the_noise_from_this_nodes_history_of_the_same_fingerprint(tmp_path):
    import math

    import numpy as np

    from specab.analysis import history
    from specab.analysis.model import Arm, Experiment, Request, Run
    from specab.config.fingerprint import fingerprint, fingerprint_doc
    from specab.driver.options import Options, prepare

    prepared = prepare(Options())
    host = prepared.inventory.hosts[0].name
    fp = fingerprint(fingerprint_doc(prepared.experiment, prepared.arms))
    base, spec = prepared.arms[0].name, prepared.arms[1].name
    rng = np.random.default_rng(1)
    runs = []
    for b in range(1, 11):                      # an earlier experiment: instances 3 % apart, requests 0.5 %
        for arm, mu in ((base, 80.0), (spec, 100.0)):
            off = rng.normal(0, 0.03)
            runs.append(Run(run_id=f"{b}-{arm}", arm=arm, block=b, host=host, requests=[
                Request(i=k, decode_tok_s=float(mu * math.exp(off + rng.normal(0, 0.005)))) for k in range(8)]))
    history.record(tmp_path, Experiment(id="earlier", arms=[Arm(base), Arm(spec, baseline=base)], runs=runs), fp)

    out = io.StringIO()
    assert cli.main(["plan", "--target-ci", "2%", "--runs-dir", str(tmp_path)], out=out) == 0
    text = out.getvalue()
    assert f"noise (history of {host}: 1 earlier experiment(s) with fingerprint {fp})" in text
    sd = float(re.search(r"between instances sd ([\d.]+)%", text).group(1))
    assert 1.5 < sd < 5.0                       # the history's instances, not the profile's
    # the history of another experiment (another fingerprint) is not this one's prior
    out = io.StringIO()
    history.path_for(tmp_path, host).write_text(history.path_for(tmp_path, host).read_text().replace(fp, "0" * 16))
    assert cli.main(["plan", "--target-ci", "2%", "--runs-dir", str(tmp_path)], out=out) == 0
    assert "noise (simulator profile" in out.getvalue() and "history of" not in out.getvalue()
