"""Test-session wide settings: which worker runs which module, and in what order.

`make test` runs the main suite on two pytest-xdist workers, one whole module per worker at a time
(`--dist loadfile --no-loadscope-reorder`). The modules of `LONG_MODULES` take minutes each (see the
`--durations` table CI prints), so they start first: a long module that starts last would leave one
worker idle while the other finishes it.

`make test PYTEST_LANES=1` runs it on three workers in lanes (`--dist loadgroup`):
- one worker runs the modules that mostly WAIT (simulated time, readiness and stop polling, the fleet's and
  the queue's node-side runs): `WAITING_MODULES`, one after another, one group ("waits"). Measured on two
  workers with scripts/suite_timeline.py (a per-test timeline beside a machine-wide /proc/stat sampler): while
  the fleet and the queue modules ran side by side the two cores were 1.1 busy, and the small simulator and
  node-tool modules ran at ~1.0;
- the two other workers take every other module (they mostly COMPUTE: Ansible, the driver, the analysis)
  as whole modules, the longest first, so the two cores stay busy while the waiting lane waits.
Lanes took the main suite from 776 s to 692-747 s on a clean clone, but the cores were then saturated (1.91-1.93
busy) and a load-sensitive test failed in one of four runs (tests/analysis/test_e2e_rules.py: the simulated
baseline's tok/s fell 3.3 % over three runs under the contention, and the doctor rightly saw a drift), so CI
keeps two workers.
The order changes nothing else: tests within a module keep their order, and every test makes its own
nodes, ports and directories.
"""
from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

# Longest first (seconds of the whole module on two workers, a clean clone, 2026-12-02: wall / CPU of the worker
# and its reaped children, scripts/suite_timeline.py), except the two that mostly wait: they must not run side by
# side (there the two cores were 1.2 busy for ~125 s), so the queue starts first, beside the integrity module, and
# the fleet last, beside the Ansible modules that compute. Every other module after them, in pytest's order.
# With lanes, the waiting lane's modules go first instead.
LONG_MODULES = (
    "tests/real_engine/test_real_vllm.py",     # real vLLM servers on the CPU: minutes, start first
    "tests/reliability/test_integrity.py",     # 245 / 167
    "tests/driver/test_queue.py",              # 149 / 65: waits (the sequencer's back-to-back runs, Ctrl-C + resume)
    "tests/driver/test_e2e_sim.py",            # 174 / 79
    "tests/analysis/test_e2e_rules.py",        # 158 / 106
    "tests/scale/test_multinode.py",           # 111 / 54
    "tests/scale/test_abtest_multinode.py",    # 101 / 45
    "tests/driver/test_secrets_e2e.py",        # 76 / 56
    "tests/node/test_sequence.py",             # 66 / 10
    "tests/reliability/test_ssh_faults.py",    # 51 / 28
    "tests/ansible/test_ssh.py",               # 49 / 22
    "tests/reliability/test_interrupt.py",     # 45 / 34
    "tests/analysis/test_e2e_sim.py",          # 41 / 32
    "tests/scale/test_fleet.py",               # 143 / 63: waits (runs of seconds of node time on two hosts)
)
# The waiting lane (see the docstring): modules whose wall time is mostly waiting, measured on two workers
# (module wall s / CPU s of the worker and its reaped children, 2026-12-02; the nodes' own daemons not counted).
WAITING_MODULES = (
    "tests/scale/test_fleet.py",               # 138 / 50: runs of seconds of node time on two hosts
    "tests/driver/test_queue.py",              # 130 / 51: the sequencer's back-to-back runs, Ctrl-C + resume
    "tests/node/test_sequence.py",             # 53 / 6.5
    "tests/sim/test_calibration.py",           # 36 / 4.1
    "tests/node/test_faults.py",               # 22 / 6.4
    "tests/sim/test_process.py",               # 14 / 5.0
    "tests/node/test_sim_server.py",           # 10 / 3.8
    "tests/sim/test_faults.py",                # 8 / 3.2
    "tests/unit/test_loadgen.py",              # 5 / 0.4
    "tests/node/test_lifecycle.py",            # 5 / 2.1
    "tests/node/test_vllm_readiness.py",       # 4.5 / 0.0
    "tests/node/test_shutdown_styles.py",      # 4 / 1.7
    "tests/sim/test_throttle.py",              # 4 / 1.5
    "tests/sim/test_smi.py",                   # 4 / 1.3
)
WAITING_GROUP = "waits"


def _path(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def _rank(item: pytest.Item, lanes: bool) -> tuple[int, int]:
    path = _path(item)
    if lanes and path in WAITING_MODULES:   # the waiting lane first: it starts at once, on a worker of its own
        return (0, WAITING_MODULES.index(path))
    return (1, LONG_MODULES.index(path) if path in LONG_MODULES else len(LONG_MODULES))


@pytest.hookimpl(tryfirst=True)             # before xdist's own hook reads the groups (--dist loadgroup)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # lanes under --dist loadgroup (PYTEST_LANES=1; the real-engine stage runs under it too, where every module
    # without groups of its own stays whole on one worker, as under loadfile)
    lanes = getattr(config.option, "dist", "no") == "loadgroup"
    items.sort(key=lambda item: _rank(item, lanes))      # stable: the rest keep pytest's order
    if not lanes:
        return
    for item in items:
        if item.get_closest_marker("xdist_group") is None:     # a module's own group (the real engines) wins
            path = _path(item)
            item.add_marker(pytest.mark.xdist_group(WAITING_GROUP if path in WAITING_MODULES
                                                     else path.removeprefix("tests/").removesuffix(".py")))


# --------------------------------------------------------------------------- no real engine left behind
# Suite-level check: no `VLLM::` process (a real vLLM's EngineCore or Worker) started by this test session
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


# Skips that only say the machine lacks what CI installs (root for namespaces and mounts, ip, sshd, Chromium): under
# SPECAB_REQUIRE_TEST_HOSTS=1 (.ci/run sets it, as SPECAB_REQUIRE_REAL_ENGINE for the real engines) such a skip is a
# failure, so a CI run can never pass by silently skipping them.
REQUIRED_SKIP_REASONS = ("needs root", "needs the 'ip' command", "openssh-server", "openssh-client",
                         "chromium not installed", "cannot mount a tmpfs", "cannot make a read-only directory")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> object:
    outcome = yield
    rep = outcome.get_result()
    if rep.skipped and os.environ.get("SPECAB_REQUIRE_TEST_HOSTS") == "1":
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        if any(s in reason for s in REQUIRED_SKIP_REASONS):
            rep.outcome = "failed"
            rep.longrepr = (f"SPECAB_REQUIRE_TEST_HOSTS=1: this test must run here, but it skipped: {reason} "
                            f"(.ci/run installs what it needs)")
