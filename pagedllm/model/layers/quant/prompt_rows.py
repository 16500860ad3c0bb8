"""Which rows of a step are prompt positions: the rows the GGUF panels run on bf16 tiles.

On a CPU with AMX-bf16 the int8-activation panels (gguf_a8_panels.py) can run prompt rows as
bf16 over weights dequantized a panel at a time (kernels/prompt_tiles_cpu.cpp; chosen by
PAGEDLLM_PROMPT_TILES, kernels/cpu_features.py), and their attention on the same tiles
(kernels/varlen_tiles_cpu.h). On a CPU with AVX-512 BF16 but no AMX (Zen 4 class) the tiles
run as vector dot products (`vector`): only the attention takes them there (`matrices`
False: the int8 panels out-run bf16 vectors on the matrices). The paths round differently,
so a row goes by what it is, never by the size of the batch or chunk it came in: a position
before its request's prompt length runs on the tiles, any other row (a decode, a draft, an
output token recomputed after a preemption) on the int8 / fp32 kernels. A prompt computed
in one chunk or ten, after a cached prefix or not, batched or alone, gives the same K/V and
logits.

    step rows      d0 d1 | p0 p0 p0 p0 | p1 p1 p1      decodes first, then prefill chunks
    prompt rows     .  . |  x  x  x  x |  x  .  .      p1's chunk crosses its prompt's end

The runner puts the step's `PromptRows` in scope for its forward pass (`step_scope`); a panel
linear whose input is the step's rows splits them (`PromptRows.apply`). Logits run after the
scope: the lm_head's rows are the sampled ones, on the int8 path like every decode. A step
with prompt rows skips the fused C++ decode loop (a one-token prompt chunk looks like a
decode there), so those rows reach the Python layers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np
import torch

_STEP: ContextVar[PromptRows | None] = ContextVar("prompt_rows", default=None)


@dataclass(frozen=True)
class PromptRows:
    """The prompt rows of one step of `total` rows: every row (`rows` None) or the sorted
    indices `rows`, the others in `rest`; `span` (start, stop) when the prompt rows are one
    run of rows at either end of the step (the usual mix: decodes, then prompt chunks), so
    `apply` splits and joins by slices instead of gathers and scatters. `matrices`: whether
    the panel matrices take them too (else only their attention: `matrices_step`)."""

    total: int
    rows: torch.Tensor | None = None
    rest: torch.Tensor | None = None
    span: tuple[int, int] | None = None
    matrices: bool = True

    @classmethod
    def build(cls, q_lens: np.ndarray, starts: np.ndarray, prompt_lens: np.ndarray,
              matrices: bool = True) -> PromptRows | None:
        """Request i's rows are positions starts[i] .. starts[i] + q_lens[i] - 1 (batch
        order); its prompt has prompt_lens[i] tokens. None when no row is a prompt row."""
        counts = np.clip(prompt_lens - starts, 0, q_lens)
        if not counts.any():
            return None
        total = int(q_lens.sum())
        if (counts == q_lens).all():
            return cls(total, matrices=matrices)
        request = np.repeat(np.arange(len(q_lens)), q_lens)
        first = np.concatenate([[0], np.cumsum(q_lens)[:-1]])
        prompt = np.arange(total) - first[request] < counts[request]
        rows = np.flatnonzero(prompt)
        start, stop = int(rows[0]), int(rows[-1]) + 1
        span = (start, stop) if stop - start == len(rows) and (start == 0 or stop == total) \
            else None
        return cls(total, torch.from_numpy(rows), torch.from_numpy(np.flatnonzero(~prompt)),
                   span, matrices)

    def mask(self, start: int, stop: int) -> torch.Tensor:
        """[stop - start] bool: which of rows start .. stop - 1 are prompt rows."""
        if self.rows is None:
            return torch.ones(stop - start, dtype=torch.bool)
        m = torch.zeros(self.total, dtype=torch.bool)
        m[self.rows] = True
        return m[start:stop]

    def counts(self, bounds: torch.Tensor) -> torch.Tensor:
        """[len(bounds) - 1] int64: the prompt rows among rows bounds[i] .. bounds[i + 1] - 1
        (a sequence's chunk, whose prompt rows come first: its positions before the
        prompt's end)."""
        if self.rows is None:
            return bounds.diff().to(torch.int64)
        before = torch.searchsorted(self.rows, bounds.to(self.rows.dtype))
        return before.diff().to(torch.int64).contiguous()

    def apply(self, x: torch.Tensor, prompt: Callable[[torch.Tensor], torch.Tensor],
              rest: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """`prompt` on the prompt rows of x [total, K], `rest` on the others, in row order."""
        if self.rows is None:
            return prompt(x)
        if self.span is not None:
            start, stop = self.span
            if start == 0:
                return torch.cat([prompt(x[:stop]), rest(x[stop:])])
            return torch.cat([rest(x[:start]), prompt(x[start:])])
        yp = prompt(x.index_select(0, self.rows))
        yr = rest(x.index_select(0, self.rest))
        y = yp.new_empty(self.total, yp.shape[1])
        y.index_copy_(0, self.rows, yp)
        y.index_copy_(0, self.rest, yr)
        return y


def current(rows: int | None = None) -> PromptRows | None:
    """The prompt rows of the step being run (None outside a step with some); with `rows`,
    only if the step has that many rows (a linear's input is the step's rows)."""
    step = _STEP.get()
    return step if step is not None and (rows is None or rows == step.total) else None


def matrices_step(rows: int) -> PromptRows | None:
    """`current(rows)` where the panel matrices run the step's prompt rows on the tiles; None
    where only their attention does (vector tiles) or outside such a step."""
    step = current(rows)
    return step if step is not None and step.matrices else None


@contextlib.contextmanager
def step_scope(step: PromptRows | None) -> Iterator[None]:
    """`step` is the current prompt rows for the duration of the block."""
    token = _STEP.set(step)
    try:
        yield
    finally:
        _STEP.reset(token)
