"""When to speculate: per-request acceptance with back-off, and a batch-size cut-off.

Each verification updates the request's acceptance rate (an exponential moving average of
accepted / proposed). Below `min_acceptance_rate` the request stops proposing for
`backoff` decode steps; the back-off doubles every time it fails again (up to 16x
`backoff_steps`) and resets once a retry is accepted well. Proposals that find nothing
(n-gram without a match) cost nothing and change nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagedllm.spec_decode.config import SpeculativeConfig

_EMA = 0.5  # weight of the newest verification


@dataclass
class SpecState:
    """Per-request speculation state (on `Request.spec_state`)."""

    acceptance: float | None = 1.0  # None: retrying after a back-off (the next one decides)
    skip: int = 0       # decode steps left without proposals
    backoff: int = 0    # the next back-off length (0: backoff_steps)
    # Draft-model proposals for a sampling request: q_j, [k, V] (None: point-mass drafts).
    draft_probs: torch.Tensor | None = None

    def may_propose(self) -> bool:
        """Called once per decode step; False while backing off."""
        if self.skip > 0:
            self.skip -= 1
            if self.skip == 0:
                self.acceptance = None  # try again: the next verification decides
            return False
        return True

    def record(self, proposed: int, accepted: int, config: SpeculativeConfig) -> None:
        rate = accepted / proposed
        self.acceptance = (rate if self.acceptance is None
                           else (1 - _EMA) * self.acceptance + _EMA * rate)
        if self.acceptance < config.min_acceptance_rate and config.backoff_steps:
            base = config.backoff_steps
            self.skip = self.backoff or base
            self.backoff = min(2 * self.skip, 16 * base)
        elif rate >= config.min_acceptance_rate:
            self.backoff = 0


def num_to_propose(config: SpeculativeConfig, num_output: int, max_tokens: int,
                   num_tokens: int, max_model_len: int) -> int:
    """Drafts worth proposing: none past max_tokens (the verified step emits one more) or
    past max_model_len."""
    return max(0, min(config.num_speculative_tokens, max_tokens - num_output - 1,
                      max_model_len - num_tokens))
