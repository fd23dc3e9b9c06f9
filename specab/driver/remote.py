"""The driver's own access to the nodes: `status` across hosts in parallel, server-log tail during load, the
preflight's probes, and the node lease's calls (driver/lease.py).

Ansible changes node state; through this module the driver writes only its node lease (the lease tool's take,
touch, hold, release: docs/decisions/0009-the-node-lease-is-the-one-write-outside-ansible.md), and otherwise reads. Hosts with `ansible_connection: local` are read
with local commands (fabric's Connection('localhost') would need an sshd); the others over SSH
with fabric, host keys checked (RejectPolicy) against the inventory's UserKnownHostsFile (or
~/.ssh/known_hosts) unless the inventory says StrictHostKeyChecking=no.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specab.config.inventory import Host

SMI_TIMEOUT_S = 10.0

class RemoteError(Exception):
    """A node could not be reached or a read failed (host and reason named)."""


def shell_path(path: str) -> str:
    """Quote a path for a remote shell, keeping a leading ~/ expandable."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


class Node:
    """Commands and file reads on one inventory host."""

    def __init__(self, host: Host):
        self.host = host

    def run(self, argv: list[str], timeout: float = SMI_TIMEOUT_S, env: dict[str, str] | None = None) \
            -> tuple[int, str, str]:
        raise NotImplementedError

    def sh(self, script: str, timeout: float = SMI_TIMEOUT_S) -> tuple[int, str, str]:
        return self.run(["sh", "-c", script], timeout=timeout)

    def read_from(self, path: str, offset: int, max_bytes: int = 1 << 20) -> bytes | None:
        """Bytes of `path` from `offset` (None when the file does not exist yet)."""
        raise NotImplementedError

    def close(self) -> None:
        pass


class LocalNode(Node):
    def run(self, argv: list[str], timeout: float = SMI_TIMEOUT_S, env: dict[str, str] | None = None) \
            -> tuple[int, str, str]:
        full_env = dict(os.environ)
        full_env.update(env or {})
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=full_env,
                               stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return 124, "", f"{argv[0]} did not answer within {timeout:g} s"
        except FileNotFoundError:
            return 127, "", f"{argv[0]}: command not found"
        return p.returncode, p.stdout, p.stderr

    def read_from(self, path: str, offset: int, max_bytes: int = 1 << 20) -> bytes | None:
        try:
            with open(os.path.expanduser(path), "rb") as f:
                f.seek(offset)
                return f.read(max_bytes)
        except FileNotFoundError:
            return None


class SshNode(Node):
    def __init__(self, host: Host, connect_timeout: float = 10.0):
        super().__init__(host)
        from fabric import Config, Connection
        from paramiko import AutoAddPolicy, RejectPolicy

        opts = host.ssh_options
        kwargs: dict[str, Any] = {}
        if host.key_file:
            kwargs["key_filename"] = os.path.expanduser(host.key_file)
            kwargs["look_for_keys"] = False
        cfg = Config(overrides={"load_ssh_configs": False, "run": {"in_stream": False}})
        self.conn = Connection(host.address, user=host.user, port=host.port, config=cfg,
                               connect_timeout=int(connect_timeout), connect_kwargs=kwargs)
        client = self.conn.client
        known = opts.get("userknownhostsfile")
        if known and known != "/dev/null":
            for f in known.split():
                if os.path.exists(os.path.expanduser(f)):
                    client.load_host_keys(os.path.expanduser(f))
        else:
            client.load_system_host_keys()
            default = os.path.expanduser("~/.ssh/known_hosts")
            if os.path.exists(default):
                client.load_host_keys(default)
        strict = opts.get("stricthostkeychecking", "yes").lower()
        client.set_missing_host_key_policy(AutoAddPolicy() if strict in ("no", "off", "accept-new")
                                           else RejectPolicy())

    def run(self, argv: list[str], timeout: float = SMI_TIMEOUT_S, env: dict[str, str] | None = None) \
            -> tuple[int, str, str]:
        cmd = shlex.join(argv)
        if env:
            cmd = "env " + " ".join(shlex.quote(f"{k}={v}") for k, v in env.items()) + " " + cmd
        from invoke.exceptions import CommandTimedOut
        try:
            r = self.conn.run(cmd, hide=True, warn=True, timeout=timeout, in_stream=False)
        except CommandTimedOut:
            return 124, "", f"{argv[0]} did not answer within {timeout:g} s on {self.host.name}"
        except Exception as exc:      # paramiko/socket errors: name the host
            raise RemoteError(f"{self.host.name} ({self.host.address}:{self.host.port}): {type(exc).__name__}: "
                              f"{exc}") from exc
        return r.exited, r.stdout, r.stderr

    def read_from(self, path: str, offset: int, max_bytes: int = 1 << 20) -> bytes | None:
        p = shell_path(path)
        rc, out, _ = self.run(["sh", "-c", f"test -f {p} || exit 3; tail -c +{offset + 1} {p} | head -c {max_bytes}"])
        if rc == 3:
            return None
        return out.encode()

    def close(self) -> None:
        self.conn.close()


def open_node(host: Host) -> Node:
    return LocalNode(host) if host.is_local else SshNode(host)


# --------------------------------------------------------------------------- status

@dataclass
class GpuRow:
    index: str
    memory_used_mib: str
    memory_total_mib: str
    processes: list[str] = field(default_factory=list)


@dataclass
class HostStatus:
    host: str
    ok: bool
    gpus: list[GpuRow] = field(default_factory=list)
    server: dict[str, Any] | None = None
    server_running: bool = False
    error: str | None = None


def _csv(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.split(",")] for line in text.splitlines() if line.strip()]


def host_status(host: Host) -> HostStatus:
    """GPU memory and compute processes, and our server (server.json) on one host."""
    try:
        node = open_node(host)
    except Exception as exc:
        return HostStatus(host=host.name, ok=False, error=f"cannot connect: {exc}")
    try:
        env = host.node_env if host.is_local else None
        smi = host.smi_cmd
        if not host.is_local and host.node_env:
            env = host.node_env
        rc, out, err = node.run(smi + ["--query-gpu=index,uuid,memory.used,memory.total",
                                       "--format=csv,noheader,nounits"], env=env)
        if rc != 0:
            return HostStatus(host=host.name, ok=False,
                              error=f"{shlex.join(smi)} failed (rc {rc}): {(err or out).strip()[:300]}")
        gpus: list[GpuRow] = []
        by_uuid: dict[str, GpuRow] = {}
        for row in _csv(out):
            if len(row) >= 4:
                g = GpuRow(index=row[0], memory_used_mib=row[2], memory_total_mib=row[3])
                gpus.append(g)
                by_uuid[row[1]] = g
        rc, out, err = node.run(smi + ["--query-compute-apps=gpu_uuid,pid,process_name,used_memory",
                                       "--format=csv,noheader,nounits"], env=env)
        if rc == 0:
            for row in _csv(out):
                if len(row) >= 4 and row[0] in by_uuid:
                    by_uuid[row[0]].processes.append(f"{row[1]} {row[2]} ({row[3]} MiB)")
        server = None
        running = False
        raw = node.read_from(host.node_dir.rstrip("/") + "/server.json", 0)
        if raw:
            try:
                server = json.loads(raw.decode())
            except (json.JSONDecodeError, UnicodeDecodeError):
                server = {"error": "server.json unreadable"}
            pid = server.get("pid") if isinstance(server, dict) else None
            if isinstance(pid, int):
                rc, _, _ = node.run(["kill", "-0", str(pid)])
                running = rc == 0
        return HostStatus(host=host.name, ok=True, gpus=gpus, server=server, server_running=running)
    except RemoteError as exc:
        return HostStatus(host=host.name, ok=False, error=str(exc))
    finally:
        node.close()


def status_all(hosts: list[Host]) -> list[HostStatus]:
    """`host_status` of every host, in parallel (in inventory order)."""
    with ThreadPoolExecutor(max_workers=max(1, min(32, len(hosts)))) as pool:
        return list(pool.map(host_status, hosts))


# --------------------------------------------------------------------------- log tail

class LogTail:
    """Follows a file on a node from a background thread, calling `on_line` for each new line."""

    def __init__(self, host: Host, path: str, on_line: Callable[[str], None], interval: float = 0.2):
        self.host = host
        self.path = path
        self.on_line = on_line
        self.interval = interval
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"logtail-{host.name}", daemon=True)

    def start(self) -> "LogTail":
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _loop(self) -> None:
        try:
            node = open_node(self.host)
        except Exception as exc:
            self.error = f"log tail: cannot connect to {self.host.name}: {exc}"
            return
        offset = 0
        pending = b""
        try:
            while not self._stop.is_set():
                try:
                    chunk = node.read_from(self.path, offset)
                except RemoteError as exc:
                    self.error = str(exc)
                    self._stop.wait(self.interval)
                    continue
                if chunk is None:           # absent (or removed by a re-run): start over when it appears
                    offset, pending = 0, b""
                elif chunk:
                    offset += len(chunk)
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        self.on_line(line.decode(errors="replace"))
                self._stop.wait(self.interval)
        finally:
            node.close()


def read_tail(host: Host, path: str, lines: int = 40) -> str | None:
    """The last `lines` lines of a file on a host (None when absent or unreachable)."""
    try:
        node = open_node(host)
    except Exception:
        return None
    try:
        if host.is_local:
            p = Path(os.path.expanduser(path))
            if not p.exists():
                return None
            with open(p, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - 64 * 1024))
                data = f.read().decode(errors="replace")
            return "\n".join(data.splitlines()[-lines:])
        rc, out, _ = node.sh(f"test -f {shell_path(path)} || exit 3; tail -n {int(lines)} {shell_path(path)}")
        return out if rc == 0 else None
    except RemoteError:
        return None
    finally:
        node.close()
