"""The training backend: causal attention over a padded batch, with autograd.

`pagedllm.finetune` runs the serving model's own layers over B right-padded sequences of
length L, flattened to T = B*L tokens the way the layers expect (no KV cache is read or
written). Its batches are built by `TrainingBackend.build_metadata`, so the layers' attention
calls come here; the serving path never does::

    tokens:  [s0 s0 s0 pad | s1 s1 s1 s1 | s2 s2 pad pad]    B = 3, L = 4
    mask of s0 (query rows x key columns), True = attend:
        1 0 0 0
        1 1 0 0
        1 1 1 0
        1 1 1 0      a pad query still sees real keys (no NaN); its loss is masked out

Scale as the layer gives it; SDPA (Gemma's soft-capping: scores in fp32, in torch).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F

from pagedllm.model.layers.attention import LayerKVCache
from pagedllm.model.layers.attention_backends.base import AttentionBackend


@dataclass
class CausalBatchMetadata:
    """The layout of one training batch: `key_valid` [B, L] is True on real tokens."""

    key_valid: torch.Tensor
    sliding_window: int | None = None
    _masks: dict[int | None, torch.Tensor] = field(default_factory=dict, repr=False)
    backend: TrainingBackend | None = field(default=None, repr=False)  # set by the builder

    @property
    def batch(self) -> int:
        return self.key_valid.shape[0]

    @property
    def seq_len(self) -> int:
        return self.key_valid.shape[1]

    def sequence_lengths(self, positions: torch.Tensor) -> torch.Tensor:
        """[B * n] what `AttentionMetadata.sequence_lengths` gives (dynamic NTK RoPE): each
        real token's row length (its last real position + 1); padding keeps position + 1."""
        lengths = (positions + 1).view(self.key_valid.shape)
        last = lengths.masked_fill(~self.key_valid, 0).amax(1, keepdim=True)
        return torch.where(self.key_valid, last, lengths).reshape(-1)

    def for_window(self, window: int | None) -> CausalBatchMetadata:
        """The same batch for a layer that sees only the last `window` keys (Gemma 3)."""
        if window is None or window == self.sliding_window:
            return self
        both = window if self.sliding_window is None else min(window, self.sliding_window)
        return replace(self, sliding_window=both, _masks=self._masks)

    def for_layer(self, kv_cache, window: int | None) -> CausalBatchMetadata:
        """As AttentionMetadata.for_layer: training reads no KV groups, only the window."""
        return self.for_window(window)

    def mask(self) -> torch.Tensor:
        """[B, 1, L, L] bool, True = attend: causal, real keys, inside the window."""
        w = self.sliding_window
        if w not in self._masks:
            n = self.seq_len
            i = torch.arange(n, device=self.key_valid.device)
            allowed = i[None, :] <= i[:, None]
            if w:
                allowed &= i[None, :] > i[:, None] - w
            self._masks[w] = (allowed[None] & self.key_valid[:, None, :])[:, None]
        return self._masks[w]


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     meta: CausalBatchMetadata, scale: float,
                     softcap: float | None = None) -> torch.Tensor:
    """q [T, H, d], k/v [T, kvh, d] with T = B*L -> [T, H*d] (differentiable)."""
    t, h, d = q.shape
    b, n = meta.batch, meta.seq_len
    kvh = k.shape[1]
    qb = q.view(b, n, h, d).transpose(1, 2)
    kb = k.view(b, n, kvh, d).transpose(1, 2)
    vb = v.view(b, n, kvh, d).transpose(1, 2)
    mask = meta.mask()
    if softcap:
        kb, vb = kb.repeat_interleave(h // kvh, 1), vb.repeat_interleave(h // kvh, 1)
        scores = (qb.float() @ kb.float().transpose(-1, -2)) * scale
        scores = torch.tanh(scores / softcap) * softcap
        out = (scores.masked_fill(~mask, float("-inf")).softmax(-1) @ vb.float()).to(q.dtype)
    else:
        out = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, scale=scale,
                                             enable_gqa=kvh != h)
    return out.transpose(1, 2).reshape(t, h * d)


class TrainingBackend(AttentionBackend):
    """Causal attention over a padded batch with autograd (module docstring), on any device
    and dtype. Never selected for serving: `pagedllm.finetune` builds its batches with it."""

    name = "training"

    @classmethod
    def supports(cls, device: torch.device, dtype: torch.dtype, kv_dtype: torch.dtype,
                 head_size: int) -> bool:
        return True

    def build_metadata(self, key_valid: torch.Tensor,
                       sliding_window: int | None = None) -> CausalBatchMetadata:
        """The batch of B right-padded sequences whose real tokens `key_valid` [B, L] marks."""
        return CausalBatchMetadata(key_valid, sliding_window, backend=self)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                kv_cache: LayerKVCache, meta: CausalBatchMetadata, scale: float,
                softcap: float | None = None) -> torch.Tensor:
        """`causal_attention`; `kv_cache` is not read (training keeps no KV cache)."""
        return causal_attention(q, k, v, meta, scale, softcap)
