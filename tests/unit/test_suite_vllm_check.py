"""The suite-level check of tests/conftest.py: a VLLM:: process of this test session left alive is found; one of
another session (a concurrent test run on the same machine) is not."""
from __future__ import annotations

import os
import subprocess
import time

from tests.conftest import SESSION_VAR, leftover_vllm_processes


def test_a_leftover_vllm_titled_process_of_this_session_is_found_and_another_sessions_is_not() -> None:
    ours = os.environ[SESSION_VAR]
    procs = {tag: subprocess.Popen(["bash", "-c", "exec -a VLLM::Worker_TP0 cat"], stdin=subprocess.PIPE,
                                   env={**os.environ, SESSION_VAR: tag}) for tag in (ours, "another-session")}
    try:
        deadline = time.monotonic() + 10
        found = {}
        while time.monotonic() < deadline and procs[ours].pid not in found:
            found = leftover_vllm_processes(ours)
            time.sleep(0.02)
        assert found.get(procs[ours].pid) == "VLLM::Worker_TP0"
        assert procs["another-session"].pid not in found
    finally:
        for p in procs.values():
            p.kill()
            p.wait()
    assert procs[ours].pid not in leftover_vllm_processes(ours)
