"""What was asked is what runs: settings that the experiment, the inventory or the command line alone decide are
refused (or applied and shown) before any node is touched, each refusal naming the setting, the limit and where
each came from."""
from __future__ import annotations

import io
import json
import re
from contextlib import redirect_stderr
from pathlib import Path

import pytest

from specab.driver import cli

REPO = Path(__file__).resolve().parents[2]
DEFAULT = (REPO / "experiments" / "default.yml").read_text()


def experiment(tmp_path: Path, old: str, new: str, name: str = "exp.yml") -> Path:
    assert re.search(old, DEFAULT), old
    f = tmp_path / name
    f.write_text(re.sub(old, new, DEFAULT, count=1))
    return f


def refused(argv: list[str]) -> str:
    """The message of a command refused before anything started (exit 2)."""
    err, out = io.StringIO(), io.StringIO()
    with redirect_stderr(err):
        rc = cli.main(argv, out=out)
    assert rc == 2, (rc, out.getvalue()[-2000:], err.getvalue())
    assert "Nothing was started." in err.getvalue()
    return err.getvalue()


def test_a_duplicate_key_is_an_error_naming_both_lines(tmp_path: Path) -> None:
    """`tp_size: 8` ... `tp_size: 4` in one mapping: YAML keeps the last silently; specab names both lines."""
    exp = experiment(tmp_path, r"    mem_fraction_static: 0.88\n", "    mem_fraction_static: 0.88\n    tp_size: 4\n")
    lines = exp.read_text().splitlines()
    first = next(i for i, line in enumerate(lines, 1) if line.strip() == "tp_size: 8")
    second = next(i for i, line in enumerate(lines, 1) if line.strip() == "tp_size: 4")
    msg = refused(["plan", "-e", str(exp)])
    assert f"exp.yml:{second}:5: duplicate key 'tp_size' (first at {exp}:{first}:5)" in msg, msg


def test_a_duplicate_key_in_the_inventory_is_an_error_naming_both_lines(tmp_path: Path) -> None:
    inv = tmp_path / "inv.yml"
    inv.write_text((REPO / "inventory" / "local.yml").read_text().replace(
        "          specab_gpu_indices: all\n", "          specab_gpu_indices: all\n          specab_gpu_indices: [0]\n"))
    msg = refused(["plan", "-i", str(inv)])
    assert re.search(r"inv.yml:(\d+):11: duplicate key 'specab_gpu_indices' \(first at .*inv.yml:(\d+):11\)", msg), msg


@pytest.mark.parametrize("rate", ["1e9", "2000000"])
def test_a_request_rate_too_high_is_refused_with_the_bound_it_broke(rate: str) -> None:
    msg = refused(["plan", "--matrix", f"request_rate={rate}"])
    assert f"--matrix request_rate: '{rate}' is not below 1e+06 requests per second, the highest rate a schedule " \
           f"may ask" in msg, msg
    assert "above 0" not in msg


def test_a_misspelt_inventory_variable_is_refused_with_the_close_name_before_any_lease(tmp_path: Path) -> None:
    """`specab_nodedir`: no role reads it, so the node directory stayed at its default and the lease was taken
    there; now `run` refuses it before any lease is taken or node touched (the lease file would be the first write)."""
    node_dir = tmp_path / "node"
    inv = tmp_path / "inv.yml"
    inv.write_text((REPO / "inventory" / "local.yml").read_text().replace(
        'specab_node_dir: "/tmp/specab-sim/{{ inventory_hostname }}"', f"specab_nodedir: {node_dir}"))
    lines = inv.read_text().splitlines()
    line = next(i for i, text in enumerate(lines, 1) if "specab_nodedir" in text)
    msg = refused(["-i", str(inv), "--runs-dir", str(tmp_path / "runs")])
    assert f"inv.yml:{line}:11: unknown variable specab_nodedir (did you mean specab_node_dir?)" in msg, msg
    assert not (tmp_path / "runs").exists() and not node_dir.exists()


def test_an_arms_own_model_path_runs_and_is_shown_and_recorded(tmp_path: Path) -> None:
    """The arms' `server_args.model_path` was overwritten by the experiment's model: now it is the model the arm
    runs (its launch script in `plan`, the arm as stored), said in a notice where it is not the experiment's."""
    exp = experiment(tmp_path, r"  arms:\n    - name: baseline\n",
                     "  arms:\n    - name: baseline\n      server_args:\n        model_path: /models/Other-INT4\n")
    exp.write_text(exp.read_text().replace("        speculative_algorithm: EAGLE3\n",
                                           "        speculative_algorithm: EAGLE3\n"
                                           "        model_path: /models/Other-INT4\n"))
    out = io.StringIO()
    assert cli.main(["plan", "-e", str(exp)], out=out) == 0
    text = out.getvalue()
    assert text.count("--model-path /models/Other-INT4") == 2 and "Kimi-K2.5-INT4 " not in text, text
    assert "notice: arm baseline runs model /models/Other-INT4 (its server_args.model_path), not the experiment's " \
           "/models/Kimi-K2.5-INT4." in text, text
    from specab.driver.options import Options, prepare
    arms = {a.name: a.to_json() for a in prepare(Options(experiment_file=str(exp))).arms}
    assert {a["server_args"]["model_path"] for a in arms.values()} == {"/models/Other-INT4"}


def test_a_speculative_arm_on_another_model_than_its_baseline_is_refused_with_the_reason(tmp_path: Path) -> None:
    exp = experiment(tmp_path, "        speculative_algorithm: EAGLE3\n",
                     "        speculative_algorithm: EAGLE3\n        model_path: /models/Other-INT4\n")
    msg = refused(["plan", "-e", str(exp)])
    assert "arm eagle3-s2 speculates on model /models/Other-INT4 but its baseline baseline runs " \
           "/models/Kimi-K2.5-INT4: its speedup and accept length would compare two models" in msg, msg


def line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def test_more_requests_in_flight_than_the_server_runs_is_refused_with_both_numbers_and_their_sources(
        tmp_path: Path) -> None:
    """`concurrency: 16` with `max_running_requests: 4`: the server ran 4 and queued the rest, and the report said
    "per user at 16 in flight"."""
    exp = experiment(tmp_path, r"max_running_requests: \d+", "max_running_requests: 4")
    exp.write_text(exp.read_text().replace("concurrency: 1\n", "concurrency: 16\n"))
    c, m = line_of(exp, "concurrency: 16"), line_of(exp, "max_running_requests: 4")
    msg = refused(["plan", "-e", str(exp)])
    assert (f"arm baseline: 16 requests in flight (bench.concurrency at {exp}:{c}:5) but the server runs at most 4 at "
            f"once (server_args.max_running_requests at {exp}:{m}:5)") in msg, msg
    assert "set bench.allow_queueing: true to measure the queue on purpose" in msg
    # a load of the matrix names the matrix
    matrix = experiment(tmp_path, r"max_running_requests: \d+", "max_running_requests: 4", "m.yml")
    matrix.write_text(matrix.read_text().replace("num_requests: 6", "num_requests: 32"))
    msg = refused(["plan", "-e", str(matrix), "--matrix", "concurrency=1,16"])
    assert "arm baseline-c16: 16 requests in flight (--matrix concurrency=16) but the server runs at most 4" in msg
    # asked for: run, with a notice saying what the server will run
    exp.write_text(exp.read_text().replace("concurrency: 16\n", "concurrency: 16\n    allow_queueing: true\n"))
    out = io.StringIO()
    assert cli.main(["plan", "-e", str(exp)], out=out) == 0
    assert "notice: arm eagle3-s2: 16 requests in flight" in out.getvalue()
    assert "up to 12 wait in its queue (bench.allow_queueing: true)" in out.getvalue()


def test_a_prompt_longer_than_the_context_length_set_is_refused_naming_the_record_and_the_limit(
        tmp_path: Path) -> None:
    """A 10,001-token prompt with `context_length: 4096` ran "ok" on the simulator (a real engine refuses it)."""
    (tmp_path / "data.jsonl").write_text('{"prompt": "short one"}\n' + '{"prompt": "%s"}\n' % " ".join(["w"] * 10001))
    exp = experiment(tmp_path, r"    port: \d+\n", "    port: 30000\n    context_length: 4096\n")
    exp.write_text(exp.read_text().replace("output_len: 256", "output_len: 256\n    dataset: data.jsonl"))
    line = line_of(exp, "context_length: 4096")
    msg = refused(["plan", "-e", str(exp)])
    assert (f"arm baseline: the prompt has at least 10001 tokens (record 2 of bench.dataset {tmp_path}/data.jsonl: "
            f"10001 words), not below the context length of 4096 tokens (server_args.context_length at "
            f"{exp}:{line}:5): the engine refuses it") in msg, msg


def test_an_answer_longer_than_the_context_length_set_is_refused_naming_the_length(tmp_path: Path) -> None:
    exp = experiment(tmp_path, r"    port: \d+\n", "    port: 30000\n    context_length: 4096\n")
    exp.write_text(exp.read_text().replace("output_len: 256", "output_len: 10000000"))
    msg = refused(["plan", "-e", str(exp)])
    assert (f"the prompt's at least 128 tokens (bench.input_len 128 words per seeded prompt) and the 10000000 tokens "
            f"asked (bench.output_len at {exp}:{line_of(exp, '    output_len:')}:5) make 10000128, above the context "
            f"length of 4096 tokens") in msg, msg
    assert "SGLang refuses the request" in msg


def two_hosts(tmp_path: Path, second: dict[str, str]) -> Path:
    text = (REPO / "inventory" / "local.yml").read_text()
    block = text[text.index("        sim0:\n"):]
    other = block.replace("sim0:", "sim1:")
    for k, v in second.items():
        other = re.sub(rf"{k}: .*\n", f"{k}: {v}\n", other)
    inv = tmp_path / "two.yml"
    inv.write_text(text + other)
    return inv


def test_two_inventory_hosts_on_one_machine_are_refused_and_lockstep_is_said(tmp_path: Path) -> None:
    """Two hosts in the inventory ran every run on both, on one port, with no notice."""
    msg = refused(["plan", "-i", str(two_hosts(tmp_path, {}))])
    assert ("hosts sim0 and sim1 are one machine (both reached with ansible_connection: local): each run would start "
            "a server on each at once, on one port and one set of GPUs") in msg, msg
    inv = two_hosts(tmp_path, {"ansible_connection": "ssh\n          ansible_host: 10.0.0.2"})
    inv.write_text(inv.read_text().replace("        sim0:\n          ansible_connection: local\n",
                                           "        sim0:\n          ansible_connection: ssh\n"
                                           "          ansible_host: 10.0.0.1\n"))
    out = io.StringIO()
    assert cli.main(["plan", "-i", str(inv)], out=out) == 0
    assert ("notice: every run runs on each of the 2 hosts of gpu_nodes at once (sim0, sim1: lockstep, each host's "
            "results under <run dir>/<host>/): --fleet gives each host its own blocks instead") in out.getvalue()
    out = io.StringIO()
    assert cli.main(["plan", "-i", str(inv), "--fleet"], out=out) == 0 and "lockstep" not in out.getvalue()


def test_plan_refuses_an_argument_the_nodes_engine_does_not_take_as_run_does(tmp_path: Path, monkeypatch) -> None:
    """`plan` rendered an SGLang-only flag into a vLLM launch script without a word while `run` refused it: with the
    node's engine flags known (cached by the run's own preflight), `plan` refuses it with `run`'s words."""
    from specab.config.inventory import load_inventory
    from specab.driver import preflight
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    host = load_inventory(REPO / "inventory" / "vllm-cpu.yml").hosts[0]
    text = (REPO / "tests" / "fixtures" / "vllm-0.32.0" / "help.txt").read_text()
    build = host.engine_build(None)
    preflight.cache_dir().mkdir(parents=True)
    (preflight.cache_dir() / f"{host.name}-fixture.json").write_text(json.dumps({
        "host": host.name, "engine_cmd": list(build.cmd), "build": None, "env": preflight._node_env(host, build),
        "version": "vllm 0.32.0", "flags": sorted(preflight.parse_help_flags(text)),
        "shapes": preflight.parse_help_shapes(text)}))
    exp = tmp_path / "vllm.yml"
    exp.write_text((REPO / "experiments" / "vllm-cpu.yml").read_text().replace(
        "    dtype: bfloat16\n", "    dtype: bfloat16\n    mem_fraction_static: 0.8\n"))
    msg = refused(["plan", "-e", str(exp)])
    assert ("arm baseline: server_args.mem_fraction_static -> --mem-fraction-static is not a flag of the engine on "
            "vllm0 (vllm 0.32.0)") in msg, msg
    assert "The engine would refuse these arguments after the launch." in msg
