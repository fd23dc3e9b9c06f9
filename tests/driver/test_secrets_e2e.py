"""Secrets end to end: an arm's secret server arg (``api_key``, flag ``--api-key``) and secret env vars (a bare
``TOKEN``, ``HF_TOKEN``) and secrets of the node env (``HF_HUB_TOKEN``, inventory; ``HUB_API_KEY`` from a file
lookup, which only Ansible renders) reach the engine, and appear in no stored file of the experiment nor in what
``driver.py -v`` prints, whatever stdout callback formats Ansible's events; a secret of the controller's environment
is not passed on at all. On the node, each file holding a secret is its owner's alone (0600, launch.sh 0700), and
the run directories on the node and the experiment's and its runs' on the controller are 0700.

The controller once used a narrower secret rule than the node (``*_TOKEN``/``*_KEY`` but not ``api_key`` or
``TOKEN``), so these two were redacted in the node's manifest yet left verbatim in the ansible-runner artifacts
and the stored config. Now one rule (specab.vocab.contract.is_secret_name) serves everything; this test runs the
real driver on the simulated node and greps every byte under the experiment directory: the runner artifacts
(``.runner/**``), results.sqlite with its WAL, each run's files and manifest.json, and the report."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from specab.results import store as st
from tests.driver.simnode import PYTHON, REPO, SPEC_ARMS, SimNode, driver, reap_driver

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

API_KEY = "SECRETAPIVALUE123"
TOKEN = "SECRETTOKENVALUE456"
HF_TOKEN = "SECRETHFTOKEN789"
NODE_TOKEN = "SECRETNODETOKEN012"       # specab_node_env (inventory)
CTRL_TOKEN = "SECRETCTRLTOKEN345"       # the controller's environment, where driver.py runs
# specab_node_env from a file lookup: only Ansible renders it, so the driver learns the value from the task results
FILE_KEY = "SECRETFILEKEY678"
SECRETS = (API_KEY.encode(), TOKEN.encode(), HF_TOKEN.encode(), NODE_TOKEN.encode(), CTRL_TOKEN.encode(),
           FILE_KEY.encode())
# the files of a node run directory that carry a secret by design or may (the engine's log), and their modes
PRIVATE_FILES = {"launch.sh": 0o700, "nccl.env": 0o600, "args.json": 0o600, "server.log": 0o600}

# the simulated node's EAGLE-3 A/B, the speculative arm carrying a secret server arg and secret env vars
ARMS = SPEC_ARMS + f"      api_key: {API_KEY}\n    env:\n      TOKEN: {TOKEN}\n      HF_TOKEN: {HF_TOKEN}\n"


def _leaks(root: Path) -> list[tuple[Path, list[str], int]]:
    out = []
    for f in sorted(root.rglob("*")):
        if f.is_file() and not f.is_symlink():
            data = f.read_bytes()
            found = [s.decode() for s in SECRETS if s in data]
            if found:
                out.append((f, found, f.stat().st_mode & 0o777))
    return out


@pytest.mark.parametrize("executor,callback", [("queue", None), ("per-run", None), ("per-run", "default"),
                                               ("per-run", "minimal")])
def test_secret_server_arg_and_env_reach_the_engine_and_no_stored_file(node: SimNode, executor: str,
                                                                       callback: str | None):
    """The run queue and the per-run path (whose runner artifacts hold the arm as an extravar) alike, and under a
    stdout callback of the user's choosing (ANSIBLE_STDOUT_CALLBACK: ansible-runner formats the events with it): the
    driver scrubs what -v streams itself, whatever formatted it."""
    node.profile = "instant"
    exp_file = node.write_experiment("sec", arms=ARMS, num_requests=2, output_len=16)
    key_file = node.root / "hub.key"
    key_file.write_text(FILE_KEY)
    inv = node.write_inventory({**node.host_vars(), "specab_node_env": {
        **node.node_env(), "HF_HUB_TOKEN": NODE_TOKEN,
        "HUB_API_KEY": "{{ lookup('ansible.builtin.file', '%s') }}" % key_file}})
    foreign = {"ANSIBLE_STDOUT_CALLBACK": callback} if callback else {}
    proc = driver("-v", "--executor", executor, "--repeats", "1", "--seed", "1", "-e", str(exp_file), "-i", str(inv),
                  "--runs-dir", str(node.runs_dir),
                  # ANSIBLE_VERBOSITY reaches ansible-playbook: -v then streams every task result (the arm, the node
                  # env), not only the task names and failures
                  env={"SPECAB_TEST_CTRL_TOKEN": CTRL_TOKEN, "ANSIBLE_VERBOSITY": "1", **foreign})
    try:
        out, _ = proc.communicate(timeout=600)
    finally:
        reap_driver(proc, 60)
    assert proc.returncode == 0, out[-4000:]
    # -v streams the Ansible events (the minimal callback prints each result, without task headers)
    assert (" | SUCCESS => " if callback == "minimal" else "TASK [") in out, out[-3000:]
    if executor == "per-run":       # its task results carry the arm and the node env: printed, each secret redacted
        assert "<redacted>" in out
    printed = [s.decode() for s in SECRETS if s.decode() in out]
    assert not printed, f"secrets printed on the driver's -v output: {printed}"
    exp_dirs = [d for d in node.runs_dir.iterdir() if (d / st.FILENAME).exists()]
    assert len(exp_dirs) == 1, exp_dirs
    exp_dir = exp_dirs[0]
    rep = subprocess.run([PYTHON, "driver.py", "report", str(exp_dir)], cwd=str(REPO), capture_output=True,
                         text=True, timeout=300)
    assert rep.returncode == 0, rep.stdout[-2000:] + rep.stderr[-2000:]
    assert API_KEY not in rep.stdout + rep.stderr and TOKEN not in rep.stdout + rep.stderr

    # both runs ran, and the secret arm's values reached the engine (its argv and its environment)
    with st.Store.open(exp_dir) as s:
        runs = s.runs()
        assert [r["status"] for r in runs] == ["ok", "ok"], runs
        exp_row = s.experiment()
        arms = s.arms()
        manifests = s.manifests()
    spec_run = node.node_dir / "runs" / next(r["run_id"] for r in runs if r["arm"] == "eagle3-s2")
    launch = (spec_run / "launch.sh").read_text()
    assert "--api-key" in launch and API_KEY in launch, launch
    assert f"HF_HUB_TOKEN={NODE_TOKEN}" in launch and f"HUB_API_KEY={FILE_KEY}" in launch, launch
    assert f"TOKEN={TOKEN}" in (spec_run / "nccl.env").read_text()
    assert f"HF_TOKEN={HF_TOKEN}" in (spec_run / "nccl.env").read_text()

    # on the node: the files that carry a secret have their private mode, and no other file holds one
    for name, mode in PRIVATE_FILES.items():
        got = (spec_run / name).stat().st_mode & 0o777
        assert got == mode, f"node {name}: mode {oct(got)}, expected {oct(mode)}"
    node_modes = {d.name: oct(d.stat().st_mode & 0o777) for d in (node.node_dir / "runs").iterdir() if d.is_dir()}
    assert len(node_modes) == 2 and set(node_modes.values()) == {oct(0o700)}, f"node run directories: {node_modes}"
    exposed = [(str(f.relative_to(node.node_dir)), found, oct(mode)) for f, found, mode in _leaks(node.node_dir)
               if mode & 0o077]
    assert not exposed, f"node files holding a secret that others can read: {exposed}"
    assert not [f for f, found, _ in _leaks(node.node_dir) if CTRL_TOKEN in found], "the controller's env reached the node"

    # the places the issue names, looked at as the user would
    for name in ("report.md", "report.html", "report.json"):
        assert (exp_dir / name).exists(), name
    assert (exp_dir / ".runner").is_dir() and any((exp_dir / ".runner").rglob("*"))
    cfg = json.dumps(exp_row, default=str)
    assert API_KEY not in cfg and TOKEN not in cfg
    assert "<redacted>" in cfg                      # the stored config shows that a secret was there
    assert arms and API_KEY not in json.dumps(arms, default=str) and TOKEN not in json.dumps(arms, default=str)
    assert manifests and API_KEY not in json.dumps(manifests, default=str)
    assert TOKEN not in json.dumps(manifests, default=str)
    for m in exp_dir.rglob("manifest.json"):
        text = m.read_text()
        assert API_KEY not in text and TOKEN not in text, m

    # every byte under the experiment directory: runner artifacts, results.sqlite and its WAL, each run's
    # files (launch.sh, args.json, nccl.env, server.log, queue_entry.json: scrubbed on collection), the report
    # (the store is closed by now, its WAL checkpointed into results.sqlite: grepping the file covers its free
    # pages too, which keep the bytes of rows written before)
    assert (exp_dir / spec_run.name / "launch.sh").exists()
    # the experiment directory and its run directories: their owner's alone, as the node's
    dirs = [exp_dir] + [exp_dir / r["run_id"] for r in runs]
    modes = {str(d.relative_to(node.runs_dir)): oct(d.stat().st_mode & 0o777) for d in dirs}
    assert set(modes.values()) == {oct(0o700)}, f"controller directories: {modes}"
    leaks = [(str(f.relative_to(exp_dir)), found, oct(mode)) for f, found, mode in _leaks(exp_dir)]
    assert not leaks, f"secret values in stored files: {leaks}"
    # ... and the controller's copies of the node's private files keep their modes
    for name, mode in PRIVATE_FILES.items():
        got = (exp_dir / spec_run.name / name).stat().st_mode & 0o777
        assert got == mode, f"runs/ {name}: mode {oct(got)}, expected {oct(mode)}"
