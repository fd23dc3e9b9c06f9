#!/usr/bin/env python3
"""Write the tiny models a REAL SGLang server loads with `--load-format dummy` (random weights, no download):
a Llama target (8 layers, hidden 1024, 8 heads, intermediate 2816, vocab 32000), an EAGLE-3 draft head for it
(`LlamaForCausalLMEagle3`, 1 layer, draft vocab 32000) and a local word-level tokenizer (no hub access).

    python3 scripts/make_tiny_models.py --out /tmp/specab-real/models

Needs only `tokenizers` (the bundle of scripts/real_sglang_bundle.sh carries it). Only configs and the
tokenizer are written: the weights are SGLang's dummy ones, so speeds and acceptance mean nothing.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

VOCAB = 32000
COMMON = {"vocab_size": VOCAB, "hidden_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 8,
          "intermediate_size": 2816, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
          "hidden_act": "silu", "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2,
          "pad_token_id": 0, "tie_word_embeddings": False, "model_type": "llama"}


def write_tokenizer(d: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<pad>", "<s>", "</s>", "<unk>"] + ["w%d" % i for i in range(VOCAB - 4)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "pad_token": "<pad>", "model_max_length": 4096}, indent=1))
    (d / "special_tokens_map.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}, indent=1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/specab-real/models")
    a = ap.parse_args()
    out = Path(a.out)
    target, draft = out / "target", out / "eagle3"
    for d in (target, draft):
        d.mkdir(parents=True, exist_ok=True)
    (target / "config.json").write_text(json.dumps(dict(COMMON, architectures=["LlamaForCausalLM"],
                                                        num_hidden_layers=8), indent=1))
    (draft / "config.json").write_text(json.dumps(dict(COMMON, architectures=["LlamaForCausalLMEagle3"],
                                                       num_hidden_layers=1, draft_vocab_size=VOCAB), indent=1))
    for d in (target, draft):
        (d / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
        write_tokenizer(d)
    print(json.dumps({"target": str(target), "draft": str(draft)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
