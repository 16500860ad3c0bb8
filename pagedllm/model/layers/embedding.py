"""Token embedding whose table may stay quantized (`quant.QuantizedWeight.embedding`).

Dense: `F.embedding` over `weight` as before. Quantized (adopted with `set_quantized`, e.g. a
GGUF Q8_0 `token_embd`, or the bf16 table `finalize` makes under `--dtype bfloat16` on CPU):
only the looked-up rows are dequantized, and a tied lm_head adopts the same object, so the
table is held once.
Under tensor parallelism (constructed inside layers/parallel.tensor_parallel_layers) this rank
holds a range of the vocabulary's rows, looks the ids up in it and all-reduces.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pagedllm.model.layers.parallel import embedding_collective
from pagedllm.model.layers.quant import QuantizedWeight
from pagedllm.model.layers.quant.dense import bf16_table, linear_weight_dtype


class VocabEmbedding(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim), requires_grad=False)
        self.quant: QuantizedWeight | None = None
        self.parallel = embedding_collective()  # None on one rank
        # bf16 matrices under an fp32 model (quant/dense.py `linear_weights`); None: the model's
        self.weight_dtype = linear_weight_dtype()

    def finalize(self) -> None:
        """Called once after loading: with bf16 matrices under an fp32 model (CPU) the dense
        table becomes a `Bf16Weight` (quant/bf16.py), which a tied lm_head then adopts."""
        if self.quant is None and (table := bf16_table(self.weight, self.weight_dtype)) is not None:
            self.set_quantized(table)

    def set_quantized(self, qweight: QuantizedWeight) -> None:
        """Adopt a quantized table [num_embeddings, embedding_dim] (frees the dense one)."""
        if qweight.shape != (self.num_embeddings, self.embedding_dim):
            raise ValueError(f"quantized weight {qweight!r} does not fit an embedding of shape "
                             f"({self.num_embeddings}, {self.embedding_dim})")
        self.quant = qweight
        self.weight = nn.Parameter(torch.empty(0, dtype=self.weight.dtype,
                                               device=self.weight.device), requires_grad=False)

    def fused_ref(self, ops):
        """This table as the C++ multi-step decode looks rows up (`ops.EmbedRef`): a dense
        fp32 table (kind 0: rows copied, as F.embedding does) or its quantized format's own
        (`QuantizedWeight.embedding_ref`); None otherwise (another dtype or format, or a
        tensor-parallel vocabulary split)."""
        if self.parallel is not None:
            return None
        if self.quant is not None:
            return self.quant.embedding_ref(ops)
        if self.weight.dtype != torch.float32 or self.weight.dim() != 2:
            return None
        return ops.EmbedRef(0, 0, self.num_embeddings, self.embedding_dim, [self.weight])

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.parallel is not None:
            return self.parallel.embed(self._lookup, ids, self.num_embeddings)
        return self._lookup(ids)

    def _lookup(self, ids: torch.Tensor) -> torch.Tensor:
        if self.quant is None:
            return F.embedding(ids, self.weight)
        rows = self.quant.embedding(ids.reshape(-1))
        return rows.view(*ids.shape, self.embedding_dim).to(self.weight.dtype)
