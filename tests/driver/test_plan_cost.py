"""`driver.py plan --target-ci`: the design by cost and the sequential design with expected GPU-minutes, before any run."""
from __future__ import annotations

import io
import re

from specab.config.yamlfile import REPO_ROOT
from tests.stores import copy_store
from specab.driver import cli


def test_plan_with_target_ci_prints_what_run_will_do_and_the_other_design_with_a_range():
    out = io.StringIO()
    assert cli.main(["plan", "--target-ci", "2%", "--max-repeats", "10"], out=out) == 0
    text = "".join(line for line in out.getvalue().splitlines(keepends=True) if not line.startswith("notice: "))
    assert text.startswith("what `driver.py run --target-ci 2%` will do:")
    assert "design by cost for --target-ci 2.0%" in text and "simulator profile default" in text
    assert "within --max-repeats 10" in text
    ranges = re.findall(r"expected ([\d.]+) GPU-minutes \(range ([\d.]+)-([\d.]+)\)", text)
    assert len(ranges) == 2                     # the design by cost (run's default), and the sequential one for comparison
    for est, lo, hi in ranges:
        assert float(lo) <= float(est) <= float(hi)
    assert text.index("design by cost") < text.index("for comparison:") < text.index("the sequential design")
    # the first block's requests per run: what `run` starts with (the same function decides it)
    first = int(re.search(r"the first block with (\d+) measured requests per run", text).group(1))
    assert first >= 1
    out = io.StringIO()
    assert cli.main(["plan", "--target-ci", "2%", "--max-repeats", "10", "--design", "sequential"], out=out) == 0
    text = "".join(line for line in out.getvalue().splitlines(keepends=True) if not line.startswith("notice: "))
    assert text.startswith("what `driver.py run --target-ci 2% --design sequential` will do:\n"
                           "  the sequential design")


ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\d+|\?)\s+(\d{3}-\S+)\s+(.+)$")


def _table(text: str) -> list[tuple[int, int, str, str, str]]:
    """The plan's run table: (seq, block, requests per run, run_id, when)."""
    return [(int(m[1]), int(m[2]), m[3], m[4], m[5]) for m in map(ROW.match, text.splitlines()) if m]


def test_plan_with_target_ci_prints_the_runs_the_described_design_runs(tmp_path):
    """By cost `run` starts with ONE block at the design's requests per run and adds the others one at a time: the
    table shows that block as `now`, with the requests the description names, then the blocks the design's plan
    expects (its restarts per arm), and the headline says the same. The `now` runs are what `run` plans
    (session.first_plan, given a store)."""
    from specab.driver import session
    from specab.driver.options import Options, prepare
    from specab.results import store as st

    out = io.StringIO()
    assert cli.main(["plan", "--target-ci", "2%", "--max-repeats", "6", "--runs-dir", str(tmp_path)], out=out) == 0
    text = out.getvalue()
    first = re.search(r"the first block with (\d+) measured requests per run", text).group(1)
    restarts = int(re.search(r"plan now: (\d+) restarts per arm", text).group(1))
    rows = _table(text)
    now = [r for r in rows if r[4] == "now"]
    assert [r[1] for r in now] == [1, 1] and {r[2] for r in now} == {first}
    assert len(rows) == 2 * restarts and {r[1] for r in rows} == set(range(1, restarts + 1))
    assert {r[4] for r in rows[2:]} == {"expected (the design by cost decides after each block)"}
    assert (f"2 arms: block 1 now (2 runs of {first} measured requests), the design by cost expects {restarts} "
            f"blocks = {2 * restarts} runs, at most --max-repeats 6 blocks = 12 runs, order interleaved, seed 1") in text
    # what `run` starts with, from the same inputs
    opts = Options(target_ci=0.02, max_repeats=6, runs_dir=str(tmp_path))
    prepared = prepare(opts)
    s = st.Store.create(tmp_path / "exp" / st.FILENAME)
    try:
        planned, d = session.first_plan(prepared, opts, s, "fp-of-test")
    finally:
        s.close()
    assert d is not None and d.blocks == restarts
    assert [(r.seq, r.block, str(r.num_requests), r.run_id) for r in planned] == [r[:4] for r in now]


def test_plan_sequential_shows_the_repeats_now_and_the_blocks_it_expects_to_add():
    out = io.StringIO()
    assert cli.main(["plan", "--target-ci", "5%", "--design", "sequential", "--repeats", "2", "--max-repeats", "6"],
                    out=out) == 0
    text = out.getvalue()
    restarts = int(re.search(r"the sequential design .*?, (\d+) restarts per arm", text).group(1))
    rows = _table(text)
    assert [r[1] for r in rows if r[4] == "now"] == [1, 1, 2, 2] and {r[2] for r in rows} == {"6"}
    assert len(rows) == 2 * max(restarts, 2)
    assert f"2 arms: blocks 1-2 now (4 runs of 6 measured requests), the sequential design expects {restarts}" in text
    # --repeats above what the target needs: the sequential design runs them all, and says so
    out = io.StringIO()
    assert cli.main(["plan", "--target-ci", "20%", "--design", "sequential", "--repeats", "5", "--max-repeats", "6"],
                    out=out) == 0
    assert "5 restarts per arm" in out.getvalue() and len(_table(out.getvalue())) == 10


def test_plan_json_with_target_ci_lists_the_same_runs_as_the_table():
    import json
    text, js = io.StringIO(), io.StringIO()
    assert cli.main(["plan", "--target-ci", "2%", "--max-repeats", "6"], out=text) == 0
    assert cli.main(["plan", "--target-ci", "2%", "--max-repeats", "6", "--format", "json"], out=js) == 0
    doc = json.loads(js.getvalue())
    assert [(r["seq"], r["block"], str(r["num_requests"]), r["run_id"], r["when"]) for r in doc["plan"]] \
        == _table(text.getvalue())
    assert doc["design"][0] == "what `driver.py run --target-ci 2%` will do:"


def test_plan_without_target_ci_prints_no_cost_design():
    out = io.StringIO()
    assert cli.main(["plan"], out=out) == 0
    assert "design by cost" not in out.getvalue()


def _earlier_runs(seed: int, host: str, blocks: int, arms: list[tuple[str, float, float]], request_sd: float,
                  request_fields: dict | None = None, **run_fields):
    """An earlier experiment's runs, for a node's history: per block and arm (name, tok/s, instance sd) one run of
    8 requests whose log tok/s carries the instance's offset and each request's own noise (sd ``request_sd``)."""
    import math

    import numpy as np

    from specab.analysis.evidence.model import Request, Run

    rng = np.random.default_rng(seed)
    runs = []
    for b in range(1, blocks + 1):
        for arm, mu, instance_sd in arms:
            off = rng.normal(0, instance_sd)
            runs.append(Run(run_id=f"{b}-{arm}", arm=arm, block=b, host=host, **run_fields, requests=[
                Request(i=k, decode_tok_s=float(mu * math.exp(off + rng.normal(0, request_sd))),
                        **(request_fields or {})) for k in range(8)]))
    return runs


def test_plan_takes_the_noise_from_this_nodes_history_of_the_same_fingerprint(tmp_path):
    from specab.analysis.cost import history
    from specab.analysis.evidence.model import Arm, Experiment
    from specab.config.fingerprint import fingerprint, fingerprint_doc
    from specab.driver.options import Options, prepare

    prepared = prepare(Options())
    host = prepared.inventory.hosts[0].name
    fp = fingerprint(fingerprint_doc(prepared.experiment, prepared.arms))
    base, spec = prepared.arms[0].name, prepared.arms[1].name
    # an earlier experiment: instances 3 % apart, requests 0.5 %
    runs = _earlier_runs(1, host, 10, [(base, 80.0, 0.03), (spec, 100.0, 0.03)], 0.005)
    history.record(tmp_path, Experiment(id="earlier", arms=[Arm(base), Arm(spec, baseline=base)], runs=runs), fp)

    out = io.StringIO()
    assert cli.main(["plan", "--target-ci", "2%", "--runs-dir", str(tmp_path)], out=out) == 0
    text = out.getvalue()
    assert f"noise (history of {host}: 1 earlier experiment(s) with fingerprint {fp} (its between-instance " \
           f"variance pooled with the default's))" in text
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
    from specab.analysis.cost import history
    from specab.analysis.evidence.model import Arm, Experiment
    from specab.config.fingerprint import fingerprint, fingerprint_doc
    from specab.driver.options import Options, prepare

    inv = REPO_ROOT / "inventory" / "example-real.yml"
    args = ["plan", "--target-ci", "2%", "--max-repeats", "12", "-i", str(inv), "--runs-dir", str(tmp_path)]
    out = io.StringIO()
    assert cli.main(args, out=out) == 0
    assert "no cost estimate for gpu-node-1" in out.getvalue() and "GPU-minutes" not in out.getvalue()
    rows = _table(out.getvalue())            # block 1 at the experiment's requests, the rest only if asked for
    assert [(r[1], r[2], r[4]) for r in rows[:2]] == [(1, "6", "now")] * 2 and len(rows) == 24
    assert {(r[2], r[4]) for r in rows[2:]} == {("?", "if the design by cost asks for it after the block before")}
    assert "no estimate of the blocks the design by cost adds, at most --max-repeats 12 blocks = 24 runs" \
        in out.getvalue()
    prepared = prepare(Options(inventory_file=str(inv)))
    fp = fingerprint(fingerprint_doc(prepared.experiment, prepared.arms))
    base, spec = prepared.arms[0].name, prepared.arms[1].name
    # 8 blocks: load 300 s, 8 requests of 6 s, 8 GPUs; instances 1 %, requests 4 %
    runs = _earlier_runs(3, "gpu-node-1", 8, [(base, 80.0, 0.01), (spec, 100.0, 0.01)], 0.04, {"e2e_s": 6.0},
                         server_args={"tp_size": 8}, gpu_seconds=8 * (300.0 + 8 * 6.0))
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
    from specab.analysis.cost import history
    from specab.analysis.evidence.model import Arm, Experiment
    from specab.config.fingerprint import fingerprint, fingerprint_doc
    from specab.driver.options import Options, prepare

    sweep = prepare(Options(matrix=["steps=1,2"]))
    plain = prepare(Options())
    host = sweep.inventory.hosts[0].name
    doc = fingerprint_doc(sweep.experiment, sweep.arms)
    assert fingerprint(doc) != fingerprint(fingerprint_doc(plain.experiment, plain.arms))
    base, s1, s2 = (a.name for a in sweep.arms)
    assert s2.startswith("eagle3-s2") and s2 != plain.arms[1].name
    # s1's instances 20 % apart, s2's 3 %: the prior must be s2's alone
    runs = _earlier_runs(2, host, 8, [(base, 80.0, 0.0), (s1, 90.0, 0.2), (s2, 100.0, 0.03)], 0.005,
                         gpu_seconds=60.0)
    earlier = Experiment(id="sweep-1", arms=[Arm(base), Arm(s1, baseline=base), Arm(s2, baseline=base)], runs=runs)
    history.record(tmp_path, earlier, fingerprint(doc), doc)

    out = io.StringIO()
    assert cli.main(["plan", "--target-ci", "2%", "--runs-dir", str(tmp_path)], out=out) == 0
    text = out.getvalue()
    assert f"noise (history of {host}: the same arm and baseline in {s2} of sweep-1 (its between-instance " \
           f"variance pooled with the default's))" in text
    sd = float(re.search(r"between instances sd ([\d.]+)%", text).group(1))
    assert 1.0 < sd < 6.0                       # s2's 3 % instances, not s1's 20 %
    # without the pair fingerprints (a line written without the document) nothing matches
    history.path_for(tmp_path, host).unlink()
    history.record(tmp_path, earlier, fingerprint(doc))
    out = io.StringIO()
    assert cli.main(["plan", "--target-ci", "2%", "--runs-dir", str(tmp_path)], out=out) == 0
    assert "history of" not in out.getvalue()


def test_an_h200_store_written_before_ignore_eos_existed_is_the_prior_of_the_same_experiment_today(tmp_path):
    """The H200 sweep's store (written before bench.ignore_eos) recorded into a node history: `plan --target-ci`
    of experiments/known-truth-h200.yml (ignore_eos true by default: the same forced lengths) takes its steps-3
    pair as the prior, as scripts/known_truth_gpu.sh's SPECAB_KT_HISTORY does on the device."""
    from specab.analysis.evidence import model
    from specab.analysis.cost import history
    from specab.results.store import Store

    store = copy_store(REPO_ROOT / "tests/fixtures/known-truth/h200/known-truth-h200-20261204-055428",
                       tmp_path / "sweep")
    fp, doc = Store.open(store).fingerprint()
    assert "ignore_eos" not in doc["bench"]
    history.record(tmp_path / "runs", model.load_store(store, read_logs=False), fp, doc)
    out = io.StringIO()
    assert cli.main(["plan", "-e", str(REPO_ROOT / "experiments/known-truth-h200.yml"), "-i",
                     str(REPO_ROOT / "inventory/gpu-real-sglang.yml"), "--target-ci", "2%", "--runs-dir", str(tmp_path / "runs")],
                    out=out) == 0
    assert "noise (history of gpu0: the same arm and baseline in eagle3-s3-k1-d4 of known-truth-h200-" \
           in out.getvalue()


def test_the_design_by_cost_measures_at_least_the_largest_load_per_run(tmp_path):
    """A run that measures fewer requests than it keeps in flight never reaches its load: under a concurrency axis the
    design's first block (and every later one) measures at least the largest load's requests per run. On the
    simulator's default noise the design alone picks 5 per run here."""
    exp = tmp_path / "c.yml"
    exp.write_text((REPO_ROOT / "experiments" / "default.yml").read_text()
                   .replace("num_requests: 6", "num_requests: 24"))
    for matrix, floor in (("concurrency=1,16", 16), ("concurrency=1,2", 2)):
        out = io.StringIO()
        assert cli.main(["plan", "-e", str(exp), "--target-ci", "2%", "--max-repeats", "10",
                         "--matrix", matrix], out=out) == 0
        first = int(re.search(r"the first block with (\d+) measured requests per run", out.getvalue()).group(1))
        assert first >= floor
        if floor == 2:
            assert first < 16, "the floor follows the load: without a large one the design keeps its own choice"
