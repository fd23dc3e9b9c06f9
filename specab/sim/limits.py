"""What SGLang refuses of a request before it runs: a prompt of the context length or more, and a prompt and answer
beyond it (TokenizerManager._validate_one_request, its error texts verbatim), with the context length SGLang derives
from the model's config.json when the launch gives none.

The /generate API answers such a request 400 `{"error": {"message": ...}}`, the OpenAI APIs with their error
object; nothing of it reaches the scheduler.
"""
from __future__ import annotations

import json
import os
from typing import Optional

from specab.vocab import engines


def model_context(model_path: str) -> Optional[int]:
    """The context length of a model whose folder holds a config.json (None: no such folder, the profile's)."""
    try:
        with open(os.path.join(os.path.expanduser(model_path), "config.json"), encoding="utf-8") as fh:
            config = json.load(fh)
    except (OSError, ValueError):
        return None
    found = engines.context_of_config(config) if isinstance(config, dict) else None
    return found[0] if found else None


def context_error(input_tokens: int, max_new_tokens: Optional[int], context_len: int) -> Optional[str]:
    """SGLang's refusal of a request of `input_tokens` asking `max_new_tokens` on a `context_len` model, or None."""
    if input_tokens >= context_len:
        return (f"The input ({input_tokens} tokens) is longer than the model's context length "
                f"({context_len} tokens).")
    if max_new_tokens is not None and max_new_tokens + input_tokens > context_len:
        total = max_new_tokens + input_tokens
        return (f"Requested token count exceeds the model's maximum context length of {context_len} tokens. You "
                f"requested a total of {total} tokens: {input_tokens} tokens from the input messages and "
                f"{max_new_tokens} tokens for the completion. Please reduce the number of tokens in the input "
                f"messages or the completion to fit within the limit.")
    return None
