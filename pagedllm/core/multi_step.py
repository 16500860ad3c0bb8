"""How many decode steps one engine step runs (`num_scheduler_steps`, vLLM's name).

A step of decodes only, with nothing waiting, can run k steps in one call to the model
(model/decode_steps.py): the Python around a step (scheduling, batch tensors, sampling,
detokenizing) is paid once for k tokens of every row. Each row then gets up to k tokens in
one update, as an accepted speculative run does: the scheduler appends them in order, stops
a row at its first stop token or string (later tokens dropped) and gives back the slots it
did not use (`Scheduler._commit_drafts`).

Runs ahead only when every row would produce the same tokens one step at a time: greedy, or
random with temperature / top-k / top-p (the sampler's C++ draw; a request's uniforms are
drawn ahead in its step order), no min_p, logprobs, penalties, logit bias, allowed / bad
words, grammar, reasoning budget, LoRA adapter or pending `min_tokens`, one sequence past its
prompt (not an n > 1 request fanning out, not a prompt's last token, whose prompt logprobs
are due); and only when nothing else wants the step (no waiting or
swapped request, no preemption, swap or block copy this step), so a new request waits at most
k - 1 steps longer for its first token. k is capped by each row's `max_tokens` and the model
length and by the batch's rows (`ROWS_PER_RUN`), and falls back to 1 unless the blocks for
all k steps are free now.
"""

from __future__ import annotations

from pagedllm.core.block_manager import BlockManager
from pagedllm.core.request import Request
from pagedllm.core.scheduler_output import SchedulerOutput

#: k x rows at most: the Python a step saves is shared by its rows (one stream 8 steps: +15-25%
#: tok/s, 4 rows +33%, 16 rows +5%, 64 rows +1% on SmolLM2, Zen 4), while a request that
#: arrives meanwhile waits up to k - 1 steps, and steps grow with rows: 8 steps of 1-4 rows,
#: 4 of 8, 2 of 16, none from 32 rows on keep that wait near 30 ms there.
ROWS_PER_RUN = 32


def runs_ahead(request: Request) -> bool:
    """Whether `request`'s next token comes from its logits by the C++ steps' rules alone
    (argmax, or temperature / top-k / top-p and a uniform) with one sampling row past its
    prompt, so k steps at once give what k single steps give."""
    p = request.sampling_params
    return (p.min_p == 0.0 and p.logprobs is None and p.presence_penalty == 0.0
            and p.frequency_penalty == 0.0 and p.repetition_penalty == 1.0
            and not (p.logit_bias or p.allowed_token_ids or p.bad_words_token_ids)
            and p.thinking is None and request.grammar is None and request.lora is None
            and request.num_output_tokens >= p.min_tokens and request.forked
            and request.num_computed_tokens >= request.num_prompt_tokens)


def plan_steps(out: SchedulerOutput, bm: BlockManager, max_steps: int, max_model_len: int,
               others_waiting: bool) -> int:
    """The steps this engine step runs (1 unless the module docstring's conditions hold);
    for k > 1 every scheduled request's blocks are extended to cover all k steps."""
    if (max_steps <= 1 or others_waiting or not out.scheduled or out.preempted
            or out.swapped_in or out.blocks_to_copy or out.blocks_to_swap_out):
        return 1
    requests = []
    for s in out.scheduled:
        req = s.request
        if s.num_new_tokens != 1 or s.num_draft_tokens or not s.samples or not runs_ahead(req):
            return 1
        requests.append(req)
    k = min(max_steps, max(1, ROWS_PER_RUN // len(requests)),
            min(r.max_tokens - r.num_output_tokens for r in requests),
            min(max_model_len - r.num_tokens for r in requests))
    if k <= 1 or sum(bm.blocks_needed(r, k) for r in requests) > bm.num_free_blocks:
        return 1
    for i, req in enumerate(requests):
        if not bm.allocate_slots(req, k):  # (the count above says it fits: a safety net)
            for r in requests[:i]:
                bm.trim_slots(r, r.num_computed_tokens + 1)
            return 1
    return k
