"""SGLang-compatible command line of the simulated server: flags, defaults and the spec rules.

Flag names, dataclass field names and rule messages follow SGLang 0.5.x ``server_args.py``
(the SGLang reference section 1). ``parse_server_args(argv)`` exits 2 on an unknown flag,
exactly as argparse does in SGLang; ``apply_rules`` is the ``__post_init__`` part and is pure, so
the matrix and the timing model can apply the same rules without starting a server.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from dataclasses import dataclass
from typing import Any, Mapping, Optional

SPEC_ALGORITHMS = ["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"]
EAGLE_FAMILY = ("EAGLE", "EAGLE3", "STANDALONE")


class SpecRuleError(AssertionError):
    """A combination of speculative arguments SGLang refuses (raised like its assertions)."""


@dataclass
class ServerArgs:
    """The subset of SGLang's ``ServerArgs`` dataclass the simulator accepts (same field names)."""
    model_path: str = ""
    tokenizer_path: Optional[str] = None
    tokenizer_mode: str = "auto"
    load_format: str = "auto"
    trust_remote_code: bool = False
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    quantization: Optional[str] = None
    context_length: Optional[int] = None
    device: str = "cuda"
    served_model_name: Optional[str] = None
    chat_template: Optional[str] = None
    revision: Optional[str] = None
    host: str = "127.0.0.1"
    port: int = 30000
    skip_server_warmup: bool = False
    mem_fraction_static: Optional[float] = None
    max_running_requests: Optional[int] = None
    max_total_tokens: Optional[int] = None
    chunked_prefill_size: Optional[int] = None
    max_prefill_tokens: int = 16384
    schedule_policy: str = "fcfs"
    schedule_conservativeness: float = 1.0
    page_size: int = 1
    tp_size: int = 1
    dp_size: int = 1
    pp_size: int = 1
    ep_size: int = 1
    stream_interval: int = 1
    stream_output: bool = False
    random_seed: Optional[int] = None
    watchdog_timeout: float = 300
    base_gpu_id: int = 0
    gpu_id_step: int = 1
    log_level: str = "info"
    log_level_http: Optional[str] = None
    log_requests: bool = False
    show_time_cost: bool = False
    enable_metrics: bool = False
    enable_metrics_for_all_schedulers: bool = False
    decode_log_interval: int = 40
    api_key: Optional[str] = None
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: Optional[str] = None
    attention_backend: Optional[str] = None
    speculative_algorithm: Optional[str] = None
    speculative_draft_model_path: Optional[str] = None
    speculative_draft_model_revision: Optional[str] = None
    speculative_num_steps: Optional[int] = None
    speculative_eagle_topk: Optional[int] = None
    speculative_num_draft_tokens: Optional[int] = None
    speculative_accept_threshold_single: float = 1.0
    speculative_accept_threshold_acc: float = 1.0
    speculative_token_map: Optional[str] = None
    speculative_attention_mode: str = "prefill"
    disable_radix_cache: bool = False
    disable_cuda_graph: bool = False
    disable_cuda_graph_padding: bool = False
    cuda_graph_max_bs: Optional[int] = None
    cuda_graph_bs: Optional[list[int]] = None
    cuda_graph_backend_decode: Optional[str] = None      # 0.5.23: full | breakable | disabled
    cuda_graph_backend_prefill: Optional[str] = None
    cuda_graph_max_bs_prefill: Optional[int] = None
    cuda_graph_bs_prefill: Optional[list[int]] = None
    disable_custom_all_reduce: bool = False
    disable_overlap_schedule: bool = False
    enable_mixed_chunk: bool = False
    enable_dp_attention: bool = False
    enable_torch_compile: bool = False
    enable_nccl_nvls: bool = False
    enable_symm_mem: bool = False
    num_continuous_decode_steps: int = 1
    tool_call_parser: Optional[str] = None
    reasoning_parser: Optional[str] = None
    enable_cache_report: bool = False
    allow_auto_truncate: bool = False
    # batch-invariant kernels (0.5.9 and 0.5.23 list it): no numeric divergence of a greedy output (outputs.py)
    enable_deterministic_inference: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def speculative(self) -> bool:
        return self.speculative_algorithm is not None


# A flag is its ServerArgs field with "_" -> "-" ("--tp-size"), of the field's type (bool: a bare flag); the fields
# with aliases, choices, help text or a list value, by dest (flags, type or "store_true", extra argparse kwargs):
_FLAG_EXCEPTIONS: dict[str, tuple[tuple[str, ...], Any, dict[str, Any]]] = {
    "model_path": (("--model-path", "--model"), str, {"required": True,
        "help": "The path of the model weights. This can be a local folder or a Hugging Face repo ID."}),
    "tokenizer_mode": (("--tokenizer-mode",), str, {"choices": ["auto", "slow"]}),
    "mem_fraction_static": (("--mem-fraction-static",), float, {"help":
        "The fraction of the memory used for static allocation (model weights and KV cache memory pool)."}),
    "tp_size": (("--tensor-parallel-size", "--tp-size"), int, {}),
    "dp_size": (("--data-parallel-size", "--dp-size"), int, {}),
    "pp_size": (("--pipeline-parallel-size", "--pp-size"), int, {}),
    "ep_size": (("--expert-parallel-size", "--ep-size"), int, {}),
    "enable_metrics": (("--enable-metrics",), "store_true", {"help": "Enable log prometheus metrics."}),
    "dist_init_addr": (("--dist-init-addr", "--nccl-init-addr"), str, {"help":
        "The host address for initializing distributed backend (e.g., `192.168.0.2:25000`)."}),
    "speculative_algorithm": (("--speculative-algorithm",), str, {"choices": SPEC_ALGORITHMS}),
    "speculative_draft_model_path": (("--speculative-draft-model-path", "--speculative-draft-model"), str, {}),
    "speculative_num_steps": (("--speculative-num-steps",), int, {"help":
        "The number of steps sampled from draft model in Speculative Decoding."}),
    "speculative_eagle_topk": (("--speculative-eagle-topk",), int, {"help":
        "The number of tokens sampled from the draft model in eagle2 each step."}),
    "speculative_num_draft_tokens": (("--speculative-num-draft-tokens",), int, {"help":
        "The number of tokens sampled from the draft model in Speculative Decoding."}),
    "speculative_attention_mode": (("--speculative-attention-mode",), str, {"choices": ["prefill", "decode"]}),
    "cuda_graph_bs": (("--cuda-graph-bs",), int, {"nargs": "+"}),
    "disable_custom_all_reduce": (("--disable-custom-all-reduce",), "store_true", {"help":
        "Disable the custom all-reduce kernel and fall back to NCCL."}),
}
_ONLY_0523 = ("cuda_graph_backend_decode", "cuda_graph_backend_prefill", "cuda_graph_max_bs_prefill",
              "cuda_graph_bs_prefill")      # fields of _FLAGS_0523 alone


def _flag(f: dataclasses.Field) -> tuple[tuple[str, ...], str, Any, dict[str, Any]]:
    if f.name in _FLAG_EXCEPTIONS:
        flags, kind, extra = _FLAG_EXCEPTIONS[f.name]
        return flags, f.name, kind, extra
    hint = value = _HINTS[f.name]
    if typing.get_origin(hint) is typing.Union:                                       # Optional[X] -> X
        value = next(a for a in typing.get_args(hint) if a is not type(None))
    kind = "store_true" if hint is bool else value if value in (int, float) else str
    return ("--" + f.name.replace("_", "-"),), f.name, kind, {}


_HINTS = typing.get_type_hints(ServerArgs)


# (flags, dest, type or "store_true", extra argparse kwargs), in the dataclass's order
_FLAGS: list[tuple[tuple[str, ...], str, Any, dict[str, Any]]] = [
    _flag(f) for f in dataclasses.fields(ServerArgs) if f.name not in _ONLY_0523]


# 0.5.23 (SGLang 0.5.23's own --help): the legacy graph flags are gone (a prefix of the per-phase ones,
# so argparse answers "ambiguous option" and exits 2), --disable-cuda-graph is a deprecated alias.
_REMOVED_0523 = ("--cuda-graph-max-bs", "--cuda-graph-bs", "--stream-output")
_FLAGS_0523: list[tuple[tuple[str, ...], str, Any, dict[str, Any]]] = [
    (("--cuda-graph-backend-decode",), "cuda_graph_backend_decode", str, {"choices": ["full", "breakable", "disabled"]}),
    (("--cuda-graph-backend-prefill",), "cuda_graph_backend_prefill", str, {"choices": ["full", "breakable", "disabled"]}),
    (("--cuda-graph-max-bs-decode",), "cuda_graph_max_bs", int, {}),
    (("--cuda-graph-max-bs-prefill",), "cuda_graph_max_bs_prefill", int, {}),
    (("--cuda-graph-bs-decode",), "cuda_graph_bs", int, {"nargs": "+"}),
    (("--cuda-graph-bs-prefill",), "cuda_graph_bs_prefill", int, {"nargs": "+"}),
]
_IGNORED = "_sim_ignored_"


def _help_0523_flags() -> list[str]:
    """Every long flag of SGLang 0.5.23's real --help (the usage block lists each one)."""
    import re
    from specab.sim.versions import HELP_0523
    text = HELP_0523.read_text()
    usage = text.split("\n\n", 1)[0]
    return sorted(set(re.findall(r"\[(--[A-Za-z0-9][A-Za-z0-9_-]*)", usage)) - {"--help"})


def _flags_059() -> list[str]:
    """Every long flag of SGLang 0.5.9 (its ServerArgs.add_cli_args, data/sglang-0.5.9-flags.txt)."""
    from specab.sim.versions import FLAGS_059
    return sorted(line.strip() for line in FLAGS_059.read_text().splitlines()
                  if line.strip().startswith("--"))


def build_parser(prog: Optional[str] = None, version: str = "0.5.23") -> argparse.ArgumentParser:
    """SGLang's argparse parser of `version`: the simulator's modelled subset (0.5.23: with the per-phase
    graph flags), and every other flag of that release's real flag set (0.5.23: its real --help; 0.5.9:
    its add_cli_args) accepted and ignored; a flag outside the release's set exits 2 as SGLang does."""
    parser = argparse.ArgumentParser(prog=prog)
    defaults = ServerArgs()
    table = _FLAGS
    if version != "0.5.9":
        table = [f for f in _FLAGS if f[0][0] not in _REMOVED_0523] + _FLAGS_0523
    for flags, dest, kind, extra in table:
        default = getattr(defaults, dest)
        if kind == "store_true":
            parser.add_argument(*flags, dest=dest, action="store_true", **extra)
        else:
            extra = dict(extra)
            if not extra.get("required"):
                extra.setdefault("default", default)
            parser.add_argument(*flags, dest=dest, type=kind, **extra)
    known = {f for flags, _, _, _ in table for f in flags}
    if version != "0.5.9":
        for i, flag in enumerate(f for f in _help_0523_flags() if f not in known):
            parser.add_argument(flag, dest=f"{_IGNORED}{i}", nargs="*", help=argparse.SUPPRESS)
    else:
        # listed in --help (the driver's preflight reads the node's flag set from it), not modelled
        for i, flag in enumerate(f for f in _flags_059() if f not in known):
            parser.add_argument(flag, dest=f"{_IGNORED}{i}", nargs="*",
                                help="accepted by SGLang 0.5.9; not modelled by the simulator")
    return parser


def parse_server_args(argv: list[str], prog: Optional[str] = None, version: str = "0.5.23") -> ServerArgs:
    """Parse SGLang flags (argparse exits 2 with "unrecognized arguments" on an unknown flag, and on 0.5.23
    with "ambiguous option: --cuda-graph-max-bs could match ..." for the removed legacy graph flags).
    On 0.5.23 `--help` prints the real 0.5.23 help text."""
    if version != "0.5.9" and ("--help" in argv or "-h" in argv):
        from specab.sim.versions import HELP_0523
        sys.stdout.write(HELP_0523.read_text())
        sys.stdout.flush()
        raise SystemExit(0)
    ns = build_parser(prog, version).parse_args(argv)
    values = {k: v for k, v in vars(ns).items() if not k.startswith(_IGNORED)}
    if version != "0.5.9" and values.get("cuda_graph_backend_decode") == "disabled":
        values["disable_cuda_graph"] = True     # the simulator models decode graphs only
    return ServerArgs(**values)


def auto_speculative_params(architecture: str, algorithm: str) -> tuple[int, int, int]:
    """SGLang 0.5.9+ ``auto_choose_speculative_params``: (steps, topk, draft tokens)."""
    if algorithm == "STANDALONE":
        return (3, 1, 4)
    if architecture in ("LlamaForCausalLM", "Grok1ForCausalLM", "Grok1VForCausalLM"):
        return (5, 4, 8)
    return (3, 1, 4)


def apply_rules(args: ServerArgs, architecture: str = "DeepseekV3ForCausalLM",
                version: str = "0.5.23") -> tuple[ServerArgs, list[str]]:
    """SGLang's ``__post_init__`` rules for the arguments an A/B run uses.

    Returns the adjusted copy and the warnings SGLang logs. Raises :class:`SpecRuleError` for
    combinations SGLang refuses.
    """
    a = dataclasses.replace(args)
    warnings: list[str] = []
    if a.tokenizer_path is None:
        a.tokenizer_path = a.model_path
    if a.served_model_name is None:
        a.served_model_name = a.model_path
    if a.nnodes < 1 or a.tp_size % a.nnodes != 0:
        raise SpecRuleError("tp_size must be divisible by number of nodes")
    if not 0 <= a.node_rank < a.nnodes:
        raise SpecRuleError(f"node_rank ({a.node_rank}) must be in [0, nnodes={a.nnodes})")
    if a.nnodes > 1 and not a.dist_init_addr:
        raise SpecRuleError("--dist-init-addr is required when --nnodes > 1")
    if a.dist_init_addr:
        host, _, port = a.dist_init_addr.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise SpecRuleError(f"--dist-init-addr {a.dist_init_addr!r}: expected HOST:PORT "
                                "(e.g. 192.168.0.2:25000)")
    if a.speculative_algorithm == "NEXTN":
        a.speculative_algorithm = "EAGLE"
    if a.speculative_algorithm in EAGLE_FAMILY:
        if a.max_running_requests is None:
            a.max_running_requests = 48
            warnings.append("Max running requests is reset to 48 for speculative decoding. "
                            "You can override this by explicitly setting --max-running-requests.")
        # 0.5.23: spec v2 is the only worker, the overlap scheduler stays on and mixed chunk is kept
        if version == "0.5.9" and not a.disable_overlap_schedule:
            a.disable_overlap_schedule = True
            warnings.append("Overlap scheduler is disabled because of using eagle speculative decoding.")
        if version == "0.5.9" and a.enable_mixed_chunk:
            a.enable_mixed_chunk = False
            warnings.append("Mixed chunked prefill is disabled because of using eagle speculative decoding.")
        if a.speculative_num_steps is None:
            if not (a.speculative_eagle_topk is None and a.speculative_num_draft_tokens is None):
                raise SpecRuleError(
                    "speculative_eagle_topk and speculative_num_draft_tokens were given without "
                    "speculative_num_steps: set all three of --speculative-num-steps, "
                    "--speculative-eagle-topk, --speculative-num-draft-tokens, or none (auto-chosen)")
            (a.speculative_num_steps, a.speculative_eagle_topk,
             a.speculative_num_draft_tokens) = auto_speculative_params(architecture, a.speculative_algorithm)
        elif a.speculative_eagle_topk is None or a.speculative_num_draft_tokens is None:
            raise SpecRuleError(
                "speculative_num_steps was given without speculative_eagle_topk/speculative_num_draft_tokens: "
                "set all three of --speculative-num-steps, --speculative-eagle-topk, "
                "--speculative-num-draft-tokens, or none (auto-chosen)")
        for name in ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens"):
            if getattr(a, name) < 1:
                raise SpecRuleError(f"{name} must be >= 1, got {getattr(a, name)}")
        if a.speculative_eagle_topk == 1 and a.speculative_num_draft_tokens != a.speculative_num_steps + 1:
            warnings.append("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 "
                            "when speculative_eagle_topk == 1")
            a.speculative_num_draft_tokens = a.speculative_num_steps + 1
        if a.speculative_algorithm in ("EAGLE", "EAGLE3") and not a.speculative_draft_model_path:
            raise SpecRuleError(f"--speculative-draft-model-path is required for --speculative-algorithm "
                                f"{a.speculative_algorithm}")
    return a, warnings


def server_args_from_mapping(values: Mapping[str, Any]) -> ServerArgs:
    """Build ServerArgs from an arm's ``server_args`` dict (SGLang field names), refusing unknown keys."""
    names = {f.name for f in dataclasses.fields(ServerArgs)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ValueError(f"unknown SGLang server arg(s) {unknown} (the simulator knows {len(names)} fields)")
    return ServerArgs(**dict(values))
