"""The model runner's side of speculative decoding: sampling rows at every verified position.

A request verifying drafts d_0..d_{k-1} has k + 1 query tokens (its last token, then the
drafts) and k + 1 sampling rows; row j sees the output extended by d_0..d_{j-1}, so
penalties, min_tokens, bad words and the grammar mask apply at each position exactly as if
those drafts had been sampled one step at a time::

    query tokens   t_last   d_0     d_1   ...  d_{k-1}
    sampling row   0        1       2          k
    output seen    out      out+d0  out+d0d1   out+d0..d_{k-1}

`Verifier.sample` runs the ordinary sampler over all rows, then keeps the longest accepted
prefix plus one token per request (`rejection_sampler.py`). A seeded request's generator is rewound
to the draws of the tokens it emitted, so with point-mass drafts (n-gram) its output equals
the output without speculation draw for draw.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagedllm.core.request import Request
from pagedllm.model.layers.sampler import (
    Sampler,
    SamplerOutput,
    SamplingMetadata,
    SamplingRow,
    uniform_draw,
)
from pagedllm.worker.rejection_sampler import num_matching, rejection_sample


@dataclass
class VerifyRows:
    """One speculating request's rows in the step's sampling batch."""

    request: Request
    first_row: int
    drafts: list[int]


def draft_rows(req: Request, drafts: list[int]) -> list[SamplingRow]:
    """The k + 1 sampling rows of a request verifying `drafts` (see the module doc)."""
    gen = req.generator
    return [SamplingRow(req.sampling_params, req.prompt_token_ids,
                        req.output_token_ids + drafts[:j], gen, req.eos_token_id)
            for j in range(len(drafts) + 1)]


def add_draft_counts(counts: torch.Tensor, specs: list[VerifyRows]) -> None:
    """Penalty counts [rows, V] (a copy) of row j += the drafts before position j."""
    rows = [s.first_row + j for s in specs for j in range(1, len(s.drafts) + 1)
            for _ in range(j)]
    cols = [d for s in specs for j in range(1, len(s.drafts) + 1) for d in s.drafts[:j]]
    if rows:
        idx = torch.tensor([rows, cols], dtype=torch.int64).to(counts.device)
        counts.index_put_((idx[0], idx[1]), torch.ones(len(rows), dtype=counts.dtype,
                                                       device=counts.device), accumulate=True)


class DraftGrammar:
    """A row's grammar as it would be after the drafts before it (for the mask only)."""

    def __init__(self, grammar, tokens: list[int]) -> None:
        self.grammar, self.tokens = grammar, tokens

    def fill_bitmask(self, bitmask, row: int) -> None:
        self.grammar.fill_bitmask_after(self.tokens, bitmask, row)


def _random_seeded(req: Request) -> bool:
    return req.generator is not None and not req.sampling_params.is_greedy


class Verifier:
    """Samples the step's rows and decides each speculating request's accepted drafts."""

    def __init__(self, sampler: Sampler) -> None:
        self.sampler = sampler

    def sample(self, logits: torch.Tensor, md: SamplingMetadata, specs: list[VerifyRows]
               ) -> tuple[SamplerOutput, list[int], dict[int, int]]:
        """(sampler output with the final token of every row, the same as a list, number
        of tokens each speculating request emits, by first row)."""
        saved = {s.first_row: s.request.generator.get_state() for s in specs
                 if _random_seeded(s.request)}
        result = self.sampler(logits, md)
        tokens = result.sampled_token_ids.tolist()
        emitted: dict[int, int] = {}
        rejection = []
        for s in specs:
            state = s.request.draft_state
            if (state is not None and state.draft_probs is not None
                    and not s.request.sampling_params.is_greedy):
                rejection.append(s)
                continue
            a = num_matching(tokens[s.first_row:s.first_row + len(s.drafts) + 1], s.drafts)
            emitted[s.first_row] = a + 1
            if s.first_row in saved:  # give back the draws of the rows it did not emit
                gen = s.request.generator
                gen.set_state(saved[s.first_row])
                for _ in range(a + 1):
                    uniform_draw(gen, logits.device)
        if rejection:
            self._rejection(logits, md, rejection, tokens, emitted)
            ids = torch.tensor(tokens, dtype=torch.int64, device=logits.device)
            lp = result.logprobs
            if lp is not None:
                lp = self.sampler.gather_logprobs(logits, ids, md.max_num_logprobs)
            result = SamplerOutput(ids, lp)
        return result, tokens, emitted

    def _rejection(self, logits: torch.Tensor, md: SamplingMetadata, specs: list[VerifyRows],
                   tokens: list[int], emitted: dict[int, int]) -> None:
        probs = self.sampler.probs(logits, md)
        k = max(len(s.drafts) for s in specs)
        v = probs.shape[1]
        dev = probs.device
        target = torch.zeros(len(specs), k + 1, v, dtype=torch.float32, device=dev)
        draft = torch.zeros(len(specs), k, v, dtype=torch.float32, device=dev)
        drafts = torch.zeros(len(specs), k, dtype=torch.int64, device=dev)
        for i, s in enumerate(specs):
            n = len(s.drafts)
            target[i, :n + 1] = probs[s.first_row:s.first_row + n + 1]
            draft[i, :n] = s.request.draft_state.draft_probs[:n].to(dev)
            drafts[i, :n] = torch.tensor(s.drafts, dtype=torch.int64)
        num = torch.tensor([len(s.drafts) for s in specs], dtype=torch.int64, device=dev)
        gens = [s.request.generator or self.sampler.generator for s in specs]
        accepted, token = rejection_sample(target, draft, drafts, num, gens)
        for s, a, t in zip(specs, accepted.tolist(), token.tolist(), strict=True):
            tokens[s.first_row:s.first_row + a] = s.drafts[:a]
            tokens[s.first_row + a] = t
            emitted[s.first_row] = a + 1
