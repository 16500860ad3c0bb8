"""`SpecDecoder`: the engine's one object for speculative decoding.

Hooks (one each):
  * scheduler    reads `Request.spec_token_ids`: a decoding request schedules 1 + k query
                 tokens (`ScheduledRequest.num_spec_tokens`); their KV is not yet computed
  * model runner `mirror` (draft model only) after the forward pass; `Verifier.sample`
                 samples every verified position and picks the accepted drafts
  * engine step  `update` after the output processor appended the emitted tokens: commit
                 the accepted drafts' KV, give back the rejected slots, count, propose anew

KV of one verification of k = 5 drafts, one accepted (block size 4)::

    position   4  5  6  7 | 8  9  10 11 | 12        7: the last token, 8..12: drafts d0..d4
    query      .  .  .  t | d0 d1 d2 d3 | d4        (slots for 7..12 were allocated)
    after      computed   | d0 e        |           d0 accepted, e = the token sampled at 9
    blocks     [   b1    ]  [    b2     ]  [b3]     b3 holds only rejected slots: given back
"""

from __future__ import annotations

import logging

from pagedllm.config import EngineConfig
from pagedllm.core.block_manager import BlockManager
from pagedllm.core.request import Request
from pagedllm.core.scheduler import Scheduler, SchedulerOutput
from pagedllm.spec_decode.adaptive import SpecState, num_to_propose, required_acceptance
from pagedllm.spec_decode.config import SpeculativeConfig
from pagedllm.spec_decode.draft_model import DraftModel
from pagedllm.spec_decode.ngram import NgramProposer
from pagedllm.spec_decode.stats import SpecDecodeStats

logger = logging.getLogger(__name__)


class SpecDecoder:
    def __init__(self, config: SpeculativeConfig, engine_config: EngineConfig,
                 vocab_size: int) -> None:
        self.config = config
        self.max_model_len = engine_config.max_model_len
        self.ngram = (NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)
                      if config.method == "ngram" else None)
        self.draft = (DraftModel(config.model, engine_config, vocab_size)
                      if config.method == "draft_model" else None)

    @property
    def draft_kv_spec(self):
        """The draft's KV layout (None for n-gram): each block also holds this much."""
        return None if self.draft is None else self.draft.kv_spec

    def new_stats(self) -> SpecDecodeStats:
        return SpecDecodeStats(self.config.num_speculative_tokens)

    def update(self, scheduler: Scheduler, sched: SchedulerOutput, sampled,
               stats: SpecDecodeStats | None) -> None:
        """After a step's tokens are appended (the engine step's hook, see the module doc)."""
        bm = scheduler.block_manager
        if stats is not None:
            stats.begin_step()
        for req in sched.preempted:
            req.spec_token_ids = []
        for st in sampled:
            if st.num_drafts:
                self._commit(st.request, st.num_drafts, st.num_accepted, bm, stats)
        decoding = [r for r in scheduler.running if r.num_tokens - r.num_computed_tokens == 1]
        limit = self.config.disable_by_batch_size
        if limit is not None and len(decoding) > limit:
            for req in decoding:
                req.spec_token_ids = []
            return
        stepped = {id(st.request) for st in sampled}
        threshold = required_acceptance(self.config.min_acceptance_rate, len(decoding))
        self._propose([r for r in decoding if id(r) in stepped or r.spec_state is None], bm,
                      threshold)

    def _commit(self, req: Request, num_drafts: int, num_accepted: int, bm: BlockManager,
                stats: SpecDecodeStats | None) -> None:
        if stats is not None:
            stats.record(num_drafts, num_accepted)
        state = req.spec_state
        if state is not None:
            state.record(num_drafts, num_accepted)
        logger.debug("%s: %d of %d drafts accepted %s", req.request_id, num_accepted,
                     num_drafts, req.spec_token_ids[:num_drafts])
        req.spec_token_ids = []
        if req.is_finished:
            return
        # The scheduler counted the last token; the accepted drafts' KV is valid too.
        req.num_computed_tokens += num_accepted
        bm.trim_slots(req, req.num_tokens)
        bm.cache_full_blocks(req)

    def _propose(self, requests: list[Request], bm: BlockManager, threshold: float) -> None:
        todo, ks = [], []
        for req in requests:
            if req.spec_state is None:
                req.spec_state = SpecState()
            k = num_to_propose(self.config, req.num_output_tokens, req.max_tokens,
                               req.num_tokens, self.max_model_len)
            if self.draft is not None and req.sampling_params.n > 1:
                k = 0  # forked siblings share a partial block: copy-on-write would race
            if k == 0 or not req.spec_state.may_propose(threshold, self.config.backoff_steps):
                req.spec_token_ids = []
                continue
            todo.append(req)
            ks.append(req.spec_state.num_drafts(k))
        if self.ngram is not None:
            for req, k in zip(todo, ks, strict=True):
                req.spec_token_ids = self.ngram.propose(req.all_token_ids, k)
        elif todo:
            self.draft.propose(todo, ks, bm)
