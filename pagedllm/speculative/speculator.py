"""`Speculator`: the engine's one object for speculative decoding, a proposer.

Hooks (one each):
  * scheduler    reads `Request.draft_token_ids`: a decoding request schedules 1 + k query
                 tokens (`ScheduledRequest.num_draft_tokens`); `update_from_output` commits
                 the accepted drafts' KV and gives back the rejected slots
  * model runner `mirror` (draft model only) after the forward pass; `Verifier.sample`
                 samples every verified position and picks the accepted drafts
  * engine step  `propose` after the step's result is applied: learn from the verifications,
                 then propose the next drafts (`Scheduler.set_draft_tokens`)
"""

from __future__ import annotations

import logging

from pagedllm.config import EngineConfig
from pagedllm.config.speculative import SpeculativeConfig
from pagedllm.core.block_manager import BlockManager
from pagedllm.core.request import Request
from pagedllm.core.runner_output import RunnerOutput
from pagedllm.speculative.adaptive import DraftState, num_to_propose, required_acceptance
from pagedllm.speculative.proposer import Proposer
from pagedllm.speculative.registry import PROPOSERS
from pagedllm.speculative.stats import SpeculativeStats

logger = logging.getLogger(__name__)


class Speculator:
    def __init__(self, config: SpeculativeConfig, engine_config: EngineConfig,
                 vocab_size: int) -> None:
        self.config = config
        self.max_model_len = engine_config.max_model_len
        self.proposer: Proposer = PROPOSERS[config.method](config, engine_config, vocab_size)

    @property
    def draft_kv_spec(self):
        """The proposer's own KV layout (None without a model): each block also holds this
        much."""
        return self.proposer.kv_spec

    @property
    def draft(self) -> Proposer | None:
        """The proposer the model runner mirrors every forward pass on (None: none)."""
        return self.proposer if self.proposer.mirrors_target else None

    def new_stats(self) -> SpeculativeStats:
        return SpeculativeStats(self.config.num_speculative_tokens)

    def propose(self, out: RunnerOutput, running: list[Request], bm: BlockManager
                ) -> list[tuple[Request, list[int]]]:
        """Draft tokens for the decoding requests of `running`, after `out` was applied:
        each verification updates its request's acceptance rate (adaptive.py) first. Requests
        that did not run this step keep their drafts (they are not in the result)."""
        for st in out.sampled:
            if st.num_drafts and st.request.draft_state is not None:
                st.request.draft_state.record(st.num_drafts, st.num_accepted)
                logger.debug("%s: %d of %d drafts accepted", st.request.request_id,
                             st.num_accepted, st.num_drafts)
        decoding = [r for r in running if r.num_tokens - r.num_computed_tokens == 1]
        limit = self.config.disable_by_batch_size
        if limit is not None and len(decoding) > limit:
            return [(req, []) for req in decoding]
        stepped = {id(st.request) for st in out.sampled}
        threshold = required_acceptance(self.config.min_acceptance_rate, len(decoding))
        return self._propose([r for r in decoding if id(r) in stepped or r.draft_state is None],
                             bm, threshold)

    def _propose(self, requests: list[Request], bm: BlockManager, threshold: float
                 ) -> list[tuple[Request, list[int]]]:
        drafts: list[tuple[Request, list[int]]] = []
        todo, ks = [], []
        for req in requests:
            if req.draft_state is None:
                req.draft_state = DraftState()
            k = num_to_propose(self.config, req.num_output_tokens, req.max_tokens,
                               req.num_tokens, self.max_model_len)
            if not self.proposer.drafts_forked_requests and req.sampling_params.n > 1:
                k = 0  # forked siblings share a partial block: copy-on-write would race
            if k == 0 or not req.draft_state.may_propose(threshold, self.config.backoff_steps):
                drafts.append((req, []))
                continue
            todo.append(req)
            ks.append(req.draft_state.num_drafts(k))
        if todo:
            drafts += zip(todo, self.proposer.propose(todo, ks, bm), strict=True)
        return drafts
