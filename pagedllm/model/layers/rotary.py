"""Rotary position embedding, always in float32.

cos/sin are computed in fp32 from each token's absolute position (the request's
`num_computed_tokens` + offset, never batch-relative), applied to q and k in fp32 and cast
back. Frequencies come from `rope_scaling.py` and are bit-identical to HF transformers'.

Static types (default, linear, yarn, llama3) read one cos/sin table, grown on demand
(doubling, capped at the model's RoPE maximum unless a longer position is asked for).

Dynamic NTK: HF recomputes inv_freq from `max(position_ids) + 1` of each forward call, i.e.
from the length the sequence reaches in that call. We apply that rule per sequence, per step:

    step: [ d0 (pos 900) | d1 (pos 40) | p0 chunk pos 512..1023 ]
    L:       901            41            1024 for all 512 tokens of the chunk
    freqs:  f(901)         f(orig)        f(1024)        f(L) = unscaled when L <= orig

So a sequence gets exactly what HF `generate` gives it when HF runs the same forward calls:
a prompt prefilled in one step matches `generate()`, a prompt chunked by the scheduler
matches `generate(prefill_chunk_size=...)` with the same chunk size, and a decode step
matches HF's decode step. Other sequences in the batch never influence a sequence (unlike
HF's padded batches, which use the batch-wide maximum), and nothing is kept between steps
(HF keeps the largest length seen, until a call shorter than the original maximum). Keys
in the cache keep the rotation they were written with, as in HF; so results depend on how
the prompt was chunked (as HF's depend on prefill_chunk_size), a preempted sequence's
recomputed keys can differ from the first ones, and prefix caching is off for this type.

LongRoPE (Phi-3 / Phi-4) follows the same rule: HF picks the long factors for a forward call
whose `max(position_ids) + 1` exceeds original_max_position_embeddings, so here a sequence
gets them in the steps where its length does (the table holds the short factors).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from pagedllm.kernels import cpu_ops
from pagedllm.kernels import triton as triton_ops
from pagedllm.model.layers.rope_scaling import (
    LENGTH_DEPENDENT_ROPE_TYPES,
    compute_inv_freq,
    rope_max_len,
    rope_parameters,
    rotary_dim,
)

if TYPE_CHECKING:
    from pagedllm.model.layers.attention import AttentionMetadata

_MIN_TABLE = 256


class RotaryEmbedding(nn.Module):
    """HF-layout rotary embedding (rotate-half over the first `rotary_dim` features)."""

    def __init__(self, head_dim: int, params: dict, max_position_embeddings: int,
                 max_len: int | None = None) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.params = params
        self.rotary_dim = rotary_dim(head_dim, params)
        self.max_position_embeddings = max_position_embeddings
        self.max_len = max_len or max_position_embeddings
        self.is_dynamic = params.get("rope_type") in LENGTH_DEPENDENT_ROPE_TYPES
        # The length past which a sequence's frequencies change.
        self.scaled_from = int(params.get("original_max_position_embeddings")
                               if params.get("rope_type") == "longrope"
                               else max_position_embeddings)
        # Plain tensors, not buffers: the model is built on the meta device and these must be
        # real; they are computed on the CPU and moved to the device of the positions.
        with torch.device("cpu"):
            self.inv_freq, self.attention_scaling = compute_inv_freq(
                self.rotary_dim, params, max_position_embeddings)
        self._cos_sin: torch.Tensor | None = None  # [len, rotary_dim]: cos half || sin half

    @classmethod
    def from_config(cls, config, head_dim: int) -> RotaryEmbedding:
        return cls(head_dim, rope_parameters(config), int(config.max_position_embeddings),
                   rope_max_len(config)[0])

    def _table(self, needed: int, device: torch.device) -> torch.Tensor:
        table = self._cos_sin
        if table is None or table.shape[0] < needed or table.device != device:
            grown = _MIN_TABLE if table is None else 2 * table.shape[0]
            # Positions past max_len only come with allow_long_max_model_len: keep doubling.
            length = max(needed, grown if needed > self.max_len else min(grown, self.max_len))
            t = torch.arange(length, dtype=torch.float32)
            freqs = torch.outer(t, self.inv_freq)
            table = torch.cat([freqs.cos() * self.attention_scaling,
                               freqs.sin() * self.attention_scaling], -1).to(device)
            self._cos_sin = table
        return table

    def halves(self, positions: torch.Tensor, max_pos: int,
               seq_lens: torch.Tensor | None = None) -> torch.Tensor:
        """fp32 [T, rotary_dim]: cos of the rotary_dim / 2 frequencies, then their sin.

        `seq_lens` [T] (dynamic NTK, LongRoPE): the length each token's sequence reaches in this
        forward call (see `sequence_lengths`); None means `max_pos + 1` for every token.
        """
        halves = self._table(max_pos + 1, positions.device)[positions]
        if self.is_dynamic:
            halves = self._dynamic(positions, max_pos, seq_lens, halves)
        return halves

    def cos_sin(self, positions: torch.Tensor, max_pos: int,
                seq_lens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 cos and sin of shape [T, 1, rotary_dim] for the given absolute positions."""
        return RopeBatch(self.halves(positions, max_pos, seq_lens)).cos_sin()

    def _dynamic(self, positions: torch.Tensor, max_pos: int, seq_lens: torch.Tensor | None,
                 halves: torch.Tensor) -> torch.Tensor:
        """Overwrite the rows of tokens whose sequence is past the original maximum."""
        if seq_lens is None:
            seq_lens = torch.full_like(positions, max_pos + 1)
        long = seq_lens > self.scaled_from
        if not bool(long.any()):
            return halves
        lengths, inverse = torch.unique(seq_lens[long].cpu(), return_inverse=True)
        # One inv_freq per distinct length (one per long sequence in the step), each computed
        # exactly as HF computes it for a forward call of that length.
        inv_freq = torch.stack([
            compute_inv_freq(self.rotary_dim, self.params, self.max_position_embeddings, n)[0]
            for n in lengths.tolist()]).to(positions.device)
        freqs = positions[long].float()[:, None] * inv_freq[inverse.to(positions.device)]
        halves = halves.clone()
        scale = self.attention_scaling  # LongRoPE's; 1.0 for dynamic NTK
        halves[long] = torch.cat([freqs.cos() * scale, freqs.sin() * scale], -1)
        return halves

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate `x` [T, heads, head_dim] in fp32; features past rotary_dim pass through."""
        rot = cos.shape[-1]
        xf = x.float()
        xr = xf[..., :rot]
        x1, x2 = xr.chunk(2, dim=-1)
        rotated = torch.cat([-x2, x1], -1)
        out = xr * cos + rotated * sin
        if rot < x.shape[-1]:
            out = torch.cat([out, xf[..., rot:]], -1)
        return out.to(x.dtype)


class RopeBatch:
    """The RoPE factors of one forward pass's tokens, shared by every layer."""

    def __init__(self, halves: torch.Tensor) -> None:
        self.halves = halves.contiguous()  # [T, rotary_dim] fp32: cos half || sin half
        self._cos_sin: tuple[torch.Tensor, torch.Tensor] | None = None

    def cos_sin(self) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [T, 1, rotary_dim] in HF's layout (each half repeated)."""
        if self._cos_sin is None:
            half = self.halves.shape[1] // 2
            cos, sin = self.halves[:, :half], self.halves[:, half:]
            self._cos_sin = (torch.cat([cos, cos], -1).unsqueeze(1),
                             torch.cat([sin, sin], -1).unsqueeze(1))
        return self._cos_sin

    def rotate_qk_(self, qkv: torch.Tensor, num_heads: int, num_kv_heads: int,
                   head_dim: int) -> None:
        """Rotate, in place, the q and k heads of fused qkv rows [T, (H + 2 KVH) * d]."""
        if qkv.is_contiguous() and triton_ops.enabled(qkv):
            from pagedllm.kernels.triton import fused

            fused.rotary_qk_(qkv, self.halves, num_heads, num_kv_heads, head_dim)
            return
        if (ops := cpu_ops.fp32_ops(qkv)) is not None and qkv.is_contiguous():
            ops.rotary_qk_(qkv, self.halves, num_heads, num_kv_heads, head_dim)
            return
        qk = qkv.view(qkv.shape[0], -1, head_dim)[:, :num_heads + num_kv_heads]
        qk.copy_(RotaryEmbedding.apply(qk, *self.cos_sin()))


def sequence_lengths(positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
    """[T] the length each token's sequence reaches in this step (its last position + 1);
    the metadata knows its batch layout (attention.AttentionMetadata.sequence_lengths)."""
    return meta.sequence_lengths(positions)
