"""Model classes by HF architecture name (config.architectures[0])."""

from __future__ import annotations

from torch import nn

from pagedllm.errors import ModelLoadError
from pagedllm.model.models.deepseek import DeepseekForCausalLM
from pagedllm.model.models.gemma2 import Gemma2ForCausalLM
from pagedllm.model.models.gemma3 import Gemma3ForCausalLM
from pagedllm.model.models.glm4 import Glm4ForCausalLM
from pagedllm.model.models.granite import GraniteForCausalLM
from pagedllm.model.models.llama import LlamaForCausalLM
from pagedllm.model.models.moe import (
    MixtralForCausalLM,
    Qwen2MoeForCausalLM,
    Qwen3MoeForCausalLM,
)
from pagedllm.model.models.olmo2 import Olmo2ForCausalLM
from pagedllm.model.models.olmoe import OlmoeForCausalLM
from pagedllm.model.models.phi3 import Phi3ForCausalLM
from pagedllm.model.models.qwen3 import Qwen3ForCausalLM
from pagedllm.model.models.seq_cls import SEQ_CLS_SUFFIX, as_seq_cls_model
from pagedllm.model.models.smollm3 import SmolLM3ForCausalLM

MODEL_REGISTRY: dict[str, type[nn.Module]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "Gemma3ForCausalLM": Gemma3ForCausalLM,
    "MixtralForCausalLM": MixtralForCausalLM,
    "Qwen2MoeForCausalLM": Qwen2MoeForCausalLM,
    "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
    "OlmoeForCausalLM": OlmoeForCausalLM,
    "Olmo2ForCausalLM": Olmo2ForCausalLM,
    "GraniteForCausalLM": GraniteForCausalLM,
    "SmolLM3ForCausalLM": SmolLM3ForCausalLM,
    "Gemma2ForCausalLM": Gemma2ForCausalLM,
    "Phi3ForCausalLM": Phi3ForCausalLM,
    "Glm4ForCausalLM": Glm4ForCausalLM,
    "DeepseekV2ForCausalLM": DeepseekForCausalLM,
    "DeepseekV3ForCausalLM": DeepseekForCausalLM,
}


class UnsupportedArchitectureError(ModelLoadError):
    """The checkpoint's architectures name no model class in MODEL_REGISTRY."""


def get_model_class(architectures: list[str] | None) -> type[nn.Module]:
    """The class of the first known architecture; `XForSequenceClassification` is the
    decoder of `XForCausalLM` with a score head (model/models/seq_cls.py)."""
    for arch in architectures or []:
        if arch in MODEL_REGISTRY:
            return MODEL_REGISTRY[arch]
        causal = arch.removesuffix(SEQ_CLS_SUFFIX) + "ForCausalLM"
        if arch.endswith(SEQ_CLS_SUFFIX) and causal in MODEL_REGISTRY:
            return as_seq_cls_model(MODEL_REGISTRY[causal])
    raise UnsupportedArchitectureError(
        f"model architecture {architectures} is not supported; supported architectures: "
        f"{', '.join(sorted(MODEL_REGISTRY))}")
