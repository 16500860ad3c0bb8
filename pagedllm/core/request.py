"""One sequence being generated, and every bit of its progress.

The scheduler's unit. `num_computed_tokens` catches up with `num_tokens` (prompt + generated):
while it is behind by more than one, the request is prefilling (possibly in chunks); when it is
behind by exactly one, the next step decodes. A request with `n > 1` samples is scheduled as one
sequence until its prompt is computed, then forked into `n` sequences sharing the prompt's blocks.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from pagedllm.errors import InvariantError
from pagedllm.outputs import Logprob
from pagedllm.pooling_params import PoolingParams
from pagedllm.sampling_params import SamplingParams

if TYPE_CHECKING:
    from pagedllm.lora.adapter import LoRAAdapter


class PromptLogprobsOrderError(InvariantError):
    """A chunk of prompt logprobs does not follow the positions already scored."""


class PooledChunkOrderError(InvariantError):
    """A pooled chunk skips or repeats positions already summed (MEAN / CLS pooling take no
    prefix-cache hits, engine/plan.py)."""


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def is_finished(self) -> bool:
        return self in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH,
                        RequestStatus.FINISHED_ABORTED)


@dataclass
class RequestTimes:
    """Wall-clock stamps (time.monotonic) for metrics."""

    arrival: float = field(default_factory=time.monotonic)
    first_scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    finished: float | None = None


class Request:
    """A sequence: prompt tokens, generated tokens, block table and scheduling state."""

    def __init__(self, request_id: str, prompt_token_ids: list[int],
                 sampling_params: SamplingParams, *, eos_token_id: int | None,
                 prompt: str | None = None, group_id: str | None = None, index: int = 0,
                 arrival_time: float | None = None, cache_salt: str | None = None,
                 lora: LoRAAdapter | None = None, priority: int = 0, grammar=None,
                 max_tokens: int | None = None,
                 generators: list[torch.Generator | None] | None = None,
                 pooling_params: PoolingParams | None = None) -> None:
        self.request_id = request_id
        self.priority = priority  # the priority scheduling policy: lower runs earlier
        self.queue_order: int | None = None  # arrival order in the waiting queue (ties)
        self.group_id = group_id or request_id
        self.index = index  # which of the group's n samples this sequence is
        self.prompt = prompt
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.all_token_ids: list[int] = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.eos_token_id = eos_token_id
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        # One block table per KV group (core/kv_groups.py); `block_ids` is group 0's.
        self.block_tables: list[list[int]] = [[]]
        self.swapped_block_ids: list[int] = []  # CPU swap pool blocks while SWAPPED
        # Per group while SWAPPED: (leading NULL_BLOCK entries, CPU blocks) of its table.
        self.swapped_layout: list[tuple[int, int]] = []
        # Prefix caching: requests with different salts never share blocks; `block_hashes`
        # are the chained hashes of the full blocks of `all_token_ids` (filled lazily);
        # `block_ids[:num_cached_blocks]` are registered in the cache; `num_cached_tokens`
        # are the tokens found there when the request was first scheduled.
        self.cache_salt = cache_salt
        self.lora = lora  # the adapter this request runs with (None: the base model)
        self.block_hashes: list[bytes] = []
        self.num_cached_blocks = 0
        self.num_cached_tokens: int | None = None
        self.num_preemptions = 0
        # The output budget: max_tokens, or what max_model_len leaves (resolved by the intake).
        self.max_tokens = max_tokens if max_tokens is not None else (
            sampling_params.max_tokens or 0)
        self.forked = sampling_params.n == 1  # True once n > 1 sampling has fanned out
        self.stop_reason: int | str | None = None
        self.times = RequestTimes(arrival=arrival_time or time.monotonic())
        # One generator per sample of the group (seed + index), kept across steps so that a
        # seeded request's draws never depend on its batch mates or on preemption.
        self.generators: list[torch.Generator | None] = (
            generators if generators is not None else [None] * sampling_params.n)
        self.logprobs: list[dict[int, Logprob]] | None = (
            [] if sampling_params.logprobs is not None else None)
        # SamplingParams.prompt_logprobs: entry i for prompt token i (None for the first), filled
        # as the prompt's chunks are computed (`add_prompt_logprobs`).
        self.prompt_logprobs: list[dict[int, Logprob] | None] | None = (
            [None] if sampling_params.prompt_logprobs is not None else None)
        # Sum of the sampled tokens' logprobs (vLLM: only tracked when logprobs are requested).
        self.cumulative_logprob: float | None = (
            0.0 if sampling_params.logprobs is not None else None)
        self.detokenizer = None  # set by the output processor
        self.grammar = grammar  # structured_output.RequestGrammar of a constrained request
        # Speculative decoding (speculative/): draft tokens proposed to follow all_token_ids,
        # verified by the next step (none while prefilling), and the proposer's own state.
        self.draft_token_ids: list[int] = []
        self.draft_state = None  # speculative.adaptive.DraftState
        # A pooling request (prefill only, never samples): its pooled sum over the prompt
        # positions pooled so far (core/runner_output.PooledChunk), finished with the prompt.
        self.pooling_params = pooling_params
        self.pooled: torch.Tensor | None = None
        self.num_pooled_positions = 0

    # ------------------------------------------------------------ block table
    @property
    def block_ids(self) -> list[int]:
        """Group 0's block table (the only one unless the model mixes attention kinds)."""
        return self.block_tables[0]

    @block_ids.setter
    def block_ids(self, ids: list[int]) -> None:
        self.block_tables[0] = ids

    # ------------------------------------------------------------------ sizes
    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def prompt_scoring_pending(self) -> bool:
        """Prompt logprobs were asked for and not every prompt position is scored yet (such a
        request takes no prefix-cache hits: a cached position would go unscored)."""
        return (self.prompt_logprobs is not None
                and len(self.prompt_logprobs) < self.num_prompt_tokens)

    def add_prompt_logprobs(self, first_position: int,
                            entries: list[dict[int, Logprob]]) -> None:
        """Logprobs of prompt tokens `first_position + 1 ...` (position p predicts token
        p + 1); chunks arrive in order, each right after the last one scored."""
        if self.prompt_logprobs is None or first_position + 1 != len(self.prompt_logprobs):
            scored = None if self.prompt_logprobs is None else len(self.prompt_logprobs) - 1
            raise PromptLogprobsOrderError(
                f"prompt logprobs from position {first_position} for {self}, which has "
                f"{scored} positions scored")
        self.prompt_logprobs.extend(entries)

    def add_pooled(self, first_position: int, num_positions: int,
                   data: torch.Tensor | None) -> bool:
        """Add a chunk's pooled part (positions `first_position ...`); True once the whole
        prompt is pooled. A chunk from position 0 starts over (recomputed after preemption);
        one after a prefix-cache hit (LAST pooling only) starts where the hit ends."""
        if first_position == 0:
            self.pooled = None
        elif first_position != self.num_pooled_positions and self.pooled is not None:
            raise PooledChunkOrderError(
                f"pooled chunk from position {first_position} for {self}, which has "
                f"{self.num_pooled_positions} positions pooled")
        if data is None:
            pass
        elif self.pooled is None:
            self.pooled = data
        elif data.dim() == 2:  # ALL pooling: one row per position, appended in order
            self.pooled = torch.cat([self.pooled, data])
        else:  # MEAN: summed
            self.pooled = self.pooled + data
        self.num_pooled_positions = first_position + num_positions
        return self.num_pooled_positions >= self.num_prompt_tokens

    @property
    def generator(self) -> torch.Generator | None:
        return self.generators[0]

    def append_token(self, token_id: int, logprobs: dict[int, Logprob] | None = None,
                     now: float | None = None) -> None:
        """Add a generated token (with its logprobs entry when they were asked for; `now`
        stamps the first / last token times)."""
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)
        if self.grammar is not None:
            self.grammar.accept(token_id)  # the matcher advances with every accepted token
        if logprobs is not None and self.logprobs is not None:
            self.logprobs.append(logprobs)
            self.cumulative_logprob += logprobs[token_id].logprob
        if now is not None:
            if self.times.first_token is None:
                self.times.first_token = now
            self.times.last_token = now

    def truncate_output(self, num_output_tokens: int) -> None:
        """Drop the output tokens after the first `num_output_tokens` (a stop string ended
        the sequence inside a speculative run); only for a sequence that stops there."""
        drop = self.num_output_tokens - num_output_tokens
        if drop <= 0:
            return
        if self.logprobs is not None:
            for tok, entry in zip(self.output_token_ids[-drop:], self.logprobs[-drop:],
                                  strict=True):
                self.cumulative_logprob -= entry[tok].logprob
            del self.logprobs[-drop:]
        del self.output_token_ids[-drop:]
        del self.all_token_ids[-drop:]

    def fork(self, request_id: str, index: int) -> Request:
        """A sibling sample sharing everything computed so far (blocks are shared by the caller)."""
        child = Request(request_id, self.prompt_token_ids, self.sampling_params,
                        eos_token_id=self.eos_token_id, prompt=self.prompt,
                        group_id=self.group_id, index=index, arrival_time=self.times.arrival,
                        cache_salt=self.cache_salt, lora=self.lora, priority=self.priority)
        child.block_hashes = list(self.block_hashes)
        child.num_cached_tokens = self.num_cached_tokens
        child.output_token_ids = list(self.output_token_ids)
        child.all_token_ids = list(self.all_token_ids)
        child.status = self.status
        child.num_computed_tokens = self.num_computed_tokens
        child.queue_order = self.queue_order
        child.forked = True
        child.max_tokens = self.max_tokens
        child.generators = [self.generators[index]]
        if self.grammar is not None:
            child.grammar = self.grammar.fork()
        child.times = RequestTimes(**vars(self.times))
        if self.logprobs is not None:
            child.logprobs = list(self.logprobs)
        child.prompt_logprobs = self.prompt_logprobs  # complete (it forks after the prompt)
        child.cumulative_logprob = self.cumulative_logprob
        return child

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, status={self.status.value}, "
                f"tokens={self.num_tokens}, computed={self.num_computed_tokens}, "
                f"blocks={len(self.block_ids)}"
                + (f", cpu_blocks={len(self.swapped_block_ids)})" if self.swapped_block_ids
                   else ")"))
