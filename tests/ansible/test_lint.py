"""ansible-lint --profile production is clean on every role and playbook."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.timeout(300)]


def test_ansible_lint_production_profile_is_clean(tmp_path: Path) -> None:
    lint = Path(sys.executable).parent / "ansible-lint"
    env = dict(os.environ, PATH=f"{lint.parent}{os.pathsep}{os.environ.get('PATH', '')}", NO_COLOR="1",
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-local"))
    proc = subprocess.run([str(lint), "--profile", "production", "--offline"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert "Profile 'production' was required, and it passed" in proc.stdout + proc.stderr
