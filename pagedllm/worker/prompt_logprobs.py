"""Prompt logprobs (`SamplingParams.prompt_logprobs`): the prompt positions a step scores, and
the step's logits computed in bounded slices.

Position p's hidden state predicts token p + 1, so a chunk of query tokens scores its own
positions, its last one predicting the first token of the next chunk; the prompt's last
position predicts the first output token, which is sampled, not scored::

    prompt        t0  t1  t2  t3 | t4  t5  t6          (chunks of 4 and 3 tokens)
    step 1 rows   p0  p1  p2  p3                      scores t1 t2 t3 t4
    step 2 rows                    p4  p5             scores t5 t6 (p6 samples)

Only requests that ask get rows. Positions already scored (a request recomputed after
preemption) are not scored again.

The logits rows of a step (the sampling rows, then the prompt rows) are computed in slices of
at most `slice_rows(vocab)` rows, on tensor-parallel ranks > 0 too, so a long prompt never
holds [prompt length, vocab] logits: each slice's prompt rows are reduced to the actual
token's logprob and rank and the top-k before the next slice is computed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from pagedllm.core.request import Request
from pagedllm.core.runner_output import ScoredPrompt
from pagedllm.model.layers.sampler import Sampler
from pagedllm.outputs import Logprob

SLICE_ELEMENTS = 2**24
"""Logits elements (float32) one slice may hold: 64 MiB, twice that with its log-softmax."""

MIN_SLICE_ROWS = 256
"""A slice holds at least this many rows (a step's sampling rows usually fit in one)."""


def slice_rows(vocab_size: int) -> int:
    return max(MIN_SLICE_ROWS, SLICE_ELEMENTS // max(1, vocab_size))


@dataclass
class PromptRows:
    """One request's scored positions this step: hidden rows `first_row ...` are positions
    `first_position ...`, scoring `targets` (the prompt tokens one position later)."""

    request: Request
    first_row: int
    first_position: int
    targets: list[int]


def plan_prompt_rows(batch) -> list[PromptRows]:
    """The prompt positions each request of `batch` (BatchInputs) scores this step."""
    plan = []
    for s, last in zip(batch.order, batch.logits_indices, strict=True):
        req = s.request
        if not req.prompt_scoring_pending:
            continue
        start = req.num_computed_tokens  # the position of the step's first query token
        first = max(start, len(req.prompt_logprobs) - 1)
        end = min(start + s.num_new_tokens - s.num_draft_tokens, req.num_prompt_tokens - 1)
        if first < end:
            row0 = int(last) - s.num_new_tokens + 1
            plan.append(
                PromptRows(
                    req, row0 + first - start, first, req.prompt_token_ids[first + 1 : end + 1]
                )
            )
    return plan


def row_indices(prompt: list[PromptRows]) -> list[int]:
    """The hidden rows the prompt positions read, in plan order."""
    return [p.first_row + i for p in prompt for i in range(len(p.targets))]


def logits_slices(
    model, hidden: torch.Tensor, rows: list[int], vocab_size: int
) -> Iterator[tuple[int, torch.Tensor]]:
    """(offset into `rows`, logits of the slice's rows), slice by slice."""
    step = slice_rows(vocab_size)
    if len(rows) == hidden.shape[0] <= step and rows == list(range(len(rows))):  # no gather
        yield 0, model.compute_logits(hidden)
        return
    for a in range(0, len(rows), step):
        index = torch.tensor(rows[a : a + step], device=hidden.device)
        yield a, model.compute_logits(hidden[index])


class PromptScorer:
    """Turns the prompt rows' logits, slice by slice, into one `ScoredPrompt` per request."""

    def __init__(self, prompt: list[PromptRows]) -> None:
        self.prompt = prompt
        self.targets = [t for p in prompt for t in p.targets]
        self.top = [p.request.sampling_params.prompt_logprobs for p in prompt for _ in p.targets]
        self.entries: list[dict[int, Logprob]] = []

    def add(self, logits: torch.Tensor) -> None:
        """The logits of the next `len(logits)` prompt rows."""
        a = len(self.entries)
        b = a + logits.shape[0]
        k = min(max(self.top[a:b]), logits.shape[-1])  # max_logprobs may pass a tiny vocab
        targets = torch.tensor(self.targets[a:b], device=logits.device)
        lp = Sampler.gather_logprobs(logits, targets, k)
        host = torch.cat(
            [
                lp.sampled_logprobs[:, None].double(),
                lp.sampled_ranks[:, None].double(),
                lp.topk_token_ids.double(),
                lp.topk_logprobs.double(),
            ],
            1,
        ).cpu()
        own, ranks = host[:, 0].tolist(), host[:, 1].long().tolist()
        top_ids, top_lp = host[:, 2 : 2 + k].long().tolist(), host[:, 2 + k :].tolist()
        for r in range(b - a):
            entry = {self.targets[a + r]: Logprob(own[r], ranks[r])}
            for rank, (tid, value) in enumerate(
                zip(top_ids[r][: self.top[a + r]], top_lp[r], strict=False)
            ):
                entry.setdefault(tid, Logprob(value, rank + 1))
            self.entries.append(entry)

    def results(self) -> list[ScoredPrompt]:
        out, a = [], 0
        for p in self.prompt:
            n = len(p.targets)
            out.append(ScoredPrompt(p.request, p.first_position, self.entries[a : a + n]))
            a += n
        return out
