"""NCCL's environment echo lines, as a scheduler with NCCL_DEBUG=INFO writes them.

Format (NVIDIA/nccl src/debug.cc, src/misc/param.cc, src/graph/tuning.cc):
``<host>:<pid>:<tid> [<cudaDev>] NCCL INFO <VAR> set by environment to <value>`` with a trailing
period for integer parameters (``%lld.``) and none for string ones (NCCL_PROTO, NCCL_ALGO,
NCCL_P2P_LEVEL, NCCL_SOCKET_IFNAME, ...). NCCL_PROTO/NCCL_ALGO are read only when algorithms are
tuned, i.e. with more than one rank. NCCL_DEBUG* themselves are not echoed. NCCL_DEBUG_SUBSYS must
include ENV (default INIT,BOOTSTRAP,ENV); NCCL_DEBUG_FILE redirects the lines (%h host, %p pid).
"""
from __future__ import annotations

import socket
from typing import Mapping

NCCL_VERSION = "2.27.3+cuda12.9"
STRING_PARAMS = {"NCCL_PROTO", "NCCL_ALGO", "NCCL_P2P_LEVEL", "NCCL_SOCKET_IFNAME", "NCCL_IB_HCA",
                 "NCCL_TOPO_FILE", "NCCL_NET_PLUGIN", "NCCL_COMM_ID", "NCCL_NET", "NCCL_SHM_LEVEL",
                 "NCCL_GRAPH_FILE", "NCCL_TOPO_DUMP_FILE", "NCCL_CONF_FILE", "NCCL_ENV_PLUGIN",
                 "NCCL_TUNER_PLUGIN", "NCCL_IB_GID_INDEX_STR"}
NOT_ECHOED = {"NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE", "NCCL_DEBUG_TIMESTAMP_FORMAT",
              "NCCL_DEBUG_TIMESTAMP_LEVELS"}
TUNING_PARAMS = {"NCCL_PROTO", "NCCL_ALGO"}


# the order NCCL reads (and echoes) these parameters during communicator init (H200, NCCL 2.28.9);
# variables not listed come after NCCL_NVLS_ENABLE, alphabetically
READ_ORDER = ["NCCL_CUMEM_ENABLE", "NCCL_P2P_LEVEL", "NCCL_NVLS_ENABLE", "<comm>", "NCCL_MAX_NCHANNELS",
              "NCCL_BUFFSIZE", "NCCL_NTHREADS", "NCCL_PROTO", "NCCL_ALGO"]


def subsys_enabled(env: Mapping[str, str], subsys: str) -> bool:
    raw = env.get("NCCL_DEBUG_SUBSYS")
    if not raw:
        return subsys in ("INIT", "BOOTSTRAP", "ENV")
    items = [s.strip().upper() for s in raw.split(",") if s.strip()]
    if items and items[0].startswith("^"):
        excluded = {items[0][1:]} | set(items[1:])
        return subsys not in excluded and "ALL" not in excluded
    return subsys in items or "ALL" in items


def nccl_info_lines(env: Mapping[str, str], world_size: int, cuda_dev: int, pid: int, tid: int,
                    rank: int, host: str | None = None) -> list[str]:
    """The NCCL INFO lines one rank writes at communicator init (empty unless NCCL_DEBUG=INFO).

    Env echoes come in NCCL's read order between its other init lines (bootstrap, comm, Init START and
    COMPLETE), as on a real GPU."""
    if env.get("NCCL_DEBUG", "").upper() not in ("INFO", "TRACE"):
        return []
    host = host or socket.gethostname()
    head = f"{host}:{pid}:{tid} [{cuda_dev}] NCCL INFO "
    comm = f"0x{(pid * 2654435761) & 0xfffffff:07x}0"
    init = (f"ncclCommInitRankConfig comm {comm} rank {rank} nranks {world_size} cudaDev {cuda_dev} "
            f"nvmlDev {cuda_dev} busId {0x18 + 0x10 * cuda_dev:x}0 commId 0x{(world_size * 7919) & 0xffff:04x}"
            f"c196a145fd92 - Init ")
    lines: list[str] = []
    if subsys_enabled(env, "BOOTSTRAP"):
        lines.append(head + "Bootstrap: Using lo:127.0.0.1<0>")
    if subsys_enabled(env, "INIT"):
        lines.append(head + "cudaDriverVersion 12090")
        if rank == 0:
            lines.append(head + f"NCCL version {NCCL_VERSION}")
        lines.append(head + init + "START")
    echo = subsys_enabled(env, "ENV")
    present = [k for k in env if k.startswith("NCCL_") and k not in NOT_ECHOED
               and not (k in TUNING_PARAMS and world_size <= 1)]
    known = [k for k in READ_ORDER if k in present or k == "<comm>"]
    rest = sorted(k for k in present if k not in READ_ORDER)
    at = known.index("<comm>") if "<comm>" in known else len(known)
    for var in known[:at] + rest + known[at:]:
        if var == "<comm>":
            if subsys_enabled(env, "INIT"):
                lines.append(head + f"comm {comm} rank {rank} nRanks {world_size} nNodes 1 localRanks "
                                    f"{world_size} localRank {rank} MNNVL 0")
            continue
        if not echo:
            continue
        value = env[var]
        if var in STRING_PARAMS:
            lines.append(head + f"{var} set by environment to {value}")
            continue
        try:
            lines.append(head + f"{var} set by environment to {int(value, 0)}.")
        except ValueError:
            lines.append(head + f"Invalid value {value} for {var}, using default 0.")
    if subsys_enabled(env, "INIT"):
        lines.append(head + init + "COMPLETE")
    return lines


def debug_file_path(template: str, pid: int) -> str:
    return template.replace("%h", socket.gethostname()).replace("%p", str(pid))
