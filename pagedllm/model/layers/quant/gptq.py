"""GPTQ checkpoints (AutoGPTQ / GPTQModel, 4 bits, sym or asym, `desc_act`) as `Int4GroupWeight`.

Per linear layer, for W[N, K] (HF layout) and G groups:
  qweight int32 [K / 8, N]   eight consecutive input rows of one column, row 8i + j at bits 4j
  qzeros  int32 [G, N / 8]   zero points packed along N the same way (column 8i + j at bits 4j)
  scales  fp16  [G, N]
  g_idx   int32 [K]          the group of each input row (k // group_size unless desc_act)
and w[n, k] = (q[k, n] - z[g_idx[k], n]) * s[g_idx[k], n]. The classic checkpoint format
("gptq", v1) stores z - 1 (AutoGPTQ's historical offset; a symmetric model stores 7 for 8);
`checkpoint_format: "gptq_v2"` stores z itself. vLLM reads both the same way.
"""

from __future__ import annotations

import torch

from pagedllm.model.layers.quant.int4 import Int4GroupWeight


def unpack_int32_rows(packed: torch.Tensor) -> torch.Tensor:
    """int32 [R / 8, C] -> uint8 [R, C]: row 8i + j from bits 4j of packed[i]."""
    r8, c = packed.shape
    nibbles = torch.stack([(packed >> (4 * j)) & 15 for j in range(8)], dim=1)  # [R8, 8, C]
    return nibbles.reshape(r8 * 8, c).to(torch.uint8)


def unpack_int32_cols(packed: torch.Tensor) -> torch.Tensor:
    """int32 [R, C / 8] -> uint8 [R, C]: column 8i + j from bits 4j of packed[:, i]."""
    r, c8 = packed.shape
    nibbles = torch.stack([(packed >> (4 * j)) & 15 for j in range(8)], dim=-1)  # [R, C8, 8]
    return nibbles.reshape(r, c8 * 8).to(torch.uint8)


class GptqWeight(Int4GroupWeight):
    format = "gptq"
    #: one module's tensors in the checkpoint (hf_checkpoint groups them; g_idx may be absent)
    checkpoint_parts = ("qweight", "qzeros", "scales", "g_idx")

    @classmethod
    def from_parts(cls, parts: dict[str, torch.Tensor], qcfg) -> GptqWeight:
        """From one module's `checkpoint_parts` and its `hf_checkpoint.HFQuantConfig`."""
        return cls.from_checkpoint(
            parts["qweight"], parts["qzeros"], parts["scales"], parts.get("g_idx"),
            qcfg.group_size, zero_offset=1 if qcfg.checkpoint_format == "gptq" else 0)

    @classmethod
    def from_checkpoint(cls, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                        g_idx: torch.Tensor | None, group_size: int,
                        zero_offset: int = 1) -> GptqWeight:
        """Build from the module's tensors; `zero_offset` 1 for v1 checkpoints (z - 1 stored)."""
        if qweight.dtype != torch.int32 or qweight.dim() != 2:
            raise ValueError(f"GPTQ qweight must be int32 [K/8, N], got {qweight.dtype} "
                             f"{tuple(qweight.shape)}")
        q = unpack_int32_rows(qweight)                                    # [K, N]
        k = q.shape[0]
        gs = k if group_size in (-1, 0, None) else int(group_size)
        z = (unpack_int32_cols(qzeros.to(torch.int32)).to(torch.int32) + zero_offset) & 15
        z = z.to(torch.uint8)                                            # [G, N]
        n_groups = z.shape[0]
        if g_idx is None:
            g_idx = torch.arange(k) // gs
        g_idx = g_idx.long()
        if g_idx.shape != (k,) or int(g_idx.min()) < 0 or int(g_idx.max()) >= n_groups:
            raise ValueError(f"GPTQ g_idx {tuple(g_idx.shape)} does not index {n_groups} groups "
                             f"of K = {k}")
        perm = torch.argsort(g_idx, stable=True)
        counts = torch.bincount(g_idx, minlength=n_groups)
        if not bool((counts == k // n_groups).all()) or k % n_groups:
            raise ValueError(f"GPTQ g_idx gives groups of sizes {sorted(set(counts.tolist()))}; "
                             f"only groups of equal size are supported")
        return cls(q[perm].t(), z.t(), scales.t(), k // n_groups, perm)
