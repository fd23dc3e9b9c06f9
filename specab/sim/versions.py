"""Which SGLang release the simulated server plays: ``SPECAB_SIM_SGLANG_VERSION`` (0.5.23 default, 0.5.9 kept).

The simulator keeps its own per-version table (it does not import specab/vocab/engines.py): it plays the real
engine, and tests hold the harness's engine knowledge against it. Sources: the 2026 engines reference.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

ENV = "SPECAB_SIM_SGLANG_VERSION"
DEFAULT = "0.5.23"
HELP_0523 = Path(__file__).resolve().parent / "data" / "sglang-0.5.23-help.txt"
FLAGS_059 = Path(__file__).resolve().parent / "data" / "sglang-0.5.9-flags.txt"   # the real 0.5.9 flag set


@dataclass(frozen=True)
class SimVersion:
    name: str
    graph_flags_per_phase: bool     # --cuda-graph-{backend,max-bs,bs}-{decode,prefill}; legacy max-bs/bs gone
    cuda_module_loading: bool       # 0.5.9 also sets CUDA_MODULE_LOADING=AUTO
    shutdown_req: bool              # drain, ShutdownReq, children killed, main exits 0 (0.5.9: SIGKILL tree + self)


VERSIONS = {
    "0.5.9": SimVersion("0.5.9", graph_flags_per_phase=False, cuda_module_loading=True, shutdown_req=False),
    "0.5.23": SimVersion("0.5.23", graph_flags_per_phase=True, cuda_module_loading=False, shutdown_req=True),
}


class VersionError(ValueError):
    """SPECAB_SIM_SGLANG_VERSION names a release the simulator does not play."""


def current(env: Optional[Mapping[str, str]] = None) -> SimVersion:
    env = os.environ if env is None else env
    name = env.get(ENV) or DEFAULT
    try:
        return VERSIONS[name]
    except KeyError:
        raise VersionError(f"{ENV}={name!r}: the simulator plays SGLang {', '.join(VERSIONS)}") from None
