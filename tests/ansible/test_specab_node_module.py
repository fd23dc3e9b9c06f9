"""Module specab_node (plugins/modules/specab_node.py) runs one node tool with its spec as JSON: the tool's keys
come back as the task's, a failure carries the tool's own error after the headline of a failure in the step's
phase (specab.vocab.phases), check mode runs nothing. Against the checkout's node tools, on localhost, through the
repository's ansible.cfg."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.timeout(180)]

FAILING_SMI = ["false"]         # an nvidia-smi that fails at once: gpufree's own error names it
SECRET = "sk-module-test-0123456789"


def _lease(node_dir: Path, experiment_id: str, token: str) -> Dict[str, Any]:
    holder = {"experiment_id": experiment_id, "controller_host": "ctl", "controller_pid": 4242, "started_at": 1.0,
              "started_at_iso": "2026-12-01T10:00:00+0000", "token": token}
    return {"tool": "lease", "node_dir": str(node_dir), "python": sys.executable, "fail_msg": "ctl-node",
            "fail_hint": "Nothing was stopped or started.",
            "spec": {"node_dir": str(node_dir), "command": "take", "holder": holder, "stale_s": 600.0}}


def _playbook(tmp_path: Path, node_dir: Path, results: Path, *flags: str,
              env: Dict[str, str] | None = None) -> subprocess.CompletedProcess:
    tasks: List[Dict[str, Any]] = [
        {"name": "Stop | nothing recorded", "register": "stop_r",
         "specab_node": {"tool": "stop", "node_dir": str(node_dir), "python": sys.executable,
                         "phase": "stopping", "host": "here",
                         "spec": {"node_dir": str(node_dir), "smi": FAILING_SMI, "grace": 1.0,
                                  "out": str(node_dir / "stop.json")}}},
        {"name": "GPUs free | nvidia-smi fails", "register": "free_r", "ignore_errors": True,
         "specab_node": {"tool": "gpufree", "node_dir": str(node_dir), "python": sys.executable,
                         "phase": "gpus free", "host": "here",
                         "spec": {"smi": FAILING_SMI, "gpus": "all", "threshold_mib": 64, "timeout": 1}}},
        {"name": "GPUs free | a key the spec does not have", "register": "bad_r", "ignore_errors": True,
         "specab_node": {"tool": "gpufree", "node_dir": str(node_dir), "python": sys.executable,
                         "phase": "gpus free", "host": "here",
                         "spec": {"smi": FAILING_SMI, "gpus": "all", "threshold_mib": 64, "timeout": 1,
                                  "treshold": 1}}},
        {"name": "GPUs free | a secret in the spec", "register": "secret_r", "ignore_errors": True,
         "specab_node": {"tool": "gpufree", "node_dir": str(node_dir), "python": sys.executable,
                         "phase": "gpus free", "host": "here",
                         "spec": {"smi": FAILING_SMI, "gpus": "all", "threshold_mib": 64, "timeout": 1,
                                  "api_key": SECRET}}},
        {"name": "Lease | take", "register": "lease_r", "specab_node": _lease(node_dir, "exp-m", "tm")},
        {"name": "Lease | take again by its holder", "register": "again_r",
         "specab_node": _lease(node_dir, "exp-m", "tm")},
        {"name": "Lease | another experiment", "register": "other_r", "ignore_errors": True,
         "specab_node": _lease(node_dir, "exp-other", "to")},
        {"name": "Queue | no more runs", "register": "finish_r",
         "specab_node": {"tool": "sequence", "node_dir": str(node_dir), "python": sys.executable,
                         "fail_msg": "Ending the run queue failed",
                         "spec": {"command": "finish", "node_dir": str(node_dir), "experiment_id": "exp-m"}}},
        {"name": "Write the results", "delegate_to": "localhost", "check_mode": False,
         "ansible.builtin.copy": {"dest": str(results), "mode": "0600",
                                  "content": "{{ {'stop': stop_r, 'free': free_r, 'bad': bad_r, 'secret': secret_r, "
                                             "'lease': lease_r, 'again': again_r, 'other': other_r, "
                                             "'finish': finish_r} | to_json }}"}},
    ]
    book = tmp_path / "module.yml"
    book.write_text(json.dumps([{"name": "specab_node", "hosts": "localhost", "gather_facts": False,
                                 "tasks": tasks}]))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"),
               ANSIBLE_NOCOLOR="1", **(env or {}))
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           "-e", f"ansible_python_interpreter={sys.executable}", str(book), *flags],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=150)


def _node_dir(tmp_path: Path) -> Path:
    """A node directory whose bin/specab is the checkout's package, as node_prepare ships it."""
    node_dir = tmp_path / "node"
    (node_dir / "bin").mkdir(parents=True)
    (node_dir / "bin" / "specab").symlink_to(REPO / "specab")
    return node_dir


def _cli(*argv: str) -> Dict[str, Any]:
    """The tool run with its flags, as other callers run it."""
    proc = subprocess.run([sys.executable, "-m", "specab.node", *argv], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    return json.loads(proc.stdout)


def test_the_tool_result_is_the_task_result_and_its_error_the_task_failure(tmp_path: Path) -> None:
    node_dir = _node_dir(tmp_path)
    results = tmp_path / "results.json"
    proc = _playbook(tmp_path, node_dir, results)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    r = json.loads(results.read_text())

    stop = r["stop"]
    assert stop["failed"] is False and stop["changed"] is False, stop
    assert stop["was_running"] is False and stop["ok"] is True and stop["rc"] == 0, stop
    assert json.loads((node_dir / "stop.json").read_text())["was_running"] is False

    # the same failure through the tool's flags: the module's message is the headline and that error verbatim
    flags = _cli("gpufree", "--smi", json.dumps(FAILING_SMI), "--gpus", "all", "--threshold-mib", "64",
                 "--timeout", "1")
    free = r["free"]
    assert flags["ok"] is False and "nvidia-smi failed" in flags["error"], flags
    assert free["failed"] is True and free["rc"] == 1, free
    assert free["msg"] == "The GPUs of here are not free: " + flags["error"], free
    assert free["error"] == flags["error"] and free["ok"] is False
    # the failure record, as the run queue's done.json holds it: phase, headline, what the run was doing, error
    assert (free["phase"], free["headline"]) == ("gpus free", "The GPUs of here are not free"), free
    assert free["task"] == "GPUs free | Wait until the GPUs are free again and record the time to free", free

    bad = r["bad"]
    assert bad["failed"] is True and bad["rc"] == 2, bad
    assert "unknown: treshold" in bad["msg"] and bad["msg"].startswith("The GPUs of here are not free: usage:")

    assert r["secret"]["failed"] is True and "unknown: api_key" in r["secret"]["msg"], r["secret"]
    assert SECRET not in results.read_text()

    # the lease tool with its LeaseSpec: taken (changed), taken again by its holder (unchanged), refused for another
    # experiment with the tool's words between the headline and the hint
    assert r["lease"]["changed"] is True and r["lease"]["taken"] and not r["lease"].get("already"), r["lease"]
    assert r["again"]["changed"] is False and r["again"]["already"] is True, r["again"]
    other = r["other"]
    assert other["failed"] is True and other["held"] is True and other["rc"] == 1, other
    assert other["msg"].startswith(f"ctl-node: node directory {node_dir} is in use by experiment exp-m (controller "
                                   "ctl pid 4242") and other["msg"].endswith(". Nothing was stopped or started."), other
    assert json.loads((node_dir / "experiment.lease").read_text())["experiment_id"] == "exp-m"
    # a sequence command with its spec
    assert r["finish"]["changed"] is True and (node_dir / "queue" / "END-exp-m").exists(), r["finish"]


def test_a_secret_in_the_spec_is_masked_in_the_invocation(tmp_path: Path) -> None:
    # Ansible's own stdout callback at -vvv prints every task's invocation and redacts nothing by itself
    results = tmp_path / "results.json"
    proc = _playbook(tmp_path, _node_dir(tmp_path), results, "-vvv",
                     env={"ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.default"})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "api_key: VALUE_SPECIFIED_IN_NO_LOG_PARAMETER" in proc.stdout, proc.stdout[-4000:]  # yaml (ansible.cfg)
    assert SECRET not in proc.stdout + proc.stderr + results.read_text()


def test_check_mode_runs_no_tool(tmp_path: Path) -> None:
    node_dir = _node_dir(tmp_path)
    results = tmp_path / "results.json"
    proc = _playbook(tmp_path, node_dir, results, "--check")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    r = json.loads(results.read_text())
    for key in ("stop", "free", "bad", "secret", "lease", "again", "other", "finish"):
        assert r[key]["skipped"] is True and r[key]["changed"] is False and "rc" not in r[key], r[key]
    assert not (node_dir / "stop.json").exists(), "check mode ran the stop tool"
