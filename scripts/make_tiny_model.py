"""Make the tiny random-weight Llama models a CPU vLLM serves with `--load-format dummy` (no hub, no weights).

Run with the vLLM venv's python (it needs the `tokenizers` library):

    python scripts/make_tiny_model.py DIR

DIR/tiny-llama        the target: Llama, hidden 512, 2 layers, 8 heads, vocab 4003 (the facts of real engines on CPU)
DIR/tiny-llama-weak   a weak draft: other shape (hidden 256, 1 layer), so other dummy weights -> low acceptance
DIR/tiny-eagle3       an EAGLE-3 draft head (LlamaForCausalLMEagle3): vLLM on CPU serves /health then fails
DIR/tiny-llama-6l     the 6-layer target of that EAGLE-3 failure

The tokenizer is word-level: w0 ... w3999 plus <unk> <s> </s>, split on whitespace. Idempotent: a model whose
files already hold the same text is left alone.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

VOCAB_WORDS = 4000
SPECIALS = ("<unk>", "<s>", "</s>")


def llama_config(hidden: int, layers: int, heads: int) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": hidden * 2,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "vocab_size": VOCAB_WORDS + len(SPECIALS),
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
        "bos_token_id": VOCAB_WORDS + 1,
        "eos_token_id": VOCAB_WORDS + 2,
    }


def eagle3_config() -> dict:
    config = llama_config(512, 1, 8)
    config["architectures"] = ["LlamaForCausalLMEagle3"]
    config["draft_vocab_size"] = VOCAB_WORDS + len(SPECIALS)
    return config


def tokenizer_json() -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(VOCAB_WORDS)}
    for offset, special in enumerate(SPECIALS):
        vocab[special] = VOCAB_WORDS + offset
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tokenizer.to_str()


def tokenizer_config() -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "<unk>",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "model_max_length": 4096,
    }


def write_if_changed(path: Path, text: str) -> None:
    if path.exists() and path.read_text() == text:
        return
    path.write_text(text)


def make_model(directory: Path, config: dict, tokenizer: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    write_if_changed(directory / "config.json", json.dumps(config, indent=2) + "\n")
    write_if_changed(directory / "tokenizer.json", tokenizer)
    write_if_changed(directory / "tokenizer_config.json", json.dumps(tokenizer_config(), indent=2) + "\n")
    write_if_changed(directory / "generation_config.json", json.dumps({"do_sample": False}) + "\n")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    root = Path(argv[0])
    tokenizer = tokenizer_json()
    make_model(root / "tiny-llama", llama_config(512, 2, 8), tokenizer)
    make_model(root / "tiny-llama-weak", llama_config(256, 1, 4), tokenizer)
    make_model(root / "tiny-llama-6l", llama_config(512, 6, 8), tokenizer)
    make_model(root / "tiny-eagle3", eagle3_config(), tokenizer)
    print(f"tiny models under {root}: tiny-llama, tiny-llama-weak, tiny-llama-6l, tiny-eagle3")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
