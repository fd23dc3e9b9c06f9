"""The phases the driver records come from the role of each task (ansible-runner's event data), not from task names:
arm.yml run through the driver's PlaybookRunner from a copy of the project whose every task is renamed records the
run's phases in the run order (specab/vocab/phases.py: PHASES, RUN_STEPS)."""
from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from specab.driver.playbook import PlaybookRunner
from tests.ansible.conftest import REPO, SimNode, experiment, resolved_arm

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

TASK_NAME = re.compile(r"^(\s*)- name: .*$", re.M)


def _renamed_project(root: Path) -> Path:
    """The project with every task of the roles and of arm.yml's task files named "Step N" (the plays too); the
    rest (specab, templates, plugins, ansible.cfg) linked to the checkout."""
    project = root / "project"
    project.mkdir()
    for name in ("ansible.cfg", "specab", "templates", "plugins", "experiments"):
        (project / name).symlink_to(REPO / name)
    number = itertools.count(1)
    renamed = 0
    for src in [*(REPO / "roles").rglob("*"), *(REPO / "playbooks").rglob("*")]:
        dst = project / src.relative_to(REPO)
        if src.is_dir():
            dst.mkdir(parents=True, exist_ok=True)
            continue
        text = src.read_bytes()
        if src.suffix == ".yml" and (src.parent.name == "tasks" or src.name == "arm.yml"):
            new, n = TASK_NAME.subn(lambda m: f"{m.group(1)}- name: Step {next(number)}", text.decode())
            renamed += n
            text = new.encode()
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(text)
        dst.chmod(src.stat().st_mode)
    assert renamed > 50, "the copy renamed too few tasks to mean anything"
    return project


def test_renaming_every_task_changes_no_recorded_phase(tmp_path: Path) -> None:
    node = SimNode(root=tmp_path / "node-root")
    exp = experiment(node.port)
    node.write_inventory()
    project = _renamed_project(tmp_path)
    names = "\n".join(p.read_text() for p in (project / "roles").glob("*/tasks/*.yml"))
    assert " | " not in "".join(re.findall(r"- name: .*", names)), "a task kept its phase-word name"
    runner = PlaybookRunner(project, node.inventory, tmp_path / "runner", stream=lambda line: None)
    seen: list[str] = []
    try:
        result = runner.run(str(project / "playbooks" / "arm.yml"), {
            "specab_experiment": exp, "specab_arm": resolved_arm(exp, 0), "specab_experiment_id": "t-phases",
            "specab_run_id": "001-baseline", "specab_run_dir": str(node.runs_dir / "t-phases" / "001-baseline"),
            "specab_runs_dir": str(node.runs_dir)}, "phases", on_phase=lambda phase, at: seen.append(phase))
    finally:
        node.stop()
    assert result.ok, (result.failures, result.stdout_tail[-3000:])
    expected = ["preparing", "stopping", "waiting for GPUs", "starting", "loading", "verifying env", "benchmarking",
                "final stop", "waiting for GPUs", "collecting"]
    assert seen == expected
