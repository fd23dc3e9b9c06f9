"""Listening sockets: who holds a port (/proc/net/tcp{,6} and the holders' file descriptors), and whether it can be
bound now (stdlib only)."""
from __future__ import annotations

import os
import socket
from typing import Any, Dict, Iterable, List, Optional, Tuple

from specab.node.procfs import describe_process, list_pids


def _parse_proc_net(text: str, port: int) -> List[Tuple[str, int]]:
    """(local address hex, inode) of LISTEN sockets on ``port`` in /proc/net/tcp{,6} text."""
    out = []
    for line in text.splitlines()[1:]:
        cols = line.split()
        if len(cols) < 10:
            continue
        local, state, inode = cols[1], cols[3], cols[9]
        try:
            lport = int(local.rsplit(":", 1)[1], 16)
        except (IndexError, ValueError):
            continue
        if state == "0A" and lport == port:
            out.append((local.rsplit(":", 1)[0], int(inode)))
    return out


def listening_inodes(port: int) -> List[int]:
    inodes = []
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as fh:
                inodes += [ino for _, ino in _parse_proc_net(fh.read(), port)]
        except OSError:
            continue
    return inodes


def socket_owners(inodes: Iterable[int]) -> List[int]:
    """PIDs holding a file descriptor on one of the socket inodes (needs root for other users)."""
    wanted = {"socket:[%d]" % i for i in inodes}
    owners = []
    if not wanted:
        return owners
    for pid in list_pids():
        fd_dir = "/proc/%d/fd" % pid
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(os.path.join(fd_dir, fd)) in wanted:
                    owners.append(pid)
                    break
            except OSError:
                continue
    return owners


def port_holders(port: int) -> List[Dict[str, Any]]:
    return [describe_process(p) for p in socket_owners(listening_inodes(port))]


def port_bindable(host: str, port: int) -> Optional[str]:
    """None when ``host:port`` can be bound now, else the OS error text."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
        return None
    except OSError as exc:
        return str(exc)
    finally:
        s.close()
