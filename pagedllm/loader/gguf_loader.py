"""Load a GGUF file as a HF-shaped :class:`Checkpoint`, for every architecture of
`gguf_archs.ARCHES` (llama with Mixtral, gemma2, gemma3, phi3, qwen2, qwen3, qwen2moe,
qwen3moe, olmo2, glm4, deepseek2).

Reading the file is :mod:`gguf_reader`; its weights under HF names :mod:`gguf_tensors`; each
architecture's config, names and fixes its `ArchSpec` (:mod:`gguf_arch`, :mod:`gguf_archs`).
Here: the config and tokenizer, the conversion cache and the choice of weight path:
  * quantized (default, ``quantization`` None or "gguf"): block-quantized matrices stay
    quantized, read from the memory-mapped file at every start; F32/F16/BF16 tensors load
    dense. Nothing dequantized is written to disk.
  * dense ("none", the reference): weights are dequantized to float32 and cached as an fp32
    safetensors file.
The config and tokenizer conversion is cached as an HF directory either way (see :mod:`cache`);
the dense path adds ``model.safetensors`` to that entry and later loads read it with the HF
loader.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from gguf import GGUFReader
from transformers import (
    AutoConfig,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from pagedllm.loader.cache import build_atomically, gguf_entry_dir, write_safetensors
from pagedllm.loader.checkpoint import Checkpoint
from pagedllm.loader.errors import UnsupportedModelError
from pagedllm.loader.gguf_arch import hf_tensor_name, reverse_permute
from pagedllm.loader.gguf_reader import GGUFFile, open_gguf
from pagedllm.loader.gguf_tensors import hf_specs, iter_gguf_quantized, iter_gguf_tensors
from pagedllm.loader.hf_loader import load_hf_checkpoint
from pagedllm.model.layers.quant import gguf as gguf_quant

__all__ = ["gguf_config", "hf_tensor_name", "iter_gguf_quantized", "iter_gguf_tensors",
           "load_gguf_checkpoint", "open_gguf", "reverse_permute", "use_quantized",
           "warn_int8_of_quantized"]

logger = logging.getLogger(__name__)

WEIGHTS_FILE = "model.safetensors"


def gguf_config(reader: GGUFReader) -> PretrainedConfig:
    """Build a HF config from the ``<arch>.*`` and ``tokenizer.ggml.*`` metadata."""
    file = GGUFFile(reader)
    return file.spec().config(file.meta, file.shapes(), file.vector)


def gguf_tokenizer(path: Path, reader: GGUFReader) -> PreTrainedTokenizerBase:
    """HF fast tokenizer converted by transformers from the GGUF vocab, with the chat template
    (a generic fast tokenizer for architectures transformers' GGUF support lacks)."""
    file = GGUFFile(reader)
    cls = AutoTokenizer if file.spec().hf_tokenizer else PreTrainedTokenizerFast
    tokenizer = cls.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
    if not tokenizer.chat_template:
        tokenizer.chat_template = file.meta("tokenizer.chat_template", None)
    return tokenizer


def _write_meta(entry: Path, config: PretrainedConfig, tokenizer: Any) -> None:
    config.save_pretrained(entry)
    tokenizer.save_pretrained(entry)


def _write_weights(entry: Path, reader: GGUFReader, config: PretrainedConfig) -> None:
    """Add the dequantized fp32 ``model.safetensors`` to a cache entry (written to a temporary
    name and renamed, so a killed process leaves no half-written file)."""
    start = time.perf_counter()
    specs = hf_specs(reader)
    tmp = entry / f".model.safetensors.tmp-{os.getpid()}"
    try:
        write_safetensors(tmp, specs, iter_gguf_tensors(reader, config))
        os.replace(tmp, entry / WEIGHTS_FILE)
    finally:
        tmp.unlink(missing_ok=True)
    logger.info(
        "dequantized and cached %d tensors in %.2fs", len(specs), time.perf_counter() - start
    )


def _stream_from_gguf(
    reader: GGUFReader, config: PretrainedConfig
) -> Iterator[tuple[str, torch.Tensor]]:
    for name, array in iter_gguf_tensors(reader, config):
        # F32 tensors come back as read-only views of the file's memory map.
        yield name, torch.from_numpy(array if array.flags.writeable else array.copy())


def _entry_meta(entry: Path) -> tuple[Any, PreTrainedTokenizerBase]:
    """Config and tokenizer of a cache entry."""
    return (AutoConfig.from_pretrained(entry, local_files_only=True),
            AutoTokenizer.from_pretrained(entry, local_files_only=True))


def use_quantized(quantization: str | None) -> bool:
    """Whether a GGUF file loads quantized: by default and with "gguf" (an error when the
    kernels are missing), dense with "none" or "int8" (int8 quantizes the dense weights)."""
    if quantization in ("none", "int8"):
        return False
    if quantization not in (None, "gguf"):
        raise UnsupportedModelError(
            f"quantization {quantization!r} does not apply to a GGUF file (use gguf or none)")
    if gguf_quant.available():
        return True
    if quantization == "gguf":
        raise UnsupportedModelError("quantization 'gguf' needs the C++ CPU kernels (AVX2, FMA, "
                                    "F16C), which are not available here")
    logger.warning("GGUF kernels unavailable; dequantizing the weights (quantization none)")
    return False


_FLOAT_TYPES = ("F32", "F16", "BF16", "F64")


def warn_int8_of_quantized(path: Path) -> None:
    """`--quantization int8` quantizes float weights; a GGUF file whose matrices are already
    block-quantized is dequantized and quantized again into more bytes and less exact
    weights (SmolLM2's 4-bit file: 92 MiB as GGUF blocks, 318 MiB resident as int8). Allowed
    (benchmarks/peers.py compares it) with a warning that gives the numbers."""
    reader = open_gguf(path, vocabulary=False)
    matrices = [t for t in reader.tensors if len(t.shape) == 2]
    blocks = sorted({t.tensor_type.name for t in matrices} - set(_FLOAT_TYPES))
    if not blocks:
        return  # an F32 / F16 / BF16 file: int8 makes it smaller
    file_mib = sum(int(t.n_bytes) for t in reader.tensors) / 2**20
    int8_mib = sum(int(t.n_elements) for t in matrices) / 2**20
    logger.warning(
        "--quantization int8 quantizes float weights; %s already holds %s blocks (%.0f MiB): "
        "they are dequantized and re-quantized to int8, at least %.0f MiB (1 byte per weight, "
        "plus float embeddings and norms) and less exact than the file. Omit --quantization "
        "to keep the GGUF blocks (the default)", path.name, "/".join(blocks), file_mib, int8_mib)


def load_gguf_checkpoint(
    path: Path, cache_dir: Path | None = None, quantization: str | None = None,
    int8_activations: bool = False
) -> Checkpoint:
    """Load ``path`` quantized (see the module docstring) or dense from its cache entry,
    converting and caching what is missing first. `int8_activations`: the quantized weights
    are repacked into the int8-activation kernels' panels (`quant.gguf_a8_panels`)."""
    start = time.perf_counter()
    if quantization == "int8":
        warn_int8_of_quantized(path)
    quantized = use_quantized(quantization)
    entry = gguf_entry_dir(path, cache_dir)
    reader: GGUFReader | None = None
    if not entry.is_dir():
        logger.info("first start with %s: converting its config and tokenizer once (cached "
                    "in %s) ...", path.name, entry)
        reader = open_gguf(path)
        logger.info("read GGUF %s (metadata and vocabulary) in %.2fs", path.name,
                    time.perf_counter() - start)
        config = gguf_config(reader)
        phase = time.perf_counter()
        tokenizer = gguf_tokenizer(path, reader)
        logger.info("converted GGUF tokenizer in %.2fs", time.perf_counter() - phase)
        try:
            build_atomically(entry, lambda tmp: _write_meta(tmp, config, tokenizer))
        except OSError as exc:
            logger.warning("cannot write cache %s (%s); weights stream from the GGUF", entry, exc)
            if quantized:
                return Checkpoint(config, tokenizer,
                                  lambda: iter_gguf_quantized(reader, config, int8_activations),
                                  path, quantization="gguf", unbuilt_weights=lambda:
                                  iter_gguf_quantized(reader, config, int8_activations, True))
            return Checkpoint(config, tokenizer, lambda: _stream_from_gguf(reader, config), path)
    if quantized:
        config, tokenizer = _entry_meta(entry)
        reader = reader or open_gguf(path, vocabulary=False)  # the tokenizer is cached
        gguf_config(reader)  # the file's architecture is still supported
    if quantized:
        logger.info("loaded %s quantized (config and tokenizer from %s) in %.2fs", path.name,
                    entry, time.perf_counter() - start)
        return Checkpoint(config, tokenizer,
                          lambda: iter_gguf_quantized(reader, config, int8_activations), path,
                          quantization="gguf", unbuilt_weights=lambda:
                          iter_gguf_quantized(reader, config, int8_activations, True))
    if not (entry / WEIGHTS_FILE).is_file():
        reader = reader or open_gguf(path)
        try:
            _write_weights(entry, reader, gguf_config(reader))
        except OSError as exc:
            logger.warning("cannot write %s (%s); weights stream from the GGUF", entry, exc)
            config, tokenizer = _entry_meta(entry)
            return Checkpoint(config, tokenizer, lambda: _stream_from_gguf(reader, config), path)
    else:
        logger.info("GGUF %s: converted before, reading the cache %s", path.name, entry)
    checkpoint = replace(load_hf_checkpoint(entry), source=path)
    logger.info("loaded %s (cache %s) in %.2fs", path.name, entry, time.perf_counter() - start)
    return checkpoint
