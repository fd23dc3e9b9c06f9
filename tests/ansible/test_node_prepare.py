"""node_prepare's task names render on a first deployment and when the tools are already deployed.

The live display (and the driver's event stream) shows task names even for skipped tasks; a name that
templates a variable registered by a skipped task rendered as an error string ("<< error 1 - object of
type 'dict' has no attribute 'path' >>") on every run after the first.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.ansible.conftest import REPO, VENV_BIN, SimNode

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

UNPACK = "Prepare | Unpack the node tools into "


def _stop_playbook(node: SimNode) -> str:
    """playbooks/stop.yml (node_prepare, stop, GPUs free) with skipped tasks shown, as users see it."""
    env = {**node.env(), "ANSIBLE_DISPLAY_SKIPPED_HOSTS": "1"}
    proc = subprocess.run([str(VENV_BIN / "ansible-playbook"), "-i", str(node.inventory), "playbooks/stop.yml"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    return out


def test_task_names_render_when_deploying_and_when_already_deployed(tmp_path: Path) -> None:
    node = SimNode(root=tmp_path)
    node.write_inventory()
    try:
        first = _stop_playbook(node)
        assert list((node.node_dir / "bin").glob(".tools-*")), "the first run deploys the node tools"
        # byte-compiled once on the node (the suite's environment sets PYTHONDONTWRITEBYTECODE: no tool start would
        # keep what it compiles), for the Python that runs them (specab_python: this interpreter)
        tag = sys.implementation.cache_tag
        assert (node.node_dir / "bin" / "specab" / "node" / "__pycache__" / f"sequence.{tag}.pyc").is_file()
        second = _stop_playbook(node)
    finally:
        node.stop()
    for run, out in (("first", first), ("second", second)):
        assert "<< error" not in out, f"{run} run rendered a template error: {out[-4000:]}"
        assert f"{UNPACK}{node.node_dir}/bin]" in out, f"{run} run: {out[-4000:]}"
    # the second run found the fingerprint and skipped the unpacking, still naming it correctly
    unpack_result = second.split(f"{UNPACK}{node.node_dir}/bin]", 1)[1].split("TASK [", 1)[0]
    assert "skipping:" in unpack_result, unpack_result
