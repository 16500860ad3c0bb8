"""Logprobs in the response shapes of the OpenAI routes: the legacy completions shape (prompt
and completion tokens alike, for `echo` + `logprobs`) and vLLM's `prompt_logprobs` field.

Legacy shape, one column per token (OpenAI's, as vLLM fills it)::

    tokens          ["The", " cat", " sat"]
    token_logprobs  [null,  -2.1,   -0.7]      null: nothing predicts the first prompt token
    top_logprobs    [null,  {...},  {...}]     the token itself and the top `logprobs`
    text_offset     [0,     3,      7]         where each token starts in the choice's text

Logprobs of -inf are sent as -9999.0 (JSON has no infinity; OpenAI's floor).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pagedllm.entrypoints.protocol_responses import (
    CompletionLogprobs,
    PromptLogprob,
    PromptLogprobsJSON,
)
from pagedllm.outputs import Logprob

LOGPROB_FLOOR = -9999.0


def _clamp(value: float) -> float:
    return max(value, LOGPROB_FLOOR)


def legacy_logprobs(
    token_ids: Sequence[int],
    entries: Sequence[dict[int, Logprob] | None],
    num_top: int,
    offset: int,
    token_str: Callable[[int], str],
) -> tuple[CompletionLogprobs, int]:
    """The legacy shape of `token_ids` with their logprob `entries` (None: not scored); the
    first token starts at `offset` in the text. Returns it and the offset after the last
    token. Each position's top_logprobs holds the first `num_top + 1` entries (the token
    itself first, then the most likely), as vLLM's; distinct ids that decode alike keep the
    likeliest."""
    lp = CompletionLogprobs()
    for tid, entry in zip(token_ids, entries, strict=True):
        tok = token_str(tid)
        lp.tokens.append(tok)
        if entry is None:
            lp.token_logprobs.append(None)
            lp.top_logprobs.append(None)
        else:
            lp.token_logprobs.append(_clamp(entry[tid].logprob))
            top: dict[str, float] = {}
            for rank, (t, v) in enumerate(entry.items()):
                if rank > num_top:
                    break
                key = token_str(t)
                top[key] = max(_clamp(v.logprob), top.get(key, LOGPROB_FLOOR))
            lp.top_logprobs.append(top)
        lp.text_offset.append(offset)
        offset += len(tok)
    return lp, offset


def prompt_logprobs_json(
    entries: Sequence[dict[int, Logprob] | None] | None,
) -> PromptLogprobsJSON | None:
    """vLLM's `prompt_logprobs` field: per prompt token None (the first) or {token id:
    {logprob, rank, decoded_token}}."""
    if entries is None:
        return None
    return [
        None
        if e is None
        else {
            t: PromptLogprob(logprob=_clamp(v.logprob), rank=v.rank, decoded_token=v.decoded_token)
            for t, v in e.items()
        }
        for e in entries
    ]
