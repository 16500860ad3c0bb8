"""`StructuredOutputManager`: the engine's one object for constrained decoding.

Hooks (one each):
  * add_request   -> `grammar_for(params)`: compile (cached) and give the request a matcher
  * model runner  -> `bitmask(grammars)`: allowed-token bitmask of the rows that need it
  * token appended -> `Request.append_token` advances the request's matcher

Masks are computed on the engine thread right before sampling: llguidance fills one 49k-token
row in a few microseconds (docs/benchmarks.md), far below a forward pass, so overlapping the
two would not pay on CPU.
"""

from __future__ import annotations

import numpy as np

from pagedllm.structured_output.backend import GrammarCompiler, RequestGrammar, bitmask_words
from pagedllm.structured_output.bitmask import GrammarBitmask
from pagedllm.structured_output.params import StructuredOutputsParams


class StructuredOutputManager:
    def __init__(self, tokenizer, vocab_size: int, eos_token_id: int | None) -> None:
        self.vocab_size = vocab_size
        self.compiler = GrammarCompiler(tokenizer, vocab_size, eos_token_id)
        self._buffer = np.zeros((0, bitmask_words(vocab_size)), np.int32)

    def grammar_for(self, params: StructuredOutputsParams) -> RequestGrammar:
        """A new matcher; raises GrammarCompileError (a ValueError) with the backend's message."""
        return self.compiler.grammar(params)

    def bitmask(self, grammars: list[RequestGrammar | None]) -> GrammarBitmask | None:
        """Bitmask rows for the non-None entries (sampler row i <- grammars[i]); None if none."""
        rows = [i for i, g in enumerate(grammars) if g is not None]
        if not rows:
            return None
        if self._buffer.shape[0] < len(rows):
            self._buffer = np.zeros((max(len(rows), 2 * self._buffer.shape[0]),
                                     self._buffer.shape[1]), np.int32)
        out = self._buffer[:len(rows)]
        for r, i in enumerate(rows):
            grammars[i].fill_bitmask(out, r)
        return GrammarBitmask(rows, out)
