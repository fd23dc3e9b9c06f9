"""Secrets end to end: an arm's secret server arg (``api_key``, flag ``--api-key``) and secret env vars (a bare
``TOKEN``, ``HF_TOKEN``) and a secret of the node env (``HF_HUB_TOKEN``, inventory) reach the engine, and appear in
no stored file of the experiment nor in what ``driver.py -v`` prints; a secret of the controller's environment is
not passed on at all. On the node, each file holding a secret is its owner's alone (0600, launch.sh 0700).

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
SECRETS = (API_KEY.encode(), TOKEN.encode(), HF_TOKEN.encode(), NODE_TOKEN.encode(), CTRL_TOKEN.encode())
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


@pytest.mark.parametrize("executor", ["queue", "per-run"])
def test_secret_server_arg_and_env_reach_the_engine_and_no_stored_file(node: SimNode, executor: str):
    """The run queue and the per-run path (whose runner artifacts hold the arm as an extravar) alike."""
    node.profile = "instant"
    exp_file = node.write_experiment("sec", arms=ARMS, num_requests=2, output_len=16)
    inv = node.write_inventory({**node.host_vars(), "specab_node_env": {**node.node_env(), "HF_HUB_TOKEN": NODE_TOKEN}})
    proc = driver("-v", "--executor", executor, "--repeats", "1", "--seed", "1", "-e", str(exp_file), "-i", str(inv),
                  "--runs-dir", str(node.runs_dir),
                  # ANSIBLE_VERBOSITY reaches ansible-playbook: -v then streams every task result (the arm, the node
                  # env), not only the task names and failures
                  env={"SPECAB_TEST_CTRL_TOKEN": CTRL_TOKEN, "ANSIBLE_VERBOSITY": "1"})
    try:
        out, _ = proc.communicate(timeout=600)
    finally:
        reap_driver(proc, 60)
    assert proc.returncode == 0, out[-4000:]
    assert "TASK [" in out, "-v streams the Ansible events"
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
    assert f"HF_HUB_TOKEN={NODE_TOKEN}" in launch, launch
    assert f"TOKEN={TOKEN}" in (spec_run / "nccl.env").read_text()
    assert f"HF_TOKEN={HF_TOKEN}" in (spec_run / "nccl.env").read_text()

    # on the node: the files that carry a secret have their private mode, and no other file holds one
    for name, mode in PRIVATE_FILES.items():
        got = (spec_run / name).stat().st_mode & 0o777
        assert got == mode, f"node {name}: mode {oct(got)}, expected {oct(mode)}"
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
    leaks = [(str(f.relative_to(exp_dir)), found, oct(mode)) for f, found, mode in _leaks(exp_dir)]
    assert not leaks, f"secret values in stored files: {leaks}"
    # ... and the controller's copies of the node's private files keep their modes
    for name, mode in PRIVATE_FILES.items():
        got = (exp_dir / spec_run.name / name).stat().st_mode & 0o777
        assert got == mode, f"runs/ {name}: mode {oct(got)}, expected {oct(mode)}"
