"""GLM-4 (`Glm4ForCausalLM`): the Llama decoder with GLM's RoPE layout, sandwich norms, q/k/v
biases and a fused gate/up tensor in the checkpoint.

What differs from Llama, as HF transformers computes it:

    RoPE on the first rotary_dim = head_dim * partial_rotary_factor features (0.5), rotating
    interleaved pairs (x0, x1), (x2, x3), ... instead of halves (x0, x_r/2), (x1, x_r/2+1), ...
    x = x + post_self_attn_layernorm(attn(input_layernorm(x)))
    x = x + post_mlp_layernorm(mlp(post_attention_layernorm(x)))
    q/k/v biases (attention_bias), none on o_proj; `mlp.gate_up_proj` stored fused

Interleaved pairs become halves by permuting each q and k head's rotary rows at load time
(the same permutation on q and k leaves every q . k unchanged), so the rotate-half kernels
run GLM's rotation:

    rows of one head:  0 1 2 3 4 5 6 7 | 8 ...      (rotary_dim 8)
    loaded as:         0 2 4 6 1 3 5 7 | 8 ...      pair (2i, 2i+1) -> (i, i + 4)
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from pagedllm.errors import ModelLoadError
from pagedllm.model.layers.linear import Linear
from pagedllm.model.layers.norm import RMSNorm
from pagedllm.model.layers.quant import QuantizedWeight
from pagedllm.model.layers.rotary import RotaryEmbedding
from pagedllm.model.models.llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaModel,
    model_dims,
)

_QK = re.compile(r"\.self_attn\.(q_proj|k_proj)\.(weight|bias)$")
# Set on a config whose checkpoint yields q/k rows already in `half_rotation_order` (the GGUF
# loader reorders them while building quantized matrices, which cannot be reordered later).
QK_ROWS_HALVED = "qk_rows_half_rotation"


def half_rotation_order(head_dim: int, rotary_dim: int) -> torch.Tensor:
    """Row order within a head that turns interleaved RoPE pairs into rotate-half pairs."""
    return torch.tensor(
        [*range(0, rotary_dim, 2), *range(1, rotary_dim, 2), *range(rotary_dim, head_dim)]
    )


class Glm4Attention(LlamaAttention):
    def __init__(self, config, rotary: RotaryEmbedding) -> None:
        super().__init__(config, rotary)
        self.o_proj = Linear(self.q_size, config.hidden_size, combine="sum")  # no bias


class Glm4DecoderLayer(LlamaDecoderLayer):
    attention_cls = Glm4Attention

    def __init__(self, config, rotary: RotaryEmbedding) -> None:
        super().__init__(config, rotary)
        self.post_self_attn_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_mlp_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, residual, rope, kv_cache, meta):
        h, residual = self.input_layernorm(x, residual)
        h, _ = self.post_self_attn_layernorm(self.self_attn(h, rope, kv_cache, meta))
        h, residual = self.post_attention_layernorm(h, residual)
        h, _ = self.post_mlp_layernorm(self.mlp(h))
        return h, residual


class Glm4Model(LlamaModel):
    layer_cls = Glm4DecoderLayer


class Glm4ForCausalLM(LlamaForCausalLM):
    model_cls = Glm4Model

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor | QuantizedWeight]]) -> None:
        if getattr(self.config, QK_ROWS_HALVED, False):
            super().load_weights(weights)
            return
        _, _, head_dim = model_dims(self.config)
        order = half_rotation_order(head_dim, self.model.rotary.rotary_dim)

        def permuted() -> Iterator[tuple[str, torch.Tensor | QuantizedWeight]]:
            for name, tensor in weights:
                if _QK.search(name):
                    if isinstance(tensor, QuantizedWeight):
                        raise ModelLoadError(
                            f"{name!r} is quantized ({tensor!r}); GLM-4's "
                            "q/k rows are reordered at load, which quantized "
                            "weights do not support yet"
                        )
                    heads = tensor.shape[0] // head_dim
                    tensor = tensor.reshape(heads, head_dim, -1)[:, order].reshape(tensor.shape)
                yield name, tensor

        super().load_weights(permuted())

    def expected_weights(self, params: dict[str, nn.Parameter]) -> set[str]:
        """q/k/v by shard as Llama's; gate/up whole, as the checkpoint stores it."""
        return {
            name.partition(":")[0] if "gate_up_proj" in name else name
            for name in super().expected_weights(params)
        }
