"""Per-row token restrictions, applied by the sampler right after the raw logprobs.

Order (vLLM v1): grammar bitmask -> allowed_token_ids -> bad_words -> logit_bias; then the
sampler's min_tokens, penalties and temperature. Reported logprobs are those of the raw
logits, before any of this (as for penalties).

bad_words: a word of one token is always banned; a word of k tokens bans its last token
when the row's last k-1 output tokens are the word's first k-1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from pagedllm.model.layers.sampler import SamplingRow
    from pagedllm.structured_output.bitmask import GrammarBitmask


@dataclass
class TokenConstraints:
    allowed: dict[int, list[int]] = field(default_factory=dict)  # row -> allowed ids
    banned: list[tuple[int, int]] = field(default_factory=list)  # (row, token)
    bias: list[tuple[int, int, float]] = field(default_factory=list)  # (row, token, bias)

    @classmethod
    def build(cls, rows: list[SamplingRow]) -> TokenConstraints | None:
        """None when no row restricts tokens (the common case costs one pass over rows)."""
        out = None
        for i, r in enumerate(rows):
            p = r.params
            if not (p.allowed_token_ids or p.bad_words_token_ids or p.logit_bias):
                continue
            out = out or cls()
            if p.allowed_token_ids:
                out.allowed[i] = p.allowed_token_ids
            for word in p.bad_words_token_ids:
                prefix = word[:-1]
                if not prefix or r.output_token_ids[-len(prefix):] == prefix:
                    out.banned.append((i, word[-1]))
            if p.logit_bias:
                out.bias.extend((i, t, b) for t, b in p.logit_bias.items())
        return out

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        dev = logits.device
        if self.allowed:
            rows = list(self.allowed)
            cols = [t for ts in self.allowed.values() for t in ts]
            rr = [r for r, ts in self.allowed.items() for _ in ts]
            keep = torch.zeros(len(rows), logits.shape[1], dtype=torch.bool, device=dev)
            pos = {r: k for k, r in enumerate(rows)}
            keep[torch.tensor([pos[r] for r in rr], device=dev), torch.tensor(cols, device=dev)] = True
            idx = torch.tensor(rows, device=dev)
            logits[idx] = logits[idx].masked_fill(~keep, float("-inf"))
        if self.banned:
            r, t = zip(*self.banned, strict=True)
            logits[torch.tensor(r, device=dev), torch.tensor(t, device=dev)] = float("-inf")
        if self.bias:
            r, t, b = zip(*self.bias, strict=True)
            logits.index_put_((torch.tensor(r, device=dev), torch.tensor(t, device=dev)),
                              torch.tensor(b, dtype=logits.dtype, device=dev), accumulate=True)
        return logits


def apply_token_restrictions(logits: torch.Tensor, grammar: GrammarBitmask | None,
                             constraints: TokenConstraints | None) -> torch.Tensor:
    """The sampler's one hook: grammar masks, then the other restrictions (in place)."""
    if grammar is not None:
        logits = grammar.apply(logits)
    if constraints is not None:
        logits = constraints.apply(logits)
    return logits
