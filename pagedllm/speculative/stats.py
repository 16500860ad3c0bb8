"""Acceptance counters (vLLM's spec_decode metrics), read by /metrics and --debug-steps."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpeculativeStats:
    num_speculative_tokens: int
    num_drafts: int = 0           # verifications (one per speculating request per step)
    num_draft_tokens: int = 0     # draft tokens verified
    num_accepted_tokens: int = 0  # of those, accepted
    accepted_per_pos: list[int] = field(default_factory=list)  # accepted at position j
    # The last step's numbers, for --debug-steps.
    last_drafts: int = 0
    last_draft_tokens: int = 0
    last_accepted: int = 0

    def __post_init__(self) -> None:
        if not self.accepted_per_pos:
            self.accepted_per_pos = [0] * self.num_speculative_tokens

    def begin_step(self) -> None:
        self.last_drafts = self.last_draft_tokens = self.last_accepted = 0

    def record(self, num_draft_tokens: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        for j in range(num_accepted):
            self.accepted_per_pos[j] += 1
        self.last_drafts += 1
        self.last_draft_tokens += num_draft_tokens
        self.last_accepted += num_accepted

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per verification (accepted drafts + the one sampled token)."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0

    def cleared(self) -> SpeculativeStats:
        return SpeculativeStats(self.num_speculative_tokens)

    def step_line(self) -> str:
        return (f"drafts={self.last_drafts} draft_tokens={self.last_draft_tokens} "
                f"accepted_drafts={self.last_accepted}")
