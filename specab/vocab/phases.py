"""The phases of a run: one vocabulary for the run queue and the per-run path.

Each phase is named once, in ``PHASES``: the name the run queue's sequencer appends to ``phases.jsonl`` as the
phase begins (``node``; None for the controller's own phase, ``collecting``), the name the driver shows and stores
(``display``; None ends the last phase), the Ansible role whose tasks are that phase on the per-run path (``role``),
and what the run was doing, in words, when it failed there (``doing``: ``done.json``'s ``task``).

On the per-run path the driver reads a task's phase from the role that ansible-runner's event data names
(``phase_of_event``), so task names are free text: renaming one changes no recorded phase. A task outside these
roles (a check of ``playbooks/tasks/run_arm.yml`` between two of them) belongs to the phase in effect.

``RUN_STEPS`` is the run order on a node: the per-run playbook (``playbooks/tasks/run_arm.yml``, one role per step)
and the sequencer (``runsteps.py``) both follow it (``tests/unit/test_architecture.py`` holds the playbook to it,
``tests/node/test_sequence.py`` the sequencer). stdlib only (Python >= 3.8), part of the shared vocabulary.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, NamedTuple, Optional, Tuple


class Phase(NamedTuple):
    node: Optional[str]       # phases.jsonl's name (the sequencer); None: a phase of the controller alone
    display: Optional[str]    # what the driver shows and stores; None ends the last phase
    role: Optional[str]       # the role whose tasks are this phase on the per-run path; None: no role of its own
    doing: str                # what the run was doing, the words of a failure's message; "{arm}" = the arm's name


PHASES: Tuple[Phase, ...] = (
    Phase("claimed", "preparing", "node_prepare", "Queue | Claim the queued run"),
    Phase("stopping-leftover", "stopping", "server_stop", "Stop | Stop any server of ours left on the node"),
    Phase("gpus-free-before", "waiting for GPUs", "gpu_free",
          "GPUs free | Wait until the GPUs are free before starting"),
    Phase("starting", "starting", "server_start", "Start | Start arm {arm}"),
    Phase("loading", "loading", "server_ready", "Ready | Wait until the server is ready"),
    Phase("ready", "ready", None, "Ready | Wait until the server is ready"),
    Phase("env", "verifying env", "env_verify", "Env | Verify env and server args"),
    Phase("warming up", "warming up", None, "Bench | Benchmark arm {arm}"),
    Phase("benchmarking", "benchmarking", "bench", "Bench | Benchmark arm {arm}"),
    Phase("stopping", "stopping", "server_stop", "Stop | Stop the server and record how"),
    Phase("gpus free", "waiting for GPUs", "gpu_free",
          "GPUs free | Wait until the GPUs are free again and record the time to free"),
    # on the per-run path the collect role writes the manifest and fetches the run: all of it is collecting
    Phase("manifest", "writing manifest", None, "Collect | Write manifest.json on the node"),
    Phase("done", None, None, "Queue | Write done.json"),
    Phase(None, "collecting", "collect", "Collect | Fetch the run's artefacts"),
)


class RunStep(NamedTuple):
    phase: str        # the node phase (PHASES) that begins the step
    role: str         # the role the per-run playbook includes for it


RUN_STEPS: Tuple[RunStep, ...] = (
    RunStep("stopping-leftover", "server_stop"),
    RunStep("gpus-free-before", "gpu_free"),
    RunStep("starting", "server_start"),
    RunStep("loading", "server_ready"),
    RunStep("env", "env_verify"),
    RunStep("benchmarking", "bench"),
    RunStep("stopping", "server_stop"),
    RunStep("gpus free", "gpu_free"),
    RunStep("manifest", "collect"),
)

# The views of PHASES that the parts read.
NODE_PHASES: Tuple[str, ...] = tuple(p.node for p in PHASES if p.node is not None)       # phases.jsonl, in order
DISPLAY_PHASES: Dict[str, Optional[str]] = {p.node: p.display for p in PHASES if p.node is not None}
TASKS: Dict[str, str] = {p.node: p.doing for p in PHASES if p.node is not None}         # done.json's task
ROLE_PHASES: Dict[str, str] = {p.role: p.display for p in PHASES if p.role is not None and p.display is not None}

# a phase that a run enters twice is stored under its second name
REPEATED_PHASES: Dict[str, str] = {"stopping": "final stop", "waiting for GPUs": "waiting for GPUs after stop"}


def display_phase(node_phase: Optional[str]) -> Optional[str]:
    """The display name of a node phase (unknown names are shown as they are)."""
    if node_phase is None:
        return None
    return DISPLAY_PHASES.get(node_phase, node_phase)


def phase_of_event(event_data: Mapping[str, Any]) -> Optional[str]:
    """The display phase of an ansible-runner event: the phase of the role its task belongs to (``role`` in the
    event data, the role's own name however it was included); None for a task of no run step's role."""
    role = event_data.get("role")
    return ROLE_PHASES.get(role) if isinstance(role, str) else None
