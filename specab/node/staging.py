"""Stage a batch of queued runs in one call: the work behind ``sequence.py stage``.

The controller (``playbooks/enqueue.yml``) renders every file of a batch of runs with Ansible's own
Jinja, from the same templates as the per-run path, and hands them over as one JSON document on
stdin instead of ~10 module round trips per run. Per run this module recreates the run directory,
writes the files with their modes and checks those marked ``"check": "bash"`` with ``bash -n`` (what
the template module's ``validate`` did). Everything is checked before anything is written: a bad
document or a launch script bash refuses changes nothing. The queue entries go into
``queue/.staging/`` and are renamed into ``queue/`` in run order only after every run directory of the
batch is complete, so the sequencer never sees a half-made entry.

Document (version 1; specab/node/README.md)::

    {"version": 1,
     "runs": [{"seq": 1, "run_id": "001-baseline",
               "files": [{"name": "launch.sh", "mode": "0700", "content": "...", "check": "bash"}, ...],
               "entry": {<the queue entry: docs/architecture.md "Run queue">}}]}

stdlib only, like every node tool; the queue's layout and the entry's rules come from ``sequence.py``.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
from typing import Any, Callable, Dict, List, Sequence

from specab.node.cli import ToolError
from specab.vocab import contract

VERSION = 1
FILE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
MODE_RE = re.compile(r"^0?[0-7]{3}$")
RUN_DIR_MODE = 0o700     # a run directory holds the engine's argv, env and log, which may carry a secret
QUEUE_MODE = 0o700
ENTRY_MODE = 0o600
CHECKS = {"bash": ["bash", "-n"]}      # "check" value -> the command that reads the file on stdin
CHECK_TIMEOUT_S = 30.0

# check_entry(data, name) validates one queue entry as the sequencer will read it (raises ValueError)
EntryCheck = Callable[[Dict[str, Any], str], Any]


class StagedFile(object):
    def __init__(self, name: str, mode: int, content: str, check: str) -> None:
        self.name = name
        self.mode = mode
        self.content = content
        self.check = check


class StagedRun(object):
    def __init__(self, seq: int, run_id: str, run_dir: str, files: List[StagedFile], entry: Dict[str, Any]) -> None:
        self.seq = seq
        self.run_id = run_id
        self.run_dir = run_dir
        self.files = files
        self.entry = entry

    @property
    def entry_name(self) -> str:
        return "%06d-%s.json" % (self.seq, self.run_id)


def _file(run_id: str, raw: Any) -> StagedFile:
    if not isinstance(raw, dict):
        raise ToolError("run %s: every file must be an object {name, mode, content[, check]}, got %s"
                        % (run_id, type(raw).__name__))
    name, mode, content = raw.get("name"), raw.get("mode"), raw.get("content")
    check = raw.get("check") or ""
    if not isinstance(name, str) or not FILE_NAME_RE.match(name):
        raise ToolError("run %s: file name %r is not a plain file name ([A-Za-z0-9][A-Za-z0-9._-]*)" % (run_id, name))
    if not isinstance(mode, str) or not MODE_RE.match(mode):
        raise ToolError("run %s: %s has mode %r; give it as an octal string such as \"0644\"" % (run_id, name, mode))
    if not isinstance(content, str):
        raise ToolError("run %s: %s has no text content" % (run_id, name))
    if check not in ("",) + tuple(CHECKS):
        raise ToolError("run %s: %s asks for check %r; known: %s" % (run_id, name, check, ", ".join(sorted(CHECKS))))
    return StagedFile(name, int(mode, 8), content, check)


def parse(text: str, node_dir: str, experiment_id: str, check_entry: EntryCheck) -> List[StagedRun]:
    """The batch of ``text``, every part checked; ToolError naming the run and what to fix otherwise."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ToolError("the batch on stdin is not JSON (%s); enqueue.yml writes it, see specab/node/README.md"
                        % exc)
    if not isinstance(doc, dict) or doc.get("version") != VERSION or not isinstance(doc.get("runs"), list):
        raise ToolError("the batch on stdin must be {\"version\": %d, \"runs\": [...]} (specab/node/README.md)"
                        % VERSION)
    runs: List[StagedRun] = []
    seen = set()
    for raw in doc["runs"]:
        if not isinstance(raw, dict):
            raise ToolError("every run of the batch must be an object {seq, run_id, files, entry}")
        run_id = str(raw.get("run_id") or "")
        if not contract.ID_RE.match(run_id):
            raise ToolError("run id %r of the batch is not a run id (<seq>-<arm>)" % run_id)
        if run_id in seen:
            raise ToolError("run %s is twice in the batch" % run_id)
        seen.add(run_id)
        try:
            seq = int(raw.get("seq"))
        except (TypeError, ValueError):
            raise ToolError("run %s: seq %r is not a number" % (run_id, raw.get("seq")))
        entry = raw.get("entry")
        if not isinstance(entry, dict):
            raise ToolError("run %s has no queue entry" % run_id)
        if entry.get("run_id") != run_id or entry.get("experiment_id") != experiment_id:
            raise ToolError("run %s: its queue entry names run %r of experiment %r, not run %s of %s"
                            % (run_id, entry.get("run_id"), entry.get("experiment_id"), run_id, experiment_id))
        run = StagedRun(seq, run_id, os.path.join(node_dir, "runs", run_id), [], entry)
        if not contract.QUEUE_ENTRY_RE.match(run.entry_name):
            raise ToolError("run %s: seq %d does not make a queue entry name <seq:06d>-<run_id>.json" % (run_id, seq))
        try:
            check_entry(entry, run.entry_name)
        except ValueError as exc:
            raise ToolError("run %s: the sequencer would refuse its queue entry: %s" % (run_id, exc))
        files = raw.get("files")
        if not isinstance(files, list) or not files:
            raise ToolError("run %s has no files to write" % run_id)
        run.files = [_file(run_id, f) for f in files]
        names = [f.name for f in run.files]
        if len(set(names)) != len(names):
            raise ToolError("run %s names a file twice: %s" % (run_id, ", ".join(names)))
        runs.append(run)
    return runs


def check_files(runs: Sequence[StagedRun]) -> None:
    """Each file marked with a check passes it (``bash -n`` for a launch script), before anything is written."""
    for run in runs:
        for f in run.files:
            if not f.check:
                continue
            try:
                proc = subprocess.run(CHECKS[f.check], input=f.content, capture_output=True, text=True,
                                      timeout=CHECK_TIMEOUT_S)
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise ToolError("run %s: cannot check %s with `%s`: %s" % (run.run_id, f.name, " ".join(CHECKS[f.check]),
                                                                          exc))
            if proc.returncode != 0:
                raise ToolError("run %s: %s fails `%s` (%s); nothing of this batch of %d run(s) was written or "
                                "queued. It was rendered from the launch template (templates/launch_server.sh.j2) "
                                "with this arm's values: fix the template or the value the error points at"
                                % (run.run_id, f.name, " ".join(CHECKS[f.check]),
                                   contract.redact_text((proc.stderr or proc.stdout).strip()) or
                                   "exit %d" % proc.returncode, len(runs)))


def _write(path: str, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), mode)
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def _fresh_dir(path: str) -> None:
    if os.path.islink(path) or os.path.isfile(path):
        os.remove(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.mkdir(path, RUN_DIR_MODE)
    os.chmod(path, RUN_DIR_MODE)


def make_queue_dir(path: str) -> None:
    """queue/ or its .staging/ (0700: entries carry the node env), created when missing."""
    os.makedirs(path, QUEUE_MODE, exist_ok=True)
    os.chmod(path, QUEUE_MODE)


def entry_text(entry: Dict[str, Any]) -> str:
    return json.dumps(entry, indent=4, sort_keys=True) + "\n"


def stage(runs: Sequence[StagedRun], queue: str, staging: str) -> Dict[str, Any]:
    """Write every run directory and staged entry, then rename the entries into ``queue`` in run order."""
    check_files(runs)
    make_queue_dir(queue)
    make_queue_dir(staging)
    staged: List[str] = []
    try:
        for run in runs:
            _fresh_dir(run.run_dir)
            for f in run.files:
                _write(os.path.join(run.run_dir, f.name), f.content.encode("utf-8"), f.mode)
            path = os.path.join(staging, run.entry_name)
            tmp = os.path.join(staging, ".tmp-%d-%s" % (os.getpid(), run.entry_name))
            _write(tmp, entry_text(run.entry).encode("utf-8"), ENTRY_MODE)
            os.replace(tmp, path)
            staged.append(path)
    except OSError as exc:
        for path in staged:          # a batch is queued whole or not at all
            with contextlib.suppress(OSError):
                os.remove(path)
        raise ToolError("staging the batch failed at %s: %s; nothing of it was queued" % (exc.filename or "?", exc))
    queued: List[str] = []
    for run, path in zip(runs, staged):
        try:
            os.replace(path, os.path.join(queue, run.entry_name))
        except OSError as exc:
            raise ToolError("queuing %s failed: %s; queued before it: %s (the rest stay in %s until a reset)"
                            % (run.entry_name, exc, ", ".join(queued) or "none", staging), {"queued": queued})
        queued.append(run.entry_name)
    return {"queued": queued,
            "runs": [{"run_id": r.run_id, "run_dir": r.run_dir, "files": [f.name for f in r.files]} for r in runs]}
