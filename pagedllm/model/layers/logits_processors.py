"""Logits processors: everything that changes a step's scores before temperature and sampling,
as objects the sampling metadata hands the sampler once per step (`SamplingMetadata.processors`,
built by `SamplingMetadata.build`; the sampler only runs them in order)::

    TokenRestrictions   grammar bitmask, allowed_token_ids, bad_words, logit_bias
    MinTokens           stop tokens banned until a row has min_tokens outputs
    Penalties           repetition, frequency, presence (vLLM's order and formulas)

Each works in place on the sampler's float32 copy of the logits [rows, vocab] and returns it.
A processor is built only when some row of the step uses it. A new one: a class here (or in
its capability's folder) and one line in `build_processors`.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

import torch

from pagedllm.model.layers.token_constraints import TokenConstraints, apply_token_restrictions
from pagedllm.structured_output.bitmask import GrammarBitmask


class LogitsProcessor(abc.ABC):
    @abc.abstractmethod
    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """The processed logits (may modify and return `logits` itself)."""


@dataclass(frozen=True)
class TokenRestrictions(LogitsProcessor):
    grammar: GrammarBitmask | None
    constraints: TokenConstraints | None

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        return apply_token_restrictions(logits, self.grammar, self.constraints)


@dataclass(frozen=True)
class MinTokens(LogitsProcessor):
    stop_ids: dict[int, set[int]]  # row -> ids banned until its min_tokens are reached

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        rows = [i for i, ids in self.stop_ids.items() for _ in ids]
        cols = [t for ids in self.stop_ids.values() for t in ids]
        idx = torch.tensor([rows, cols], dtype=torch.int64).to(logits.device, non_blocking=True)
        logits[idx[0], idx[1]] = float("-inf")
        return logits


@dataclass(frozen=True)
class Penalties(LogitsProcessor):
    output_counts: torch.Tensor  # [B, V] occurrences of each token in the row's output
    prompt_mask: torch.Tensor  # [B, V] the token occurs in the prompt
    repetition: torch.Tensor | None  # [B] float32, or None when no row uses it
    frequency: torch.Tensor | None
    presence: torch.Tensor | None

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        output_mask = self.output_counts > 0
        if self.repetition is not None:
            seen = output_mask | self.prompt_mask
            penalty = torch.where(seen, self.repetition.unsqueeze(1), 1.0)
            logits = torch.where(logits > 0, logits / penalty, logits * penalty)
        if self.frequency is not None:
            logits = logits - self.frequency.unsqueeze(1) * self.output_counts
        if self.presence is not None:
            logits = logits - self.presence.unsqueeze(1) * output_mask
        return logits


def build_processors(grammar: GrammarBitmask | None, constraints: TokenConstraints | None,
                     min_tokens_stop_ids: dict[int, set[int]],
                     penalties: Penalties | None) -> tuple[LogitsProcessor, ...]:
    """The step's processors, in the order they apply (see the module doc)."""
    processors: list[LogitsProcessor] = []
    if grammar is not None or constraints is not None:
        processors.append(TokenRestrictions(grammar, constraints))
    if min_tokens_stop_ids:
        processors.append(MinTokens(min_tokens_stop_ids))
    if penalties is not None:
        processors.append(penalties)
    return tuple(processors)
