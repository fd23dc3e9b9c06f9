"""Secrets on the playbook path (``ansible-playbook playbooks/ab_test.yml``), end to end on the simulated node.

Three secrets are planted, one per way a secret enters an experiment: a secret server arg (``api_key``, flag
``--api-key``), a secret env var of the experiment (``HF_TOKEN``) and a secret in the controller's environment
(``SPECAB_TEST_CTRL_TOKEN``), which the inventory passes on to the node as ``HF_HUB_TOKEN`` through
``lookup('env')``. Each must reach the engine, and no byte that the playbook prints (``-v`` included) or
collects into ``runs/`` may hold one; on the node every file that holds one is private (0600, scripts 0700), and
so is each file on the controller that would hold one had it not been scrubbed.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.ansible.conftest import EAGLE3, SimNode, experiment

pytestmark = [pytest.mark.timeout(600)]

API_KEY = "SECRETAPIKEY7f3a9"
HF_TOKEN = "SECRETHFTOKEN9c1e5"
CTRL_TOKEN = "SECRETCTRLTOKEN42d8"
SECRETS = {"api_key": API_KEY, "HF_TOKEN": HF_TOKEN, "controller env": CTRL_TOKEN}

# the files of a run directory that carry a secret by design (the engine's argv, its env, the args it was given)
# or may (the engine's log), and the mode each must have wherever it is, on the node and on the controller
PRIVATE_FILES = {"launch.sh": 0o700, "nccl.env": 0o600, "args.json": 0o600, "server.log": 0o600}


def _node(sim_node: SimNode, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The secrets planted: the experiment file, the controller's environment, the inventory's node env."""
    monkeypatch.setenv("SPECAB_TEST_CTRL_TOKEN", CTRL_TOKEN)
    exp = experiment(sim_node.port, arms=[{"name": "eagle3-s2", "server_args": {**EAGLE3, "api_key": API_KEY},
                                           "env": {"HF_TOKEN": HF_TOKEN}}])
    sim_node.write_inventory(specab_node_env={**sim_node.node_env(),
                                              "HF_HUB_TOKEN": "{{ lookup('ansible.builtin.env', 'SPECAB_TEST_CTRL_TOKEN') }}"})
    return sim_node.write_experiment(exp)


def _found(data: bytes) -> list[str]:
    return [name for name, value in SECRETS.items() if value.encode() in data]


def _files(root: Path) -> list[Path]:
    return sorted(f for f in root.rglob("*") if f.is_file() and not f.is_symlink())


def test_ab_test_playbook_prints_and_collects_no_secret_and_keeps_the_node_files_private(
        sim_node: SimNode, monkeypatch: pytest.MonkeyPatch) -> None:
    exp_file = _node(sim_node, monkeypatch)
    result = sim_node.playbook("ab_test.yml", {"specab_experiment_file": str(exp_file)}, "-v")
    assert result.rc == 0, str(result)
    assert not _found(result.output.encode()), f"secrets printed by ansible-playbook -v: {_found(result.output.encode())}"

    # every secret reached the engine: its argv, the env file it sources, the node env its launch script exports
    node_runs = [d for d in (sim_node.node_dir / "runs").iterdir() if d.is_dir()]
    assert len(node_runs) == 1, node_runs
    launch = (node_runs[0] / "launch.sh").read_text()
    assert f"--api-key {API_KEY}" in launch and f"HF_HUB_TOKEN={CTRL_TOKEN}" in launch, launch
    assert f"HF_TOKEN={HF_TOKEN}" in (node_runs[0] / "nccl.env").read_text()

    # on the node: the files that carry a secret have their private mode, and no other file holds one
    for name, mode in PRIVATE_FILES.items():
        got = (node_runs[0] / name).stat().st_mode & 0o777
        assert got == mode, f"node {name}: mode {oct(got)}, expected {oct(mode)}"
    assert node_runs[0].stat().st_mode & 0o777 == 0o700, f"node run directory: {oct(node_runs[0].stat().st_mode)}"
    exposed = [(str(f.relative_to(sim_node.node_dir)), _found(f.read_bytes()), oct(f.stat().st_mode & 0o777))
               for f in _files(sim_node.node_dir)
               if _found(f.read_bytes()) and f.stat().st_mode & 0o077]
    assert not exposed, f"node files holding a secret that others can read: {exposed}"

    # on the controller: every byte under runs/ is free of the secrets, and the private files keep their modes
    exp_dirs = [d for d in sim_node.runs_dir.iterdir() if d.is_dir()]
    assert len(exp_dirs) == 1, exp_dirs
    run_dirs = [d for d in exp_dirs[0].iterdir() if d.is_dir()]
    assert len(run_dirs) == 1 and (run_dirs[0] / "launch.sh").exists(), run_dirs
    # the experiment's directory and its run's: their owner's alone, as on the node
    modes = {str(d.relative_to(sim_node.runs_dir)): oct(d.stat().st_mode & 0o777) for d in (exp_dirs[0], run_dirs[0])}
    assert set(modes.values()) == {oct(0o700)}, modes
    leaks = [(str(f.relative_to(sim_node.runs_dir)), _found(f.read_bytes())) for f in _files(sim_node.runs_dir)
             if _found(f.read_bytes())]
    assert not leaks, f"secret values in runs/: {leaks}"
    assert "--api-key <redacted>" in (run_dirs[0] / "launch.sh").read_text()
    for name, mode in PRIVATE_FILES.items():
        got = (run_dirs[0] / name).stat().st_mode & 0o777
        assert got == mode, f"runs/ {name}: mode {oct(got)}, expected {oct(mode)}"


def test_ab_test_check_diff_shows_the_rendered_files_with_every_secret_redacted(
        sim_node: SimNode, monkeypatch: pytest.MonkeyPatch) -> None:
    exp_file = _node(sim_node, monkeypatch)
    result = sim_node.playbook("ab_test.yml", {"specab_experiment_file": str(exp_file)}, "--check", "--diff", "-v")
    assert result.rc == 0, str(result)
    assert not _found(result.output.encode()), f"secrets printed by --check --diff -v: {_found(result.output.encode())}"
    # the rendered files are still shown, each secret as <redacted>
    out = result.output
    assert "+  --speculative-algorithm EAGLE3" in out and "+  --api-key <redacted>" in out, str(result)
    assert "+HF_TOKEN=<redacted>" in out and "+export HF_HUB_TOKEN=<redacted>" in out, str(result)
    assert not sim_node.node_dir.exists() and not sim_node.runs_dir.exists()


def test_under_another_stdout_callback_check_diff_shows_no_file_that_holds_a_secret(
        sim_node: SimNode, monkeypatch: pytest.MonkeyPatch) -> None:
    """The redacting callback is ansible.cfg's; a user who sets their own (here Ansible's default) and asks for
    --check --diff still sees no secret: the files that hold one are shown by no diff (here every arm's: the node env
    carries the controller's token), the other files' diffs are shown as usual. (With -v such a callback prints every
    task's result, the resolved experiment among them: there the redacting callback is the guard.)"""
    exp_file = _node(sim_node, monkeypatch)
    monkeypatch.setenv("ANSIBLE_STDOUT_CALLBACK", "ansible.builtin.default")
    result = sim_node.playbook("ab_test.yml", {"specab_experiment_file": str(exp_file)}, "--check", "--diff")
    assert result.rc == 0, str(result)
    assert not _found(result.output.encode()), f"secrets printed under the default callback: {_found(result.output.encode())}"
    assert "--speculative-algorithm EAGLE3" not in result.output and "--model-path" not in result.output
    assert "engine.json" in result.output and '"flags_fingerprint"' in result.output, str(result)   # no secret: shown
