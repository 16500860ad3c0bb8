"""Load a GGUF file as a HF-shaped :class:`Checkpoint`: the llama (Llama, Mistral, Mixtral),
gemma2, gemma3, phi3, qwen2, qwen3, qwen2moe, qwen3moe and deepseek2 architectures.

(Each architecture's names, config and value fix-ups live in its module: :mod:`gguf_gemma2`,
:mod:`gguf_gemma3`, :mod:`gguf_phi3`, :mod:`gguf_qwen`, :mod:`gguf_deepseek2`; stacked MoE
experts and Mixtral in :mod:`gguf_moe`; llama's here.)

Two weight paths, both with HF parameter names and llama.cpp's q/k rotary row
permutation undone:
  * quantized (default, ``quantization`` None or "gguf"): block-quantized matrices stay
    quantized (`model.layers.quant.gguf.gguf_weight`, repacked for the CPU kernel and read
    from the memory-mapped file at every start); F32/F16/BF16 tensors load dense. Nothing
    dequantized is written to disk.
  * dense ("none", the reference): weights are dequantized to float32 with
    ``gguf.quants.dequantize`` and cached as an fp32 safetensors file.
The config and tokenizer conversion is cached as an HF directory either way (see :mod:`cache`);
the dense path adds ``model.safetensors`` to that entry and later loads read it with the HF
loader.
"""

from __future__ import annotations

import logging
import os
import re
import struct
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGUFReader, GGUFValueType, ReaderField, ReaderTensor
from gguf.quants import dequantize
from transformers import (
    AutoConfig,
    AutoTokenizer,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from pagedllm.loader import (
    gguf_deepseek2,
    gguf_gemma2,
    gguf_gemma3,
    gguf_moe,
    gguf_phi3,
    gguf_qwen,
)
from pagedllm.loader.cache import build_atomically, gguf_entry_dir, write_safetensors
from pagedllm.loader.checkpoint import Checkpoint
from pagedllm.loader.errors import UnsupportedModelError
from pagedllm.loader.hf_loader import load_hf_checkpoint
from pagedllm.model.layers.quant import QuantizedWeight, gguf_a8
from pagedllm.model.layers.quant import gguf as gguf_quant
from pagedllm.model.layers.quant.gguf_matrix import GGUFMatrix

logger = logging.getLogger(__name__)

_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
ROPE_FREQS = "rope_freqs.weight"  # llama.cpp's per-frequency RoPE divisors (Llama 3.1+)
_GEMMA = (gguf_gemma2.ARCH, gguf_gemma3.ARCH)  # norms stored as 1 + w, q/k not permuted
_LAYER_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
_REQUIRED = object()
WEIGHTS_FILE = "model.safetensors"


def hf_tensor_name(gguf_name: str, layer_names: dict[str, str] = _LAYER_NAMES) -> str | None:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``; None if unknown.

    `layer_names` maps per-layer tensor names (llama's by default; gguf_gemma3.LAYER_NAMES for
    Gemma 3, whose extra norms also rename ``ffn_norm``)."""
    base, _, suffix = gguf_name.rpartition(".")
    if base in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[base]}.{suffix}"
    match = _LAYER_RE.fullmatch(gguf_name)
    if match is None or match.group(2) not in layer_names:
        return None
    return f"model.layers.{match.group(1)}.{layer_names[match.group(2)]}.{match.group(3)}"


def reverse_permute(weight: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (``convert_hf_to_gguf.py``: ``permute``).

    HF rotary pairs dimension i with i + d/2 inside each head ("rotate_half");
    llama.cpp pairs adjacent dimensions (2i, 2i+1). Per head, the converter
    reorders rows as ``reshape(n_head, 2, d/2).swapaxes(1, 2)``::

        HF rows per head:   [x0 x1 .. x(d/2-1) | y0 y1 .. y(d/2-1)]
        GGUF rows per head: [x0 y0 x1 y1 .. x(d/2-1) y(d/2-1)]

    so the inverse is ``reshape(n_head, d/2, 2).swapaxes(1, 2)``. ``n_head`` is the
    number of heads of this projection (the kv head count for k_proj).
    """
    half = weight.shape[0] // n_head // 2
    shaped = weight.reshape(n_head, half, 2, *weight.shape[1:])
    return shaped.swapaxes(1, 2).reshape(weight.shape)


def _meta(reader: GGUFReader, key: str, default: Any = _REQUIRED) -> Any:
    field = reader.get_field(key)
    if field is None:
        if default is _REQUIRED:
            raise UnsupportedModelError(f"GGUF metadata key '{key}' is missing")
        return default
    return field.contents()


def _architecture(reader: GGUFReader) -> str:
    return _meta(reader, "general.architecture")


def _tensors(reader: GGUFReader) -> list[tuple[ReaderTensor, str]]:
    """GGUF tensors that have an HF equivalent, with their HF names."""
    planned = []
    arch = _architecture(reader)
    layer_names = (gguf_gemma3.LAYER_NAMES if arch in _GEMMA
                   else gguf_phi3.LAYER_NAMES if arch == gguf_phi3.ARCH
                   else {**gguf_deepseek2.LAYER_NAMES, **gguf_moe.EXPERT_NAMES}
                   if arch == gguf_deepseek2.ARCH
                   else {**gguf_qwen.LAYER_NAMES, **gguf_moe.EXPERT_NAMES}
                   if arch in gguf_qwen.ARCHES else {**_LAYER_NAMES, **gguf_moe.LLAMA_MOE_NAMES})
    for tensor in reader.tensors:
        if tensor.name in (ROPE_FREQS, *gguf_phi3.ROPE_FACTORS):  # read into the config
            continue
        name = hf_tensor_name(tensor.name, layer_names)
        if name is None:
            logger.warning("skipping GGUF tensor %s: no HF Llama equivalent", tensor.name)
            continue
        planned.append((tensor, gguf_deepseek2.hf_name(name)))
    return planned


def _hf_shape(tensor: ReaderTensor) -> tuple[int, ...]:
    # GGUF lists dimensions fastest-first (ggml order); numpy/torch list them slowest-first.
    return tuple(int(dim) for dim in reversed(tensor.shape))


def gguf_config(reader: GGUFReader) -> PretrainedConfig:
    """Build a HF config from the ``<arch>.*`` and ``tokenizer.ggml.*`` metadata."""
    arch = _architecture(reader)
    if arch == gguf_phi3.ARCH:
        factors = {t.name: dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1)
                   .tolist() for t in reader.tensors if t.name in gguf_phi3.ROPE_FACTORS}
        return gguf_phi3.config(lambda key, default=_REQUIRED: _meta(reader, key, default),
                                {t.name: _hf_shape(t) for t in reader.tensors}, factors)
    if arch == gguf_gemma2.ARCH:
        return gguf_gemma2.config(lambda key, default=_REQUIRED: _meta(reader, key, default),
                                  {t.name: _hf_shape(t) for t in reader.tensors})
    if arch == gguf_gemma3.ARCH:
        return gguf_gemma3.config(lambda key, default=_REQUIRED: _meta(reader, key, default),
                                  {t.name: _hf_shape(t) for t in reader.tensors})
    if arch == gguf_deepseek2.ARCH:
        return gguf_deepseek2.config(lambda key, default=_REQUIRED: _meta(reader, key, default),
                                     {t.name: _hf_shape(t) for t in reader.tensors})
    if arch in gguf_qwen.ARCHES:
        return gguf_qwen.config(arch, lambda key, default=_REQUIRED: _meta(reader, key, default),
                                {t.name: _hf_shape(t) for t in reader.tensors})
    if arch != "llama":
        raise UnsupportedModelError(f"GGUF architecture '{arch}' is not supported (only "
                                    f"'llama', 'gemma2', 'gemma3', 'phi3', {', '.join(map(repr, gguf_qwen.ARCHES))}, "
                                    f"'deepseek2')")
    meta = lambda key, default=_REQUIRED: _meta(reader, key, default)  # noqa: E731
    if gguf_moe.is_llama_moe(meta):  # Mixtral
        return gguf_moe.mixtral_config(meta, {t.name: _hf_shape(t) for t in reader.tensors})
    names = {tensor.name: tensor for tensor in reader.tensors}
    if "token_embd.weight" not in names:
        raise UnsupportedModelError("GGUF file has no token_embd.weight tensor")
    heads = int(_meta(reader, "llama.attention.head_count"))
    hidden = int(_meta(reader, "llama.embedding_length"))
    scaling = _meta(reader, "llama.rope.scaling.type", "none")
    if scaling != "none":
        logger.warning("GGUF rope scaling '%s' is ignored (plain RoPE is used)", scaling)
    return LlamaConfig(
        architectures=["LlamaForCausalLM"],
        vocab_size=_hf_shape(names["token_embd.weight"])[0],
        hidden_size=hidden,
        intermediate_size=int(_meta(reader, "llama.feed_forward_length")),
        num_hidden_layers=int(_meta(reader, "llama.block_count")),
        num_attention_heads=heads,
        num_key_value_heads=int(_meta(reader, "llama.attention.head_count_kv", heads)),
        head_dim=int(_meta(reader, "llama.attention.key_length", hidden // heads)),
        max_position_embeddings=int(_meta(reader, "llama.context_length")),
        rms_norm_eps=float(_meta(reader, "llama.attention.layer_norm_rms_epsilon")),
        rope_parameters={
            "rope_type": "default",
            "rope_theta": float(_meta(reader, "llama.rope.freq_base", 10000.0)),
        },
        attention_bias="blk.0.attn_q.bias" in names,
        tie_word_embeddings="output.weight" not in names,
        bos_token_id=_meta(reader, "tokenizer.ggml.bos_token_id", None),
        eos_token_id=_meta(reader, "tokenizer.ggml.eos_token_id", None),
        pad_token_id=_meta(reader, "tokenizer.ggml.padding_token_id", None),
        # Llama 3.1+: the llama3 RoPE scaling as one divisor per frequency (rope_scaling.py)
        rope_freq_factors=(dequantize(names[ROPE_FREQS].data, names[ROPE_FREQS].tensor_type)
                           .astype(np.float32).reshape(-1).tolist()
                           if ROPE_FREQS in names else None),
    )


def _row_order(name: str, rows: int, config: PretrainedConfig) -> np.ndarray | None:
    """The HF row order of a q/k projection (undoes llama.cpp's rotary permutation; gemma3
    and qwen files are not permuted)."""
    if getattr(config, "model_type", None) in ("gemma2", "gemma3_text", "phi3",
                                                *gguf_qwen.MODEL_TYPES,
                                                *gguf_deepseek2.MODEL_TYPES):
        return None
    if ".self_attn.q_proj." in name:
        return reverse_permute(np.arange(rows), config.num_attention_heads)
    if ".self_attn.k_proj." in name:
        return reverse_permute(np.arange(rows), config.num_key_value_heads)
    return None


def iter_gguf_tensors(reader: GGUFReader, config: PretrainedConfig
                      ) -> Iterator[tuple[str, np.ndarray]]:
    """Yield ``(hf_name, float32 array in HF shape)``, dequantizing one tensor at a time."""
    gemma3 = _architecture(reader) in _GEMMA
    for tensor, name in _tensors(reader):
        array = dequantize(tensor.data, tensor.tensor_type).reshape(_hf_shape(tensor))
        if gemma3:
            array = gguf_gemma3.to_hf(name, array)
        elif (order := _row_order(name, array.shape[0], config)) is not None:
            array = array[order]
        for hf_name, part in gguf_moe.split(name, array):  # MoE experts: one per expert
            yield hf_name, np.ascontiguousarray(part, dtype=np.float32)


def iter_gguf_quantized(
    reader: GGUFReader, config: LlamaConfig, int8_activations: bool = False,
    unbuilt: bool = False,
) -> Iterator[tuple[str, torch.Tensor | QuantizedWeight | GGUFMatrix]]:
    """Yield ``(hf_name, weight)``: block-quantized matrices as `GGUFWeight` (kept quantized;
    `GGUFA8Weight` in the file's row layout with `int8_activations`), F32/F16/BF16 tensors as
    float32 tensors (Gemma 3's norms lose llama.cpp's +1). `unbuilt`: each 2-D quantized
    matrix as a `GGUFMatrix` (the file's bytes, for a tensor-parallel rank to cut)."""
    make = gguf_a8.gguf_a8_weight if int8_activations else gguf_quant.gguf_weight
    if unbuilt:
        def make(tensor: ReaderTensor, row_order: np.ndarray | None = None) -> GGUFMatrix:
            qtype, shape = gguf_quant.matrix_type_and_shape(tensor)
            return GGUFMatrix.of(qtype, np.asarray(tensor.data), shape, tensor.name, row_order,
                                 int8_activations)
    gemma3 = _architecture(reader) in _GEMMA
    for tensor, name in _tensors(reader):
        qtype = tensor.tensor_type
        if qtype in gguf_quant.DENSE_TYPES or name.endswith(gguf_deepseek2.DENSE_ONLY):
            array = dequantize(tensor.data, qtype).reshape(_hf_shape(tensor))
            if gemma3:
                array = gguf_gemma3.to_hf(name, array)
            elif (order := _row_order(name, array.shape[0], config)) is not None:
                array = array[order]
            for hf_name, part in gguf_moe.split(name, array):
                yield hf_name, torch.from_numpy(np.array(part, dtype=np.float32))
            continue
        if "{}" in name:  # stacked MoE experts: each expert's matrix stays quantized
            for e, view in enumerate(gguf_moe.expert_views(tensor)):
                yield name.format(e), make(view)
            continue
        if gemma3 and name.endswith("norm.weight"):
            raise UnsupportedModelError(f"GGUF gemma3 norm {tensor.name} is {qtype.name}; "
                                        "only F32/F16/BF16 norms are supported")
        if len(tensor.shape) != 2:
            raise UnsupportedModelError(
                f"GGUF tensor {tensor.name} ({qtype.name}) has {len(tensor.shape)} dimensions; "
                f"only quantized matrices are supported")
        rows = _hf_shape(tensor)[0]
        yield name, make(tensor, row_order=_row_order(name, rows, config))


def gguf_tokenizer(path: Path, reader: GGUFReader) -> PreTrainedTokenizerBase:
    """HF fast tokenizer converted by transformers from the GGUF vocab, with the chat template.
    (AutoTokenizer reads the file's config first, which transformers cannot for deepseek2; the
    generic fast tokenizer reads the vocabulary alone.)"""
    cls = (PreTrainedTokenizerFast if _architecture(reader) == gguf_deepseek2.ARCH
           else AutoTokenizer)
    tokenizer = cls.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
    if not tokenizer.chat_template:
        tokenizer.chat_template = _meta(reader, "tokenizer.chat_template", None)
    return tokenizer


def _write_meta(entry: Path, config: PretrainedConfig, tokenizer: Any) -> None:
    config.save_pretrained(entry)
    tokenizer.save_pretrained(entry)


def _write_weights(entry: Path, reader: GGUFReader, config: LlamaConfig) -> None:
    """Add the dequantized fp32 ``model.safetensors`` to a cache entry (written to a temporary
    name and renamed, so a killed process leaves no half-written file)."""
    start = time.perf_counter()
    specs = [spec for tensor, name in _tensors(reader)
             for spec in gguf_moe.hf_specs(name, _hf_shape(tensor))]
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


class _NoVocabularyReader(GGUFReader):
    """A `GGUFReader` without the metadata arrays longer than `SKIP_ABOVE` entries: the
    tokenizer's vocabulary, scores, merges and token types (262k entries each in Gemma 3,
    which gguf-py parses one part per entry: 20-35 s on 2 cores). Its tensors and scalar
    metadata are GGUFReader's own, for starts that take the tokenizer from the conversion
    cache. The skipped fields are absent from `fields`."""

    SKIP_ABOVE = 1024

    def _build_fields(self, offs: int, count: int) -> int:
        if self.byte_order == "S":  # a big-endian file: parse everything, as gguf-py does
            return super()._build_fields(offs, count)
        view = memoryview(self.data)
        for _ in range(count):
            orig_offs = offs
            kv_klen, kv_kdata = self._get_str(offs)
            offs += int(kv_klen.nbytes + kv_kdata.nbytes)
            raw_kv_type = self._get(offs, np.uint32)
            offs += int(raw_kv_type.nbytes)
            if raw_kv_type[0] == GGUFValueType.ARRAY:
                item_type, n = struct.unpack_from("<IQ", view, offs)
                end = self._skip_array(view, offs + 12, item_type, n)
                if end is not None:
                    offs = end
                    continue
            size, parts, idxs, types = self._get_field_parts(offs, raw_kv_type[0])
            self._push_field(ReaderField(orig_offs, str(bytes(kv_kdata), encoding="utf-8"),
                                         [kv_klen, kv_kdata, raw_kv_type, *parts],
                                         [i + 3 for i in idxs], types), skip_sum=True)
            offs += size
        return offs

    def _skip_array(self, view: memoryview, offs: int, item_type: int, n: int) -> int | None:
        """The offset after an array of `n` strings or scalars, None to parse it instead."""
        if n <= self.SKIP_ABOVE:
            return None
        if item_type == GGUFValueType.STRING:
            unpack = struct.Struct("<Q").unpack_from
            for _ in range(n):
                offs += 8 + unpack(view, offs)[0]
            return offs
        scalar = self.gguf_scalar_to_np.get(GGUFValueType(item_type))
        return None if scalar is None else offs + n * np.dtype(scalar).itemsize


def open_gguf(path: Path, vocabulary: bool = True) -> GGUFReader:
    """`GGUFReader` of ``path``; a file that is not GGUF, or is truncated, is a clear error.
    ``vocabulary=False``: without the long metadata arrays (`_NoVocabularyReader`)."""
    try:
        return GGUFReader(path) if vocabulary else _NoVocabularyReader(path)
    except (ValueError, IndexError, KeyError, OSError, struct.error) as exc:
        size = path.stat().st_size if path.exists() else 0
        raise UnsupportedModelError(
            f"{path} is not a readable GGUF file ({size} bytes; truncated or corrupt?): "
            f"{exc}") from exc


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
    stay in the file's layout for the int8-activation kernels (`quant.gguf_a8`)."""
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
