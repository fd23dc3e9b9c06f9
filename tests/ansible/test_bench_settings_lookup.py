"""The lookup specab_bench_settings (plugins/lookup/specab_bench_settings.py): one run's bench settings, resolved in
Python on the controller (specab.config.bench), as the bench role and a multi-node rank's sampler take them; the
lookup specab_timeouts, the run's timeouts from the same module; and the lookup specab_queue_wait_s, collect_run.yml's
default wait for a call by hand, from the same resolution."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specab.config import bench, defaults

REPO = Path(__file__).resolve().parents[2]


def test_the_arm_wins_over_the_experiment_which_wins_over_specab_values_typed_as_the_client_takes_them() -> None:
    resolve = bench.resolve
    base = {"num_requests": "12", "concurrency": 3, "ignore_eos": "false"}          # as the inventory may give them
    out = resolve(base, {"concurrency": 2, "request_rate": 4, "dataset": "/home/u/prompts.jsonl", "seed": None},
                  {"concurrency": 8, "output_len": None}, "/node/datasets")
    assert out["num_requests"] == 12 and out["concurrency"] == 8 and out["ignore_eos"] is False
    assert out["request_rate"] == 4.0 and isinstance(out["request_rate"], float)
    assert out["seed"] == defaults.get("bench_seed") and out["output_len"] == defaults.get("bench_output_len")
    assert out["dataset"] == "/node/datasets/prompts.jsonl"
    assert set(defaults.BENCH_DEFAULTS) <= set(out)
    assert out["client_procs"] == "auto" and resolve({"client_procs": "3"}, None, None)["client_procs"] == 3
    assert resolve({}, None, None, None) == {**defaults.bench({}), **{k: float(defaults.bench({})[k])
                                                                      for k in ("request_rate", "timeout_s")}}


def _play(tmp_path: Path, expression: str, *extra_vars: str) -> object:
    """The value of ``expression`` in a play (role specab first, as every play) run with ``extra_vars``."""
    play = tmp_path / "play.yml"
    play.write_text(
        "- hosts: localhost\n  gather_facts: false\n  roles: [specab]\n  tasks:\n"
        "    - ansible.builtin.copy:\n"
        f"        content: \"{{{{ {expression} | to_json }}}}\"\n"
        f"        dest: {tmp_path / 'out.json'}\n"
        "        mode: '0644'\n")
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_ROLES_PATH=str(REPO / "roles"),
               ANSIBLE_LOOKUP_PLUGINS=str(REPO / "plugins" / "lookup"), ANSIBLE_STDOUT_CALLBACK="default")
    args = [a for var in extra_vars for a in ("-e", var)]
    p = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                        str(play), *args, "-e", f"ansible_python_interpreter={sys.executable}"], env=env,
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads((tmp_path / "out.json").read_text())


def test_a_play_resolves_an_inventory_value_the_experiment_and_the_arm(tmp_path: Path) -> None:
    """In a play: an extra var overrides a specab_bench_* default."""
    out = _play(tmp_path, "query('specab_bench_settings', {'warmup_requests': 1}, {'concurrency': 4}) | first",
                "specab_bench_num_requests=5")
    assert isinstance(out, dict)
    assert (out["num_requests"], out["warmup_requests"], out["concurrency"]) == (5, 1, 4), out
    assert out["api"] == defaults.get("bench_api") and isinstance(out["timeout_s"], float)


def test_no_playbook_or_role_resolves_a_bench_setting_or_a_timeout_in_jinja() -> None:
    """Every path takes the bench settings and the timeouts from the lookups: a `default(specab_bench_*)` or
    `default(<a timeout's specab_* variable>)` outside roles/specab would resolve one again, and could differ from
    what the roles run and the driver waits for."""
    names = ["default(specab_bench_", *(f"default({var})" for var in defaults.TIMEOUT_DEFAULTS.values())]
    found = [f"{path.relative_to(REPO)}:{n}" for top in ("playbooks", "roles") for path in (REPO / top).rglob("*.yml")
             if not path.is_relative_to(REPO / "roles" / "specab")
             for n, line in enumerate(path.read_text().splitlines(), 1) if any(name in line for name in names)]
    assert found == [], found


def test_a_play_resolves_the_timeouts_as_the_driver_does(tmp_path: Path) -> None:
    """specab_timeouts in a play: an inventory or extra var over roles/specab's value, the experiment's timeouts
    over both, seconds as floats; the driver's resolution (bench.timeouts) gives the same."""
    out = _play(tmp_path, "query('specab_timeouts', {'ready_s': 90, 'gpu_free_s': None}) | first",
                "specab_stop_grace_s=7")
    assert out == {"ready_s": 90.0, "stop_grace_s": 7.0, "gpu_free_s": float(defaults.get("gpu_free_timeout_s"))}
    assert out == bench.timeouts({"stop_grace_s": 7}, {"ready_s": 90, "gpu_free_s": None})


def test_a_timeout_that_is_not_a_number_fails_the_lookup_naming_the_timeouts(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match="specab_timeouts: a timeout has no usable value"):
        _play(tmp_path, "query('specab_timeouts', {'ready_s': 'soon'}) | first")


def test_the_queue_wait_counts_every_request_of_the_run_the_arms_own_included() -> None:
    """collect_run.yml's wait: the ready timeout, two stops, two waits for free GPUs, each request (warm-up
    included) at its timeout, the margin; an arm whose own bench asks for more requests or a longer timeout waits
    longer; the timeouts: the experiment's over the inventory's over specab's defaults."""
    run_timeouts = {"ready_s": 60.0, "stop_grace_s": 5.0, "gpu_free_s": 30.0}
    experiment = {"num_requests": 3, "warmup_requests": 1, "timeout_s": 60}
    wait = bench.queue_wait_s(bench.resolve({}, experiment, None), run_timeouts)
    assert wait == 60 + 2 * 5 + 2 * 30 + 60 * (3 + 1) + bench.QUEUE_WAIT_MARGIN_S
    more = bench.queue_wait_s(bench.resolve({}, experiment, {"num_requests": 40}), run_timeouts)
    assert more == wait + 60 * 37
    longer = bench.queue_wait_s(bench.resolve({}, experiment, {"timeout_s": 120}), run_timeouts)
    assert longer == wait + 60 * 4
    assert bench.timeouts({"ready_s": "999", "gpu_free_s": 7}, {"gpu_free_s": 12}) == {
        "ready_s": 999.0, "stop_grace_s": float(defaults.get("stop_grace_s")), "gpu_free_s": 12.0}


def test_collect_runs_default_wait_for_a_call_by_hand_is_the_same_function(tmp_path: Path) -> None:
    """lookup specab_queue_wait_s (collect_run.yml's default): bench.queue_wait_s of the experiment's bench and
    timeouts, the arm's own bench settings over them, an inventory's timeout under the experiment's."""
    out = _play(tmp_path, "lookup('specab_queue_wait_s', {'num_requests': 3, 'warmup_requests': 1}, {'num_requests': 40},"
                          " timeouts={'ready_s': 60})", "specab_gpu_free_timeout_s=7")
    run_timeouts = bench.timeouts({"gpu_free_s": 7}, {"ready_s": 60})
    assert out == bench.queue_wait_s(bench.resolve({}, {"num_requests": 3, "warmup_requests": 1},
                                                   {"num_requests": 40}), run_timeouts)
    assert out == 60 + 2 * defaults.get("stop_grace_s") + 2 * 7 + defaults.get("bench_timeout_s") * 41 + 300


def test_the_bench_and_collect_roles_defaults_take_the_arms_own_settings(tmp_path: Path) -> None:
    """The bench role's bench_settings and the collect role's collect_seed, as a caller that passes neither gets
    them (the expressions read from the roles' defaults): the arm's own bench settings over the experiment's."""
    import yaml
    bench_default = yaml.safe_load((REPO / "roles" / "bench" / "defaults" / "main.yml").read_text())["bench_settings"]
    seed_default = yaml.safe_load((REPO / "roles" / "collect" / "defaults" / "main.yml").read_text())["collect_seed"]
    extra = json.dumps({"specab_experiment": {"bench": {"seed": 1, "num_requests": 3}},
                        "specab_arm": {"name": "a", "bench": {"seed": 7, "concurrency": 2}},
                        "bench_node_dir": "/node", "bench_default": bench_default, "seed_default": seed_default})
    out = _play(tmp_path, "[bench_default, seed_default]", extra)
    assert isinstance(out, list)
    settings, seed = out
    assert (settings["seed"], settings["num_requests"], settings["concurrency"], int(seed)) == (7, 3, 2, 7), out
