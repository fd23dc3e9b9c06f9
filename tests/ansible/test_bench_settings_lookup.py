"""The lookup specab_bench_settings (plugins/lookup/specab_bench_settings.py): one run's bench settings, resolved in
Python on the controller, as the bench role and a multi-node rank's sampler take them."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from specab.config import defaults

REPO = Path(__file__).resolve().parents[2]
PLUGIN = REPO / "plugins" / "lookup" / "specab_bench_settings.py"


def _plugin() -> ModuleType:
    spec = importlib.util.spec_from_file_location("test_specab_bench_settings", PLUGIN)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_arm_wins_over_the_experiment_which_wins_over_specab_values_typed_as_the_client_takes_them() -> None:
    resolve = _plugin().resolve
    base = {"num_requests": "12", "concurrency": 3, "ignore_eos": "false"}          # as the inventory may give them
    out = resolve(base, {"concurrency": 2, "request_rate": 4, "dataset": "/home/u/prompts.jsonl", "seed": None},
                  {"concurrency": 8, "output_len": None}, "/node/datasets")
    assert out["num_requests"] == 12 and out["concurrency"] == 8 and out["ignore_eos"] is False
    assert out["request_rate"] == 4.0 and isinstance(out["request_rate"], float)
    assert out["seed"] == defaults.get("bench_seed") and out["output_len"] == defaults.get("bench_output_len")
    assert out["dataset"] == "/node/datasets/prompts.jsonl"
    assert set(defaults.BENCH_DEFAULTS) <= set(out)
    assert resolve({}, None, None, None) == {**defaults.bench({}), **{k: float(defaults.bench({})[k])
                                                                      for k in ("request_rate", "timeout_s")}}


def test_a_play_resolves_an_inventory_value_the_experiment_and_the_arm(tmp_path: Path) -> None:
    """In a play (role specab first, as every play): an extra var overrides a specab_bench_* default."""
    play = tmp_path / "play.yml"
    play.write_text(
        "- hosts: localhost\n  gather_facts: false\n  roles: [specab]\n  tasks:\n"
        "    - ansible.builtin.copy:\n"
        "        content: \"{{ query('specab_bench_settings', {'warmup_requests': 1}, {'concurrency': 4}) | first"
        " | to_json }}\"\n"
        f"        dest: {tmp_path / 'out.json'}\n"
        "        mode: '0644'\n")
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_ROLES_PATH=str(REPO / "roles"),
               ANSIBLE_LOOKUP_PLUGINS=str(REPO / "plugins" / "lookup"), ANSIBLE_STDOUT_CALLBACK="default")
    p = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                        str(play), "-e", "specab_bench_num_requests=5", "-e",
                        f"ansible_python_interpreter={sys.executable}"], env=env, capture_output=True, text=True,
                       timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    out = json.loads((tmp_path / "out.json").read_text())
    assert (out["num_requests"], out["warmup_requests"], out["concurrency"]) == (5, 1, 4), out
    assert out["api"] == defaults.get("bench_api") and isinstance(out["timeout_s"], float)


def test_no_playbook_or_role_resolves_a_bench_setting_in_jinja() -> None:
    """Every path takes the bench settings from the lookup: a `default(specab_bench_*)` outside roles/specab would
    resolve one again, and could differ from what the bench role runs."""
    found = [f"{path.relative_to(REPO)}:{n}" for top in ("playbooks", "roles") for path in (REPO / top).rglob("*.yml")
             if not path.is_relative_to(REPO / "roles" / "specab")
             for n, line in enumerate(path.read_text().splitlines(), 1) if "default(specab_bench_" in line]
    assert found == [], found
