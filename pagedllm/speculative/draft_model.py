"""A smaller draft model proposing tokens, with its own paged KV pool in the same budget.

The draft's pool has the target's block ids: block b of a request's table holds the target's
KV in the target pool and the draft's in this one, so the block manager, prefix caching and
preemption serve both (a block costs target + draft bytes; the engine sizes the pool so).
Every forward pass of the target is mirrored on the draft (same tokens, positions, slots),
which keeps the draft's KV valid for every computed token::

    step t:   target + draft mirror over the batch (prefill chunks, decodes, verifications)
    update:   for each decoding request, reserve k slots, then k batched draft decodes:
              feed the last token at position M-1 -> d_0, feed d_0 at M -> d_1, ...

Greedy requests get the draft's argmax (a point mass); sampling requests draw d_j from
q_j = softmax(draft logits / temperature) and keep q_j for the rejection sampler.
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import torch

from pagedllm.config import EngineConfig
from pagedllm.config.speculative import SpeculativeConfig
from pagedllm.core.block_manager import BlockManager
from pagedllm.core.request import Request
from pagedllm.loader import load_checkpoint
from pagedllm.model.layers.attention_backends import BatchLayout
from pagedllm.model.layers.sampler import inverse_cdf, make_generator, uniform_draw
from pagedllm.speculative.adaptive import DraftState
from pagedllm.speculative.proposer import Proposer
from pagedllm.worker import model_setup
from pagedllm.worker.cache_engine import CacheEngine
from pagedllm.worker.input_batch import BatchInputs
from pagedllm.worker.rank_builder import build_rank

logger = logging.getLogger(__name__)


class DraftModel(Proposer):
    mirrors_target = True
    drafts_forked_requests = False  # its KV writes into a block forked siblings share

    def __init__(self, spec_config: SpeculativeConfig, config: EngineConfig,
                 target_vocab_size: int) -> None:
        path = spec_config.model
        ckpt = load_checkpoint(path, quantization=None)
        vocab = ckpt.config.vocab_size
        if vocab != target_vocab_size:
            raise ValueError(f"draft model {path} has a vocabulary of {vocab} tokens, the "
                             f"target {target_vocab_size}: they must share one tokenizer")
        window = getattr(ckpt.config, "sliding_window", None)
        if window is not None and getattr(ckpt.config, "use_sliding_window", True):
            raise ValueError(f"draft model {path} uses sliding-window attention, which the "
                             "draft runner does not support")
        draft_config = dataclasses.replace(
            config, model=path, quantization=None, speculative_config=None, enable_lora=False)
        draft_config.finalize(config.max_model_len)
        model_setup.resolve_linear_dtype(ckpt, draft_config)  # 'auto' on CPU: by its weights
        # The target's start-up (worker/rank_builder.py) on the draft's own checkpoint: the
        # target's RoPE overrides and trained length do not apply to it.
        parts = build_rank(draft_config, ckpt)
        self.model, self.kv_spec = parts.model, parts.kv_spec
        # Builds the metadata of the draft's own decode steps; its mirror of the target's
        # passes runs on the target's metadata (same device and dtypes: the same backend).
        self.attention_backend = parts.attention_backend
        self.device = config.torch_device
        self.block_size = config.block_size
        self.generator = make_generator(config.seed + 1, self.device)
        self.cache: CacheEngine | None = None

    def allocate(self, num_blocks: int) -> None:
        self.cache = CacheEngine(self.kv_spec, num_blocks, self.device)

    @torch.inference_mode()
    def mirror(self, batch: BatchInputs, copies: list[tuple[int, int]]) -> None:
        """Run the draft over the target's batch (writes its KV; no logits)."""
        self.cache.copy_blocks(copies)
        self.model(batch.input_ids, batch.positions, batch.max_pos, self.cache.layer_caches,
                   batch.meta)

    @torch.inference_mode()
    def propose(self, requests: list[Request], ks: list[int], bm: BlockManager
                ) -> list[list[int]]:
        """The draft tokens of each decoding request (its draft probabilities go to its
        `draft_state` when it samples): up to ks[i] tokens, none when no block is free for
        them."""
        todo, index = [], []
        for i, (req, k) in enumerate(zip(requests, ks, strict=True)):
            if k > 0 and bm.allocate_slots(req, k):
                todo.append((req, k))
                index.append(i)
        result: list[list[int]] = [[] for _ in requests]
        if not todo:
            return result
        drafts: list[list[int]] = [[] for _ in todo]
        probs: list[list[torch.Tensor]] = [[] for _ in todo]
        for j in range(max(k for _, k in todo)):
            live = [i for i, (_, k) in enumerate(todo) if k > j]
            reqs = [todo[i][0] for i in live]
            last = [drafts[i][-1] if j else todo[i][0].all_token_ids[-1] for i in live]
            logits = self._decode(reqs, last, [r.num_tokens - 1 + j for r in reqs])
            for row, i in enumerate(live):
                tok, q = self._draw(todo[i][0], logits[row])
                drafts[i].append(tok)
                if q is not None:
                    probs[i].append(q)
        for i, (req, _) in enumerate(todo):
            result[index[i]] = drafts[i]
            if req.draft_state is None:
                req.draft_state = DraftState()
            req.draft_state.draft_probs = torch.stack(probs[i]) if probs[i] else None
        return result

    def _draw(self, req: Request, logits: torch.Tensor) -> tuple[int, torch.Tensor | None]:
        p = req.sampling_params
        if p.is_greedy:
            return int(logits.argmax()), None
        q = torch.softmax(logits.float() / p.temperature, dim=-1)
        u = uniform_draw(req.generator or self.generator, q.device)
        return int(inverse_cdf(q.unsqueeze(0), u.view(1))), q

    def _decode(self, reqs: list[Request], tokens: list[int], positions: list[int]
                ) -> torch.Tensor:
        """One draft forward pass of one token per request; [len(reqs), V] logits."""
        bs = self.block_size
        pos = np.asarray(positions, np.int64)
        width = int(-(-(pos.max() + 1) // bs))
        table = np.zeros((len(reqs), width), np.int64)
        for i, r in enumerate(reqs):
            ids = r.block_ids[:width]
            table[i, :len(ids)] = ids
        n = len(reqs)
        meta = self.attention_backend.build_metadata(BatchLayout(
            bs, q_lens=np.ones(n, np.int64), seq_lens=pos + 1, query_start=np.arange(n + 1),
            token_request=np.arange(n), positions=pos, block_table=table, num_decode_reqs=n))
        to = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(self.device)  # noqa: E731
        hidden = self.model(to(np.asarray(tokens, np.int64)), to(pos), int(pos.max()),
                            self.cache.layer_caches, meta)
        return self.model.compute_logits(hidden)
