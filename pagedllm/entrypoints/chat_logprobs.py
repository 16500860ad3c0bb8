"""Chat logprobs in OpenAI's shape: per generated token its string, logprob and UTF-8 bytes,
with the `top_logprobs` best alternatives (by the engine's rank)."""

from __future__ import annotations

from collections.abc import Callable

from pagedllm.entrypoints.protocol_responses import ChatLogprobs, ChatTokenLogprob, TopLogprob
from pagedllm.outputs import SampleLogprobs


def chat_logprobs(
    token_str: Callable[[int], str],
    token_ids: list[int],
    logprobs: SampleLogprobs | None,
    num_top: int | None,
) -> ChatLogprobs | None:
    """None unless the request asked for logprobs (`num_top` set)."""
    if logprobs is None or num_top is None:
        return None

    def entry_of(token_id: int, logprob: float) -> dict:
        tok = token_str(token_id)
        return {"token": tok, "logprob": logprob, "bytes": list(tok.encode("utf-8"))}

    content = []
    for tid, entry in zip(token_ids, logprobs, strict=True):
        top = sorted(
            (v.rank or 0, t, v.logprob)
            for t, v in entry.items()
            if v.rank is not None and v.rank <= num_top
        )[:num_top]
        content.append(
            ChatTokenLogprob(
                **entry_of(tid, entry[tid].logprob),
                top_logprobs=[TopLogprob(**entry_of(t, lp)) for _, t, lp in top],
            )
        )
    return ChatLogprobs(content=content)
