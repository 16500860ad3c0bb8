"""The sampling rows of one step, and the tokens they yield per request.

A request sampling this step (pooling requests never do) gets one row on the hidden state of its last query token, or n
rows on the same logits when an n > 1 request has just finished its prompt, or k + 1 rows
when it verifies k draft tokens (worker/draft_verification.py). `plan_sampling` lays the rows out,
`collect` turns the sampler's rows back into one `SampledTokens` per request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch

from pagedllm.core.request import Request
from pagedllm.core.runner_output import SampledTokens
from pagedllm.model.layers.sampler import SamplingRow
from pagedllm.outputs import Logprob
from pagedllm.worker.draft_verification import VerifyRows, draft_rows


@dataclass
class SamplingPlan:
    """The step's sampling rows, in order: row r reads the hidden state `row_index[r]`;
    `owners` lists (request, its number of rows) in row order."""

    rows: list[SamplingRow] = field(default_factory=list)
    row_index: list[int] = field(default_factory=list)
    owners: list[tuple[Request, int]] = field(default_factory=list)
    verifying: list[VerifyRows] = field(default_factory=list)  # requests verifying drafts

    @cached_property
    def row_requests(self) -> list[Request]:
        return [r for r, n in self.owners for _ in range(n)]


def plan_sampling(batch) -> SamplingPlan:
    """The rows of the requests of `batch` (BatchInputs) that sample this step."""
    plan = SamplingPlan()
    for s, last in zip(batch.order, batch.logits_indices, strict=True):
        if not s.samples or s.request.pooling_params is not None:  # pooling: no sampling
            continue
        req, last = s.request, int(last)
        if s.num_draft_tokens:
            drafts = req.draft_token_ids[:s.num_draft_tokens]
            plan.verifying.append(VerifyRows(req, len(plan.rows), drafts))
            plan.rows.extend(draft_rows(req, drafts))
            plan.row_index.extend(range(last - len(drafts), last + 1))
            plan.owners.append((req, len(drafts) + 1))
            continue
        n = 1 if req.forked else req.sampling_params.n
        gens = req.generators if n > 1 else [req.generator]
        for i in range(n):
            plan.rows.append(SamplingRow(req.sampling_params, req.prompt_token_ids,
                                         req.output_token_ids, gens[i], req.eos_token_id))
            plan.row_index.append(last)
        plan.owners.append((req, n))
    return plan


def collect(logits: torch.Tensor, result, owners: list[tuple[Request, int]],
            emitted: dict[int, int]) -> list[SampledTokens]:
    """Per request: its sampled tokens (see SampledTokens), logprobs and finiteness, from
    the step's one device -> host copy."""
    token_ids, finite, lp = _to_host(logits, result)
    if lp is not None:
        s_lp, s_rank, top_ids, top_lp = lp
    sampled: list[SampledTokens] = []
    row = 0
    for req, n in owners:
        # A speculating request emits its first `emitted` rows' tokens (the rest were
        # rejected); an n > 1 request fanning out emits one token per row.
        num = emitted.get(row, n)
        toks = token_ids[row:row + num]
        logprobs = None
        k = req.sampling_params.logprobs
        if k is not None and lp is not None:
            logprobs = []
            for r in range(row, row + num):
                entry = {token_ids[r]: Logprob(s_lp[r], s_rank[r])}
                for rank, (tid, tl) in enumerate(
                        zip(top_ids[r][:k], top_lp[r][:k], strict=True)):
                    entry.setdefault(tid, Logprob(tl, rank + 1))
                logprobs.append(entry)
        error = (None if all(finite[row:row + num]) else
                 f"the model's logits for request {req.group_id} are not finite (NaN/inf)")
        spec = (n - 1, num - 1) if row in emitted else (0, 0)
        sampled.append(SampledTokens(req, toks, logprobs, error, *spec))
        row += n
    return sampled


def _to_host(logits: torch.Tensor, result) -> tuple[list[int], list[bool], tuple | None]:
    """The step's one device -> host copy: sampled ids, whether each row's logits were
    finite (O(rows): a NaN / inf row makes its sampled token's own logit non-finite) and,
    if asked for, the logprobs, packed into one float64 tensor (ids < 2^53 are exact)::

        [id, finite, sampled logprob, rank, top ids (N), top logprobs (N)]   per row
    """
    if result.host is not None:  # the sampler's greedy host path did the copy
        return result.host[0], result.host[1], None
    ids = result.sampled_token_ids
    finite = torch.isfinite(logits.gather(1, ids.unsqueeze(1)).squeeze(1))
    lp = result.logprobs
    if lp is None:
        host = torch.stack([ids, finite.long()], 1).cpu()
        return host[:, 0].tolist(), host[:, 1].bool().tolist(), None
    cols = [ids[:, None], finite[:, None], lp.sampled_logprobs[:, None],
            lp.sampled_ranks[:, None], lp.topk_token_ids, lp.topk_logprobs]
    host = torch.cat([c.double() for c in cols], 1).cpu()
    n = lp.topk_token_ids.shape[1]
    token_ids = host[:, 0].long().tolist()
    rows = (host[:, 2].float().tolist(), host[:, 3].long().tolist(),
            host[:, 4:4 + n].long().tolist(), host[:, 4 + n:].float().tolist())
    return token_ids, host[:, 1].bool().tolist(), rows
