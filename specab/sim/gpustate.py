"""Per-node simulated GPU state kept in a directory (``SPECAB_SIM_STATE``).

Layout of the state directory::

    node.json                 GPUs of this node (count, uuids, name, total memory, look), epoch
    allocs/<pid>-<ticks>.json one file per process holding simulated GPU memory
    activity.json             which GPUs a server is currently computing on (utilization, clocks)
    instances                 launch counter (per-instance speed offset)
    flushes.jsonl             one line per /flush_cache a server of this node answered: {instance, t, ok}
    watcher.lock              held by the death watcher (specab.sim.watcher)

An allocation is a compute process while its pid is alive (same start time, not a zombie). When it
dies, the watcher records ``dead_at`` (pidfd: the exact time of death) and the memory stays counted
until ``dead_at + release_lag_s``: the compute-app entry disappears first, memory.used drops after.
Two nodes with different state directories share nothing.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

from specab.sim.procutil import is_alive, proc_start_ticks

DEFAULT_STATE = "/tmp/specab-sim/default"


def state_dir_from_env() -> Path:
    return Path(os.environ.get("SPECAB_SIM_STATE") or DEFAULT_STATE)


def _atomic_write(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, sort_keys=True))
    os.replace(tmp, path)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def gpu_uuid(state: Path, index: int) -> str:
    h = hashlib.sha256(f"{state.resolve()}#{index}".encode()).hexdigest()
    return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


@dataclass(frozen=True)
class Allocation:
    path: Path
    pid: int
    start_ticks: Optional[int]
    gpu: int
    mib: int
    process_name: str
    kind: str
    release_lag_s: float
    dead_at: Optional[float]
    app_exit_lag_s: float = 0.0

    def listed(self, now: float) -> bool:
        """Shown by --query-compute-apps: alive, or dead for less than ``app_exit_lag_s`` (tearing down)."""
        if self.alive:
            return True
        if self.app_exit_lag_s <= 0:
            return False
        return self.dead_at is None or now < self.dead_at + self.app_exit_lag_s

    @property
    def alive(self) -> bool:
        return self.dead_at is None and is_alive(self.pid, self.start_ticks)

    def holds_memory(self, now: float) -> bool:
        if self.alive:
            return True
        if self.dead_at is None:     # death not yet recorded by the watcher: count it as just died
            return True
        return now < self.dead_at + self.release_lag_s


class GpuNode:
    """Read and change one simulated node's GPU state."""

    def __init__(self, state: Path):
        self.state = Path(state)
        self.allocs_dir = self.state / "allocs"

    # ----- node description
    def ensure(self, profile_ref: Optional[str] = None) -> dict[str, Any]:
        """Create the node on first use (GPUs from the profile) and return node.json."""
        path = self.state / "node.json"
        if path.is_file():
            return json.loads(path.read_text())
        self.state.mkdir(parents=True, exist_ok=True)
        self.allocs_dir.mkdir(exist_ok=True)
        with _locked(self.state / ".node.lock"):
            if path.is_file():
                return json.loads(path.read_text())
            node = self._fresh(profile_ref)
            _atomic_write(path, node)
            return node

    def _fresh(self, profile_ref: Optional[str] = None) -> dict[str, Any]:
        from specab.sim.profile import load_profile  # lazy: smi stays light once node.json exists
        prof = load_profile(profile_ref or os.environ.get("SPECAB_SIM_PROFILE"))
        g = prof.gpu
        return {
            "created_at": time.time(),
            "profile": prof.name,
            "name": g.name,
            "memory_total_mib": g.memory_total_mib,
            "clocks_max_sm": g.clocks_max_sm,
            "power_limit_w": g.power_limit_w,
            "idle": vars(g.idle), "busy": vars(g.busy),
            "release_lag_s": g.release_lag_s,
            "gpus": [{"index": i, "uuid": gpu_uuid(self.state, i)} for i in range(g.count)],
        }

    def describe(self) -> dict[str, Any]:
        """The node as a query sees it, written nowhere: nvidia-smi changes nothing on a node, so a node nothing ran
        on yet is described from its profile without creating its state (the same GPUs and UUIDs `ensure` writes)."""
        path = self.state / "node.json"
        if path.is_file():
            return json.loads(path.read_text())
        return self._fresh()

    def next_instance(self) -> int:
        self.ensure()
        counter = self.state / "instances"
        with _locked(self.state / ".instances.lock"):
            n = int(counter.read_text()) if counter.is_file() else 0
            counter.write_text(str(n + 1))
        return n

    def record_flush(self, instance: int, ok: bool) -> None:
        """A /flush_cache answered by server instance ``instance`` (done, or refused while requests ran or waited)."""
        self.ensure()
        with _locked(self.state / ".instances.lock"), open(self.state / "flushes.jsonl", "a") as fh:
            fh.write(json.dumps({"instance": instance, "t": time.time(), "ok": ok}) + "\n")

    # ----- allocations
    def allocate(self, gpu: int, mib: int, kind: str, release_lag_s: float, spawn_watcher: bool = True,
                 app_exit_lag_s: float = 0.0) -> Allocation:
        node = self.ensure()
        if not 0 <= gpu < len(node["gpus"]):
            raise ValueError(f"GPU {gpu} does not exist on this simulated node "
                             f"({len(node['gpus'])} GPUs, state {self.state})")
        pid = os.getpid()
        ticks = proc_start_ticks(pid)
        path = self.allocs_dir / f"{pid}-{ticks}.json"
        data = {"pid": pid, "start_ticks": ticks, "gpu": gpu, "mib": int(mib),
                "process_name": sys.executable, "kind": kind,
                "release_lag_s": float(release_lag_s), "dead_at": None,
                "app_exit_lag_s": float(min(app_exit_lag_s, release_lag_s))}
        self.allocs_dir.mkdir(parents=True, exist_ok=True)
        _atomic_write(path, data)
        if spawn_watcher:
            self.ensure_watcher()
        return self._load(path)  # type: ignore[return-value]

    def _load(self, path: Path) -> Optional[Allocation]:
        try:
            d = json.loads(path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        return Allocation(path=path, pid=d["pid"], start_ticks=d.get("start_ticks"), gpu=d["gpu"],
                          mib=d["mib"], process_name=d["process_name"], kind=d.get("kind", ""),
                          release_lag_s=d.get("release_lag_s", 0.15),
                          dead_at=d.get("dead_at"), app_exit_lag_s=d.get("app_exit_lag_s", 0.0))

    def allocations(self) -> list[Allocation]:
        if not self.allocs_dir.is_dir():
            return []
        return [a for a in map(self._load, sorted(self.allocs_dir.glob("*.json"))) if a is not None]

    def record_death(self, alloc: Allocation, when: float) -> None:
        try:
            d = json.loads(alloc.path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return
        if d.get("dead_at") is None:
            d["dead_at"] = when
            _atomic_write(alloc.path, d)

    def reap_released(self) -> int:
        """Delete allocation files whose memory has been released; returns how many remain."""
        now = time.time()
        remaining = 0
        for a in self.allocations():
            if a.dead_at is not None and now >= a.dead_at + a.release_lag_s:
                with contextlib.suppress(FileNotFoundError):
                    a.path.unlink()
            else:
                remaining += 1
        return remaining

    def memory_used(self, now: Optional[float] = None) -> dict[int, int]:
        now = time.time() if now is None else now
        used = {g["index"]: 0 for g in self.describe()["gpus"]}
        for a in self.allocations():
            if a.gpu in used and a.holds_memory(now):
                used[a.gpu] += a.mib
        return used

    def compute_apps(self, now: Optional[float] = None) -> list[Allocation]:
        now = time.time() if now is None else now
        return sorted((a for a in self.allocations() if a.listed(now)), key=lambda a: (a.gpu, a.pid))

    # ----- activity (utilization and clocks while a server computes)
    def set_activity(self, gpus: list[int], busy_for_s: float, clock_ratio: float = 1.0,
                     reasons: int = 0) -> None:
        """A server computes on ``gpus`` for the next ``busy_for_s`` s; ``clock_ratio`` < 1 and ``reasons``
        (NVML clock event bits) while the throttle fault holds its clocks down."""
        _atomic_write(self.state / "activity.json",
                      {"gpus": gpus, "busy_until": time.time() + busy_for_s, "pid": os.getpid(),
                       "clock_ratio": clock_ratio, "reasons": reasons})

    def _activity(self, now: Optional[float]) -> dict[str, Any]:
        now = time.time() if now is None else now
        try:
            d = json.loads((self.state / "activity.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}
        if now < d.get("busy_until", 0) and is_alive(d.get("pid", -1)):
            return d
        return {}

    def busy_look(self, now: Optional[float] = None) -> tuple[set[int], float, int]:
        """(busy GPUs, SM clock ratio, clock event reasons while busy) in one read of activity.json."""
        d = self._activity(now)
        return set(d.get("gpus", [])), float(d.get("clock_ratio", 1.0)), int(d.get("reasons", 0))

    # ----- death watcher
    def watcher_running(self) -> bool:
        lock = self.state / "watcher.lock"
        with open(lock, "a+") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(fh, fcntl.LOCK_UN)
            return False

    def ensure_watcher(self) -> None:
        if self.watcher_running():
            return
        # double fork: the watcher is re-parented to init at once (no zombie under the holder) and
        # lives in its own session with no inherited descriptors (it never holds a log pipe open)
        argv = [sys.executable, "-m", "specab.sim.watcher", str(self.state)]
        env = {**os.environ, "PYTHONPATH": _pythonpath()}
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the forked child
            try:
                os.setsid()
                if os.fork() == 0:
                    fd = os.open(os.devnull, os.O_RDWR)
                    for target in (0, 1, 2):
                        os.dup2(fd, target)
                    os.closerange(3, 65536)
                    os.chdir("/")
                    os.execve(sys.executable, argv, env)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)


def _pythonpath() -> str:
    root = str(Path(__file__).resolve().parents[2])
    existing = os.environ.get("PYTHONPATH", "")
    return root if not existing else f"{root}{os.pathsep}{existing}"
