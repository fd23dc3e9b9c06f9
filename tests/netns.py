"""A real SSH host for tests: a network namespace with its own address and a running sshd.

Reusable by every test that needs Ansible, fabric or testinfra to go over real SSH (driver, faults,
multi-node). Each host is a fresh network namespace joined to the root namespace by a veth pair on
its own /30 subnet (so several hosts can coexist), with an sshd listening on the namespace's address.
The test makes a root key pair and the host key, and trusts the host through a generated
known_hosts file: host key checking stays on.

Only the network is separate: the namespace shares the file system and the PID space with the test,
so a simulated node reached over SSH runs the same Python and sees the same files.

Usage (pytest fixture)::

    from tests.netns import netns_host  # noqa: F401  (fixture)

    def test_x(netns_host):
        inv_vars = netns_host.ansible_vars()     # ansible_host, ansible_user, key, known_hosts ...
        netns_host.ssh("true")

or, for several hosts, ``with NetnsHost.create(workdir) as h: ...``. Hosts made with
``NetnsHost.create(workdir, routed=True)`` also reach each other (multi-node servers): the namespace
routes through the root namespace, which forwards only on that host's own veth. Tests are skipped (with the
reason) unless running as root with ``ip`` and ``/usr/sbin/sshd`` available.

Teardown kills every process inside the namespace (they can only be ours: the namespace was made
by the test and only our sshd and what it started live there), then deletes the namespace, the
veth pair and the key material.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
import tempfile
from typing import Iterator, Optional

import pytest

SSHD = "/usr/sbin/sshd"
def control_path_dir(root: Path) -> str:
    """A directory for ssh's ControlPath sockets (ANSIBLE_SSH_CONTROL_PATH_DIR) of a test rooted at `root`.

    ssh names a socket `<dir>/<10-char hash>.<16 random chars>` and a Unix socket path holds 107 bytes;
    pytest-xdist's temporary paths (`.../popen-gw0/<test name>0/...`) can be too long for that
    ("unix_listener: ... too long for Unix domain socket"). A long root gets a short directory under
    the temporary directory, named after the root (one per test, like root/cp)."""
    d = root / "cp"
    if len(str(d)) <= 64:
        return str(d)
    short = Path(tempfile.gettempdir()) / "specab-cp" / hashlib.sha1(str(root).encode()).hexdigest()[:12]
    short.mkdir(parents=True, exist_ok=True, mode=0o700)
    return str(short)


LOCK_FILE = "/tmp/specab-netns.lock"
SUBNET_POOL = ipaddress.ip_network("10.231.0.0/16")
START_TIMEOUT_S = 20.0


class NetnsError(RuntimeError):
    """The namespace host could not be set up; the message says which step failed and why."""


def unavailable_reason() -> Optional[str]:
    """Why a namespace host cannot be made here, or None when it can."""
    if os.geteuid() != 0:
        return "needs root to create a network namespace (run the tests as root)"
    if shutil.which("ip") is None:
        return "needs the 'ip' command (apt-get install iproute2)"
    if not os.access(SSHD, os.X_OK):
        return f"needs {SSHD} (apt-get install openssh-server)"
    for tool in ("ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"needs '{tool}' (apt-get install openssh-client)"
    return None


def _run(*argv: str, check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise NetnsError(f"{' '.join(argv)} failed (exit {proc.returncode}): {proc.stderr.strip()}")
    return proc


def _used_addresses() -> set[ipaddress.IPv4Address]:
    out = _run("ip", "-o", "-4", "addr", "show").stdout
    used = set()
    for line in out.splitlines():
        parts = line.split()
        if "inet" in parts:
            used.add(ipaddress.ip_interface(parts[parts.index("inet") + 1]).ip)
    return used


def _wait_port(address: str, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((address, port), timeout=1.0):
                return
        except OSError as exc:
            last = exc
            time.sleep(0.05)
    raise NetnsError(f"sshd did not start listening on {address}:{port} within {timeout:.0f} s ({last})")


@dataclass
class NetnsHost:
    """One namespace host. Create with :meth:`create` (a context manager)."""

    name: str
    address: str
    workdir: Path
    port: int = 22
    user: str = "root"
    host_veth: str = ""
    routed: bool = False
    sshd: Optional[subprocess.Popen] = field(default=None, repr=False)

    # ----------------------------------------------------------------------------- paths
    @property
    def key_file(self) -> Path:
        return self.workdir / "client_key"

    @property
    def known_hosts(self) -> Path:
        return self.workdir / "known_hosts"

    @property
    def ssh_config(self) -> Path:
        """An ssh_config for tools that take one (testinfra --ssh-config, ssh -F)."""
        return self.workdir / "ssh_config"

    @property
    def sshd_log(self) -> Path:
        return self.workdir / "sshd.log"

    # ----------------------------------------------------------------------------- use
    def ssh_options(self) -> list[str]:
        return ["-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "StrictHostKeyChecking=yes",
                "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]

    def ansible_vars(self) -> dict[str, object]:
        """Inventory variables that reach this host over SSH with host key checking on."""
        return {
            "ansible_connection": "ssh",
            "ansible_host": self.address,
            "ansible_port": self.port,
            "ansible_user": self.user,
            "ansible_ssh_private_key_file": str(self.key_file),
            "ansible_ssh_common_args": " ".join(self.ssh_options()),
        }

    def ssh(self, command: str, timeout: float = 60.0, check: bool = True) -> subprocess.CompletedProcess:
        """Run ``command`` (a shell command line) on the host over SSH."""
        argv = ["ssh", "-i", str(self.key_file), "-p", str(self.port), *self.ssh_options(),
                f"{self.user}@{self.address}", command]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise NetnsError(f"ssh {self.address} {command!r} failed (exit {proc.returncode}): "
                             f"{proc.stderr.strip()}")
        return proc

    def pids(self) -> list[int]:
        """Processes living in the namespace (ours by construction)."""
        out = _run("ip", "netns", "pids", self.name, check=False).stdout
        return [int(p) for p in out.split() if p.isdigit()]

    def argvs(self) -> dict[int, list[bytes]]:
        """The argv of each process living in the namespace (those that exited meanwhile left out)."""
        out = {}
        for pid in self.pids():
            try:
                out[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
        return out

    # ----------------------------------------------------------------------------- lifecycle
    @classmethod
    @contextlib.contextmanager
    def create(cls, workdir: Path, routed: bool = False) -> Iterator["NetnsHost"]:
        """A namespace host; ``routed=True``: it reaches (and is reached by) other routed hosts."""
        reason = unavailable_reason()
        if reason:
            raise NetnsError(reason)
        workdir.mkdir(parents=True, exist_ok=True)
        tag = "%06x" % random.randrange(1 << 24)
        host = cls(name=f"specab-{tag}", address="", workdir=workdir, host_veth=f"sab{tag}h",
                   routed=routed)
        try:
            host._setup(tag)
            yield host
        finally:
            host._teardown()

    def _setup(self, tag: str) -> None:
        ns_veth = f"sab{tag}n"
        with open(LOCK_FILE, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)   # address choice + creation are atomic across test processes
            used = _used_addresses()
            subnets = list(SUBNET_POOL.subnets(new_prefix=30))
            random.shuffle(subnets)
            subnet = next((s for s in subnets if not (set(s.hosts()) & used)), None)
            if subnet is None:
                raise NetnsError(f"no free /30 left in {SUBNET_POOL}")
            outer, inner = list(subnet.hosts())
            self.address = str(inner)
            _run("ip", "netns", "add", self.name)
            _run("ip", "netns", "exec", self.name, "ip", "link", "set", "lo", "up")
            _run("ip", "link", "add", self.host_veth, "type", "veth", "peer", "name", ns_veth)
            _run("ip", "link", "set", ns_veth, "netns", self.name)
            _run("ip", "addr", "add", f"{outer}/30", "dev", self.host_veth)
            _run("ip", "link", "set", self.host_veth, "up")
            _run("ip", "netns", "exec", self.name, "ip", "addr", "add", f"{inner}/30", "dev", ns_veth)
            _run("ip", "netns", "exec", self.name, "ip", "link", "set", ns_veth, "up")
            if self.routed:
                # other namespaces are reached through the root namespace; forwarding is switched on for
                # this veth only (IPv4 decides per incoming interface), not for the whole machine
                _run("ip", "netns", "exec", self.name, "ip", "route", "add", "default", "via", str(outer))
                Path(f"/proc/sys/net/ipv4/conf/{self.host_veth}/forwarding").write_text("1\n")
        self._keys()
        self._start_sshd()
        self.ssh("true", timeout=30)   # proves key auth and host key checking end to end

    def _keys(self) -> None:
        d = self.workdir
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "specab-test-host", "-f", str(d / "host_key"))
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "specab-test-root", "-f", str(self.key_file))
        (d / "authorized_keys").write_text((d / "client_key.pub").read_text())
        os.chmod(d / "authorized_keys", 0o600)
        host_pub = (d / "host_key.pub").read_text().split()
        entry = self.address if self.port == 22 else f"[{self.address}]:{self.port}"
        self.known_hosts.write_text(f"{entry} {host_pub[0]} {host_pub[1]}\n")
        self.ssh_config.write_text(
            f"Host {self.address}\n  User {self.user}\n  Port {self.port}\n  IdentityFile {self.key_file}\n"
            f"  IdentitiesOnly yes\n  UserKnownHostsFile {self.known_hosts}\n  StrictHostKeyChecking yes\n"
            f"  BatchMode yes\n")
        (d / "sshd_config").write_text(
            f"Port {self.port}\nListenAddress {self.address}\nHostKey {d / 'host_key'}\n"
            f"AuthorizedKeysFile {d / 'authorized_keys'}\nPidFile {d / 'sshd.pid'}\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            "UsePAM no\nStrictModes no\nSubsystem sftp internal-sftp\nMaxSessions 50\nMaxStartups 50\n"
            # Debian's bash runs ~/.bashrc for every command sshd starts (it sees SSH_CLIENT) when SHLVL says
            # it is a top-level shell. The test hosts log in as this machine's root, whose ~/.bashrc may be a
            # developer's (here: `pyenv init`, ~100 processes and ~0.14 s of CPU per command: the two multi-node
            # tests took 205 s with it, 132 s without). What a node's login files cost is not what these tests
            # measure: the commands start as a nested shell would, with sshd's environment, without the dotfiles.
            "SetEnv SHLVL=1\n")

    def _start_sshd(self) -> None:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)   # privilege separation directory
        self.sshd = subprocess.Popen(
            ["ip", "netns", "exec", self.name, SSHD, "-D", "-f", str(self.workdir / "sshd_config"),
             "-E", str(self.sshd_log)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            _wait_port(self.address, self.port, START_TIMEOUT_S)
        except NetnsError:
            log = self.sshd_log.read_text() if self.sshd_log.exists() else "(no log)"
            raise NetnsError(f"sshd in namespace {self.name} did not start: {log[-2000:]}") from None

    def _teardown(self) -> None:
        if self.name and Path(f"/run/netns/{self.name}").exists():
            self._kill_namespace_processes()
        if self.sshd is not None and self.sshd.poll() is None:
            self.sshd.kill()
        if self.sshd is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.sshd.wait(timeout=10)
        if self.name:
            _run("ip", "netns", "del", self.name, check=False)
        if self.host_veth:
            _run("ip", "link", "del", self.host_veth, check=False)
        for secret in ("client_key", "host_key"):
            with contextlib.suppress(FileNotFoundError):
                (self.workdir / secret).unlink()

    def _kill_namespace_processes(self) -> None:
        for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 10.0)):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and self.pids():
                time.sleep(0.05)


@pytest.fixture
def netns_host(tmp_path: Path) -> Iterator[NetnsHost]:
    """A namespace host with a running sshd, removed after the test; skips when not possible here."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    with NetnsHost.create(tmp_path / "netns") as host:
        yield host
