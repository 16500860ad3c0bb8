"""OLMoE (`OlmoeForCausalLM`): a MoE decoder (models/moe.py) with OLMo's attention
(models/olmo2.py: q and k RMS-normalized over all heads before RoPE, q/k/v clipped to
`clip_qkv` when the config sets it)."""

from __future__ import annotations

from pagedllm.model.models.moe import MoEForCausalLM, MoEModel
from pagedllm.model.models.olmo2 import OlmoAttention


class OlmoeModel(MoEModel):
    attention_cls = OlmoAttention


class OlmoeForCausalLM(MoEForCausalLM):
    model_cls = OlmoeModel
