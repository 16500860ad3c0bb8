"""AWQ checkpoints (AutoAWQ `gemm` packing), as `Int4GroupWeight`.

Per linear layer the checkpoint holds, for W[N, K] (HF layout) and G = K / group_size:
  qweight int32 [K, N / 8]   eight 4-bit values of one input row k; the nibble at bits 4i..4i+3
                             of word j holds output column 8j + AWQ_ORDER[i]
  qzeros  int32 [G, N / 8]   the zero points, packed the same way
  scales  fp16  [G, N]
and w[n, k] = (q[k, n] - z[g, n]) * s[g, n], g = k // group_size.
"""

from __future__ import annotations

import torch

from pagedllm.model.layers.quant.int4 import Int4GroupWeight

#: column (within a group of eight) stored in nibble i of an AWQ int32 word
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def unpack_awq_int32(packed: torch.Tensor) -> torch.Tensor:
    """int32 [R, C / 8] in AWQ's nibble order -> uint8 [R, C] values 0..15."""
    r, c8 = packed.shape
    nibbles = torch.stack([(packed >> (4 * i)) & 15 for i in range(8)], dim=-1)  # [R, C8, 8]
    out = torch.empty_like(nibbles)
    out[..., list(AWQ_ORDER)] = nibbles
    return out.reshape(r, c8 * 8).to(torch.uint8)


class AwqWeight(Int4GroupWeight):
    format = "awq"
    #: one module's tensors in the checkpoint (hf_checkpoint groups them)
    checkpoint_parts = ("qweight", "qzeros", "scales")

    @classmethod
    def from_parts(cls, parts: dict[str, torch.Tensor], qcfg) -> AwqWeight:
        """From one module's `checkpoint_parts` and its `hf_checkpoint.HFQuantConfig`."""
        return cls.from_checkpoint(parts["qweight"], parts["qzeros"], parts["scales"],
                                   qcfg.group_size, qcfg.zero_point)

    @classmethod
    def from_checkpoint(cls, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                        group_size: int, zero_point: bool = True) -> AwqWeight:
        """Build from the module's qweight / qzeros / scales (`group_size` -1: one group)."""
        if qweight.dtype != torch.int32 or qweight.dim() != 2:
            raise ValueError(f"AWQ qweight must be int32 [K, N/8], got {qweight.dtype} "
                             f"{tuple(qweight.shape)}")
        k = qweight.shape[0]
        gs = k if group_size in (-1, 0, None) else int(group_size)
        q = unpack_awq_int32(qweight).t()                            # [N, K]
        if zero_point:
            z = unpack_awq_int32(qzeros.to(torch.int32)).t()        # [N, G]
        else:
            z = torch.full((q.shape[0], k // gs), 8, dtype=torch.uint8)
        s = scales.t()
        if s.shape != z.shape:
            raise ValueError(f"AWQ scales {tuple(scales.shape)} do not match qweight "
                             f"{tuple(qweight.shape)} with group size {gs}")
        return cls(q, z, s, gs)
