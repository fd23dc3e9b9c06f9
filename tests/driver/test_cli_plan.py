"""`driver.py plan` prints the plan and the rendered files, the same for the same seed, and touches nothing."""
from __future__ import annotations

import io
import os
import re
import subprocess
from pathlib import Path

import pytest

from specab.driver.cli import main

INVENTORY = """\
all:
  children:
    gpu_nodes:
      hosts:
        simA:
          ansible_connection: local
          specab_python: "{{ ansible_playbook_python }}"
          specab_engine_cmd: ["{{ ansible_playbook_python }}", "-m", "specab.sim.launch_server"]
          specab_smi_cmd: ["{{ ansible_playbook_python }}", "-m", "specab.sim.smi"]
          specab_node_dir: "NODEDIR"
          specab_node_env:
            SPECAB_SIM_STATE: "NODEDIR/gpus"
"""


@pytest.fixture
def inventory(tmp_path: Path) -> tuple[Path, Path]:
    node_dir = tmp_path / "node"
    p = tmp_path / "inv.yml"
    p.write_text(INVENTORY.replace("NODEDIR", str(node_dir)))
    return p, node_dir


@pytest.fixture
def no_processes(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError(f"plan started a process: {a[:1]}")
    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setattr(os, "fork", refuse)
    monkeypatch.setattr(os, "posix_spawn", refuse)


def run_cli(*argv: str) -> tuple[int, str]:
    buf = io.StringIO()
    code = main(list(argv), out=buf)
    return code, buf.getvalue()


def test_plan_is_deterministic_for_a_seed_and_touches_nothing(tmp_path, experiment_file, inventory, no_processes,
                                                              monkeypatch):
    inv, node_dir = inventory
    monkeypatch.chdir(tmp_path)
    args = ["plan", "-e", str(experiment_file), "-i", str(inv), "--matrix", "steps=1,2,3", "--repeats", "2",
            "--seed", "5"]
    code, out1 = run_cli(*args)
    assert code == 0
    _, out2 = run_cli(*args)
    assert out1 == out2
    _, out3 = run_cli(*args[:-1], "6")
    order = [line.split()[-1] for line in out1.splitlines() if line.strip()[:1].isdigit() and "-" in line]
    assert len(order) == 8 and order != [line.split()[-1] for line in out3.splitlines()
                                         if line.strip()[:1].isdigit() and "-" in line]
    # every arm's exact launch script and env file are shown
    assert out1.count("--- launch.sh ---") == 4 and out1.count("--- nccl.env") == 4
    assert "--speculative-num-steps 3" in out1 and "--speculative-num-draft-tokens 4" in out1
    assert "NCCL_PROTO=LL" in out1
    assert not node_dir.exists()
    assert not (tmp_path / "runs").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["exp.yml", "inv.yml"])


def test_plan_json(experiment_file, inventory, no_processes):
    import json
    inv, _ = inventory
    code, out = run_cli("plan", "-e", str(experiment_file), "-i", str(inv), "--format", "json", "--repeats", "1")
    data = json.loads(out)
    assert code == 0 and [a["name"] for a in data["arms"]] == ["baseline", "eagle3-s2"]
    assert "exec " in data["arms"][0]["launch_sh"]


def test_plan_redacts_secrets(write, inventory, no_processes):
    from tests.driver.conftest import EXPERIMENT
    exp = write("s.yml", EXPERIMENT.replace("NCCL_PROTO: LL", "NCCL_PROTO: LL\n    HF_TOKEN: hf_plantedsecret123"))
    code, out = run_cli("plan", "-e", str(exp), "-i", str(inventory[0]))
    assert code == 0 and "hf_plantedsecret123" not in out and "HF_TOKEN='<redacted>'" in out


@pytest.mark.parametrize("matrix, needle", [
    (["steps="], "steps=: no values"),
    (["steps=a"], "'a' is not an integer"),
    (["bogus=1"], "unknown key 'bogus'"),
    (["steps=1", "topk=2", "draft_tokens=8"], "draft_tokens <= steps*topk+1"),
])
def test_invalid_matrix_refused_before_anything_runs(tmp_path, experiment_file, inventory, no_processes, capsys,
                                                     matrix, needle):
    inv, node_dir = inventory
    args = ["-e", str(experiment_file), "-i", str(inv), "--runs-dir", str(tmp_path / "runs")]
    for m in matrix:
        args += ["--matrix", m]
    code, _ = run_cli(*args)           # the run command itself, not plan
    err = capsys.readouterr().err
    assert code == 2 and needle in err and "Nothing was started" in err
    assert not node_dir.exists() and not (tmp_path / "runs").exists()


def _cache_flags(tmp_path: Path, monkeypatch, inv: Path, flags: set[str], version: str) -> None:
    """A cached `--help` flag list for the inventory's host, as a launch would leave it."""
    import json

    from specab.config.inventory import load_inventory
    from specab.driver import preflight
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    host = load_inventory(str(inv)).hosts[0]
    cmd = [str(c) for c in host.vars["specab_engine_cmd"]]
    path = preflight._cache_file(host, host.engine_build(None), version)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"host": host.name, "engine_cmd": cmd, "version": version, "flags": sorted(flags)}))


def test_plan_shows_the_node_spelling_and_the_engine_build(tmp_path, write, inventory, no_processes, monkeypatch):
    """Logical names (cuda_graph_max_bs, disable_cuda_graph) are shown in the 0.5.23 node's spelling."""
    from specab.driver import preflight
    from tests.driver.conftest import EXPERIMENT
    help_text = (Path(__file__).resolve().parents[2] / "specab/sim/data/sglang-0.5.23-help.txt").read_text()
    _cache_flags(tmp_path, monkeypatch, inventory[0], preflight.parse_help_flags(help_text), "sglang 0.5.23")
    exp = write("g.yml", EXPERIMENT.replace("tp_size: 2", "tp_size: 2\n    cuda_graph_max_bs: 16\n"
                                            "    disable_cuda_graph: true"))
    code, out = run_cli("plan", "-e", str(exp), "-i", str(inventory[0]))
    assert code == 0, out
    assert "engine build: sglang 0.5.23, SGLang 0.5.23 flag set" in out
    assert "--cuda-graph-max-bs-decode 16" in out and "--cuda-graph-backend-decode disabled" in out
    assert "--cuda-graph-max-bs " not in out and "--disable-cuda-graph " not in out


def test_plan_refuses_a_name_without_spelling_on_the_node(tmp_path, write, inventory, no_processes, monkeypatch,
                                                          capsys):
    from tests.driver.conftest import EXPERIMENT
    _cache_flags(tmp_path, monkeypatch, inventory[0], {"--model-path", "--tp-size", "--cuda-graph-backend-decode"},
                 "sglang 9.9.9")
    exp = write("g.yml", EXPERIMENT.replace("tp_size: 2", "tp_size: 2\n    cuda_graph_max_bs: 16"))
    code, _ = run_cli("plan", "-e", str(exp), "-i", str(inventory[0]))
    err = capsys.readouterr().err
    assert code == 2 and "no spelling" in err and "--cuda-graph-backend-decode" in err

# --------------------------------------------------------------------------- CLI edges

def test_export_to_a_missing_directory_is_exit_2_without_traceback(tmp_path, capsys):
    from specab.results import store as st
    exp_dir = tmp_path / "runs" / "e-1"
    exp_dir.mkdir(parents=True)
    st.Store.create(exp_dir / st.FILENAME).close()
    missing = tmp_path / "missing" / "dir" / "x.csv"
    code = main(["export", str(exp_dir), "--format", "csv", "-o", str(missing)], out=io.StringIO())
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"error: {missing}: No such file or directory" in err and "Traceback" not in err


@pytest.mark.parametrize("argv, hint", [
    (["rnu"], "unknown command 'rnu'. Did you mean `driver.py run`?"),
    (["exprot", "x"], "Did you mean `driver.py export`?"),
    (["--matrix", "steps=2", "plan"], "'plan' is a command: it goes first, before its options: "
                                      "`driver.py plan --matrix steps=2`"),
])
def test_argparse_slips_get_the_closest_command_or_the_option_order(argv, hint, capsys, no_processes):
    assert main(argv, out=io.StringIO()) == 2
    err = capsys.readouterr().err
    assert hint in err and "usage: driver.py" in err, err


def test_an_option_value_that_names_a_command_is_not_taken_for_one(tmp_path, capsys, no_processes):
    """`-e plan` is a file called plan, not a misplaced command: the file is what gets refused."""
    assert main(["plan", "-e", "status"], out=io.StringIO()) == 2
    assert "status: file not found" in capsys.readouterr().err


def test_top_level_help_shows_the_common_forms(capsys):
    with pytest.raises(SystemExit):
        main(["--help"], out=io.StringIO())
    out = capsys.readouterr().out
    assert "driver.py --matrix steps=1,2,3" in out and "driver.py --resume EXPERIMENT_ID" in out
    assert "options go after the subcommand" in out


# --------------------------------------------------------------------------- values and A/B shape

def test_known_engine_argument_values_are_type_checked(experiment_file, inventory, no_processes, capsys):
    inv, _ = inventory
    code, _ = run_cli("plan", "-e", str(experiment_file), "-i", str(inv), "--matrix", "mem_fraction_static=abc")
    err = capsys.readouterr().err
    assert code == 2 and "mem_fraction_static takes a number, not 'abc'" in err, err
    assert run_cli("plan", "-e", str(experiment_file), "-i", str(inv), "--matrix", "mem_fraction_static=0.8")[0] == 0
    capsys.readouterr()
    # in the experiment file too, with its line; a bare flag takes true/false
    for bad, needle in (("mem_fraction_static: 0.88", "mem_fraction_static: abc"),
                        ("trust_remote_code: true", "trust_remote_code: maybe")):
        f = experiment_file.with_name("bad.yml")
        f.write_text(experiment_file.read_text().replace(bad, needle))
        code, _ = run_cli("plan", "-e", str(f), "-i", str(inv))
        err = capsys.readouterr().err
        assert code == 2 and f"{f}:" in err and needle.split(":")[0] in err, err


def test_skip_invalid_never_leaves_a_baseline_only_ab(experiment_file, inventory, no_processes, capsys):
    inv, _ = inventory
    f = experiment_file.with_name("refused.yml")
    f.write_text(experiment_file.read_text().replace("speculative_eagle_topk: 1", "speculative_eagle_topk: 2")
                 .replace("speculative_num_draft_tokens: 3", "speculative_num_draft_tokens: 8"))
    code, _ = run_cli("plan", "-e", str(f), "-i", str(inv), "--skip-invalid")
    err = capsys.readouterr().err
    assert code == 2 and "nothing to compare with the baseline" in err and "draft_tokens <= steps*topk+1" in err, err
    code, _ = run_cli("plan", "-e", str(f), "-i", str(inv), "--skip-invalid", "--matrix", "env.NCCL_PROTO=LL,Simple")
    err = capsys.readouterr().err
    assert code == 2 and "nothing to compare with the baseline" in err, err



TWO_ENGINES = """\
          specab_engines:
            sglang-0.5.9:
              env: {SPECAB_SIM_SGLANG_VERSION: "0.5.9"}
            sglang-0.5.23:
              python: /opt/sgl0523/bin/python
"""


def test_plan_renders_each_arm_with_its_engine_build(tmp_path, experiment_file, inventory, no_processes, monkeypatch):
    """The engine axis: a build's env is exported after the node env, `python` replaces the first word."""
    inv, _ = inventory
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    inv.write_text(inv.read_text() + TWO_ENGINES)
    code, out = run_cli("plan", "-e", str(experiment_file), "-i", str(inv), "--matrix",
                        "engine=sglang-0.5.9,sglang-0.5.23", "--matrix", "steps=2", "--repeats", "1")
    assert code == 0, out
    arms = out.split("=== arm ")[1:]
    assert len(arms) == 4
    old = next(a for a in arms if a.startswith("baseline-sglang-0.5.9 (baseline, engine build sglang-0.5.9)"))
    new = next(a for a in arms if a.startswith("eagle3-s2-k1-d3-sglang-0.5.23 (compared with baseline-sglang-0.5.23, "
                                               "engine build sglang-0.5.23)"))
    assert "export SPECAB_SIM_SGLANG_VERSION=0.5.9" in old and "-m specab.sim.launch_server" in old
    assert "exec /opt/sgl0523/bin/python -m specab.sim.launch_server" in new and "SGLANG_VERSION" not in new
    assert "engine build sglang-0.5.9: not yet known" in out and "engine build sglang-0.5.23: not yet known" in out


def test_an_engine_build_the_inventory_lacks_is_refused_before_anything_runs(tmp_path, experiment_file, inventory,
                                                                            no_processes, capsys):
    inv, node_dir = inventory
    inv.write_text(inv.read_text() + TWO_ENGINES)
    code, _ = run_cli("-e", str(experiment_file), "-i", str(inv), "--runs-dir", str(tmp_path / "runs"),
                      "--matrix", "engine=sglang-0.5.9,sglang-0.6.0")
    err = capsys.readouterr().err
    assert code == 2 and "declares no engine build sglang-0.6.0" in err and "sglang-0.5.9, sglang-0.5.23" in err
    assert "Nothing was started" in err and not node_dir.exists() and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("body, needle", [
    ("specab_engines: [a, b]", "must map engine build names"),
    ("specab_engines: {a: {pyhton: /x}}", "unknown key(s) pyhton"),
    ("specab_engines: {a: {python: /x, cmd: [/x]}}", "not both"),
    ("specab_engines: {'a b': {}}", "is not a build name"),
])
def test_a_malformed_specab_engines_is_refused(tmp_path, experiment_file, inventory, no_processes, capsys, body, needle):
    inv, _ = inventory
    inv.write_text(inv.read_text() + "          " + body + "\n")
    code, _ = run_cli("plan", "-e", str(experiment_file), "-i", str(inv))
    assert code == 2 and needle in capsys.readouterr().err


def test_plan_spells_each_build_with_its_own_cached_flags(tmp_path, write, inventory, no_processes, monkeypatch):
    """Each engine build's --help is cached on its own: the 0.5.23 build's arms get the 0.5.23 spelling,
    the 0.5.9 build's arms (flags not yet read) keep the experiment's names."""
    import json

    from specab.config.inventory import load_inventory
    from specab.driver import preflight
    from tests.driver.conftest import EXPERIMENT
    inv, _ = inventory
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    inv.write_text(inv.read_text() + TWO_ENGINES)
    host = load_inventory(str(inv)).hosts[0]
    build = host.engine_build("sglang-0.5.23")
    help_text = (Path(__file__).resolve().parents[2] / "specab/sim/data/sglang-0.5.23-help.txt").read_text()
    path = preflight._cache_file(host, build, "sglang 0.5.23")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"host": host.name, "engine_cmd": list(build.cmd), "build": build.name,
                                "env": preflight._node_env(host, build), "version": "sglang 0.5.23",
                                "flags": sorted(preflight.parse_help_flags(help_text))}))
    exp = write("g.yml", EXPERIMENT.replace("tp_size: 2", "tp_size: 2\n    cuda_graph_max_bs: 16"))
    code, out = run_cli("plan", "-e", str(exp), "-i", str(inv), "--matrix", "engine=sglang-0.5.9,sglang-0.5.23")
    assert code == 0, out
    assert "engine build: sglang-0.5.23 (sglang 0.5.23), SGLang 0.5.23 flag set" in out
    assert "engine build sglang-0.5.9: not yet known" in out
    arms = {a.split(" ", 1)[0]: a for a in out.split("=== arm ")[1:]}
    assert "--cuda-graph-max-bs-decode 16" in arms["baseline-sglang-0.5.23"]
    assert "--cuda-graph-max-bs 16" in arms["baseline-sglang-0.5.9"]


def test_plan_shows_the_burn_in_runs_and_their_gpu_minutes(tmp_path, write, inventory, no_processes, monkeypatch):
    import json

    from specab.analysis.cost import economics
    from specab.config.spec import load_experiment
    from specab.driver import design_inputs
    from tests.driver.conftest import EXPERIMENT
    inv, node_dir = inventory
    monkeypatch.chdir(tmp_path)
    exp = write("b.yml", EXPERIMENT + "  design:\n    burn_in: 2\n")
    code, out = run_cli("plan", "-e", str(exp), "-i", str(inv), "--repeats", "2", "--runs-dir", str(tmp_path / "r"))
    assert code == 0
    assert "2 arms x 2 blocks + 2 burn-in = 6 runs, order interleaved, seed 1" in out
    rows = [m.groups() for m in map(re.compile(r"^\s*(\d+)\s+1\s+\d{3}-\S+(  burn-in: not measured)?$").match,
                                     out.splitlines()) if m]
    assert rows == [("1", "  burn-in: not measured"), ("2", "  burn-in: not measured"), ("3", None), ("4", None)]
    # the GPU-minutes: two runs at the run cost plan --target-ci uses, here the simulator profile's
    arms = ["eagle3-s2", "baseline"]
    spec = load_experiment(exp)
    profile, scale = design_inputs.simulator_profile(load_inventory_host(inv))
    cost = [economics.profile_cost(profile, speculative=a != "baseline", gpus=2, output_len=32, warmup=1,
                                   time_scale=scale) for a in arms]
    expected = sum(c.gpu_s(spec.bench_settings["num_requests"]) for c in cost) / 2 * 2 / 60
    code, js = run_cli("plan", "-e", str(exp), "-i", str(inv), "--repeats", "2", "--format", "json",
                       "--runs-dir", str(tmp_path / "r"))
    burn = json.loads(js)["burn_in"]
    assert (burn["per_host"], burn["runs"]) == (2, 2) and burn["gpu_minutes"] == pytest.approx(expected, rel=1e-9)
    assert f"burn-in (design.burn_in: 2): 2 unmeasured server start(s) and benchmark(s) before block 1, stored and " \
           f"not analysed, expected {expected:.1f} GPU-minutes (run cost of simulator profile default" in out
    assert [p["burn_in"] for p in json.loads(js)["plan"]] == [True, True, False, False, False, False]
    assert not node_dir.exists() and not (tmp_path / "r").exists()


def load_inventory_host(inv: Path):
    from specab.config.inventory import load_inventory
    return load_inventory(str(inv)).hosts[0]
