"""Multi-head latent attention (DeepSeek-V2 / V3) over a paged latent cache.

Per token the layer caches one latent row shared by every head (MQA with one KV "head"):

    kv_a_proj_with_mqa(x) = [ c | k_pe ]      c: kv_lora_rank, k_pe: qk_rope_head_dim
    cached row            = [ kv_a_layernorm(c) | rope(k_pe) ]      (r + rope_dim values)

so the KV pool has one part of head size r + rope_dim, read as both K and V (the first r
outputs are kept): latent bytes per token per layer = (kv_lora_rank + qk_rope_head_dim) x
dtype bytes (config/kv_cache.py, `parts=1`), against 2 x heads x head_dim for expanded K / V.

Prefill and decode both run the absorbed form (one path; the expanded form would only pay
off for long prefills on an accelerator). kv_b_proj's weight [H (nope + v), r] splits per
head into W_UK [nope, r] and W_UV [v, r]:

    q_lat[h] = q_nope[h] @ W_UK[h]                        [T, H, r]
    scores   = [q_lat | rope(q_pe)] . [c | k_pe] * scale  one latent "head" for all H
    out[h]   = (softmax(scores) @ c)[h] @ W_UV[h]^T       [T, H, v]  -> o_proj

which equals HF's expanded k_nope = c @ W_UK^T, v = c @ W_UV^T (only the summation order
differs). Scale: qk_head_dim^-0.5, times mscale^2 under YaRN with `mscale_all_dim`
(mscale = 0.1 mscale_all_dim ln(factor) + 1); YaRN's attention factor on cos / sin comes
with the rotary table (rope_scaling.py). RoPE pairs are interleaved ((x0, x1), (x2, x3) ..)
unless a V3 config says `rope_interleave: false`; q_pe and k_pe get the same layout, so
their dot products are HF's.

The attention runs on the step's attention backend (`latent_attention`): MQA over one KV head
whose K and V are both the whole latent row, so the C++ / Triton kernels (which take V of K's
head size) run it unchanged and the last rope_dim outputs are dropped.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from pagedllm.errors import ModelLoadError
from pagedllm.model.layers.attention import AttentionMetadata, LayerKVCache
from pagedllm.model.layers.linear import Linear
from pagedllm.model.layers.norm import RMSNorm
from pagedllm.model.layers.rope_scaling import rope_parameters
from pagedllm.model.layers.rotary import RopeBatch, RotaryEmbedding

MLA_FAMILIES = ("deepseek_v2", "deepseek_v3")


def latent_head_size(config) -> int:
    """The cached row of one token in one layer: kv_lora_rank + qk_rope_head_dim values."""
    return int(config.kv_lora_rank) + int(config.qk_rope_head_dim)


def latent_kv_dims(config) -> tuple[int, int] | None:
    """(kv heads, head size) of the latent cache of an MLA config (an HF config or a
    config.json namespace): one row of kv_lora_rank + qk_rope_head_dim; None for other
    families."""
    if getattr(config, "model_type", None) not in MLA_FAMILIES:
        return None
    return 1, latent_head_size(config)


def attention_parameters(config) -> int:
    """Parameters of one MLA block (projections and their norms), for `pagedllm plan`."""
    h, heads = config.hidden_size, config.num_attention_heads
    qk = config.qk_nope_head_dim + config.qk_rope_head_dim
    r, q_rank = config.kv_lora_rank, getattr(config, "q_lora_rank", None)
    q = h * heads * qk if q_rank is None else h * q_rank + q_rank + q_rank * heads * qk
    kv = h * (r + config.qk_rope_head_dim) + r + r * heads * (
        config.qk_nope_head_dim + config.v_head_dim)
    return q + kv + heads * config.v_head_dim * h


def softmax_scale(config) -> float:
    """qk_head_dim^-0.5, corrected by mscale^2 under YaRN with mscale_all_dim (as HF)."""
    scale = (config.qk_nope_head_dim + config.qk_rope_head_dim) ** -0.5
    params = rope_parameters(config)
    all_dim = params.get("mscale_all_dim")
    factor = params.get("factor") or 1.0
    if params.get("rope_type", "default") != "default" and all_dim and factor > 1:
        mscale = 0.1 * all_dim * math.log(factor) + 1.0
        scale *= mscale * mscale
    return scale


class LatentUpProjection(nn.Module):
    """kv_b_proj: the latent -> per-head (k_nope, v) weight, only ever used absorbed."""

    def __init__(self, num_heads: int, nope: int, v: int, rank: int) -> None:
        super().__init__()
        self.num_heads, self.nope, self.v = num_heads, nope, v
        self.weight = nn.Parameter(torch.empty(num_heads * (nope + v), rank),
                                   requires_grad=False)

    def parts(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(W_UK [H, nope, r], W_UV [H, v, r]), views of the weight."""
        w = self.weight.view(self.num_heads, self.nope + self.v, -1)
        return w[:, :self.nope], w[:, self.nope:]


class MLAAttention(nn.Module):
    """DeepSeek's attention block (module docstring); parameter names are HF's, but for
    `q_proj`, loaded as `q_proj_full` (the Llama loader fuses names with `.q_proj.`)."""

    def __init__(self, config, rotary: RotaryEmbedding) -> None:
        super().__init__()
        h = config.num_attention_heads
        self.num_heads = h
        self.nope, self.rope_dim = config.qk_nope_head_dim, config.qk_rope_head_dim
        self.v_dim, self.rank = config.v_head_dim, config.kv_lora_rank
        self.q_lora_rank = config.q_lora_rank
        qk = self.nope + self.rope_dim
        bias = bool(getattr(config, "attention_bias", False))
        if self.q_lora_rank is None:
            self.q_proj_full = Linear(config.hidden_size, h * qk)
        else:
            self.q_a_proj = Linear(config.hidden_size, self.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(self.q_lora_rank, 1e-6)
            self.q_b_proj = Linear(self.q_lora_rank, h * qk)
        self.kv_a_proj_with_mqa = Linear(config.hidden_size, self.rank + self.rope_dim,
                                         bias=bias)
        self.kv_a_layernorm = RMSNorm(self.rank, 1e-6)
        self.kv_b_proj = LatentUpProjection(h, self.nope, self.v_dim, self.rank)
        self.o_proj = Linear(h * self.v_dim, config.hidden_size, bias=bias, combine="sum")
        self.rotary = rotary
        self.interleaved = config.model_type == "deepseek_v2" or bool(
            getattr(config, "rope_interleave", True))
        self.scale = softmax_scale(config)
        if rotary.rotary_dim != self.rope_dim:
            raise ModelLoadError(f"MLA rotates qk_rope_head_dim = {self.rope_dim} features; "
                                 f"the rotary table has {rotary.rotary_dim}")

    def forward(self, x: torch.Tensor, rope: RopeBatch, kv_cache: LayerKVCache,
                meta: AttentionMetadata) -> torch.Tensor:
        t, h = x.shape[0], self.num_heads
        if self.q_lora_rank is None:
            q = self.q_proj_full(x)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))[0])
        q = q.view(t, h, self.nope + self.rope_dim)
        q_nope, q_pe = q.split([self.nope, self.rope_dim], -1)
        c, k_pe = self.kv_a_proj_with_mqa(x).split([self.rank, self.rope_dim], -1)
        c = self.kv_a_layernorm(c.contiguous())[0]
        w_uk, w_uv = self.kv_b_proj.parts()
        q_lat = torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)        # [T, H, r]
        query = torch.cat([q_lat, self._rotate(q_pe, rope)], -1)               # [T, H, r+p]
        latent = torch.cat([c, self._rotate(k_pe[:, None], rope)[:, 0]], -1)   # [T, r+p]
        out = latent_attention(query, latent, kv_cache, meta, self.rank, self.scale)
        out = torch.bmm(out.transpose(0, 1), w_uv.transpose(1, 2))             # [H, T, v]
        return self.o_proj(out.transpose(0, 1).reshape(t, h * self.v_dim))

    def _rotate(self, x: torch.Tensor, rope: RopeBatch) -> torch.Tensor:
        """x [T, n, rope_dim] rotated in fp32 (interleaved pairs out as [even' | odd'])."""
        if not self.interleaved:
            return RotaryEmbedding.apply(x, *rope.cos_sin())
        half = rope.halves.shape[1] // 2
        cos, sin = rope.halves[:, None, :half], rope.halves[:, None, half:]
        xf = x.float()
        even, odd = xf[..., 0::2], xf[..., 1::2]
        return torch.cat([even * cos - odd * sin, odd * cos + even * sin], -1).to(x.dtype)


def latent_attention(query: torch.Tensor, latent: torch.Tensor, kv: LayerKVCache,
                     meta: AttentionMetadata, rank: int, scale: float) -> torch.Tensor:
    """query [T, H, r+p] over the latent rows (the new ones [T, r+p] written at their slots
    first) -> [T, H, rank], through the step's attention backend: MQA with one KV head whose
    K and V are both the whole latent row (`kv.k` and `kv.v` are the same pool), so every
    backend's kernels run it unchanged (C++ decode and varlen prefill, Triton, torch); the
    output's last p values (softmax @ k_pe) are dropped. Against a torch path that gathers
    the blocks and reads V as the first r values (fp32 CPU, r 256, p 32, 16 heads, 4 layers,
    8 x 512-token prompts, 2 threads on a 2-core machine at load 8-11): prefill 23.2 s -> 7.8 /
    15.0 s, decode 7.9 -> 11.6 / 16.3 tokens/s, the same tokens; the kernels win despite the
    p / (r + p) extra V work."""
    row = latent[:, None, :]
    out = meta.backend.forward(query, row, row, kv, meta, scale)
    return out.view(query.shape)[..., :rank]
