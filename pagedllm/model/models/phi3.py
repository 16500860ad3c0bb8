"""Phi-3 / Phi-4 (`Phi3ForCausalLM`): the Llama decoder with q/k/v and gate/up stored fused
in the checkpoint (`self_attn.qkv_proj`, `mlp.gate_up_proj`: the layouts pagedllm's layers
use), no biases, an optional sliding window on every layer, LongRoPE (`rope_type:
longrope`, model/layers/rope_scaling.py) or plain RoPE, partial rotary (Phi-4-mini).
"""

from __future__ import annotations

from torch import nn

from pagedllm.model.models.llama import LlamaForCausalLM


class Phi3ForCausalLM(LlamaForCausalLM):
    def expected_weights(self, params: dict[str, nn.Parameter]) -> set[str]:
        """Every parameter by its own name: the checkpoint holds the fused tensors whole."""
        return set(params)
