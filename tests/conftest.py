"""Test-session wide settings: the order in which modules start.

`make test` runs the suite on two pytest-xdist workers, one whole module per worker at a time
(`--dist loadfile --no-loadscope-reorder`). The modules below take minutes each (see the
`--durations` table CI prints), so they start first: a long module that starts last would leave one
worker idle while the other finishes it. The order changes nothing else: tests within a module keep
their order, and every test makes its own nodes, ports and directories.
"""
from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

# longest first, from a 2-worker run's --durations table (seconds of the whole module, session 7)
LONG_MODULES = (
    "tests/real_engine/test_real_vllm.py",     # real vLLM servers on the CPU (issue 16): minutes, start first
    "tests/reliability/test_integrity.py",     # ~360 s
    "tests/analysis/test_e2e_rules.py",        # ~330 s
    "tests/driver/test_e2e_sim.py",            # ~245 s
    "tests/driver/test_queue.py",              # ~230 s
    "tests/scale/test_multinode.py",           # ~205 s
    "tests/scale/test_fleet.py",               # ~170 s: a fleet and the same blocks one after another
    "tests/scale/test_abtest_multinode.py",    # ~145 s
    "tests/driver/test_secrets_e2e.py",        # ~105 s
    "tests/node/test_sequence.py",             # ~80 s
    "tests/analysis/test_e2e_sim.py",          # ~80 s
    "tests/reliability/test_ssh_faults.py",    # ~80 s
    "tests/ansible/test_ssh.py",               # ~70 s
    "tests/reliability/test_interrupt.py",     # ~70 s
)


def _rank(item: pytest.Item) -> int:
    path = item.nodeid.split("::", 1)[0]
    return LONG_MODULES.index(path) if path in LONG_MODULES else len(LONG_MODULES)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=_rank)      # stable: the rest keep pytest's order


# --------------------------------------------------------------------------- no real engine left behind
# Suite-level check (issue 16): no `VLLM::` process (a real vLLM's EngineCore or Worker) started by this test session
# may outlive it. "Started by this session": its environment carries this session's SPECAB_TEST_SESSION (set once
# by the controlling process, inherited by xdist workers and by every engine the tests launch; the launch scripts
# keep /proc/PID/environ readable), so a concurrent session's engines on the same machine are not counted.
# Checked once, by the controlling process.

SESSION_VAR = "SPECAB_TEST_SESSION"
os.environ.setdefault(SESSION_VAR, uuid.uuid4().hex)


def leftover_vllm_processes(session: str) -> dict[int, str]:
    """pid -> title of every live (non-zombie) VLLM::* process whose environment names this test session."""
    found = {}
    marker = f"{SESSION_VAR}={session}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            title = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            if not title.startswith("VLLM::"):
                continue
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if state != "Z" and marker in environ:
            found[int(entry)] = title
    return found


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if hasattr(session.config, "workerinput"):
        return
    left = leftover_vllm_processes(os.environ[SESSION_VAR])
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        msg = ("VLLM:: processes of this test session left after the tests (a real vLLM not stopped): "
               + ", ".join(f"{pid} {t}" for pid, t in sorted(left.items())))
        if reporter is not None:
            reporter.write_line(msg, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
