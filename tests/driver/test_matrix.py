"""Matrix grammar and SGLang's speculative rules: refused before anything runs, with the key or rule named."""
from __future__ import annotations

import pytest

from specab.config.spec import load_experiment
from specab.config.matrix import MatrixError, build_arms, check_spec, parse_matrix


def arms_of(exp_file, *specs, skip=False):
    return build_arms(load_experiment(exp_file), parse_matrix(list(specs)), skip_invalid=skip)


def test_steps_matrix_makes_one_eagle3_arm_per_value_plus_baseline(experiment_file):
    s = arms_of(experiment_file, "steps=1,2,3")
    assert [a.name for a in s.arms] == ["baseline", "eagle3-s1-k1-d2", "eagle3-s2-k1-d3", "eagle3-s3-k1-d4"]
    spec = s.arms[1]
    assert spec.server_args["speculative_algorithm"] == "EAGLE3"
    assert spec.server_args["speculative_draft_model_path"] == "/models/draft"
    assert spec.server_args["model_path"] == "/models/target"
    assert spec.baseline == "baseline" and not spec.is_baseline
    base = s.arms[0]
    assert base.is_baseline and not any(k.startswith("speculative_") for k in base.server_args)
    # topk=1 => draft = steps+1, adjusted with a notice naming the rule
    assert any("adjusted 3 -> 2" in n and "topk=1" in n for n in s.notices)


def test_ranges_and_products(experiment_file):
    s = arms_of(experiment_file, "steps=1..3", "topk=1,2")
    names = [a.name for a in s.arms]
    assert len(names) == 1 + 6
    assert "eagle3-s3-k2-d3" in names and "eagle3-s1-k2-d3" in names


def test_env_and_engine_args_are_conditions_with_their_own_baseline(experiment_file):
    s = arms_of(experiment_file, "env.NCCL_PROTO=LL,Simple")
    by = {a.name: a for a in s.arms}
    assert set(by) == {"baseline-NCCL_PROTO-LL", "baseline-NCCL_PROTO-Simple",
                       "eagle3-s2-NCCL_PROTO-LL", "eagle3-s2-NCCL_PROTO-Simple"}
    assert by["eagle3-s2-NCCL_PROTO-Simple"].env["NCCL_PROTO"] == "Simple"
    assert by["eagle3-s2-NCCL_PROTO-Simple"].baseline == "baseline-NCCL_PROTO-Simple"
    s = arms_of(experiment_file, "mem_fraction_static=0.85", "steps=2")
    by = {a.name: a for a in s.arms}
    assert by["eagle3-s2-k1-d3-mem_fraction_static-0.85"].server_args["mem_fraction_static"] == 0.85
    assert by["baseline-mem_fraction_static-0.85"].server_args["mem_fraction_static"] == 0.85


def test_arm_names_fit_the_roles_pattern(experiment_file):
    import re
    s = arms_of(experiment_file, "steps=1,2", "env.NCCL_SOCKET_IFNAME=eth0/with=odd chars,lo",
                "speculative_draft_model_path=/very/long/path/to/a/draft/model/directory/that/goes/on")
    for a in s.arms:
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", a.name), a.name
        if not a.is_baseline:
            assert a.baseline in {b.name for b in s.arms if b.is_baseline}


def test_no_matrix_uses_the_experiment_arms(experiment_file):
    s = arms_of(experiment_file)
    assert [a.name for a in s.arms] == ["baseline", "eagle3-s2"]


@pytest.mark.parametrize("specs, needle", [
    (["steps="], "steps=: no values"),
    (["steps=a"], "'a' is not an integer"),
    (["steps=1.."], "a range needs both ends"),
    (["bogus=1"], "unknown key 'bogus'"),
    (["mem_fraction_statc=0.8"], "Did you mean mem_fraction_static"),
    (["steps=1", "steps=2"], "duplicate key"),
    (["steps=1", "speculative_num_steps=2"], "duplicate key"),
    (["steps=0"], "positive integers"),
    (["steps=3..1"], "range is empty"),
    (["env.1BAD=x"], "not a valid environment variable name"),
    (["nokey"], "expected key=values"),
])
def test_malformed_matrix_refused_naming_the_key(experiment_file, specs, needle):
    with pytest.raises(MatrixError) as e:
        arms_of(experiment_file, *specs)
    assert needle in str(e.value)


def test_draft_tokens_above_steps_times_topk_plus_one_refused_with_rule(experiment_file):
    with pytest.raises(MatrixError) as e:
        arms_of(experiment_file, "steps=1", "topk=2", "draft_tokens=8")
    msg = str(e.value)
    assert "draft_tokens <= steps*topk+1" in msg and "8 > 1*2+1 = 3" in msg


def test_every_refused_combination_is_listed_and_skip_invalid_keeps_the_rest(experiment_file):
    with pytest.raises(MatrixError) as e:
        arms_of(experiment_file, "steps=1,3", "topk=2", "draft_tokens=4,8")
    msg = str(e.value)
    assert "steps=1, topk=2, draft_tokens=4" in msg and "steps=1, topk=2, draft_tokens=8" in msg
    assert "steps=3, topk=2, draft_tokens=8" in msg   # 8 > 7
    s = arms_of(experiment_file, "steps=1,3", "topk=2", "draft_tokens=4,8", skip=True)
    assert [a.name for a in s.arms] == ["baseline", "eagle3-s3-k2-d4"]


def test_missing_draft_model_path_refused(write):
    f = write("nodraft.yml", """\
        specab_experiment:
          name: t
          model_path: /m
          arms:
            - name: baseline
        """)
    with pytest.raises(MatrixError) as e:
        arms_of(f, "steps=2", "topk=1", "draft_tokens=3")
    assert "draft model path" in str(e.value)
    s = arms_of(f, "steps=2", "topk=1", "draft_tokens=3", "speculative_draft_model_path=/d")
    assert s.arms[1].server_args["speculative_draft_model_path"] == "/d"


def test_all_or_none_rule():
    _, _, refused = check_spec({"speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "/d",
                                "speculative_num_steps": 2}, "arm x")
    assert refused and "all of steps/topk/draft_tokens or none" in refused[0]
    _, notices, refused = check_spec({"speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "/d"},
                                     "arm x")
    assert not refused and "automatically" in notices[0]


def test_adjustment_collapsing_two_combinations_runs_once(experiment_file):
    s = arms_of(experiment_file, "steps=1", "topk=1", "draft_tokens=2,5")
    assert [a.name for a in s.arms] == ["baseline", "eagle3-s1-k1-d2"]
    assert any("identical" in n for n in s.notices)


def test_newline_in_value_refused(experiment_file):
    with pytest.raises(MatrixError):
        parse_matrix(["env.X=a\nb"])


def test_engine_axis_makes_every_arm_per_engine_build_each_with_its_own_baseline(experiment_file):
    """--matrix engine=...: the baseline too is made per build; an arm is compared with its build's."""
    s = arms_of(experiment_file, "engine=sglang-0.5.9,sglang-0.5.23", "steps=2")
    by = {a.name: a for a in s.arms}
    assert set(by) == {"baseline-sglang-0.5.9", "eagle3-s2-k1-d3-sglang-0.5.9",
                       "baseline-sglang-0.5.23", "eagle3-s2-k1-d3-sglang-0.5.23"}
    for build in ("sglang-0.5.9", "sglang-0.5.23"):
        base, spec = by[f"baseline-{build}"], by[f"eagle3-s2-k1-d3-{build}"]
        assert base.is_baseline and base.engine == build and base.matrix == {"engine": build}
        assert spec.baseline == base.name and spec.engine == build and not spec.is_baseline
        assert "engine" not in spec.server_args          # a build is not an engine argument
        assert spec.to_extravar()["engine"] == build and spec.to_json()["engine"] == build
    # identical arguments on two builds are two arms, not one "identical" arm
    assert not any("identical" in n for n in s.notices)


def test_engine_axis_combines_with_other_conditions(experiment_file):
    s = arms_of(experiment_file, "env.NCCL_PROTO=LL,Simple", "engine=a,b")
    names = {a.name for a in s.arms}
    assert "baseline-NCCL_PROTO-Simple-b" in names and "eagle3-s2-NCCL_PROTO-LL-a" in names and len(names) == 8


@pytest.mark.parametrize("spec", ["engine=sglang 0.5.9", "engine=-x", "engine=a/b"])
def test_engine_axis_refuses_a_value_that_is_no_build_name(spec):
    with pytest.raises(MatrixError, match="not an engine build name"):
        parse_matrix([spec])


def test_concurrency_is_a_bench_condition_of_every_arm_with_its_own_baseline(write):
    from specab.config.fingerprint import fingerprint_doc, pair_fingerprints
    from tests.driver.conftest import EXPERIMENT
    f = write("exp32.yml", EXPERIMENT.replace("num_requests: 3", "num_requests: 32"))
    exp = load_experiment(f)
    s = build_arms(exp, parse_matrix(["steps=1,2", "concurrency=1,8,32"]))
    by = {a.name: a for a in s.arms}
    assert list(by) == [f"{n}-c{c}" for c in (1, 8, 32) for n in ("baseline", "eagle3-s1-k1-d2", "eagle3-s2-k1-d3")]
    for c in (1, 8, 32):
        base = by[f"baseline-c{c}"]
        assert base.is_baseline and base.bench == {"concurrency": c} and base.matrix == {"concurrency": c}
        spec = by[f"eagle3-s2-k1-d3-c{c}"]
        assert spec.baseline == f"baseline-c{c}" and spec.bench == {"concurrency": c}
        assert spec.matrix == {"steps": 2, "concurrency": c}
        # what reaches the node: the arm's bench over the experiment's (enqueue.yml and run_arm.yml combine them)
        assert spec.to_extravar()["bench"] == {"concurrency": c} and "concurrency" not in spec.server_args
    # baselines at different loads launch the same server: not deduplicated as identical
    assert not any("identical" in n for n in s.notices)
    # each pair has its own fingerprint, and a load of the sweep is the same pair as an experiment run at that load
    doc = fingerprint_doc(exp, s.arms)
    fps = pair_fingerprints(doc, {a.name: a.baseline for a in s.arms})
    assert len(set(fps.values())) == 6
    at8 = load_experiment(write("exp8.yml", EXPERIMENT.replace("num_requests: 3", "num_requests: 32")
                                .replace("concurrency: 1", "concurrency: 8")))
    plain = build_arms(at8, parse_matrix(["steps=2"])).arms
    assert pair_fingerprints(fingerprint_doc(at8, plain), {a.name: a.baseline for a in plain}) == {
        "eagle3-s2-k1-d3": fps["eagle3-s2-k1-d3-c8"]}


def test_request_rate_is_a_bench_condition_under_the_cap_of_requests_in_flight(write):
    """`--matrix concurrency=16 request_rate=2,8`: arms end in `-c16-r2`, each with its own baseline, the rate reaching
    the node as a bench setting; a rate that is no positive number is refused with the closed loop named."""
    from specab.config.fingerprint import fingerprint_doc, pair_fingerprints
    from tests.driver.conftest import EXPERIMENT
    exp = load_experiment(write("exp16.yml", EXPERIMENT.replace("num_requests: 3", "num_requests: 32")))
    s = build_arms(exp, parse_matrix(["steps=2", "concurrency=16", "request_rate=2,0.5"]))
    by = {a.name: a for a in s.arms}
    assert set(by) == {f"{n}-c16-r{r}" for n in ("baseline", "eagle3-s2-k1-d3") for r in ("2", "0.5")}
    spec = by["eagle3-s2-k1-d3-c16-r0.5"]
    assert spec.baseline == "baseline-c16-r0.5" and spec.to_extravar()["bench"] == {"concurrency": 16,
                                                                                  "request_rate": 0.5}
    assert len(set(pair_fingerprints(fingerprint_doc(exp, s.arms), {a.name: a.baseline for a in s.arms}).values())) == 2
    for bad in ("request_rate=0", "request_rate=-1", "request_rate=fast"):
        with pytest.raises(MatrixError, match="not a rate of requests per second above 0.*closed loop"):
            parse_matrix([bad])


def test_a_standalone_arm_follows_sglangs_eagle_rules_as_the_simulator_does(experiment_file):
    """SGLang checks STANDALONE with its EAGLE-family rules: at topk 1 it runs draft_tokens = steps + 1. On an
    H200 (SGLang 0.5.17) a STANDALONE `--matrix steps=1,2,3` whose arms kept the file's draft_tokens 4 failed env
    verification at steps 1 and 2 ("expected 4, but the server runs with 2"); the matrix adjusts it now, the same
    value the simulator's copy of SGLang's rules arrives at."""
    from specab.sim.args import ServerArgs, apply_rules
    exp = load_experiment(experiment_file)
    template = next(a for a in exp.arms if (a.get("server_args") or {}).get("speculative_algorithm"))
    template["server_args"] = {**template["server_args"], "speculative_algorithm": "STANDALONE",
                               "speculative_num_steps": 3, "speculative_eagle_topk": 1,
                               "speculative_num_draft_tokens": 4}
    s = build_arms(exp, parse_matrix(["steps=1,2,3"]))
    spec = [a for a in s.arms if not a.is_baseline]
    assert [a.server_args["speculative_num_draft_tokens"] for a in spec] == [2, 3, 4]
    assert [a.name.rsplit("-", 3)[1:] for a in spec] == [["s1", "k1", "d2"], ["s2", "k1", "d3"], ["s3", "k1", "d4"]]
    for a in spec:
        sim, _ = apply_rules(ServerArgs(model_path="/m", speculative_algorithm="STANDALONE",
                                        speculative_draft_model_path="/d",
                                        speculative_num_steps=a.server_args["speculative_num_steps"],
                                        speculative_eagle_topk=1, speculative_num_draft_tokens=4),
                             architecture="LlamaForCausalLM", version="0.5.17")
        assert sim.speculative_num_draft_tokens == a.server_args["speculative_num_draft_tokens"]
