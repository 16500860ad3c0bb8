"""Runs one engine step on the device: batch tensors -> model -> logits -> sampler.

One forward pass per step over every scheduled token (prefill chunks and decodes mixed);
`compute_logits` runs only on the last token of the requests that sample, and on the prompt
positions of requests asking for prompt logprobs (worker/prompt_logprobs.py, in bounded
slices). A request with n > 1 samples that has just finished its prompt gets n sampling rows on the same logits.
Under tensor parallelism (`tp_executor`, pagedllm/distributed/) this is rank 0: it first sends
the step's compact message to the other ranks, whose forward passes pair with its own.
"""

from __future__ import annotations

import contextlib
import logging
import time

import numpy as np
import torch
from torch import nn

from pagedllm.core.runner_output import RunnerOutput, SampledTokens, ScoredPrompt
from pagedllm.core.scheduler_output import SchedulerOutput
from pagedllm.kernels import cpu_features
from pagedllm.lora.manager import LoRAManager
from pagedllm.model.decode_steps import AheadDraws, DecodeSteps
from pagedllm.model.layers.attention_backends import PagedAttentionBackend
from pagedllm.model.layers.quant import prompt_rows, prompt_tile_weights
from pagedllm.model.layers.sampler import Sampler, SamplingMetadata, make_generator
from pagedllm.model.layers.token_constraints import TokenConstraints
from pagedllm.worker.cache_engine import CacheEngine
from pagedllm.worker.draft_verification import DraftGrammar, Verifier, add_draft_counts
from pagedllm.worker.input_batch import build_inputs, inputs_from_host
from pagedllm.worker.persistent_batch import PersistentBatch
from pagedllm.worker.prompt_logprobs import (
    PromptRows,
    PromptScorer,
    logits_slices,
    plan_prompt_rows,
    row_indices,
)
from pagedllm.worker.sampling_rows import SamplingPlan, collect, plan_sampling

logger = logging.getLogger(__name__)


class ModelRunner:
    """One rank's step executor. Its collaborators come in at construction: the rank's
    `attention_backend` (selected once by worker/rank_builder.py; it builds each step's
    attention metadata), the `tp_executor` (rank 0 of a tensor-parallel group), the
    speculative `draft` model that mirrors every forward pass, captured CUDA `graphs` and
    the `pooler` of a pooling model (those four None when unused)."""

    def __init__(self, model: nn.Module, cache: CacheEngine,
                 attention_backend: PagedAttentionBackend, *, vocab_size: int,
                 device: torch.device,
                 seed: int = 0, structured_output=None, lora: LoRAManager | None = None,
                 tp_executor=None, draft=None, graphs=None, pooler=None,
                 decode_steps: DecodeSteps | None = None) -> None:
        self.model = model
        self.cache = cache
        self.attention_backend = attention_backend
        self.vocab_size = vocab_size
        self.device = device
        self.block_size = cache.spec.block_size
        # Unseeded random rows draw from this engine-seeded generator (vLLM seeds its RNG
        # from --seed), so a run's samples are reproducible given the engine seed.
        self.sampler = Sampler(make_generator(seed, device))
        self.verifier = Verifier(self.sampler)
        self.batch = PersistentBatch(vocab_size, device)  # block tables, penalty counts
        self.structured_output = structured_output  # StructuredOutputManager or None
        self.lora = lora
        self.tp_executor = tp_executor  # distributed.executor.TPExecutor (rank 0 of TP > 1)
        self.draft = draft  # speculative.draft_model.DraftModel
        self.graphs = graphs  # cuda_graphs.DecodeGraphs (CUDA, not --enforce-eager)
        self.pooler = pooler  # pooling.step_pooler.StepPooler (--runner pooling)
        self.decode_steps = decode_steps  # several greedy decode steps per call (CPU)
        # The prompt rows' bf16 tiles serve the GGUF panels' matrices (and then their
        # attention); a model without them keeps every row as it was.
        self.prompt_tiles_apply = bool(prompt_tile_weights.prompt_linears(model))

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput) -> RunnerOutput:
        """prepare -> (TP message, block moves) -> forward -> sample (or pool)."""
        t0 = time.perf_counter()
        batch, plan = self._prepare(sched)
        prompt = plan_prompt_rows(batch) if batch is not None else []
        if self.tp_executor is not None:
            self._send_to_ranks(sched, batch, plan.row_index + row_indices(prompt))
        self._move_blocks(sched.blocks_to_swap_out, sched.blocks_to_swap_in, sched.blocks_to_copy)
        if batch is None:
            return RunnerOutput()
        t1 = time.perf_counter()
        if sched.num_steps > 1 and (sampled := self._steps(batch, plan, sched.num_steps)):
            t2 = time.perf_counter()
            return RunnerOutput(sampled, timings_ms={"prepare": (t1 - t0) * 1e3,
                                                     "forward": (t2 - t1) * 1e3})
        hidden = self._forward(batch, sched.blocks_to_copy)
        logits, scored = self._logits(hidden, plan, prompt)
        t2 = time.perf_counter()
        sampled = self._sample(logits, plan) if plan.rows else []
        pooled = self.pooler.pool(batch, hidden) if self.pooler is not None else []
        t3 = time.perf_counter()
        return RunnerOutput(sampled, scored, pooled, {"prepare": (t1 - t0) * 1e3,
                                                      "forward": (t2 - t1) * 1e3,
                                                      "sample": (t3 - t2) * 1e3})

    @torch.inference_mode()
    def replay(self, host, logits_rows, swap_out, swap_in, copies) -> None:
        """A tensor-parallel rank > 0's step: the block moves and forward pass of rank 0's
        step, from the arrays it sent (`HostBatch`, None for a step that only moves blocks);
        the logits rows join rank 0's vocab gathers, slice by slice as rank 0 computes them.
        Nothing is sampled here."""
        self._move_blocks(swap_out, swap_in, copies)
        if host is None:
            return
        batch = inputs_from_host(host, self.block_size, self.attention_backend,
                                 self.cache.spec.groups)
        hidden = self._forward(batch, copies)
        for _ in logits_slices(self.model, hidden, list(logits_rows), self.vocab_size):
            pass

    def _prepare(self, sched: SchedulerOutput):
        """The batch tensors of the scheduled tokens and the step's sampling rows."""
        if not sched.scheduled:
            return None, SamplingPlan()
        self.batch.begin_step()
        batch = build_inputs(sched.scheduled, self.block_size, self.attention_backend,
                             self.batch, self.cache.spec.groups)
        return batch, plan_sampling(batch)

    def _steps(self, batch, plan: SamplingPlan, steps: int) -> list[SampledTokens]:
        """Up to `steps` decode steps of the batch in one call (the scheduler's blocks cover
        them all: core/multi_step.py; one sampling row per request, `plan`'s): each
        request's tokens as one accepted run of `steps - 1` lookahead positions, which
        `update_from_output` applies as it applies speculative drafts. Empty when the first
        step's logits are not finite in some row: the step then runs the ordinary way, which
        reports that row."""
        order = [s.request for s in batch.order]
        width = -(-(batch.max_pos + steps) // self.block_size)  # positions < max_pos + steps
        tables = [torch.from_numpy(self.batch.block_tables(order, width, g))
                  for g in range(self.cache.spec.groups.num_groups)]
        md = SamplingMetadata.build(plan.rows, self.vocab_size, self.device)
        draws = None if md.all_greedy else AheadDraws(self.sampler.generator, md.generators,
                                                      len(order), steps)
        tokens = self.decode_steps(
            batch.input_ids, batch.positions, batch.max_pos, self.cache.layer_caches,
            batch.meta, tables, self.block_size, steps,
            [r.sampling_params.ending_token_ids(r.eos_token_id) for r in order],
            None if draws is None else md, draws)
        if draws is not None:
            draws.keep(tokens.shape[1])
        if tokens.shape[1] == 0:
            return []
        return [SampledTokens(req, row, num_drafts=steps - 1, num_accepted=len(row) - 1)
                for req, row in zip(order, tokens.tolist(), strict=True)]

    def _send_to_ranks(self, sched: SchedulerOutput, batch, row_index: list[int]) -> None:
        """Tensor parallelism: the other ranks mirror this step (swaps, forward, gather)."""
        self.tp_executor.send_step(batch.host if batch is not None else None, row_index,
                                   sched.blocks_to_swap_out, sched.blocks_to_swap_in,
                                   sched.blocks_to_copy)

    def _move_blocks(self, swap_out, swap_in, copies) -> None:
        # Swap-outs first: a device block they read may be a swap-in's or a copy's target.
        self.cache.swap_blocks_out(swap_out)
        self.cache.swap_blocks_in(swap_in)
        self.cache.copy_blocks(copies)

    def _forward(self, batch, copies: list[tuple[int, int]]) -> torch.Tensor:
        """Hidden states of the step (with the LoRA rows' slots in scope): a captured CUDA
        graph for a decode batch that fits one, else the eager forward pass. The draft model
        then mirrors the pass, which keeps its KV in step with the target's."""
        with self._lora_step(batch), self._prompt_step(batch):
            if self.graphs is not None and self.graphs.can_run(batch.input_ids, batch.meta):
                hidden = self.graphs.run(batch.input_ids, batch.positions, batch.meta)
            else:
                hidden = self.model(batch.input_ids, batch.positions, batch.max_pos,
                                    self.cache.layer_caches, batch.meta)
        if self.draft is not None:
            self.draft.mirror(batch, copies)
        return hidden

    def _logits(self, hidden: torch.Tensor, plan: SamplingPlan, prompt: list[PromptRows]
                ) -> tuple[torch.Tensor | None, list[ScoredPrompt]]:
        """Logits of the sampling rows (None when no request samples this step) and the
        prompt positions' logprobs: the rows' logits come slice by slice, and a slice's
        prompt rows are reduced to their logprobs before the next is computed."""
        n = len(plan.row_index)
        rows = plan.row_index + row_indices(prompt)
        parts, scorer = [], PromptScorer(prompt)
        for a, logits in logits_slices(self.model, hidden, rows, self.vocab_size):
            k = min(max(0, n - a), len(logits))  # this slice's sampling rows
            if k == len(logits):
                parts.append(logits)
                continue
            if k:
                parts.append(logits[:k].clone())  # not a view holding the whole slice
            scorer.add(logits[k:])
        sampling = None if not parts else parts[0] if len(parts) == 1 else torch.cat(parts)
        return sampling, scorer.results()

    def _sample(self, logits: torch.Tensor, plan: SamplingPlan) -> list[SampledTokens]:
        """Sampling metadata (penalties, restrictions, grammar masks) -> sampler, or the
        verifier for requests checking drafts -> one SampledTokens per request."""
        penalties = self.batch.penalty_tensors(plan.row_requests)
        if penalties is not None and plan.verifying:
            add_draft_counts(penalties[0], plan.verifying)
        md = SamplingMetadata.build(plan.rows, self.vocab_size, self.device, penalties,
                                    grammar=self._grammar_mask(plan),
                                    constraints=TokenConstraints.build(plan.rows))
        emitted: dict[int, int] = {}
        if plan.verifying:
            result, _, emitted = self.verifier.sample(logits, md, plan.verifying)
        else:
            result = self.sampler(logits, md)
        return collect(logits, result, plan.owners, emitted)

    def _grammar_mask(self, plan: SamplingPlan):
        """The constrained rows' grammar bitmask (None without structured output)."""
        if self.structured_output is None:
            return None
        grammars = [req.grammar for req in plan.row_requests]
        for s in plan.verifying:  # a verified position: as if the drafts before it were taken
            if s.request.grammar is not None:
                for j in range(1, len(s.drafts) + 1):
                    grammars[s.first_row + j] = DraftGrammar(s.request.grammar, s.drafts[:j])
        return self.structured_output.bitmask(grammars)

    def _prompt_step(self, batch):
        """The step's prompt rows in scope for the GGUF panels' bf16 tiles when those run
        (PAGEDLLM_PROMPT_TILES; model/layers/quant/prompt_rows.py). One rank only: a
        tensor-parallel group keeps every row on the int8 path, rank 0 (`tp_executor`) and
        the others alike, whose replay of its step has no requests (`batch.order` empty)."""
        if (self.device.type != "cpu" or self.tp_executor is not None or not batch.order
                or not self.prompt_tiles_apply or not cpu_features.prompt_tiles_on()):
            return contextlib.nullcontext()
        prompt_lens = np.fromiter((s.request.num_prompt_tokens for s in batch.order), np.int64,
                                  len(batch.order))
        return prompt_rows.step_scope(prompt_rows.PromptRows.build(
            batch.host.q_lens, batch.host.starts, prompt_lens,
            matrices=cpu_features.prompt_matrix_tiles_on()))

    def _lora_step(self, batch):
        """The adapters' row -> slot mapping, scoped to this forward pass (LoRA on)."""
        if self.lora is None:
            return contextlib.nullcontext()
        return self.lora.step([s.request.lora for s in batch.order],
                              np.fromiter((s.num_new_tokens for s in batch.order), np.int64))
