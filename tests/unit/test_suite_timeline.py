"""scripts/suite_timeline.py, the tool that chose tests/conftest.py's lanes: recorded on a real pytest run, its
report tells a module that computes from one that waits."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(120)

COMPUTES = '''
def test_burns_cpu():
    x = 0
    for i in range(8_000_000):
        x += i * i
    assert x
'''
WAITS = '''
import time

def test_sleeps():
    time.sleep(0.6)      # the waiting being measured: nothing to poll

def test_sleeps_again():
    time.sleep(0.6)
'''


def _timeline_module() -> ModuleType:
    """scripts/suite_timeline.py loaded by its path (scripts/ is no package), as tests/bench loads bench/."""
    spec = importlib.util.spec_from_file_location("suite_timeline", REPO / "scripts" / "suite_timeline.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod          # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def _pytest(tests: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """A pytest of the tests in `tests` with the plugin, as a user starts it (PYTHONPATH=scripts -p suite_timeline)."""
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args,
                           "-p", "suite_timeline", str(tests)], cwd=tests, env=env,
                          capture_output=True, text=True, timeout=100)


def test_the_report_shows_each_module_its_tests_and_whether_it_computed_or_waited(tmp_path: Path) -> None:
    (tmp_path / "test_computes.py").write_text(COMPUTES)
    (tmp_path / "test_waits.py").write_text(WAITS)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")          # not the repository's settings
    out = tmp_path / "timeline"
    # as a user starts it (this test may itself run on an xdist worker, whose PYTEST_XDIST_* variables the child
    # would inherit: the plugin must not take them for its own)
    env = {**os.environ, "SPECAB_TIMELINE_DIR": str(out), "PYTHONPATH": str(REPO / "scripts")}
    run = _pytest(tmp_path, env, "-p", "no:xdist")
    assert run.returncode == 0, run.stdout + run.stderr
    assert (out / "stat.jsonl").read_text().count("\n") >= 2      # sampled at the start and at the end

    st = _timeline_module()
    tl = st.load(out)
    assert set(tl.modules) == {"test_computes.py", "test_waits.py"}, tl.modules
    computes, waits = tl.modules["test_computes.py"], tl.modules["test_waits.py"]
    assert (computes.tests, waits.tests) == (1, 2)
    assert waits.wall >= 1.2 and waits.cpu < 0.2 * waits.wall, waits       # it waited
    # it computed: CPU seconds spent, which a loaded machine does not shrink (its share of the wall does: two busy
    # processes beside the suite on two cores left it below a quarter)
    assert computes.cpu > 0.1 and computes.cpu > 4 * waits.cpu, (computes, waits)
    text = st.report(tl, top=10)
    assert "test_waits.py" in text and "test_computes.py" in text and "busy cores minute by minute" in text

    # on xdist workers: each worker records the tests it ran; the controller only samples the machine
    par = tmp_path / "timeline-xdist"
    run = _pytest(tmp_path, {**env, "SPECAB_TIMELINE_DIR": str(par)}, "-n", "2")
    assert run.returncode == 0, run.stdout + run.stderr
    assert not (par / "tests-main.jsonl").exists() and sorted(p.name for p in par.glob("tests-gw*.jsonl"))
    tl = st.load(par)
    assert {m: tl.modules[m].tests for m in tl.modules} == {"test_computes.py": 1, "test_waits.py": 2}
    assert all(w.startswith("gw") for m in tl.modules.values() for w in m.workers)

    # without the directory the plugin refuses to run, saying what it needs
    env.pop("SPECAB_TIMELINE_DIR")
    refused = _pytest(tmp_path, env, "-p", "no:xdist")
    assert refused.returncode != 0 and "SPECAB_TIMELINE_DIR" in refused.stdout + refused.stderr
