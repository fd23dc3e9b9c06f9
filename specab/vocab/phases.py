"""The phases of a run: one vocabulary for the run queue and the per-run path.

Each phase is named once, in ``PHASES``: the name the run queue's sequencer appends to ``phases.jsonl`` as the
phase begins (``node``; None for the controller's own phase, ``collecting``), the name the driver shows and stores
(``display``; None ends the last phase), the Ansible role whose tasks are that phase on the per-run path (``role``),
what the run was doing, in words, when it failed there (``doing``: the failure record's ``task``) and the headline
of a failure there (``failure``).

A failure's record is the same on both paths: its phase, its headline (``failure_headline``: these words, for the
host as the inventory names it) and the node tool's own error, stated as ``"<headline>: <error>"``. The run queue's
``RunSteps.fail`` and the roles' module (``plugins/modules/specab_node.py``, given the phase) take the headline from
here; nothing else words it.

On the per-run path the driver reads a task's phase from the role that ansible-runner's event data names
(``phase_of_event``), so task names are free text: renaming one changes no recorded phase. A task outside these
roles (a check of ``playbooks/tasks/run_arm.yml`` between two of them) belongs to the phase in effect.

A row whose ``step`` names a role begins a step of the run: ``RUN_STEPS``, derived from those rows, is the run order on
a node, which the per-run playbook (``playbooks/tasks/run_arm.yml``, one role per step) and the sequencer
(``runsteps.py``) both follow (``tests/unit/test_architecture.py`` holds the playbook to it,
``tests/node/test_sequence.py`` the sequencer). A new step is one row here, its role, its node tool and its method
of ``RunSteps``. stdlib only (Python >= 3.8), part of the shared vocabulary.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Tuple


class Phase(NamedTuple):
    node: Optional[str]       # phases.jsonl's name (the sequencer); None: a phase of the controller alone
    display: Optional[str]    # what the driver shows and stores; None ends the last phase
    role: Optional[str]       # the role whose tasks are this phase on the per-run path; None: no role of its own
    doing: str                # what the run was doing when it failed there; "{arm}" = the arm's name
    failure: str              # the headline of a failure there; "{host}" = the inventory's name of the host
    step: Optional[str] = None    # a step of the run begins here: the role the per-run playbook includes for it


# headlines that several phases share (a step before the start and after the run; a phase and the next of one step)
STOP_FAILED = "Stopping the server on {host} failed"
GPUS_BUSY = "The GPUs of {host} are not free"
NOT_READY = "The server on {host} did not become ready"
BENCH_FAILED = "The benchmark on {host} failed"

PHASES: Tuple[Phase, ...] = (
    Phase("claimed", "preparing", "node_prepare", "Queue | Claim the queued run",
          "Preparing the run on {host} failed"),
    Phase("stopping-leftover", "stopping", "server_stop", "Stop | Stop any server of ours left on the node",
          STOP_FAILED, step="server_stop"),
    Phase("gpus-free-before", "waiting for GPUs", "gpu_free",
          "GPUs free | Wait until the GPUs are free before starting", GPUS_BUSY, step="gpu_free"),
    Phase("starting", "starting", "server_start", "Start | Start arm {arm}", "Starting arm {arm} on {host} failed",
          step="server_start"),
    Phase("loading", "loading", "server_ready", "Ready | Wait until the server is ready", NOT_READY,
          step="server_ready"),
    Phase("ready", "ready", None, "Ready | Wait until the server is ready", NOT_READY),
    Phase("env", "verifying env", "env_verify", "Env | Verify env and server args",
          "Env verification failed on {host}", step="env_verify"),
    Phase("warming up", "warming up", None, "Bench | Benchmark arm {arm}", BENCH_FAILED),
    Phase("benchmarking", "benchmarking", "bench", "Bench | Benchmark arm {arm}", BENCH_FAILED, step="bench"),
    Phase("stopping", "stopping", "server_stop", "Stop | Stop the server and record how", STOP_FAILED,
          step="server_stop"),
    Phase("gpus free", "waiting for GPUs", "gpu_free",
          "GPUs free | Wait until the GPUs are free again and record the time to free", GPUS_BUSY, step="gpu_free"),
    # on the per-run path the collect role writes the manifest and fetches the run: all of it is collecting
    Phase("manifest", "writing manifest", None, "Collect | Write manifest.json on the node",
          "Writing the manifest on {host} failed", step="collect"),
    Phase("done", None, None, "Queue | Write done.json", "Writing done.json on {host} failed"),
    Phase(None, "collecting", "collect", "Collect | Fetch the run's artefacts",
          "Collecting the run from {host} failed"),
)

# the headline of a run cut short by SIGINT/SIGTERM (the driver's interrupt or stop.py), whatever its phase
INTERRUPTED = "The run on {host} was interrupted"


class RunStep(NamedTuple):
    phase: str        # the node phase (PHASES) that begins the step
    role: str         # the role the per-run playbook includes for it


RUN_STEPS: Tuple[RunStep, ...] = tuple(RunStep(p.node, p.step) for p in PHASES if p.node is not None and p.step)

# The views of PHASES that the parts read.
NODE_PHASES: Tuple[str, ...] = tuple(p.node for p in PHASES if p.node is not None)       # phases.jsonl, in order
DISPLAY_PHASES: Dict[str, Optional[str]] = {p.node: p.display for p in PHASES if p.node is not None}
TASKS: Dict[str, str] = {p.node: p.doing for p in PHASES if p.node is not None}         # done.json's task
FAILURES: Dict[str, str] = {p.node: p.failure for p in PHASES if p.node is not None}     # headline words
ROLE_PHASES: Dict[str, str] = {p.role: p.display for p in PHASES if p.role is not None and p.display is not None}

# a phase that a run enters twice is stored under its second name
REPEATED_PHASES: Dict[str, str] = {"stopping": "final stop", "waiting for GPUs": "waiting for GPUs after stop"}


def stored_phase_name(phase: str, earlier: List[str]) -> str:
    """The name a run's phase is stored under, given the names stored before it: its own the first time, then its
    second name (REPEATED_PHASES), then numbered ("loading (2)")."""
    if phase not in earlier:
        return phase
    name = REPEATED_PHASES.get(phase, phase)
    return name if name not in earlier else f"{phase} ({earlier.count(phase) + 1})"


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


def failure_headline(node_phase: str, host: str, arm: str = "") -> str:
    """The headline of a failure in ``node_phase`` (a name of ``NODE_PHASES``) on ``host`` (the inventory's name)."""
    return FAILURES.get(node_phase, "The run on {host} failed in phase %s" % node_phase).format(host=host, arm=arm)


def failure_task(node_phase: str, arm: str = "") -> str:
    """What the run was doing when it failed in ``node_phase``: the failure record's ``task``."""
    return TASKS.get(node_phase, node_phase).format(arm=arm)


def display_task(display: str, arm: str = "") -> str:
    """What the run was doing in the phase the driver shows as ``display`` (the first node phase shown so: the
    driver stores an interrupted per-run run's phase by its display name)."""
    node = next((p.node for p in PHASES if p.display == display and p.node is not None), display)
    return failure_task(node, arm)
