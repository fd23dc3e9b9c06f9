"""The simulated server's tokenizer and its scoring of text (input-token log-probabilities).

Tokenizer (``/tokenize``): a prompt's tokens are its words as the engine counts them (engine.count_prompt_tokens),
each word's id a stable hash above every output id (``WORD_ID_BASE``); the server keeps the words it tokenized, so
``input_ids`` holding them map back to the same words, and a prompt sent as text and as its ids is the same prompt.

Scoring (``/generate`` with ``return_logprob`` and ``logprob_start_len``, SGLang 0.5.17's format): the input up to
and including position ``logprob_start_len`` is taken as the prompt, every later token as its output, scored under
the target's raw distribution (sampling.py ``score``). ``meta_info.input_token_logprobs`` holds one
``[logprob, token_id, None]`` per input token from ``logprob_start_len`` on, the first with logprob ``None``: SGLang
returns no log-probability for the token at ``logprob_start_len`` itself (``[None] + logprobs[:-1]``,
scheduler_components/logprob_result_processor.py), so a scorer starts one token before the output. Pure.
"""
from __future__ import annotations

import hashlib
from typing import Any, Optional

from specab.sim import sampling
from specab.sim.outputs import prompt_digest

WORD_ID_BASE = 10 ** 15


def word_id(word: str) -> int:
    return WORD_ID_BASE + int(hashlib.sha1(word.encode("utf-8")).hexdigest()[:12], 16)


def chat_prompt(messages: list[Any]) -> str:
    """The text the simulated chat template makes of a chat request's messages."""
    text = "\n".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
    return f"<|im_system|>system<|im_middle|>\n{text}\n<|im_assistant|>assistant<|im_middle|>"


class Vocab:
    """Word <-> id for the prompts this server tokenized."""

    def __init__(self) -> None:
        self.words: dict[int, str] = {}

    def ids(self, words: list[str]) -> list[int]:
        out = []
        for w in words:
            i = word_id(w)
            self.words[i] = w
            out.append(i)
        return out

    def words_of(self, ids: list[int]) -> list[str]:
        """The engine's prompt words of ``input_ids``: a tokenized word's id is that word, any other id its digits
        (a known-truth model's token-id prompt, an output token)."""
        return [self.words.get(i, str(i)) for i in ids]


def input_token_logprobs(words: list[str], ids: list[int], start: int) -> Optional[list[list[Any]]]:
    """SGLang's ``input_token_logprobs`` of an input from ``start`` on (None: ``start`` < 0, none asked)."""
    if start < 0 or start >= len(ids):
        return None if start < 0 else []
    cont = ids[start + 1:]
    logps = sampling.score(prompt_digest(words[:start + 1]), cont)
    return [[None, ids[start], None]] + [[lp, t, None] for lp, t in zip(logps, cont)]
