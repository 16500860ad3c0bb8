"""The loader's output contract, and the single entry point that picks a loader.

A :class:`Checkpoint` is format-neutral: whatever the source (HF directory or
GGUF file), the model code sees a HF config, a HF tokenizer and HF parameter
names with float32 CPU tensors. Weights are a callable returning a fresh
iterator, so a model can stream them one tensor at a time (no full state dict
in memory) and the caller decides dtype and device.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers

from pagedllm.loader.default_model import resolve_model

logger = logging.getLogger(__name__)

WeightsFn = Callable[[], Iterator[tuple[str, torch.Tensor]]]


@dataclass
class Checkpoint:
    """A model ready to be instantiated.

    Attributes:
        config: HF config; ``architectures`` is set (e.g. ``["LlamaForCausalLM"]``).
        tokenizer: fast tokenizer; ``chat_template`` is set when the model has one.
        weights: each call yields ``(hf_name, tensor)`` lazily, e.g.
            ``("model.layers.0.self_attn.q_proj.weight", tensor)``; tensors are
            float32 on CPU. Tied models may omit ``lm_head.weight``.
        source: the file or directory the checkpoint was read from.
        quantization: the weight format ``weights`` yields: "none" (float tensors only) or a
            quantized format (e.g. "gguf": linear and embedding weights are
            `QuantizedWeight`s, the rest float tensors).
    """

    config: transformers.PretrainedConfig
    tokenizer: transformers.PreTrainedTokenizerBase
    weights: WeightsFn
    source: Path
    quantization: str = "none"
    # GGUF kept quantized: `weights` with each block-quantized matrix unbuilt (a
    # `quant.gguf_matrix.GGUFMatrix`), for tensor parallelism to cut before building.
    unbuilt_weights: WeightsFn | None = None

    @property
    def architecture(self) -> str:
        """First entry of ``config.architectures`` (the model registry key)."""
        architectures = self.config.architectures or []
        if not architectures:
            raise ValueError(f"config of {self.source} has no 'architectures' entry")
        return architectures[0]


def load_checkpoint(model: str | None, cache_dir: Path | None = None,
                    quantization: str | None = None, *, revision: str | None = None,
                    download_dir: str | Path | None = None,
                    tokenizer: str | None = None, int8_activations: bool = False) -> Checkpoint:
    """Resolve ``model`` (see :func:`resolve_model`) and load it.

    Args:
        model: HF model directory, ``.gguf`` file, Hub name (``Org/Model``), or ``None``
            for the default model.
        cache_dir: GGUF conversion cache; defaults to ``$PAGEDLLM_CACHE_DIR``
            or ``~/.cache/pagedllm``. Unused for HF directories.
        quantization: `EngineConfig.quantization`; None = what the checkpoint holds (a GGUF
            file stays quantized), "none" = dense float weights.
        revision: branch, tag or commit of a Hub model (default main).
        download_dir: HF cache directory for Hub models instead of the default one.
        tokenizer: directory or Hub name whose tokenizer replaces the model's.
        int8_activations: a GGUF file's weights stay in the layout of the int8-activation
            kernels (`--int8-activations`).
    """
    path = resolve_model(model, revision, download_dir)
    if path.is_dir():
        from pagedllm.loader.hf_loader import load_hf_checkpoint

        ckpt = load_hf_checkpoint(path)
    else:
        from pagedllm.loader.gguf_loader import load_gguf_checkpoint

        ckpt = load_gguf_checkpoint(path, cache_dir=cache_dir, quantization=quantization,
                                    int8_activations=int8_activations)
    if tokenizer is not None:
        tok_path = resolve_model(tokenizer, None, download_dir)
        logger.info("tokenizer from %s", tok_path)
        ckpt.tokenizer = transformers.AutoTokenizer.from_pretrained(
            tok_path, local_files_only=True)
    return ckpt


def hf_reference_dir(model: str | None, cache_dir: Path | None = None) -> Path:
    """An ordinary HF folder with the same weights as ``model`` (for transformers references).

    For a GGUF file this is its conversion cache entry (created if missing), whose fp32
    safetensors hold exactly the dequantized weights the engine loads.
    """
    path = resolve_model(model)
    if path.is_dir():
        return path
    from pagedllm.loader.cache import gguf_entry_dir

    load_checkpoint(model, cache_dir=cache_dir, quantization="none")  # builds the fp32 entry
    return gguf_entry_dir(path, cache_dir)
