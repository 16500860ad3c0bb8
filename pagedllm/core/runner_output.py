"""What the model runner hands back for one step: the contract between `ModelRunner.execute`
and `Scheduler.update_from_output` (vLLM v1's `ModelRunnerOutput`).

It lives in core/ so the scheduler can be driven, and unit-tested, with runner outputs made by
hand: nothing here knows about models (a pooled vector is a plain CPU tensor).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pagedllm.core.request import Request
from pagedllm.outputs import Logprob


@dataclass
class SampledTokens:
    """Tokens sampled for one request this step (n of them when an n > 1 request fans out).

    With speculative decoding `num_drafts` draft tokens were verified; `token_ids` are then the
    `num_accepted` accepted drafts followed by the token sampled after them. Several decode
    steps in one (core/multi_step.py) report the same way: `num_drafts` the k - 1 lookahead
    positions, `token_ids` the steps' tokens, `num_accepted` = len(token_ids) - 1.
    """

    request: Request
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]] | None = None
    error: str | None = None  # e.g. a non-finite logits row: only this request fails
    num_drafts: int = 0
    num_accepted: int = 0


@dataclass
class ScoredPrompt:
    """Prompt logprobs computed this step for one request (vLLM's `prompt_logprobs_dict`):
    `entries[i]` is position `first_position + i` scoring prompt token `first_position + i + 1`
    (the actual token's logprob and rank, then its top `prompt_logprobs`)."""

    request: Request
    first_position: int
    entries: list[dict[int, Logprob]]


@dataclass
class PooledChunk:
    """A pooling request's prompt positions `first_position ...` computed this step and
    their pooled part (pagedllm/pooling/step_pooler.py): MEAN the sum of their hidden states,
    LAST / CLS the row it pools if this chunk holds it, else None, ALL every row ([n, H]);
    through the classifier's score head for a classification model. CPU float32."""

    request: Request
    first_position: int
    num_positions: int
    data: torch.Tensor | None


@dataclass
class RunnerOutput:
    sampled: list[SampledTokens] = field(default_factory=list)
    prompt_logprobs: list[ScoredPrompt] = field(default_factory=list)
    pooled: list[PooledChunk] = field(default_factory=list)
    timings_ms: dict[str, float] = field(default_factory=dict)
