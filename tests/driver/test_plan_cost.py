"""`driver.py plan --target-ci`: the design by cost and today's design with expected GPU-minutes, before any run."""
from __future__ import annotations

import io
import re

from specab.config.yamlfile import REPO_ROOT
from specab.driver import cli


def test_plan_with_target_ci_prints_what_run_will_do_and_the_other_design_with_a_range():
    out = io.StringIO()
    assert cli.main(["plan", "--target-ci", "2%", "--max-repeats", "10"], out=out) == 0
    text = "".join(line for line in out.getvalue().splitlines(keepends=True) if not line.startswith("notice: "))
    assert text.startswith("what `driver.py run --target-ci 2%` will do:")
    assert "design by cost for --target-ci 2.0%" in text and "simulator profile default" in text
    assert "within --max-repeats 10" in text
    ranges = re.findall(r"expected ([\d.]+) GPU-minutes \(range ([\d.]+)-([\d.]+)\)", text)
    assert len(ranges) == 2                     # the design by cost (run's default), and today's for comparison
    for est, lo, hi in ranges:
        assert float(lo) <= float(est) <= float(hi)
    assert text.index("design by cost") < text.index("for comparison:") < text.index("today's sequential design")
    # the first block's requests per run: what `run` starts with (the same function decides it)
    first = int(re.search(r"the first block with (\d+) measured requests per run", text).group(1))
    assert first >= 1
    out = io.StringIO()
    assert cli.main(["plan", "--target-ci", "2%", "--max-repeats", "10", "--design", "sequential"], out=out) == 0
    text = "".join(line for line in out.getvalue().splitlines(keepends=True) if not line.startswith("notice: "))
    assert text.startswith("what `driver.py run --target-ci 2% --design sequential` will do:\n"
                           "  today's sequential design")


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


def test_plan_on_a_real_node_estimates_from_the_history_it_measured_and_narrows_the_range(tmp_path):
    """A real node has no profile: with no history `plan` says so; once an experiment of the same fingerprint
    ended there, its measured restart and request seconds and its noise give an estimate, whose range has no
    dead-time guess in it and the history's degrees of freedom."""
    import math

    import numpy as np

    from specab.analysis import history
    from specab.analysis.model import Arm, Experiment, Request, Run
    from specab.config.fingerprint import fingerprint, fingerprint_doc
    from specab.driver.options import Options, prepare

    inv = REPO_ROOT / "inventory" / "example-real.yml"
    args = ["plan", "--target-ci", "2%", "--max-repeats", "12", "-i", str(inv), "--runs-dir", str(tmp_path)]
    out = io.StringIO()
    assert cli.main(args, out=out) == 0
    assert "no cost estimate for gpu-node-1" in out.getvalue() and "GPU-minutes" not in out.getvalue()
    prepared = prepare(Options(inventory_file=str(inv)))
    fp = fingerprint(fingerprint_doc(prepared.experiment, prepared.arms))
    base, spec = prepared.arms[0].name, prepared.arms[1].name
    rng = np.random.default_rng(3)
    runs = []
    for b in range(1, 9):          # 8 blocks: load 300 s, 8 requests of 6 s, 8 GPUs; instances 1 %, requests 4 %
        for arm, mu in ((base, 80.0), (spec, 100.0)):
            off = rng.normal(0, 0.01)
            reqs = [Request(i=k, decode_tok_s=float(mu * math.exp(off + rng.normal(0, 0.04))), e2e_s=6.0)
                    for k in range(8)]
            runs.append(Run(run_id=f"{b}-{arm}", arm=arm, block=b, host="gpu-node-1", requests=reqs,
                            server_args={"tp_size": 8}, gpu_seconds=8 * (300.0 + 8 * 6.0)))
    history.record(tmp_path, Experiment(id="earlier", arms=[Arm(base), Arm(spec, baseline=base)], runs=runs), fp)
    out = io.StringIO()
    assert cli.main(args, out=out) == 0
    text = out.getvalue()
    assert "run cost (history of gpu-node-1: 1 earlier experiment(s), 16 runs measured): load and restart " \
           "300.0 s, 6.00 s per request" in text
    est, lo, hi = map(float, re.search(r"expected ([\d.]+) GPU-minutes \(range ([\d.]+)-([\d.]+)\)", text).groups())
    assert lo <= est <= hi and hi / lo < 3         # the profile's prior of one degree of freedom spans >10x


def test_a_matrix_sweeps_history_is_the_prior_of_a_later_run_of_one_of_its_arms(tmp_path):
    """`--matrix steps=1,2` names its arms eagle3-s1-…, eagle3-s2-… and has another fingerprint than the plain
    experiment, whose arm eagle3-s2 is the same server args: the history matches the pair by content, so the
    plain experiment's `plan --target-ci` takes the sweep's eagle3-s2 noise and run cost, and not eagle3-s1's."""
    import math

    import numpy as np

    from specab.analysis import history
    from specab.analysis.model import Arm, Experiment, Request, Run
    from specab.config.fingerprint import fingerprint, fingerprint_doc
    from specab.driver.options import Options, prepare

    sweep = prepare(Options(matrix=["steps=1,2"]))
    plain = prepare(Options())
    host = sweep.inventory.hosts[0].name
    doc = fingerprint_doc(sweep.experiment, sweep.arms)
    assert fingerprint(doc) != fingerprint(fingerprint_doc(plain.experiment, plain.arms))
    base, s1, s2 = (a.name for a in sweep.arms)
    assert s2.startswith("eagle3-s2") and s2 != plain.arms[1].name
    rng = np.random.default_rng(2)
    runs = []
    for b in range(1, 9):           # s1's instances 20 % apart, s2's 3 %: the prior must be s2's alone
        for arm, mu, sd in ((base, 80.0, 0.0), (s1, 90.0, 0.2), (s2, 100.0, 0.03)):
            off = rng.normal(0, sd)
            runs.append(Run(run_id=f"{b}-{arm}", arm=arm, block=b, host=host, gpu_seconds=60.0, requests=[
                Request(i=k, decode_tok_s=float(mu * math.exp(off + rng.normal(0, 0.005)))) for k in range(8)]))
    earlier = Experiment(id="sweep-1", arms=[Arm(base), Arm(s1, baseline=base), Arm(s2, baseline=base)], runs=runs)
    history.record(tmp_path, earlier, fingerprint(doc), doc)

    out = io.StringIO()
    assert cli.main(["plan", "--target-ci", "2%", "--runs-dir", str(tmp_path)], out=out) == 0
    text = out.getvalue()
    assert f"noise (history of {host}: the same arm and baseline in {s2} of sweep-1)" in text
    sd = float(re.search(r"between instances sd ([\d.]+)%", text).group(1))
    assert 1.0 < sd < 6.0                       # s2's 3 % instances, not s1's 20 %
    # without the pair fingerprints (a line written without the document) nothing matches
    history.path_for(tmp_path, host).unlink()
    history.record(tmp_path, earlier, fingerprint(doc))
    out = io.StringIO()
    assert cli.main(["plan", "--target-ci", "2%", "--runs-dir", str(tmp_path)], out=out) == 0
    assert "history of" not in out.getvalue()
