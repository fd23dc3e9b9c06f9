"""The experiment's node leases: one experiment per node directory at a time.

Before anything on a node is touched (the first enqueue or stop), the session takes the lease of every host
it will use (``specab/node/lease.py`` with its ``LeaseSpec``, run over the driver's node access as a ``python -c``
program, ``nodeprogram``, so it needs no deployed tool: docs/decisions/0009), touches them from one heartbeat
thread every ``specab_lease_heartbeat_s`` while the experiment runs (the lease file's mtime is the controller's
one sign of life, read by the next experiment and by the run queue's sequencer), and releases them on every exit
path (``NodeLeases`` is a context manager). A lease held by another live controller refuses the experiment
(``LeaseHeld``: the CLI's exit 2, naming the holder); a stale one (no sign of life for ``stale_s``, the
sequencer's ``--lease-s`` rule) is broken with a notice.
"""
from __future__ import annotations

import dataclasses
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from specab.config import defaults
from specab.config.inventory import Host
from specab.driver import nodeprogram
from specab.driver.remote import RemoteError, open_node
from specab.node import lease as node_lease

CALL_TIMEOUT_S = 60.0


class LeaseError(Exception):
    """A lease could not be taken (the node unreachable, the tool failed): what, where, what to do."""


class LeaseHeld(LeaseError):
    """Another experiment holds a node's lease."""


def lease_argv(python: str, spec: node_lease.LeaseSpec) -> list[str]:
    """The argv that runs the lease tool with ``spec`` where no node tool is deployed."""
    return [python, "-c", nodeprogram.tool_program("lease"), "--spec-json",
            json.dumps(dataclasses.asdict(spec))]


def call(host: Host, command: str, timeout: float = CALL_TIMEOUT_S, **fields: Any) -> tuple[int, dict[str, Any]]:
    """Run the lease tool's ``command`` on ``host`` (``fields``: the rest of its ``LeaseSpec``): (exit status, its
    JSON output)."""
    python = str(host.vars.get("specab_python") or "python3")
    argv = lease_argv(python, node_lease.LeaseSpec(node_dir=host.node_dir, command=command, **fields))
    node = open_node(host)
    try:
        rc, out, err = node.run(argv, timeout=timeout)
    finally:
        node.close()
    try:
        data = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
    except (ValueError, IndexError):
        data = {}
    if not isinstance(data, dict):
        data = {}
    if rc not in (0, 1) or (rc == 1 and "error" not in data):
        data.setdefault("error", f"the lease tool exited with {rc}: {(err or out).strip()[-500:]}")
    return rc, data


@dataclass
class LeaseState:
    """Who holds one host's node lease (``driver.py status``): holder None = the node is free."""

    host: str
    holder: dict[str, Any] | None = None
    stale: str | None = None          # why the next experiment would break it
    idle_s: float | None = None       # seconds since the holder's last sign of life
    error: str | None = None          # the lease could not be read

    def text(self) -> str:
        if self.error:
            return f"{self.host}: node lease unknown ({self.error})"
        if self.holder is None:
            return f"{self.host}: node free (no experiment holds its lease)"
        h = self.holder
        line = (f"{self.host}: node leased by experiment {h.get('experiment_id', '?')} (controller "
                f"{h.get('controller_host', '?')} pid {h.get('controller_pid', '?')}, since "
                f"{h.get('started_at_iso') or h.get('started_at', '?')})")
        if self.stale:
            line += f"; stale: {self.stale}; the next experiment breaks it"
        return line


def stale_s_of(host: Host) -> float:
    """Seconds without a sign of life after which a lease on ``host`` is broken: the host's
    ``specab_lease_stale_s``, else roles/specab's (the sequencer's ``--lease-s``, from enqueue.yml, is the same)."""
    return float(host.vars.get("specab_lease_stale_s", defaults.get("lease_stale_s")))


def heartbeat_s_of(host: Host) -> float:
    """Seconds between two touches of ``host``'s lease: the host's ``specab_lease_heartbeat_s``, else roles/specab's."""
    return float(host.vars.get("specab_lease_heartbeat_s", defaults.get("lease_heartbeat_s")))


def lease_state(host: Host) -> LeaseState:
    """Read one host's node lease (read-only)."""
    try:
        rc, data = call(host, "show", stale_s=stale_s_of(host))
    except RemoteError as exc:
        return LeaseState(host=host.name, error=str(exc))
    if rc != 0:
        return LeaseState(host=host.name, error=str(data.get("error")))
    holder = data.get("holder")
    return LeaseState(host=host.name, holder=holder if isinstance(holder, dict) else None,
                      stale=data.get("stale"), idle_s=data.get("idle_s"))


def lease_states(hosts: list[Host]) -> list[LeaseState]:
    """``lease_state`` of every host, in parallel (in inventory order)."""
    with ThreadPoolExecutor(max_workers=max(1, min(32, len(hosts)))) as pool:
        return list(pool.map(lease_state, hosts))


def hold(host: Host) -> None:
    """Put ``host``'s lease, held by this process, on hold (``NodeLeases.hold``)."""
    leases = NodeLeases.active
    if leases is None:
        raise LeaseError(f"{host.name}: this process holds no node lease to put on hold")
    leases.hold(host)


def active_holder() -> dict[str, Any] | None:
    """The holder record of the leases this process holds now (the driver's stop.yml runs under it)."""
    leases = NodeLeases.active
    return dict(leases.holder) if leases is not None else None


class NodeLeases:
    """The leases of one experiment on a set of hosts (context manager: taken on enter, released on exit)."""

    active: "NodeLeases | None" = None     # the leases this process holds (one experiment per driver process)

    def __init__(self, hosts: list[Host], experiment_id: str, notice: Callable[[str], None],
                 stale_s: float | None = None, heartbeat_s: float | None = None):
        self.hosts = hosts
        self.notice = notice
        # one value for the experiment (the holder record is one): the shortest of its hosts'
        self.stale_s = stale_s if stale_s is not None else min((stale_s_of(h) for h in hosts),
                                                               default=float(defaults.get("lease_stale_s")))
        self.heartbeat_s = heartbeat_s if heartbeat_s is not None else min(
            (heartbeat_s_of(h) for h in hosts), default=float(defaults.get("lease_heartbeat_s")))
        started = time.time()
        self.holder = {"experiment_id": experiment_id, "controller_host": socket.gethostname(),
                       "controller_pid": os.getpid(), "started_at": round(started, 3),
                       "started_at_iso": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
                       "token": uuid.uuid4().hex}
        self.taken: list[Host] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ take / release
    def take(self) -> None:
        """Take every host's lease, or none: on a refusal the ones already taken are released. Taking
        leases already held is a no-op (``with NodeLeases(...).take()`` or ``with NodeLeases(...)``)."""
        if self._thread is not None:
            return
        if not 0 < self.heartbeat_s < self.stale_s:
            raise LeaseError(f"the lease's heartbeat ({self.heartbeat_s:g} s, specab_lease_heartbeat_s) must be "
                             f"positive and shorter than its stale age ({self.stale_s:g} s, specab_lease_stale_s): "
                             f"set them so in the inventory or roles/specab/defaults/main.yml")
        try:
            for h in self.hosts:
                self._take_one(h)
        except BaseException:
            self.release()
            raise
        self._thread = threading.Thread(target=self._heartbeat, name="node-lease-heartbeat", daemon=True)
        self._thread.start()
        NodeLeases.active = self

    def _take_one(self, host: Host) -> None:
        where = f"{host.name}:{host.node_dir}"
        try:
            rc, data = call(host, "take", holder=self.holder, stale_s=self.stale_s)
        except RemoteError as exc:
            raise LeaseError(f"cannot take the node lease of {where}: {exc}") from None
        if rc == 1 and data.get("held"):
            raise LeaseHeld(f"{host.name}: {data['error']}")
        if rc != 0:
            raise LeaseError(f"cannot take the node lease of {where}: {data.get('error')}")
        self.taken.append(host)
        broken = data.get("broken")
        if isinstance(broken, dict):
            self.notice(f"{host.name}: {broken.get('notice')}")

    def hold(self, host: Host) -> None:
        """The experiment was interrupted: put ``host``'s lease on hold, so that its sequencer claims and starts no
        further run at once (it reads the lease; the stop playbook that follows takes seconds to start)."""
        if host not in self.taken:
            raise LeaseError(f"{host.name}: this experiment holds no node lease there to put on hold")
        try:
            rc, data = call(host, "hold", token=self.holder["token"])
        except RemoteError as exc:
            raise LeaseError(f"{host.name}: could not put the node lease on hold: {exc}") from None
        if rc != 0:
            raise LeaseError(f"{host.name}: could not put the node lease on hold: {data.get('error')}")

    def release(self) -> None:
        """Release every lease taken (never raises: an exit path must not fail on it)."""
        self._stop.set()
        if NodeLeases.active is self:
            NodeLeases.active = None
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=CALL_TIMEOUT_S)
        for h in list(self.taken):
            try:
                rc, data = call(h, "release", token=self.holder["token"])
                if rc == 0 and data.get("released") is False and data.get("holder"):
                    self.notice(f"{h.name}: the node lease was no longer ours at the end (held by "
                                f"{node_lease.describe(data['holder'])})")
            except Exception as exc:    # unreachable node: the lease goes stale after stale_s
                self.notice(f"WARNING: {h.name}: could not release the node lease ({exc}); it is broken by the "
                            f"next experiment after {self.stale_s:g} s without sign of life")
            self.taken.remove(h)

    # ------------------------------------------------------------------ sign of life
    def _heartbeat(self) -> None:
        """Touch every lease taken, every ``heartbeat_s``: the controller's one sign of life on its nodes."""
        warned: set[str] = set()
        while not self._stop.wait(self.heartbeat_s):
            for h in list(self.taken):
                try:
                    rc, data = call(h, "touch", token=self.holder["token"])
                except Exception as exc:
                    rc, data = 1, {"error": str(exc)}
                if rc != 0 and h.name not in warned:
                    warned.add(h.name)
                    self.notice(f"WARNING: {h.name}: refreshing the node lease failed: {data.get('error')}")

    def __enter__(self) -> "NodeLeases":
        self.take()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
