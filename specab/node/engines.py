"""Engine knowledge in one place: what differs between SGLang generations (issue 15).

Stdlib only. The node tools import it as a sibling (``import engines``: node_prepare copies every
``specab/node/*.py``); the controller imports ``specab.node.engines``. The simulator does NOT import it:
it plays the real engine, whose behaviour these tables describe, so tests can hold one against the other.

Everything here is keyed by what the node's own engine reports, never by a guess:
- its ``--help`` flag set (``generation_of_flags``): a flag set with ``--cuda-graph-backend-decode`` and
  without ``--cuda-graph-max-bs`` is the 0.5.23 generation; anything else the 0.5.9 one;
- its version string when known (``generation_of_version``), e.g. ``"0.5.23"`` from ``/server_info``.

Experiments keep logical names (``cuda_graph_max_bs: 16``, ``disable_cuda_graph: true``);
``spell_args`` turns them into the node's spelling (``cuda_graph_max_bs_decode: 16`` on 0.5.23), or
raises ``NoSpelling`` naming the flags the node does have. Sources: shared/reference/engines-2026.md.
"""
from __future__ import annotations

import hashlib
import re
from typing import Any, Dict, FrozenSet, Iterable, List, NamedTuple, Optional, Sequence, Tuple

SGLANG_0_5_9 = "0.5.9"
SGLANG_0_5_23 = "0.5.23"
GENERATIONS = (SGLANG_0_5_9, SGLANG_0_5_23)


class Generation(NamedTuple):
    """What specab relies on that changed between SGLang 0.5.9 and 0.5.23 (engines-2026.md A1-A7)."""
    name: str
    overlap_kept_under_spec: bool        # A2: 0.5.9 disables the overlap scheduler under EAGLE; 0.5.23 keeps it
    mixed_chunk_kept_under_spec: bool    # A2: 0.5.9 forces mixed chunk off under EAGLE
    accept_rate_def: str                 # A3: what the Decode line's `accept rate` divides
    spec_meta_final_only: bool           # A4: per-request spec fields in the final chunk only
    spec_meta_fields: Tuple[str, str, str]   # (correct drafts, proposed drafts, histogram) meta_info names
    server_info_path: str                # A4: the non-deprecated path
    graph_readback: Tuple[str, ...]      # A4: where the resolved decode max batch size sits in /server_info
    shutdown: str                        # A7: "tree-kill" (main SIGKILLs its tree and itself, rc -9) or
                                         #     "shutdown-req" (drain, ShutdownReq, children killed, main exits 0)
    main_process_titled: bool            # A7: both untitled


_TABLE: Dict[str, Generation] = {
    SGLANG_0_5_9: Generation(
        name=SGLANG_0_5_9, overlap_kept_under_spec=False, mixed_chunk_kept_under_spec=False,
        accept_rate_def="accepted tokens incl. bonus / (verify steps * draft tokens) = tau/(K+1) at topk 1",
        spec_meta_final_only=True,
        spec_meta_fields=("spec_accept_token_num", "spec_draft_token_num", "spec_accept_histogram"),
        server_info_path="/get_server_info", graph_readback=("cuda_graph_max_bs",),
        shutdown="tree-kill", main_process_titled=False),
    SGLANG_0_5_23: Generation(
        name=SGLANG_0_5_23, overlap_kept_under_spec=True, mixed_chunk_kept_under_spec=True,
        accept_rate_def="correct drafts / (verify steps * (draft tokens - 1)) = (tau-1)/K at topk 1",
        spec_meta_final_only=True,
        spec_meta_fields=("spec_num_correct_drafts", "spec_num_proposed_drafts", "spec_correct_drafts_histogram"),
        server_info_path="/server_info", graph_readback=("cuda_graph_config", "decode", "max_bs"),
        shutdown="shutdown-req", main_process_titled=False),
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
    """The generation a `--help` flag set belongs to (per-phase graph flags and no legacy max-bs: 0.5.23)."""
    fs = set(flags)
    if "--cuda-graph-backend-decode" in fs and "--cuda-graph-max-bs" not in fs:
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


def argv_of(server_args: Dict[str, Any]) -> List[str]:
    """The command-line words of (already spelled) server_args, exactly as templates/launch_server.sh.j2
    renders them: true -> bare flag; false/None -> omitted; list -> flag then each item; else flag value."""
    words: List[str] = []
    for key, value in server_args.items():
        if value is True:
            words.append(flag_of(key))
        elif value is False or value is None:
            continue
        elif isinstance(value, (list, tuple)):
            words += [flag_of(key)] + [str(v) for v in value]
        else:
            words += [flag_of(key), str(value)]
    return words


# --------------------------------------------------------------------------- log lines and readback

# Load-phase lines of both generations (A3): (needle, which graph, edge)
CAPTURE_LINES: Tuple[Tuple[str, str, str], ...] = (
    ("Capture cuda graph begin", "target", "begin"),                  # 0.5.9
    ("Capture cuda graph end", "target", "end"),
    ("Capture draft cuda graph begin", "draft", "begin"),
    ("Capture draft cuda graph end", "draft", "end"),
    ("Capture target decode CUDA graph begin", "target", "begin"),    # 0.5.23
    ("Capture target decode CUDA graph end", "target", "end"),
    ("Capture target verify CUDA graph begin", "target", "begin"),
    ("Capture target verify CUDA graph end", "target", "end"),
    ("Capture draft decode CUDA graph begin", "draft", "begin"),
    ("Capture draft decode CUDA graph end", "draft", "end"),
)


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
    out: Dict[str, Any] = {}
    for k, v in meta.items():
        if k.startswith("spec_"):
            out[SPEC_META_RENAMES.get(k, k)] = v
    return out


def generations_known() -> FrozenSet[str]:
    return frozenset(_TABLE)
