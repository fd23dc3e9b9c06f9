"""Multi-node launches: the nodes of one server hold a TCP link to the head, as torch's TCPStore/NCCL do.

The head (``--node-rank 0``) listens on ``--dist-init-addr`` and waits until every other node joined
before it opens its HTTP port; a non-head node connects (retrying while the head is not up yet). When
the link of any node breaks (process died, host gone: EOF, reset or TCP keepalive failure), the
remaining nodes fail like SGLang does when a peer rank dies: the first local scheduler reports a NCCL
error and the node's server goes down through the SIGQUIT path.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
from typing import Awaitable, Callable, Optional

from specab.sim.simlog import SimLogger

PEER_LOST = ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.cpp, "
             "remote process exited or there was a network error, NCCL version 2.27.3\n"
             "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting "
             "prematurely.")


def split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--dist-init-addr {addr!r}: expected HOST:PORT (e.g. 192.168.0.2:25000)")
    return host.strip("[]"), int(port)


def _keepalive(sock: Optional[socket.socket]) -> None:
    if sock is None:
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for opt, value in (("TCP_KEEPIDLE", 3), ("TCP_KEEPINTVL", 1), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, opt):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)


class NodeLink:
    """The TCP links of one node to the others (head: one per joined node; other: one to the head)."""

    def __init__(self, addr: str, nnodes: int, node_rank: int, log: SimLogger):
        self.host, self.port = split_addr(addr)
        self.nnodes = nnodes
        self.node_rank = node_rank
        self.log = log
        self.readers: dict[int, asyncio.StreamReader] = {}
        self.writers: list[asyncio.StreamWriter] = []
        self._server: Optional[asyncio.AbstractServer] = None

    async def connect(self) -> None:
        if self.node_rank == 0:
            await self._wait_for_nodes()
        else:
            await self._join_head()

    async def _wait_for_nodes(self) -> None:
        joined = asyncio.Event()

        async def on_join(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                hello = json.loads(await reader.readline())
                rank = int(hello["node_rank"])
            except (ValueError, KeyError, json.JSONDecodeError):
                writer.close()
                return
            _keepalive(writer.get_extra_info("socket"))
            writer.write(b"ok\n")
            await writer.drain()
            self.readers[rank] = reader
            self.writers.append(writer)
            self.log.info(f"Node {rank} joined from {writer.get_extra_info('peername')[0]} "
                          f"({len(self.readers) + 1}/{self.nnodes} nodes).")
            if len(self.readers) == self.nnodes - 1:
                joined.set()
        try:
            self._server = await asyncio.start_server(on_join, self.host, self.port, reuse_address=True)
        except OSError:   # the address names another interface of this host or is not local: listen on all
            self._server = await asyncio.start_server(on_join, "0.0.0.0", self.port, reuse_address=True)
        self.log.info(f"Waiting for {self.nnodes - 1} other node(s) at {self.host}:{self.port}.")
        await joined.wait()

    async def _join_head(self) -> None:
        said = False
        while True:
            with contextlib.suppress(OSError):
                reader, writer = await asyncio.open_connection(self.host, self.port)
                writer.write((json.dumps({"node_rank": self.node_rank, "pid": os.getpid(),
                                          "host": socket.gethostname()}) + "\n").encode())
                await writer.drain()
                if (await reader.readline()).strip() == b"ok":
                    break
                writer.close()
            if not said:
                self.log.info(f"Waiting for the head node at {self.host}:{self.port}.")
                said = True
            await asyncio.sleep(0.2)
        _keepalive(writer.get_extra_info("socket"))
        self.readers[0] = reader
        self.writers.append(writer)
        self.log.info(f"Joined the head node at {self.host}:{self.port}.")

    async def watch(self, on_lost: Callable[[int], Awaitable[None] | None]) -> None:
        """Return (after calling ``on_lost(node_rank)``) when any link breaks."""
        async def wait_eof(rank: int, reader: asyncio.StreamReader) -> int:
            with contextlib.suppress(OSError):
                while await reader.read(4096):
                    pass
            return rank
        tasks = [asyncio.create_task(wait_eof(r, rd)) for r, rd in self.readers.items()]
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for t in pending:
            t.cancel()
        rank = next(iter(done)).result()
        result = on_lost(rank)
        if asyncio.iscoroutine(result):
            await result
