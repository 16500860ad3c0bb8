"""The GGUF architectures pagedllm loads: ``general.architecture`` -> `ArchSpec`.

One entry per architecture; its module holds the config builder and what llama.cpp's
converter does differently for it (:mod:`gguf_llama`, :mod:`gguf_gemma2`, :mod:`gguf_gemma3`,
:mod:`gguf_phi3`, :mod:`gguf_qwen`, :mod:`gguf_olmo2`, :mod:`gguf_glm4`,
:mod:`gguf_deepseek2`; stacked experts in :mod:`gguf_moe`).
"""

from __future__ import annotations

from types import ModuleType

from transformers import PretrainedConfig

from pagedllm.loader import (
    gguf_deepseek2,
    gguf_gemma2,
    gguf_gemma3,
    gguf_glm4,
    gguf_llama,
    gguf_moe,
    gguf_olmo2,
    gguf_phi3,
    gguf_qwen,
)
from pagedllm.loader.errors import UnsupportedModelError
from pagedllm.loader.gguf_arch import (
    LLAMA_LAYER_NAMES,
    ArchSpec,
    Meta,
    Shapes,
    Vectors,
    llama_row_order,
)


def _qwen(arch: str) -> ArchSpec:
    return ArchSpec(arch, lambda meta, shapes, _: gguf_qwen.config(arch, meta, shapes),
                    {**gguf_qwen.LAYER_NAMES, **gguf_moe.EXPERT_NAMES})


def _gemma(module: ModuleType) -> ArchSpec:
    return ArchSpec(module.ARCH, lambda meta, shapes, _: module.config(meta, shapes),
                    gguf_gemma3.LAYER_NAMES, norm_offset=gguf_gemma3.NORM_OFFSET)


def _phi3_config(meta: Meta, shapes: Shapes, vectors: Vectors) -> PretrainedConfig:
    factors = {name: vectors(name) for name in gguf_phi3.ROPE_FACTORS if name in shapes}
    return gguf_phi3.config(meta, shapes, factors)


ARCHES: dict[str, ArchSpec] = {spec.arch: spec for spec in (
    ArchSpec(gguf_llama.ARCH, gguf_llama.config,
             {**LLAMA_LAYER_NAMES, **gguf_moe.LLAMA_MOE_NAMES},
             row_order=llama_row_order, side_tensors=(gguf_llama.ROPE_FREQS,)),
    _gemma(gguf_gemma2),
    _gemma(gguf_gemma3),
    ArchSpec(gguf_phi3.ARCH, _phi3_config, gguf_phi3.LAYER_NAMES,
             side_tensors=gguf_phi3.ROPE_FACTORS),
    *(_qwen(arch) for arch in gguf_qwen.ARCHES),
    ArchSpec(gguf_olmo2.ARCH, lambda meta, shapes, _: gguf_olmo2.config(meta, shapes),
             gguf_olmo2.LAYER_NAMES, hf_tokenizer=False),
    ArchSpec(gguf_glm4.ARCH, lambda meta, shapes, _: gguf_glm4.config(meta, shapes),
             gguf_glm4.LAYER_NAMES, row_order=gguf_glm4.row_order, hf_tokenizer=False),
    ArchSpec(gguf_deepseek2.ARCH, lambda meta, shapes, _: gguf_deepseek2.config(meta, shapes),
             {**gguf_deepseek2.LAYER_NAMES, **gguf_moe.EXPERT_NAMES}, hf_tokenizer=False,
             rename=gguf_deepseek2.hf_name, dense_only=gguf_deepseek2.DENSE_ONLY),
)}


def arch_spec(arch: str) -> ArchSpec:
    """The `ArchSpec` of a file's ``general.architecture``; a clear error if unsupported."""
    spec = ARCHES.get(arch)
    if spec is None:
        raise UnsupportedModelError(f"GGUF architecture '{arch}' is not supported (only "
                                    f"{', '.join(map(repr, ARCHES))})")
    return spec
