"""When to speculate: per-request acceptance with back-off, stricter in larger batches.

Each verification updates the request's acceptance rate (an exponential moving average of
accepted / proposed), which scales how many drafts it proposes (k x rate, at least 1).
A draft token costs one more verified position; in a batch of B decoding requests that is
a larger share of a step that already emits B tokens, so the acceptance a request needs
grows with B (`required_acceptance`: `min_acceptance_rate` at B = 1, towards 1 as B
grows). Below it the request stops proposing for `backoff_steps` decode steps, doubling
every time it fails again (up to 16x), reset once it does well. Proposals that find nothing
(n-gram without a match) cost nothing and change nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagedllm.config.speculative import SpeculativeConfig

_EMA = 0.5  # weight of the newest verification


def required_acceptance(min_rate: float, batch_size: int) -> float:
    """1 - (1 - min_rate) / sqrt(B): 0.25 -> 0.25 (B=1), 0.63 (B=4), 0.73 (B=8)."""
    return 1.0 - (1.0 - min_rate) / max(batch_size, 1) ** 0.5


@dataclass
class DraftState:
    """Per-request speculation state (on `Request.draft_state`)."""

    acceptance: float | None = 1.0  # None: retrying after a back-off (the next one decides)
    skip: int = 0       # decode steps left without proposals
    backoff: int = 0    # the next back-off length (0: backoff_steps)
    # Draft-model proposals for a sampling request: q_j, [k, V] (None: point-mass drafts).
    draft_probs: torch.Tensor | None = None

    def may_propose(self, threshold: float, backoff_steps: int) -> bool:
        """Called once per decode step; False while backing off (or starting to)."""
        if self.skip > 0:
            self.skip -= 1
            if self.skip == 0:
                self.acceptance = None  # try again: the next verification decides
            return False
        if self.acceptance is None or self.acceptance >= threshold or not backoff_steps:
            if self.acceptance is not None and self.acceptance >= threshold:
                self.backoff = 0
            return True
        self.skip = self.backoff or backoff_steps
        self.backoff = min(2 * self.skip, 16 * backoff_steps)
        return False

    def num_drafts(self, k: int) -> int:
        """Drafts to propose: k scaled by the acceptance rate (at least 1), so a request
        whose drafts are often wrong wastes fewer verified positions."""
        acc = 1.0 if self.acceptance is None else self.acceptance
        return max(1, min(k, round(k * acc)))

    def record(self, proposed: int, accepted: int) -> None:
        rate = accepted / proposed
        self.acceptance = (rate if self.acceptance is None
                           else (1 - _EMA) * self.acceptance + _EMA * rate)


def num_to_propose(config: SpeculativeConfig, num_output: int, max_tokens: int,
                   num_tokens: int, max_model_len: int) -> int:
    """Drafts worth proposing: none past max_tokens (the verified step emits one more) or
    past max_model_len."""
    return max(0, min(config.num_speculative_tokens, max_tokens - num_output - 1,
                      max_model_len - num_tokens))
