"""When a sequence stops on a token it has just appended (vLLM v1 order and semantics).

Stop tokens come first: once `min_tokens` are generated, EOS (unless `ignore_eos`) and
`stop_token_ids`; their text is left out of the output unless `include_stop_str_in_output`.
Stop strings come next, but they need the detokenized text, so the output processor checks
them (engine/output_processor.py) and a hit overrides the two checks below. Then a finished
grammar (only EOS could follow: stop as if it had been sampled), then `max_tokens` or
`max_model_len` ("length").
"""

from __future__ import annotations

from pagedllm.core.request import Request, RequestStatus


def is_stop_token(request: Request, token_id: int, num_output_tokens: int) -> bool:
    """`token_id`, the `num_output_tokens`-th output token of `request`, is a stop token."""
    p = request.sampling_params
    if num_output_tokens < p.min_tokens:
        return False
    return (not p.ignore_eos and token_id == request.eos_token_id) or (
        token_id in p.stop_token_ids)


def stop_status(request: Request, token_id: int, max_model_len: int
                ) -> tuple[RequestStatus, int | None] | None:
    """The status `request` finishes with after appending `token_id` (and the stop reason:
    the stop token's id, None for EOS), or None if it goes on. Stop strings are not checked
    here (see the module doc)."""
    if is_stop_token(request, token_id, request.num_output_tokens):
        eos = not request.sampling_params.ignore_eos and token_id == request.eos_token_id
        return RequestStatus.FINISHED_STOPPED, None if eos else token_id
    if request.grammar is not None and request.grammar.is_terminated:
        return RequestStatus.FINISHED_STOPPED, None
    if request.num_output_tokens >= request.max_tokens or request.num_tokens >= max_model_len:
        return RequestStatus.FINISHED_LENGTH, None
    return None
