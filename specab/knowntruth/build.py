"""Build known-truth models: HF-format Llama folders (safetensors, config, a local word-level tokenizer; no hub).

Target (``LlamaForCausalLM``, any Llama shape): every layer's ``o_proj`` and ``down_proj`` are zero, so the residual
stream stays the token embedding E[t]; ``lm_head`` row f(t) is E[t] (rows of specials summed onto row ``first``),
so greedy decoding follows f(t) = t+1 over [first, vocab). q/k/v/gate/up are random: every GEMM runs.

Drafts agree with f on a seeded random set A of density p and propose f(f(t)) elsewhere:
- ``draft`` (vLLM ``draft_model``, SGLang ``STANDALONE``): a small Llama with its own embedding whose ``lm_head``
  maps its embedding of t to g(t) (rows summed with ``index_add_``: g is not a permutation).
- ``eagle3`` (``LlamaForCausalLMEagle3``): ``fc = [I/3 I/3 I/3]`` over the target's three aux hidden states (all
  E[t]); attention ``o_proj = 0``; the layer's MLP is a lookup table (intermediate = vocab) that advances
  E[t] -> E[f(t)], so each draft step moves one token along f; its ``lm_head`` maps E[u] to g(u).

Each folder gets a ``known_truth.json`` (:mod:`specab.knowntruth.truth` says what it holds). torch and safetensors
are imported only when a build runs.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from specab.knowntruth import truth

FIRST = 4                       # <pad> <s> </s> <unk>
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
LOOKUP_GAIN = 20.0              # the EAGLE-3 lookup MLP's gate gain: silu(20) ~ 20, silu(~0) ~ 0


@dataclass(frozen=True)
class Shape:
    """A Llama shape (the config.json fields a twin copies)."""
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int

    def check(self) -> None:
        if min(self.hidden, self.layers, self.heads, self.kv_heads, self.intermediate) < 1:
            raise ValueError(f"every dimension must be >= 1: {self}")
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ValueError(f"hidden {self.hidden} must divide by heads {self.heads}, heads by kv heads "
                             f"{self.kv_heads}")
        if self.vocab < FIRST + 8:
            raise ValueError(f"vocab {self.vocab} is too small (at least {FIRST + 8})")

    @property
    def params(self) -> int:
        hd = self.hidden // self.heads
        attn = self.hidden * (self.hidden + 2 * self.kv_heads * hd) + self.hidden * self.hidden
        mlp = 3 * self.hidden * self.intermediate
        return self.layers * (attn + mlp + 2 * self.hidden) + 2 * self.vocab * self.hidden + self.hidden


PRESETS: dict[str, Shape] = {
    # CPU CI on a real vLLM: 21 M parameters, built in about a second
    "tiny": Shape(hidden=512, layers=4, heads=8, kv_heads=8, intermediate=1024, vocab=32000),
    # one GPU: 3.8 B parameters (the H200 measurements of docs/validation/known-truth.md)
    "gpu-4b": Shape(hidden=4096, layers=16, heads=32, kv_heads=8, intermediate=14336, vocab=32000),
}
DRAFT_PRESETS: dict[str, Shape] = {
    "tiny": Shape(hidden=256, layers=1, heads=4, kv_heads=4, intermediate=512, vocab=32000),
    "gpu-4b": Shape(hidden=1024, layers=1, heads=8, kv_heads=8, intermediate=2816, vocab=32000),
}


def shape_like(config: dict[str, Any]) -> tuple[Shape, list[str]]:
    """A dense twin's shape from a model's config.json, and notes on what the twin approximates."""
    cfg = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    try:
        hidden, layers, heads = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), int(cfg["num_attention_heads"])
        vocab = int(cfg["vocab_size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"config.json lacks a Llama-like field: {exc}") from None
    kv = int(cfg.get("num_key_value_heads") or heads)
    notes = []
    inter = cfg.get("intermediate_size")
    experts = cfg.get("num_experts") or cfg.get("n_routed_experts") or cfg.get("num_local_experts")
    if experts:
        per = int(cfg.get("num_experts_per_tok") or cfg.get("moe_topk") or 1)
        moe_inter = int(cfg.get("moe_intermediate_size") or inter or 4 * hidden)
        inter = moe_inter * per + int(cfg.get("shared_expert_intermediate_size") or 0)
        notes.append(f"MoE ({experts} experts, {per} per token): the twin is dense with the active experts' "
                     f"intermediate size {inter}; it has the active FLOPs per token, not the expert weights' "
                     "memory traffic or routing")
    if cfg.get("model_type") not in (None, "llama"):
        notes.append(f"model_type {cfg.get('model_type')!r}: the twin is a Llama of the same hidden size, layers, "
                     "heads and vocabulary (no other architecture detail)")
    return Shape(hidden, layers, heads, kv, int(inter or 4 * hidden), vocab), notes


@dataclass(frozen=True)
class DraftSpec:
    name: str                    # folder name
    kind: str                    # "draft" | "eagle3"
    p: float
    seed: int
    shape: Shape | None = None   # the draft model's own shape (kind "draft")


def _config(shape: Shape, **extra: Any) -> dict[str, Any]:
    c = {"vocab_size": shape.vocab, "hidden_size": shape.hidden, "num_attention_heads": shape.heads,
         "num_key_value_heads": shape.kv_heads, "intermediate_size": shape.intermediate,
         "num_hidden_layers": shape.layers, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
         "rope_theta": 10000.0, "hidden_act": "silu", "torch_dtype": "bfloat16", "bos_token_id": 1,
         "eos_token_id": 2, "pad_token_id": 0, "tie_word_embeddings": False, "model_type": "llama",
         "architectures": ["LlamaForCausalLM"]}
    c.update(extra)
    return c


def _tokenizer(d: Path, vocab: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    words = SPECIALS + ["w%d" % i for i in range(vocab - FIRST)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()     # no decoder: decoding joins the words with spaces
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "pad_token": "<pad>", "model_max_length": 4096, "add_bos_token": False}))
    (d / "special_tokens_map.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>",
                                                           "unk_token": "<unk>", "pad_token": "<pad>"}))
    (d / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))


def _save(d: Path, tensors: dict[str, Any], config: dict[str, Any], doc: dict[str, Any]) -> None:
    import torch
    from safetensors.torch import save_file
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(config, indent=1))
    _tokenizer(d, config["vocab_size"])
    save_file({k: v.to(torch.bfloat16).contiguous().cpu() for k, v in tensors.items()}, str(d / "model.safetensors"),
              metadata={"format": "pt"})
    (d / truth.FILE).write_text(json.dumps(doc, separators=(",", ":")) + "\n")


def _base_doc(shape: Shape) -> dict[str, Any]:
    return {"vocab_size": shape.vocab, "first": FIRST, "rule": truth.RULE, "token_text": "w{t-first}",
            "specials": SPECIALS}


@dataclass
class Built:
    out: Path
    target: Path
    drafts: dict[str, Path]
    density: dict[str, float]
    seconds: float
    device: str

    def to_json(self) -> dict[str, Any]:
        return {"out": str(self.out), "target": str(self.target), "drafts": {k: str(v) for k, v in self.drafts.items()},
                "realized_density": self.density, "seconds": round(self.seconds, 1), "device": self.device}


class _Weights:
    """The weights of the models of one build, drawn from one generator (the target's seed) on one device, in the
    order the models are built: the same seed gives the same files."""

    def __init__(self, torch: Any, device: str, seed: int) -> None:
        self.torch, self.device = torch, device
        self.gen = torch.Generator(device=device).manual_seed(seed)

    def randn(self, *size: int, scale: float = 1.0) -> Any:
        return self.torch.randn(*size, generator=self.gen, device=self.device) * scale

    def layer(self, prefix: str, s: Shape, qkv_in: int | None = None) -> dict[str, Any]:
        torch, device = self.torch, self.device
        hd = s.hidden // s.heads
        i_n = qkv_in or s.hidden
        return {
            prefix + "self_attn.q_proj.weight": self.randn(s.hidden, i_n, scale=0.02),
            prefix + "self_attn.k_proj.weight": self.randn(s.kv_heads * hd, i_n, scale=0.02),
            prefix + "self_attn.v_proj.weight": self.randn(s.kv_heads * hd, i_n, scale=0.02),
            prefix + "self_attn.o_proj.weight": torch.zeros(s.hidden, s.hidden, device=device),
            prefix + "input_layernorm.weight": torch.ones(s.hidden, device=device),
            prefix + "post_attention_layernorm.weight": torch.ones(s.hidden, device=device),
        }

    def llama(self, s: Shape, E: Any, next_of: Any) -> dict[str, Any]:
        """A Llama of shape `s` whose every layer adds nothing (zero output projections): its next token after t is
        `next_of[t]`, through the embedding `E` tied to the rows of its lm_head."""
        torch, device = self.torch, self.device
        tens: dict[str, Any] = {
            "model.embed_tokens.weight": E, "model.norm.weight": torch.ones(s.hidden, device=device),
            "lm_head.weight": torch.zeros(s.vocab, s.hidden, device=device).index_add_(0, next_of, E)}
        for i in range(s.layers):
            pre = f"model.layers.{i}."
            tens.update(self.layer(pre, s))
            tens[pre + "mlp.gate_proj.weight"] = self.randn(s.intermediate, s.hidden, scale=0.02)
            tens[pre + "mlp.up_proj.weight"] = self.randn(s.intermediate, s.hidden, scale=0.02)
            tens[pre + "mlp.down_proj.weight"] = torch.zeros(s.hidden, s.intermediate, device=device)
        return tens

    def eagle3(self, shape: Shape, E: Any, fidx: Any, gidx: Any) -> dict[str, Any]:
        """An EAGLE-3 head over the target of `shape` (embedding `E`, next token `fidx`) that proposes `gidx`."""
        torch, device, H = self.torch, self.device, shape.hidden
        eye = torch.eye(H, device=device) / 3
        et = {"fc.weight": torch.cat([eye, eye, eye], dim=1),
              "midlayer.hidden_norm.weight": torch.ones(H, device=device),
              "midlayer.mlp.gate_proj.weight": E * (LOOKUP_GAIN / H),
              "midlayer.mlp.up_proj.weight": E / H,
              "midlayer.mlp.down_proj.weight": ((E[fidx] - E) / LOOKUP_GAIN).T.contiguous(),
              "norm.weight": torch.ones(H, device=device),
              "lm_head.weight": torch.zeros(shape.vocab, H, device=device).index_add_(0, gidx, E)}
        et.update(self.layer("midlayer.", shape, qkv_in=2 * H))
        return et


def build(out: Path, shape: Shape, drafts: list[DraftSpec], seed: int = 0, device: str = "auto",
          twin_of: str | None = None, notes: list[str] | None = None) -> Built:
    """Write ``out/target`` and one folder per draft, each with its known_truth.json."""
    import torch
    shape.check()
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    t0 = time.monotonic()
    out = Path(out)
    V, H = shape.vocab, shape.hidden
    rule = truth.Rule(V, FIRST)
    w = _Weights(torch, device, seed)
    fidx = torch.tensor([rule.next(t) for t in range(V)], device=device)
    E = w.randn(V, H)
    target_doc = {**_base_doc(shape), "role": "target", "shape": asdict(shape), "seed": seed,
                  "twin_of": twin_of, "notes": notes or []}
    _save(out / "target", w.llama(shape, E, fidx), _config(shape), target_doc)
    paths, density = {}, {}
    for spec in drafts:
        if not 0.0 <= spec.p <= 1.0:
            raise ValueError(f"draft {spec.name}: p {spec.p} must lie in [0, 1]")
        dgen = torch.Generator(device=device).manual_seed(spec.seed)
        A = torch.rand(V, generator=dgen, device=device) < spec.p
        gidx = torch.where(A, fidx, fidx[fidx])
        agree = sorted(int(t) for t in torch.nonzero(A).flatten().tolist())
        doc = {**_base_doc(shape), "role": "draft", "kind": spec.kind, "p": spec.p, "seed": spec.seed,
               "target": "../target", "agree": agree}
        if spec.kind == "draft":
            ds = replace(spec.shape or DRAFT_PRESETS["tiny"], vocab=V)
            ds.check()
            doc["shape"] = asdict(ds)
            _save(out / spec.name, w.llama(ds, w.randn(V, ds.hidden), gidx), _config(ds), doc)
        elif spec.kind == "eagle3":
            cfg = _config(replace(shape, layers=1, intermediate=V), architectures=["LlamaForCausalLMEagle3"],
                          draft_vocab_size=V, target_hidden_size=H)
            doc["shape"] = asdict(replace(shape, layers=1, intermediate=V))
            _save(out / spec.name, w.eagle3(shape, E, fidx, gidx), cfg, doc)
        else:
            raise ValueError(f"draft {spec.name}: kind {spec.kind!r} is not 'draft' or 'eagle3'")
        paths[spec.name] = out / spec.name
        density[spec.name] = sum(1 for t in agree if t >= FIRST) / (V - FIRST)
    if device == "cuda":
        torch.cuda.synchronize()
    return Built(out, out / "target", paths, density, time.monotonic() - t0, device)


def parse_draft(text: str, index: int, default_seed: int) -> DraftSpec:
    """``KIND:P[:SEED][:NAME]``, e.g. ``eagle3:0.9`` or ``draft:0.5:7:weak``."""
    parts = text.split(":")
    if len(parts) < 2 or parts[0] not in ("draft", "eagle3"):
        raise ValueError(f"--draft {text!r}: write KIND:P[:SEED][:NAME] with KIND draft or eagle3, e.g. eagle3:0.9")
    try:
        p = float(parts[1])
        seed = int(parts[2]) if len(parts) > 2 and parts[2] else default_seed + 1 + index
    except ValueError:
        raise ValueError(f"--draft {text!r}: P must be a number in [0, 1] and SEED an integer") from None
    if not 0.0 <= p <= 1.0 or math.isnan(p):
        raise ValueError(f"--draft {text!r}: P {p} must lie in [0, 1]")
    name = parts[3] if len(parts) > 3 and parts[3] else f"{parts[0]}-p{p:g}"
    return DraftSpec(name, parts[0], p, seed)


def register(subparsers: Any) -> Any:
    """``driver.py known-truth build``: the models, their known_truth.json, a JSON line of what was built."""
    p = subparsers.add_parser(
        "known-truth", help="build known-truth models (a target and drafts whose acceptance is known exactly)",
        description="Known-truth models: a Llama target whose greedy output is f(t)=t+1 and drafts that agree with "
                    "it on a random token set of density p. Each folder holds safetensors, config.json, a local "
                    "tokenizer and known_truth.json (enough to recompute every cycle's accepted count). Needs torch, "
                    "safetensors and tokenizers.")
    sub = p.add_subparsers(dest="kt_command", required=True)
    b = sub.add_parser("build", help="write OUT/target and OUT/<draft> folders",
                       description="Example: driver.py known-truth build --out /models/kt --preset tiny "
                                   "--draft draft:0.8. A twin of your model: --like /models/Llama-3.1-8B/config.json "
                                   "--draft eagle3:0.5 --draft eagle3:0.7 --draft eagle3:0.9.")
    b.add_argument("--out", required=True, type=Path, help="folder to write (target/ and one folder per draft)")
    b.add_argument("--preset", choices=sorted(PRESETS), default=None, help="a target shape (default tiny)")
    b.add_argument("--like", type=Path, metavar="CONFIG_JSON",
                   help="a dense twin of this config.json's shape (hidden, layers, heads, kv heads, intermediate, vocab)")
    for name in ("hidden", "layers", "heads", "kv_heads", "intermediate", "vocab"):
        b.add_argument("--" + name.replace("_", "-"), type=int, help=f"override the target's {name}")
    b.add_argument("--draft", action="append", default=[], metavar="KIND:P[:SEED][:NAME]",
                   help="a draft: KIND draft (vLLM draft_model, SGLang STANDALONE) or eagle3 (LlamaForCausalLMEagle3), "
                        "agreement P; repeat for several (default draft:0.8)")
    b.add_argument("--draft-preset", choices=sorted(DRAFT_PRESETS), default=None,
                   help="the draft model's shape (default: the target preset's, else tiny)")
    b.add_argument("--seed", type=int, default=0, help="the target's seed; drafts default to seed+1, seed+2, ...")
    b.add_argument("--device", default="auto", help="auto (cuda when available), cpu or cuda")
    b.set_defaults(func=cmd_build)
    return p


def cmd_build(ns: Any, out: Any = None) -> int:
    import sys
    out = out or sys.stdout
    notes: list[str] = []
    twin_of = None
    if ns.like:
        try:
            shape, notes = shape_like(json.loads(Path(ns.like).read_text()))
        except (OSError, ValueError) as exc:
            print(f"error: --like {ns.like}: {exc}", file=sys.stderr)
            return 2
        twin_of = str(ns.like)
        if ns.preset:
            print("error: --like and --preset both name a shape: give one", file=sys.stderr)
            return 2
    else:
        shape = PRESETS[ns.preset or "tiny"]
    over = {k: getattr(ns, k) for k in ("hidden", "layers", "heads", "kv_heads", "intermediate", "vocab")
            if getattr(ns, k) is not None}
    shape = replace(shape, **over)
    try:
        shape.check()
        drafts = [parse_draft(d, i, ns.seed) for i, d in enumerate(ns.draft or ["draft:0.8"])]
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    names = [d.name for d in drafts]
    if len(set(names)) != len(names) or "target" in names:
        print(f"error: draft folder names must be distinct and not 'target' (got {names}): name them with "
              "KIND:P:SEED:NAME", file=sys.stderr)
        return 2
    dshape = DRAFT_PRESETS.get(ns.draft_preset or ns.preset or "tiny", DRAFT_PRESETS["tiny"])
    drafts = [replace(d, shape=dshape) if d.kind == "draft" else d for d in drafts]
    built = build(ns.out, shape, drafts, seed=ns.seed, device=ns.device, twin_of=twin_of, notes=notes)
    print(json.dumps({**built.to_json(), "shape": asdict(shape), "params": shape.params, "notes": notes}), file=out)
    return 0
