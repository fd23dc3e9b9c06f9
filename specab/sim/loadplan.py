"""What each scheduler does while the model "loads": timed steps, SGLang's log lines, memory growth.

Pure: the main process computes a plan per rank and hands it to the worker, which only sleeps,
logs, grows its allocation and reports. Log texts follow SGLang 0.5.x (model_runner.py,
cuda_graph_runner.py, eagle_worker.py, scheduler.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specab.sim.args import ServerArgs
from specab.sim import versions
from specab.sim.limits import model_context
from specab.sim.profile import Profile

GIB_MIB = 1024.0


@dataclass(frozen=True)
class Capacity:
    mem_fraction_static: float
    total_mib: int
    final_mib: int
    weights_mib: int
    draft_mib: int
    graph_mib: int
    kv_mib: int
    max_total_num_tokens: int
    max_running_requests: int
    context_len: int


def auto_mem_fraction(args: ServerArgs) -> float:
    """SGLang picks mem_fraction_static when it is not given; large GPUs get ~0.88, spec reserves 2 GB more."""
    return 0.874 if args.speculative_algorithm else 0.888


def capacity(profile: Profile, args: ServerArgs) -> Capacity:
    total = profile.gpu.memory_total_mib
    frac = args.mem_fraction_static if args.mem_fraction_static is not None else auto_mem_fraction(args)
    final = int(round(frac * total))
    m = profile.model
    weights = int(m.weights_gib_per_gpu * GIB_MIB)
    draft = int(m.draft_weights_gib_per_gpu * GIB_MIB) if args.speculative_algorithm else 0
    graph = 0 if args.disable_cuda_graph else int(m.cuda_graph_gib * GIB_MIB)
    kv = final - 512 - weights - draft - graph
    tokens = max(0, int(kv / GIB_MIB * m.kv_tokens_per_gib))
    if args.max_total_tokens is not None:
        tokens = min(tokens, args.max_total_tokens)
    context = args.context_length or model_context(args.model_path) or m.context_length
    max_reqs = min(max(int(tokens / context * 512), 2048), 4096)
    running = args.max_running_requests if args.max_running_requests is not None else min(tokens // 2, max_reqs)
    return Capacity(frac, total, final, weights, draft, graph, kv, tokens, max(1, running), context)


def _gb(mib: float) -> str:
    return f"{mib / GIB_MIB:.2f}"


def scheduler_plan(profile: Profile, args: ServerArgs, tp_rank: int, oom: bool, time_scale: float) -> dict[str, Any]:
    """Steps for one scheduler: each ``{"sleep": s, "log": str|None, "mib": int|None, "op": str|None}``."""
    cap = capacity(profile, args)
    ld = profile.load
    total = cap.total_mib
    steps: list[dict[str, Any]] = []

    def step(sleep_s: float = 0.0, log: str | None = None, mib: int | None = None, op: str | None = None) -> None:
        steps.append({"sleep": sleep_s / time_scale, "log": log, "mib": mib, "op": op})

    used = 512
    step(ld.init_s / 2, "Init torch distributed begin.")
    step(0.0, None, None, "nccl_init")
    step(ld.init_s / 2, f"Init torch distributed ends. mem usage={_gb(used)} GB", used)
    step(0.0, f"Load weight begin. avail mem={_gb(total - used)} GB")
    if oom:
        step(ld.weights_s / 3, None, None, "oom")
    weights_end = used + cap.weights_mib
    step(ld.weights_s, f"Load weight end. type={profile.model.architecture}, dtype=torch.bfloat16, "
                       f"avail mem={_gb(total - weights_end)} GB, mem usage={_gb(cap.weights_mib)} GB.", weights_end)
    used = weights_end
    if cap.kv_mib < 1024:
        step(0.0, None, None, "not_enough_memory")
    if cap.draft_mib:
        step(0.0, f"Load weight begin. avail mem={_gb(total - used)} GB")
        used += cap.draft_mib
        step(ld.draft_weights_s, f"Load weight end. type=LlamaForCausalLMEagle3, dtype=torch.bfloat16, "
                                 f"avail mem={_gb(total - used)} GB, mem usage={_gb(cap.draft_mib)} GB.", used)
    used += cap.kv_mib
    step(ld.kv_cache_s, f"KV Cache is allocated. #tokens: {cap.max_total_num_tokens}, "
                        f"KV size: {_gb(cap.kv_mib)} GB", used)
    step(0.0, f"Memory pool end. avail mem={_gb(total - used)} GB")
    if not args.disable_cuda_graph:
        bs_max = min(profile.decode.default_cuda_graph_max_bs if args.cuda_graph_max_bs is None
                     else args.cuda_graph_max_bs, cap.max_running_requests)
        sizes = [b for b in (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160, 192, 224, 256)
                 if b <= bs_max] or [1]
        new = versions.current().name != "0.5.9"
        if new:     # 0.5.23 cuda_graph_setup.py:750-792, eagle_worker_v2.py:513-533
            kind = "verify" if args.speculative_algorithm else "decode"
            per_req = args.speculative_num_draft_tokens or 1 if args.speculative_algorithm else 1
            step(0.0, f"Capture target {kind} CUDA graph begin. backend=full, num_tokens_per_req={per_req}, "
                      f"avail mem={_gb(total - used)} GB")
        else:
            step(0.0, f"Capture cuda graph begin. This can take up to several minutes. avail mem={_gb(total - used)} GB")
            step(0.0, f"Capture cuda graph bs {sizes}")
        used += cap.graph_mib * 3 // 4
        if new:
            step(ld.cuda_graph_s, f"Capture target {kind} CUDA graph end. bs={sizes}, elapsed={ld.cuda_graph_s:.2f} s, "
                                  f"mem usage={_gb(cap.graph_mib * 3 // 4)} GB, avail mem={_gb(total - used)} GB", used)
        else:
            step(ld.cuda_graph_s, f"Capture cuda graph end. Time elapsed: {ld.cuda_graph_s:.2f} s. "
                                  f"mem usage={_gb(cap.graph_mib * 3 // 4)} GB. avail mem={_gb(total - used)} GB.", used)
        if args.speculative_algorithm:
            step(0.0, ("Capture draft decode CUDA graph begin. " if new else
                       "Capture draft cuda graph begin. This can take up to several minutes. ")
                 + f"avail mem={_gb(total - used)} GB")
            delta = cap.final_mib - used
            used = cap.final_mib
            step(ld.draft_cuda_graph_s,
                 (f"Capture draft decode CUDA graph end. elapsed={ld.draft_cuda_graph_s:.2f} s, "
                  f"mem usage={_gb(delta)} GB, avail mem={_gb(total - used)} GB") if new else
                 (f"Capture draft cuda graph end. Time elapsed: {ld.draft_cuda_graph_s:.2f} s. "
                  f"mem usage={_gb(delta)} GB. avail mem={_gb(total - used)} GB."), used)
    used = cap.final_mib
    step(0.0, None, used)
    if tp_rank == 0:
        step(0.0, f"max_total_num_tokens={cap.max_total_num_tokens}, chunked_prefill_size="
                  f"{args.chunked_prefill_size or 8192}, max_prefill_tokens={args.max_prefill_tokens}, "
                  f"max_running_requests={cap.max_running_requests}, context_len={cap.context_len}, "
                  f"available_gpu_mem={_gb(total - used)} GB")
    return {"steps": steps, "final_mib": cap.final_mib, "total_mib": total}
