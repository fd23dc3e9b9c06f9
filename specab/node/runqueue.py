#!/usr/bin/env python3
"""The run queue's layout on a node and its entries: the files under ``<node_dir>/queue/``, the queue entry the
controller writes (``Entry``, checked as the sequencer reads it). Shared by the sequencer (runsteps.py, sequencer.py) and its commands (sequence.py).
stdlib only, like every node tool; imports its siblings.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

from specab.node import loadgen, staging
from specab.vocab import contract, phases

POLL_S = 0.05
QUEUE_DIR = "queue"
SEQUENCER_LOG = "sequencer.log"
SEQUENCER_START = "sequencer_start.json"
SERVE_LOCK = "sequencer.lock"
ENSURE_LOCK = "sequencer.ensure.lock"
END_PREFIX = "END-"
STAGING_DIR = ".staging"     # queue/.staging: entries being written (`stage`), not yet queued
ENTRY_RE = contract.QUEUE_ENTRY_RE
ID_RE = contract.ID_RE
# What failed, in the words of the per-run path's task names (playbooks/tasks/run_arm.yml).
TASKS = phases.TASKS


def log_tail(path: str, n: int = 12) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 16384))
            lines = fh.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return "(no %s)" % os.path.basename(path)
    return "\n".join(contract.redact_text(l) for l in lines[-n:])


# ---------------------------------------------------------------------------------------------
# Queue entries
# ---------------------------------------------------------------------------------------------

class Entry(object):
    """One queued run (the JSON the controller writes; its fields: specab/node/README.md, "queue entry")."""

    def __init__(self, data: Dict[str, Any], node_dir: str, name: str) -> None:
        self.data = data
        self.name = name
        m = ENTRY_RE.match(name)
        if m is None:
            raise ValueError("queue entry name %r is not <seq:06d>-<run_id>.json" % name)
        self.run_id = str(data.get("run_id") or "")
        if data.get("version") != 1:
            raise ValueError("queue entry %s has version %r; this sequencer reads version 1"
                             % (name, data.get("version")))
        if self.run_id != m.group("run_id"):
            raise ValueError("queue entry %s names run %r, its file name %r" % (name, self.run_id, m.group("run_id")))
        want = os.path.join(node_dir, "runs", self.run_id)
        self.run_dir = str(data.get("run_dir") or "")
        if not os.path.isabs(self.run_dir) or os.path.realpath(self.run_dir) != os.path.realpath(want):
            raise ValueError("queue entry %s: run_dir %r is not this node's run directory %s"
                             % (name, self.run_dir, want))
        for key in ("experiment_id", "arm", "host", "port", "url", "smi", "gpus", "python", "bench", "timeouts",
                    "gpu_free", "sample_interval_s"):
            if key not in data:
                raise ValueError("queue entry %s lacks %r (see docs/architecture.md, queue entry)" % (name, key))
        if not isinstance(data["smi"], list) or not data["smi"] or not all(isinstance(w, str) for w in data["smi"]):
            raise ValueError("queue entry %s: smi must be a non-empty list of strings" % name)
        self.experiment_id = str(data["experiment_id"])
        self.seq = int(data.get("seq", m.group("seq")))
        self.arm = str(data["arm"])
        self.url = str(data["url"]).rstrip("/")
        self.smi: List[str] = list(data["smi"])
        self.gpus = str(data["gpus"])
        # every setting comes from the entry (enqueue.yml writes them from the inventory and the experiment,
        # defaults in roles/specab): the sequencer has no defaults of its own
        t, g = data["timeouts"], data["gpu_free"]
        try:
            self.stop_grace_s = float(t["stop_grace_s"])
            self.gpu_free_s = float(t["gpu_free_s"])
            self.ready_s = float(t["ready_s"])
            self.gpu_free_threshold_mib = float(g["threshold_mib"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError("queue entry %s: timeouts {stop_grace_s, gpu_free_s, ready_s} and gpu_free "
                             "{threshold_mib} must be numbers (%s: %s)" % (name, type(exc).__name__, exc))
        self.bench: Dict[str, Any] = dict(data.get("bench") or {})
        missing = [k for k in loadgen.BENCH_KEYS if self.bench.get(k) is None]
        if missing:
            raise ValueError("queue entry %s: its bench lacks %s (enqueue.yml resolves every bench setting from "
                             "the experiment and roles/specab)" % (name, ", ".join(missing)))
        self.bench_env = {str(k): str(v) for k, v in (data.get("bench_env") or {}).items() if v is not None}
        # a baseline run at temperature > 0: the runs its server scores after its measured window (scoring.py)
        self.score = data.get("score") or None  # type: Optional[Dict[str, Any]]
        self.python = str(data["python"])
        self.engine_python = str(data.get("engine_python") or self.python)
        self.sample_interval_s = float(data["sample_interval_s"])
        self.server_info = bool((data.get("env_verify") or {}).get("server_info", True))
        mf = data.get("manifest") or {}
        self.seed = mf.get("seed", self.bench["seed"])
        self.extra: Dict[str, Any] = dict(mf.get("extra") or {})
        self.instance, self.keep, self.engine = instance_of(data, name)

    def path(self, name: str) -> str:
        return os.path.join(self.run_dir, name)

    def task(self, phase: str) -> str:
        return phases.failure_task(phase, self.arm)

    def headline(self, phase: str, hostname: str) -> str:
        """A failure's headline in ``phase``, naming the host as the inventory does (the per-run path's words);
        ``hostname`` (the node's own name) where the entry does not say it."""
        return phases.failure_headline(phase, str(self.extra.get("inventory_hostname") or hostname), self.arm)


def instance_of(data: Dict[str, Any], name: str) -> Tuple[Optional[str], bool, str]:
    """The entry's instance (docs/decisions/0011): its id (None: the run has a server of its own), whether the run
    keeps its server up for the instance's next run, and the engine kind whose cache reset it uses."""
    inst = data.get("instance")
    if inst is None:
        return None, False, "sglang"
    if not isinstance(inst, dict) or inst.get("id") in (None, "") or not isinstance(inst.get("keep", False), bool):
        raise ValueError("queue entry %s: instance must be {id, keep: true|false, engine}, got %r" % (name, inst))
    return str(inst["id"]), bool(inst.get("keep")), str(inst.get("engine") or "sglang")


def queue_dir(node_dir: str) -> str:
    return os.path.join(node_dir, QUEUE_DIR)


def make_queue_dir(node_dir: str) -> str:
    """queue/ (0700: entries carry the node env), created when missing."""
    path = queue_dir(node_dir)
    staging.make_queue_dir(path)
    return path


def queued_names(node_dir: str) -> List[str]:
    try:
        names = os.listdir(queue_dir(node_dir))
    except OSError:
        return []
    return sorted(n for n in names if ENTRY_RE.match(n))

