"""Runs one engine step on the device: batch tensors -> model -> logits -> sampler.

One forward pass per step over every scheduled token (prefill chunks and decodes mixed);
`compute_logits` runs only on the last token of the requests that sample. A request with
n > 1 samples that has just finished its prompt gets n sampling rows on the same logits.
Under tensor parallelism (`workers`, pagedllm/distributed/) this is rank 0: it first sends
the step's compact message to the other ranks, whose forward passes pair with its own.
"""

from __future__ import annotations

import contextlib
import logging
import time

import numpy as np
import torch
from torch import nn

from pagedllm.core.request import Request
from pagedllm.core.runner_output import RunnerOutput, SampledTokens
from pagedllm.core.scheduler_output import SchedulerOutput
from pagedllm.lora.manager import LoRAManager
from pagedllm.model.layers.sampler import (
    Sampler,
    SamplingMetadata,
    SamplingRow,
    make_generator,
)
from pagedllm.model.layers.token_constraints import TokenConstraints
from pagedllm.outputs import Logprob
from pagedllm.spec_decode.verify import (
    DraftGrammar,
    SpecRows,
    Verifier,
    add_draft_counts,
    draft_rows,
)
from pagedllm.worker.cache_engine import CacheEngine
from pagedllm.worker.input_batch import build_inputs
from pagedllm.worker.persistent_batch import PersistentBatch

logger = logging.getLogger(__name__)


class ModelRunner:
    def __init__(self, model: nn.Module, cache: CacheEngine, *, vocab_size: int,
                 device: torch.device, sliding_window: int | None = None,
                 seed: int = 0, structured_output=None,
                 lora: LoRAManager | None = None) -> None:
        self.model = model
        self.cache = cache
        self.vocab_size = vocab_size
        self.device = device
        self.block_size = cache.spec.block_size
        self.sliding_window = sliding_window
        # Unseeded random rows draw from this engine-seeded generator (vLLM seeds its RNG
        # from --seed), so a run's samples are reproducible given the engine seed.
        self.sampler = Sampler(make_generator(seed, device))
        self.faults = None  # FaultInjector in tests (engine/fault_injection.py), else None
        self.batch = PersistentBatch(vocab_size, device)  # block tables, penalty counts
        self.structured_output = structured_output  # StructuredOutputManager or None
        self.lora = lora
        self.graphs = None  # cuda_graphs.DecodeGraphs once captured (CUDA, not --enforce-eager)
        self.draft = None  # spec_decode DraftModel: mirrors every forward pass
        self.verifier = Verifier(self.sampler, vocab_size)
        self.workers = None  # distributed.executor.TPExecutor under tensor parallelism

    def _send_to_workers(self, sched: SchedulerOutput, batch, row_index: list[int]) -> None:
        """Tensor parallelism: the other ranks mirror this step (swaps, forward, gather)."""
        from pagedllm.distributed.step_message import StepMessage

        self.workers.send_step(StepMessage.step(
            batch.host if batch is not None else None, row_index, sched.blocks_to_swap_out,
            sched.blocks_to_swap_in, sched.blocks_to_copy))

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput) -> RunnerOutput:
        t0 = time.perf_counter()
        batch = None
        if sched.scheduled:
            self.batch.begin_step()
            batch = build_inputs(sched.scheduled, self.block_size, self.device,
                                 self.sliding_window, self.batch, self.cache.spec.groups)
        rows: list[SamplingRow] = []
        row_index: list[int] = []
        owners: list[tuple[Request, int]] = []  # (request, number of rows)
        specs: list[SpecRows] = []  # requests verifying draft tokens (one row per position)
        for s, last in (zip(batch.order, batch.logits_indices, strict=True)
                        if batch is not None else ()):
            if not s.samples:
                continue
            req = s.request
            if s.num_draft_tokens:
                drafts = req.draft_token_ids[:s.num_draft_tokens]
                specs.append(SpecRows(req, len(rows), drafts))
                rows.extend(draft_rows(req, drafts))
                row_index.extend(range(int(last) - len(drafts), int(last) + 1))
                owners.append((req, len(drafts) + 1))
                continue
            n = 1 if req.forked else req.sampling_params.n
            gens = req.generators if n > 1 else [req.generator]
            for i in range(n):
                rows.append(SamplingRow(req.sampling_params, req.prompt_token_ids,
                                        req.output_token_ids, gens[i], req.eos_token_id))
                row_index.append(int(last))
            owners.append((req, n))
        if self.workers is not None:
            self._send_to_workers(sched, batch, row_index)
        # Swap-outs first: a device block they read may be a swap-in's or a copy's target.
        self.cache.swap_blocks_out(sched.blocks_to_swap_out)
        self.cache.swap_blocks_in(sched.blocks_to_swap_in)
        self.cache.copy_blocks(sched.blocks_to_copy)
        if batch is None:
            return RunnerOutput()
        t1 = time.perf_counter()
        with self._lora_step(batch):
            hidden = self._forward(batch)
        if self.draft is not None:
            self.draft.mirror(batch, sched.blocks_to_copy)
        out = RunnerOutput()
        if rows:
            logits = self.model.compute_logits(
                hidden[torch.tensor(row_index, device=hidden.device)])
            if self.faults is not None:
                self.faults.corrupt_logits(logits, [r.group_id for r, n in owners
                                                    for _ in range(n)])
            t2 = time.perf_counter()
            row_requests = [r for r, n in owners for _ in range(n)]
            penalties = self.batch.penalty_tensors(row_requests)
            if penalties is not None and specs:
                add_draft_counts(penalties[0], specs)
            md = SamplingMetadata.build(rows, self.vocab_size, self.device, penalties)
            self._add_restrictions(md, rows, owners, specs)
            emitted: dict[int, int] = {}
            if specs:
                result, _, emitted = self.verifier.sample(logits, md, specs)
            else:
                result = self.sampler(logits, md)
            out.sampled = self._collect(logits, result, owners, emitted)
        else:
            t2 = time.perf_counter()
        t3 = time.perf_counter()
        out.timings_ms = {"prepare": (t1 - t0) * 1e3, "forward": (t2 - t1) * 1e3,
                          "sample": (t3 - t2) * 1e3}
        return out

    def _forward(self, batch) -> torch.Tensor:
        """Hidden states of the step: a captured CUDA graph for a decode batch that fits one,
        else the eager forward pass."""
        if self.graphs is not None and self.graphs.can_run(batch.input_ids, batch.meta):
            return self.graphs.run(batch.input_ids, batch.positions, batch.meta)
        return self.model(batch.input_ids, batch.positions, batch.max_pos,
                          self.cache.layer_caches, batch.meta)

    def _add_restrictions(self, md: SamplingMetadata, rows: list[SamplingRow],
                          owners: list[tuple[Request, int]], specs: list[SpecRows]) -> None:
        """Grammar bitmask for the constrained rows; logit_bias / allowed / bad words."""
        md.constraints = TokenConstraints.build(rows)
        if self.structured_output is None:
            return
        grammars = [req.grammar for req, n in owners for _ in range(n)]
        for s in specs:  # a verified position's mask: as if the drafts before it were taken
            if s.request.grammar is not None:
                for j in range(1, len(s.drafts) + 1):
                    grammars[s.first_row + j] = DraftGrammar(s.request.grammar, s.drafts[:j])
        md.grammar = self.structured_output.bitmask(grammars)

    def _lora_step(self, batch):
        """The adapters' row -> slot mapping, scoped to this forward pass (LoRA on)."""
        if self.lora is None:
            return contextlib.nullcontext()
        return self.lora.step([s.request.lora for s in batch.order],
                              np.fromiter((s.num_new_tokens for s in batch.order), np.int64))

    def _collect(self, logits: torch.Tensor, result, owners: list[tuple[Request, int]],
                 emitted: dict[int, int]) -> list[SampledTokens]:
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
