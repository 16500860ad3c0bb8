"""`ThinkingParams`: where a reasoning model's thinking ends, for the token-level rules that
depend on it (the server's `--reasoning-parser` sets it; dependency-free, as params.py).

    start_token_id   the token that opens thinking (`<think>`)
    end_token_id     the token that closes it (`</think>`)
    thinking         True: the output starts inside thinking (the prompt opened it);
                     False: it may open it with its first token, else there is none
    budget           vLLM's `thinking_token_budget`: after this many thinking tokens the
                     end token is the only one allowed (None: no cap)

With it, a request's grammar (structured output, required / named tool calls) applies only
after the end token, and the budget is enforced: see thinking_gate.ThinkingGate.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ThinkingParams:
    start_token_id: int
    end_token_id: int
    thinking: bool = True
    budget: int | None = None

    def __post_init__(self) -> None:
        for name in ("start_token_id", "end_token_id"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"thinking {name} must be a token id >= 0, got {value!r}")
        b = self.budget
        if b is not None and (isinstance(b, bool) or not isinstance(b, int) or b < 0):
            raise ValueError(f"thinking_token_budget must be an int >= 0, got {b!r}")
