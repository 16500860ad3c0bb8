"""bf16 weights with fp32 activations on CPU: `Bf16Weight`, a `QuantizedWeight`.

`--dtype bfloat16` on CPU (and `--dtype auto` where the CPU has bf16 matrix instructions,
config/dtype.py) stores every linear layer's weight once in bf16, in the HF layout [N, K],
and keeps everything else fp32: activations, norms, residuals, attention, the KV cache. The
embedding table is a bf16 matrix too (its rows widened exactly to fp32 at lookup): a tied
lm_head shares it, so the model holds one bf16 copy instead of an fp32 table plus the
lm_head's own copy (Gemma 3 270M: 335 MB instead of 671 + 335 MB). So every fp32 kernel and
the C++ decode loop keep working, and the weights take half the memory and half the bytes
read per decode step.

The contract (also the grouped bf16 MoE kernels'), for x [M, K] fp32 -> y [M, N] fp32:

    M <  TORCH_ROWS   fp32 x times W widened exactly to fp32 (a 16-bit shift), fp32
                      accumulation: kernels/bf16_linear_cpu.cpp, AVX-512 / AVX2 / scalar,
                      multi-threaded, bandwidth-bound at the row counts of decoding
    M >= TORCH_ROWS   x rounded to bf16, torch's bf16 matmul (oneDNN: avx512_bf16 dot
                      products, AMX-bf16 on Xeons; fp32 accumulation), output widened to fp32
                      (torch rounds the output to bf16 once: it has no CPU bf16 x bf16 -> fp32
                      matmul), bias added in fp32

Both branches live in the C++ `bf16_linear` (the decode loop calls the same function). Without
the C++ kernels every M takes the torch branch. A row's result does not depend on the rows
beside it below TORCH_ROWS (the kernel is batch-invariant); a batch of TORCH_ROWS rows or
more (prefill chunks, many decodes) rounds its activations to bf16, so there the numerics
follow the batch size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pagedllm.model.layers.quant.base import QuantizedWeight

#: this format's kind in the C++ decode loop (LinearKind in kernels/decode_layers_cpu.cpp)
BF16_KIND = 4

#: Rows from which torch's bf16 matmul beats the fp32-activation kernel. Measured on a 2-vCPU
#: Zen 4/5 class CPU with avx512_bf16 (no AMX), 1 thread, min of 200 interleaved calls per
#: point, load average ~6 (other jobs on the machine); kernel vs torch bf16, us:
#:   1536x576   M=1 18 vs 63, M=4 32 vs 66, M=6 49 vs 73, M=8 67 vs 81, M=10 81 vs 86,
#:              M=12 99 vs 95, M=16 126 vs 105
#:   2048x2048  M=1 102 vs 277, M=4 203 vs 299, M=6 262 vs 337, M=8 422 vs 383
#:   49152x576  M=1 1558 vs 3153 (the lm_head), M=4 1914 vs 3408, M=6 3885 vs 3762
#: With 2 threads (load ~4): 1536x576 M=8 45 vs 56, 2048x2048 M=6 176 vs 257, M=8 252 vs 224.
#: Below 8 rows the kernel wins at every shape; from 8 on torch wins at the larger ones.
TORCH_ROWS = 8


class Bf16Weight(QuantizedWeight):
    """A bf16 [out, in] weight run with fp32 activations (the module docstring's contract).

    `ops` is the C++ kernel module, None where the kernels are not built: then every row
    count takes torch's bf16 matmul. Also an embedding table (rows widened exactly at
    lookup), shared with a tied lm_head: one bf16 copy for both."""

    format = "bf16"

    def __init__(self, ops, weight: torch.Tensor, torch_rows: int = TORCH_ROWS) -> None:
        super().__init__(*weight.shape)
        if torch_rows < 1:
            raise ValueError(f"torch_rows must be >= 1, got {torch_rows}")
        self.ops = ops
        self.torch_rows = torch_rows
        self.weight = weight.detach().to(torch.bfloat16).contiguous()

    def linear(self, x: torch.Tensor) -> torch.Tensor:
        return self.apply(x, None)

    def embedding(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.weight[token_ids].float()

    def embedding_ref(self, ops):
        return ops.EmbedRef(BF16_KIND, 0, self.out_features, self.in_features, [self.weight])

    def apply(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features).float().contiguous()
        if self.ops is not None:
            out = self.ops.bf16_linear(x2, self.weight, bias, self.torch_rows)
        else:
            out = F.linear(x2.to(torch.bfloat16), self.weight).float()
            if bias is not None:
                out = out + bias
        return out.view(*lead, self.out_features).to(x.dtype)

    @property
    def nbytes(self) -> int:
        return self.weight.numel() * self.weight.element_size()

    def fused_ref(self, ops, bias: torch.Tensor | None):
        return ops.LinearRef(BF16_KIND, 0, self.out_features, self.in_features,
                             self.torch_rows, [self.weight], bias)

    def __repr__(self) -> str:
        return (f"Bf16Weight(out={self.out_features}, in={self.in_features}, "
                f"torch_rows={self.torch_rows}, {self.nbytes / 2**20:.2f} MiB)")

    def dequantize(self) -> torch.Tensor:
        """The weight widened to fp32 [out, in] (exact): the kernel's reference."""
        return self.weight.float()
