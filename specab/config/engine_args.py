"""Known SGLang server-argument names (the dataclass field names of `ServerArgs`, 0.4.x-0.5.x).

One list, used by the matrix grammar and the experiment-file check to refuse a misspelt engine
argument before any node is touched. A flag is the field name with '_' -> '-' (`tp_size` ->
`--tp-size`). Aliases that SGLang's argparse also accepts (`tensor_parallel_size`) are listed too.
The authoritative check is the node's own `<engine> --help`; this list is the
early, offline one. Add a name here when a new SGLang version introduces a flag.
"""
from __future__ import annotations

import difflib
from typing import Any

SPEC_KEYS: tuple[str, ...] = (
    "speculative_algorithm",
    "speculative_draft_model_path",
    "speculative_draft_model_revision",
    "speculative_draft_load_format",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "speculative_accept_threshold_single",
    "speculative_accept_threshold_acc",
    "speculative_token_map",
    "speculative_attention_mode",
    "speculative_draft_attention_backend",
    "speculative_moe_runner_backend",
    "speculative_draft_model_quantization",
    "speculative_ngram_min_match_window_size",
    "speculative_ngram_max_match_window_size",
    "speculative_ngram_min_bfs_breadth",
    "speculative_ngram_max_bfs_breadth",
    "speculative_ngram_match_type",
    "speculative_ngram_branch_length",
    "speculative_ngram_capacity",
    "speculative_use_rejection_sampling",
    "speculative_adaptive",
)

_GENERAL: tuple[str, ...] = (
    # model and tokenizer
    "model_path", "tokenizer_path", "tokenizer_mode", "tokenizer_worker_num", "skip_tokenizer_init",
    "load_format", "model_loader_extra_config", "trust_remote_code", "context_length",
    "is_embedding", "enable_multimodal", "revision", "model_impl", "dtype", "quantization",
    "quantization_param_path", "kv_cache_dtype", "served_model_name", "weight_version",
    "chat_template", "completion_template", "json_model_override_args", "preferred_sampling_params",
    "custom_weight_loader", "weight_loader_disable_mmap", "delete_ckpt_after_loading",
    "download_dir", "enable_tokenizer_batch_encode", "disable_fast_image_processor",
    "modelopt_quant", "modelopt_checkpoint_restore_path", "modelopt_checkpoint_save_path",
    "hybrid_kvcache_ratio", "swa_full_tokens_ratio", "disable_hybrid_swa_memory",
    "max_mamba_cache_size", "mamba_ssm_dtype",
    # HTTP server
    "host", "port", "skip_server_warmup", "warmups", "nccl_port", "api_key", "file_storage_path",
    "enable_cache_report", "reasoning_parser", "tool_call_parser", "tool_server",
    "allow_auto_truncate", "enable_custom_logit_processor", "enable_return_hidden_states",
    # memory and scheduling
    "mem_fraction_static", "max_running_requests", "max_queued_requests", "max_total_tokens",
    "chunked_prefill_size", "max_prefill_tokens", "schedule_policy",
    "enable_priority_scheduling", "schedule_low_priority_values_first",
    "priority_scheduling_preemption_threshold", "schedule_conservativeness", "page_size",
    "cpu_offload_gb", "offload_group_size", "offload_num_in_group", "offload_prefetch_step_size",
    "offload_mode", "num_continuous_decode_steps", "stream_interval", "stream_output",
    "scheduler_recv_interval", "sleep_on_idle", "enable_mixed_chunk", "disable_overlap_schedule",
    "num_reserved_decode_tokens", "enable_memory_saver", "enable_deterministic_inference",
    # parallelism and distribution
    "device", "tp_size", "tensor_parallel_size", "pp_size", "pipeline_parallel_size",
    "max_micro_batch_size", "dp_size", "data_parallel_size", "load_balance_method",
    "dist_init_addr", "nccl_init_addr", "nnodes", "node_rank", "base_gpu_id", "gpu_id_step",
    "dist_timeout", "numa_node", "enable_dp_attention", "enable_dp_lm_head",
    "enable_two_batch_overlap", "tbo_token_distribution_threshold",
    # experts
    "ep_size", "expert_parallel_size", "moe_a2a_backend", "moe_runner_backend",
    "flashinfer_mxfp4_moe_precision", "enable_flashinfer_allreduce_fusion", "deepep_mode",
    "ep_num_redundant_experts", "ep_dispatch_algorithm", "init_expert_location", "enable_eplb",
    "eplb_algorithm", "eplb_rebalance_num_iterations", "eplb_rebalance_layers_per_chunk",
    "expert_distribution_recorder_mode", "expert_distribution_recorder_buffer_size",
    "enable_expert_distribution_metrics", "deepep_config", "moe_dense_tp_size",
    "disable_shared_experts_fusion", "disable_flashinfer_cutlass_moe_fp4_allgather",
    # kernels and backends
    "attention_backend", "decode_attention_backend", "prefill_attention_backend",
    "sampling_backend", "grammar_backend", "mm_attention_backend",
    "disable_radix_cache", "cuda_graph_max_bs", "cuda_graph_bs", "cuda_graph_max_bs_decode",
    "cuda_graph_bs_decode", "cuda_graph_backend_decode", "cuda_graph_backend_prefill",
    "disable_cuda_graph", "disable_cuda_graph_padding", "enable_profile_cuda_graph",
    "enable_cudagraph_gc", "enable_nccl_nvls", "enable_symm_mem", "enable_torch_symm_mem",
    "disable_custom_all_reduce", "enable_mscclpp", "enable_torch_compile", "torch_compile_max_bs",
    "torchao_config", "enable_nan_detection", "enable_p2p_check",
    "triton_attention_reduce_in_fp32", "triton_attention_num_kv_splits",
    "triton_attention_split_tile_size", "flashinfer_mla_disable_ragged",
    "disable_chunked_prefix_cache", "disable_outlines_disk_cache", "constrained_json_whitespace_pattern",
    "enable_pdmux", "sm_group_num",
    # hierarchical cache and sparsity
    "enable_hierarchical_cache", "hicache_ratio", "hicache_size", "hicache_write_policy",
    "hicache_io_backend", "hicache_mem_layout", "hicache_storage_backend",
    "hicache_storage_prefetch_policy", "enable_double_sparsity", "ds_channel_config_path",
    "ds_heavy_channel_num", "ds_heavy_token_num", "ds_heavy_channel_type",
    "ds_sparse_decode_threshold",
    # LoRA
    "enable_lora", "max_lora_rank", "lora_target_modules", "lora_paths", "max_loaded_loras",
    "max_loras_per_batch", "lora_backend",
    # logging, metrics, debugging
    "random_seed", "watchdog_timeout", "log_level", "log_level_http", "log_requests",
    "log_requests_level", "crash_dump_folder", "show_time_cost", "enable_metrics",
    "enable_metrics_for_all_schedulers", "tokenizer_metrics_custom_labels_header",
    "bucket_time_to_first_token", "bucket_inter_token_latency", "bucket_e2e_request_latency",
    "collect_tokens_histogram", "prompt_tokens_buckets", "generation_tokens_buckets",
    "decode_log_interval", "enable_request_time_stats_logging", "kv_events_config",
    "gc_warning_threshold_secs", "debug_tensor_dump_output_folder",
    "debug_tensor_dump_input_file", "debug_tensor_dump_inject", "debug_tensor_dump_prefill_only",
    # disaggregation
    "disaggregation_mode", "disaggregation_transfer_backend", "disaggregation_bootstrap_port",
    "disaggregation_decode_tp", "disaggregation_decode_dp", "disaggregation_prefill_pp",
    "disaggregation_ib_device", "pdlb_url",
)

SERVER_ARGS: frozenset[str] = frozenset(_GENERAL + SPEC_KEYS)


def is_known(name: str) -> bool:
    """True when `name` is a known SGLang server-argument field name."""
    return name in SERVER_ARGS


def suggest(name: str, n: int = 3) -> list[str]:
    """Close matches for a misspelt argument name (may be empty)."""
    return difflib.get_close_matches(name, sorted(SERVER_ARGS), n=n, cutoff=0.6)


def unknown_message(name: str, where: str) -> str:
    """The actionable refusal text for an unknown engine argument."""
    close = suggest(name)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    return (f"{where}: '{name}' is not a known SGLang server argument.{hint} "
            f"Use the SGLang field name (with '_', e.g. mem_fraction_static for --mem-fraction-static), "
            f"or env.{name}=... for an environment variable.")


# --------------------------------------------------------------------------- value types
# The type SGLang's argparse gives a known argument, so `mem_fraction_static=abc` is refused offline rather
# than by the engine after the launch. Bare flags (`store_true`) take true/false (false omits the flag).

INT_ARGS: frozenset[str] = frozenset({
    "tp_size", "tensor_parallel_size", "pp_size", "pipeline_parallel_size", "dp_size", "data_parallel_size",
    "ep_size", "expert_parallel_size", "max_running_requests", "max_queued_requests", "max_total_tokens",
    "chunked_prefill_size", "max_prefill_tokens", "page_size", "cuda_graph_max_bs", "decode_log_interval",
    "stream_interval", "port", "nccl_port", "num_continuous_decode_steps", "context_length", "random_seed",
    "nnodes", "node_rank", "base_gpu_id", "gpu_id_step", "dist_timeout", "torch_compile_max_bs",
    "max_lora_rank", "max_loras_per_batch", "tokenizer_worker_num", "ep_num_redundant_experts",
    "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
    "disaggregation_bootstrap_port", "max_micro_batch_size"})
FLOAT_ARGS: frozenset[str] = frozenset({
    "mem_fraction_static", "schedule_conservativeness", "hicache_ratio", "swa_full_tokens_ratio",
    "speculative_accept_threshold_single", "speculative_accept_threshold_acc", "watchdog_timeout",
    "gc_warning_threshold_secs", "cpu_offload_gb"})
BOOL_ARGS: frozenset[str] = frozenset({
    "trust_remote_code", "skip_tokenizer_init", "is_embedding", "enable_multimodal", "skip_server_warmup",
    "disable_radix_cache", "disable_cuda_graph", "disable_cuda_graph_padding", "disable_custom_all_reduce",
    "disable_overlap_schedule", "enable_mixed_chunk", "enable_dp_attention", "enable_dp_lm_head",
    "enable_torch_compile", "enable_nan_detection", "enable_p2p_check", "enable_metrics", "log_requests",
    "show_time_cost", "enable_two_batch_overlap", "enable_eplb", "enable_hierarchical_cache", "enable_lora",
    "enable_memory_saver", "enable_deterministic_inference", "enable_cache_report", "enable_nccl_nvls",
    "enable_symm_mem", "enable_mscclpp", "disable_outlines_disk_cache", "disable_chunked_prefix_cache",
    "enable_return_hidden_states", "enable_custom_logit_processor", "allow_auto_truncate"})


def type_problem(name: str, value: Any) -> str | None:
    """Why `value` is not a valid value of the known argument `name` (None when it is, or when the
    argument's type is not known here: the node's --help and the engine stay the final checks)."""
    if value is None or isinstance(value, list):
        return None
    if name in BOOL_ARGS:
        return None if isinstance(value, bool) else (
            f"{name} is a bare flag (--{name.replace('_', '-')}): give true or false, not {value!r}")
    want: type | None = int if name in INT_ARGS else float if name in FLOAT_ARGS else None
    if want is None:
        return None
    if isinstance(value, bool):
        return f"{name} takes {'an integer' if want is int else 'a number'}, not {value!r}"
    try:
        number = float(str(value).strip())
        if want is int and (not number.is_integer() or "." in str(value)):
            raise ValueError
    except ValueError:
        return f"{name} takes {'an integer' if want is int else 'a number'}, not {value!r}"
    return None
