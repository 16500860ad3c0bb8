"""`ThinkingGate`: a request's grammar that starts after its thinking, and the thinking budget.

It stands where the engine keeps a request's grammar (`Request.grammar`) and has the same
interface (`fill_bitmask`, `fill_bitmask_after`, `accept`, `is_terminated`, `error`, `fork`),
so the runner's mask, `Request.append_token` and the stop checks treat it as any grammar:

    state     allowed next tokens                               on token t
    MAYBE     the inner grammar's + the start token              start -> THINKING;
              (no inner grammar: any)                            else inner.accept(t), DONE
    THINKING  any; only the end token once `budget` are spent    end -> DONE; else count
    DONE      the inner grammar's (none: any)                    inner.accept(t)

MAYBE is for templates that leave opening the thinking to the model (Qwen3); a prompt that
opened it (DeepSeek-R1's, Qwen3's thinking variants) starts in THINKING.
"""

from __future__ import annotations

import numpy as np

from pagedllm.structured_output.backend import RequestGrammar
from pagedllm.structured_output.thinking import ThinkingParams

MAYBE, THINKING, DONE = "maybe", "thinking", "done"


class ThinkingGate:
    def __init__(self, inner: RequestGrammar | None, params: ThinkingParams) -> None:
        self.inner = inner
        self.params = params
        self.state = THINKING if params.thinking else MAYBE
        self.num_thinking = 0  # tokens sampled inside the thinking

    def fill_bitmask(self, bitmask: np.ndarray, row: int) -> None:
        p = self.params
        if self.state == THINKING:
            if p.budget is not None and self.num_thinking >= p.budget:
                bitmask[row] = 0
                _allow(bitmask, row, p.end_token_id)
            else:
                bitmask[row] = -1
        elif self.inner is None:
            bitmask[row] = -1
        else:
            self.inner.fill_bitmask(bitmask, row)
            if self.state == MAYBE:
                _allow(bitmask, row, p.start_token_id)

    def fill_bitmask_after(self, tokens: list[int], bitmask: np.ndarray, row: int) -> None:
        """The mask after `tokens` (speculative drafts), on a copy."""
        gate = self.fork()
        for t in tokens:
            gate.accept(t)
        gate.fill_bitmask(bitmask, row)

    def accept(self, token_id: int) -> bool:
        p = self.params
        if self.state == MAYBE:
            if token_id == p.start_token_id:
                self.state = THINKING
                return True
            self.state = DONE
        elif self.state == THINKING:
            if token_id == p.end_token_id:
                self.state = DONE
            else:
                self.num_thinking += 1
            return True
        return True if self.inner is None else self.inner.accept(token_id)

    @property
    def is_terminated(self) -> bool:
        return self.state == DONE and self.inner is not None and self.inner.is_terminated

    @property
    def error(self) -> str:
        return self.inner.error if self.inner is not None else ""

    def fork(self) -> ThinkingGate:
        gate = ThinkingGate(self.inner.fork() if self.inner is not None else None, self.params)
        gate.state, gate.num_thinking = self.state, self.num_thinking
        return gate


def _allow(bitmask: np.ndarray, row: int, token_id: int) -> None:
    word, bit = divmod(token_id, 32)
    if word < bitmask.shape[1]:
        view = bitmask[row].view(np.uint32)
        view[word] |= np.uint32(1 << bit)
