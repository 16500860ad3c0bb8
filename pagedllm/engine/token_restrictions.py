"""Checks and resolves a request's token restrictions against the model's vocabulary when it is
added: logit_bias / allowed_token_ids ids in range, bad_words tokenized (vLLM's rule: the word as
written and with a leading space, as two token sequences when they differ)."""

from __future__ import annotations

from pagedllm.sampling_params import SamplingParams


def resolve_token_restrictions(params: SamplingParams, tokenizer, vocab_size: int) -> None:
    """Raises ValueError naming the field; fills `params.bad_words_token_ids`."""
    for name, ids in (("logit_bias", params.logit_bias or ()),
                      ("allowed_token_ids", params.allowed_token_ids or ())):
        bad = next((t for t in ids if t >= vocab_size), None)
        if bad is not None:
            raise ValueError(f"{name} token id {bad} is out of range [0, {vocab_size})")
    words: list[list[int]] = []
    for word in params.bad_words or ():
        for text in (word.lstrip(), " " + word.lstrip()):
            ids = list(tokenizer.encode(text, add_special_tokens=False))
            if ids and ids not in words:
                words.append(ids)
    params.bad_words_token_ids = words
