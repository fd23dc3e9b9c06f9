"""Recording a run on the controller: its phase clock, the collected directory into the store, what a
failed run left on the node, the log excerpt of a failure.

Shared by every executor (per-run, queue, fleet): one implementation of "what a run leaves in the store".
"""
from __future__ import annotations

import json
import os
import re
import shutil
import tarfile
import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from specab.analysis.evidence.model import bench_records
from specab.config.inventory import Host
from specab.driver.options import ExperimentError
from specab.driver.progress import Progress
from specab.driver.remote import open_node, shell_path
from specab.results import store as st
from specab.vocab.contract import FIRST_ERROR_RE, HELPERS_JSON, PRIVATE_RUN_FILES
from specab.vocab.phases import stored_phase_name

MIN_FREE_MB = 50
# a run's small files (JSON, CSV) are kept in the store up to this size each
STORED_FILE_MAX_BYTES = 256 * 1024
# the failure reason of a run the user interrupted (SIGINT/SIGTERM to the driver), on every executor
INTERRUPTED_REASON = "interrupted by the user (SIGINT/SIGTERM)"
# What a run's teardown records in its run directory (the run queue's RunSteps.teardown, run_arm.yml's stop and
# rescue, stop.yml for an interrupted per-run run): its stop, its GPUs verified free and its manifest.
TEARDOWN_FILES = ("stop.json", "gpu_free.json", "gpu_free.csv", "manifest.json")
# The experiment directory and each run's on the controller: their owner's alone, as the node's run directories
# (the files in them, launch.sh, args.json, server.log, may have held a secret, and their names and the logs tell
# what ran)
PRIVATE_DIR_MODE = 0o700


def node_run_dir(host: Host, run_id: str) -> str:
    """A run's directory on the node (docs/architecture.md "Node layout")."""
    return host.node_dir.rstrip("/") + f"/runs/{run_id}"


def check_writable(directory: Path, min_free_mb: int = MIN_FREE_MB) -> None:
    """Refuse a run directory that is a file, unwritable or on a full disk before a run starts."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        # one probe per thread: a fleet's host threads check the experiment directory at once
        probe = directory / f".write-test-{os.getpid()}-{threading.get_ident()}"
        probe.write_text("ok")
        probe.unlink()
    except (NotADirectoryError, FileExistsError):
        file = next((p for p in (directory, *directory.parents) if p.exists() and not p.is_dir()), directory)
        raise ExperimentError(f"{directory}: not a directory ({file} is a file). Pass --runs-dir a directory, or "
                              f"move the file away.") from None
    except OSError as exc:
        raise ExperimentError(f"{directory}: the run directory is not writable ({exc.strerror}). Fix its "
                              f"permissions or pass --runs-dir to another directory.") from None
    free_mb = shutil.disk_usage(directory).free / 1e6
    if free_mb < min_free_mb:
        raise ExperimentError(f"{directory}: only {free_mb:.0f} MB free on its disk (need at least {min_free_mb} MB "
                              f"for a run's logs and records). Free some space or pass --runs-dir.")


class PhaseClock:
    """Phase timings of one run (driver side), fed by Ansible task events and the log tail."""

    def __init__(self, progress: Progress):
        self.progress = progress
        self.times: list[tuple[str, float, float | None]] = []
        self.current: str | None = None
        self._lock = threading.Lock()

    def enter(self, phase: str, at: float | None = None) -> None:
        """Phase `phase` begins, now or at `at` (a time past: a node tool's phase told by its result)."""
        with self._lock:
            if phase == self.current:
                return
            now = time.time() if at is None else at
            if self.times and self.times[-1][2] is None:
                self.times[-1] = (self.times[-1][0], self.times[-1][1], now)
            self.current = phase
            self.times.append((stored_phase_name(phase, [t[0] for t in self.times]), now, None))
        self.progress.phase(phase)

    def close(self) -> None:
        with self._lock:
            if self.times and self.times[-1][2] is None:
                self.times[-1] = (self.times[-1][0], self.times[-1][1], time.time())

    def phase_at(self, t: float) -> str | None:
        """The phase (display name) that was current at time `t`."""
        with self._lock:
            return phase_at(self.times, t) or self.current

    def load_phases(self) -> dict[str, float]:
        """Seconds from the start of `starting` to each load phase reached."""
        start = next((t0 for name, t0, _ in self.times if name == "starting"), None)
        if start is None:
            return {}
        return {name.replace(" ", "_") + "_s": round(t0 - start, 3) for name, t0, _ in self.times
                if name in ("loading weights", "capturing graphs", "ready")}


def phase_at(rows: list[tuple[str, float, float | None]], t: float) -> str | None:
    """The phase of stored phase rows (name, start, end) that was current at time `t` (None before the first)."""
    return next((re.sub(r" \(\d+\)$", "", name) for name, t0, _ in sorted(rows, key=lambda r: r[1], reverse=True)
                 if t0 <= t), None)


def log_excerpt(text: str, lines: int = 40, context: int = 6) -> str:
    """The last `lines` lines, preceded by the first fatal line (and a few after it) when that came
    earlier: with TP>1 the other ranks keep logging after rank 0 failed, burying the cause."""
    all_lines = text.splitlines()
    tail = all_lines[-lines:]
    head_end = len(all_lines) - len(tail)
    for i, line in enumerate(all_lines[:head_end]):
        if FIRST_ERROR_RE.search(line):
            first = all_lines[i:min(i + context, head_end)]
            gap = "[...]" if i + context < head_end else None
            return "\n".join(first + ([gap] if gap else []) + tail)
    return "\n".join(tail)


def tail_file(path: Path, lines: int = 40) -> str:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 256 * 1024))
        return log_excerpt(f.read().decode(errors="replace"), lines)


class UnpackError(Exception):
    """A fetched run archive could not be unpacked (unreadable, or a member that is not a plain file or a
    directory inside the run directory)."""


def unpack_fetched(archive: Path, dest: Path, run_ids: Collection[str]) -> list[str]:
    """Unpack `archive` (collect_run.yml's fetch of the node's packed runs: members ``<run id>/...``, the run
    waited for and the later ones that were done) into ``dest/<run id>``, then remove the archive. Returns the run
    ids it held, in its order ([] when there is no archive). As ``tar --no-same-owner -xf`` did in the collect
    role, with members checked first: only plain files and directories of a run of `run_ids`, none outside that
    run's directory (a node is another machine). Raises UnpackError; the archive is removed either way (the runs'
    files stay on the node)."""
    if not archive.exists():
        return []
    try:
        root = dest.resolve()
        held: list[str] = []
        with tarfile.open(archive) as tar:
            members = tar.getmembers()
            for m in members:
                run_id = m.name.split("/", 1)[0]
                target = (root / m.name).resolve()
                if run_id not in run_ids or not (m.isfile() or m.isdir()) \
                        or not target.is_relative_to(root / run_id):
                    raise UnpackError(f"{archive}: refusing member {m.name!r} (only plain files and directories "
                                      f"inside the directory of a run collected ({', '.join(run_ids)}) are unpacked)")
                m.uid, m.gid, m.uname, m.gname = os.getuid(), os.getgid(), "", ""   # --no-same-owner
                if run_id not in held:
                    held.append(run_id)
            root.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
            tar.extractall(root, members=members)
            for run_id in held:         # a directory takes the mode the node's had (an older node's: 0755)
                os.chmod(root / run_id, PRIVATE_DIR_MODE)
    except (OSError, tarfile.TarError) as exc:
        raise UnpackError(f"{archive}: the fetched run directory could not be unpacked: {exc}") from exc
    finally:
        archive.unlink(missing_ok=True)
    return held


def fetch_missing(host: Host, node_run_dir: str, dest: Path, only: Collection[str] = ()) -> None:
    """Copy the node's run files that the controller run dir lacks (after a failed run; read-only); ``only``: just
    these files, over the controller's copy (an interrupted run's TEARDOWN_FILES, written by the stop after it).
    The node's record of the run's helper processes (HELPERS_JSON, live while they run) is no file of the run."""
    try:
        node = open_node(host)
    except Exception:
        return
    try:
        rc, out, _ = node.sh(f"cd {shell_path(node_run_dir)} 2>/dev/null && ls -1A")
        if rc != 0:
            return
        dest.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
        os.chmod(dest, PRIVATE_DIR_MODE)
        for name in out.split():
            if "/" in name or name == HELPERS_JSON or (name not in only if only else (dest / name).exists()) \
                    or (dest / name).is_dir():
                continue
            data = node.read_from(f"{node_run_dir}/{name}", 0, max_bytes=64 << 20)
            if data is not None:
                (dest / name).unlink(missing_ok=True)      # a copy kept read-only is replaced, not written into
                (dest / name).write_bytes(data)
                if name in PRIVATE_RUN_FILES or name.endswith(".env"):
                    os.chmod(dest / name, PRIVATE_RUN_FILES.get(name, 0o600))
    except Exception:
        return
    finally:
        node.close()


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None


RANK_DIR = re.compile(r"node(\d+)-(.+)")


def rank_dirs(run_dir: Path) -> list[tuple[str, Path]]:
    """(host, directory) of a multi-node run's other ranks, by rank: rank r's files are collected into
    <run dir>/node<r>-<host>/ (playbooks/tasks/run_arm.yml, multi-node)."""
    found = []
    if run_dir.is_dir():
        for d in run_dir.iterdir():
            m = RANK_DIR.fullmatch(d.name)
            if m and d.is_dir() and int(m.group(1)) > 0:
                found.append((int(m.group(1)), m.group(2), d))
    return [(host, d) for _, host, d in sorted(found)]


def host_dirs(run_dir: Path, hosts: list[str]) -> list[tuple[str, Path]]:
    """(host, directory) of a collected run's files: a single host's (a multi-node head's) in the run directory and
    a multi-node run's other ranks' in theirs (rank_dirs); each host's of several own servers in <run dir>/<host>/."""
    return [(hosts[0], run_dir), *rank_dirs(run_dir)] if len(hosts) == 1 else [(h, run_dir / h) for h in hosts]


# The records a run's row keeps (store.finish_run's keyword, the file it is read from), each the first host's that
# has one: ingest_run_dir reads them all right after the run, ingest_teardown those of TEARDOWN_FILES after the stop.
ROW_RECORDS = (("summary", "bench_summary.json"), ("server_info", "server_info.json"), ("stop", "stop.json"),
               ("gpu_free", "gpu_free.json"), ("ready", "ready.json"))


def ingest_host_files(store: st.Store, seq: int, run_dir: Path, hosts: list[str],
                      wanted: Callable[[str], bool]) -> dict[str, Any]:
    """Each host's manifest and its small files of the collected run in ``run_dir`` whose name is ``wanted`` into
    the store (queue_entry.json never: it holds the node env the client ran with, which may carry a secret). Returns
    the ROW_RECORDS among them, each the first host's that has one. The one reading of a run directory's records
    shared by the run's row (ingest_run_dir) and a teardown recorded after it (ingest_teardown), so both store the
    same stop and GPUs-free records."""
    out: dict[str, Any] = {}
    for host, d in host_dirs(run_dir, hosts):
        if not d.is_dir():
            continue
        manifest = read_json(d / "manifest.json")
        if isinstance(manifest, dict):
            store.add_manifest(seq, host, manifest)
        for key, name in ROW_RECORDS:
            val = read_json(d / name) if wanted(name) and key not in out else None
            if val is not None:
                out[key] = val
        for f in sorted(d.iterdir()):
            if f.is_file() and wanted(f.name) and f.name not in ("manifest.json", "queue_entry.json") \
                    and f.stat().st_size <= STORED_FILE_MAX_BYTES:
                store.add_file(seq, host, f.name, f.read_text(errors="replace"))
    return out


def ingest_teardown(store: st.Store, seq: int, run_dir: Path, hosts: list[str]) -> None:
    """Add the records of a stop that came after the run's row was written (an interrupted per-run run's, stop.yml's
    TEARDOWN_FILES fetched into its directory) to that row: its stop and GPUs-free records, each host's files and
    manifest, read as ingest_run_dir reads them."""
    found = ingest_host_files(store, seq, run_dir, hosts, lambda name: name in TEARDOWN_FILES)
    store.record_teardown(seq, stop=found.get("stop"), gpu_free=found.get("gpu_free"))


def server_seq(run_dir: Path, seq: int) -> int:
    """The run whose server start run `seq` measured on: the start its instance.json names (a run that continued its
    instance's server, docs/decisions/0011), else the run itself."""
    rec = read_json(run_dir / "instance.json")
    started = str(rec.get("started_run_id") or "") if isinstance(rec, dict) else ""
    head = started.split("-", 1)[0]
    return int(head) if head.isdigit() else seq


def ingest_run_dir(store: st.Store, seq: int, run_dir: Path, hosts: list[str]) -> dict[str, Any]:
    """Read a collected run directory into the store (immediately after the run). A multi-node run's
    other ranks (their manifest, env check, GPU samples and small files) are stored under their hosts."""
    out: dict[str, Any] = {"measured": 0, "measured_ok": 0}
    for host, d in host_dirs(run_dir, hosts):
        if not d.is_dir():
            continue
        records = bench_records(d / "bench.jsonl")
        if records is not None:
            store.add_requests(seq, host, records)
            out["measured"] += sum(1 for r in records if not r.get("warmup"))
            out["measured_ok"] += sum(1 for r in records if not r.get("warmup") and r.get("ok"))
        samples = d / "gpu_samples.csv"
        if samples.exists():
            store.add_gpu_samples(seq, host, samples.read_text(errors="replace"))
        env_check = read_json(d / "env_check.json")
        if isinstance(env_check, dict):
            store.add_env_check(seq, host, env_check)
    # the GPU samples are stored as samples (above), not as a file
    # scores.jsonl: a baseline run's scores of outputs under the target (temperature > 0, specab/node/scoring.py)
    out.update(ingest_host_files(store, seq, run_dir, hosts,
                                 lambda name: (name.endswith((".json", ".csv")) and name != "gpu_samples.csv")
                                 or name == "scores.jsonl"))
    return out
