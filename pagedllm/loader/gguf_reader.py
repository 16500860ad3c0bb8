"""Reading a GGUF file: `open_gguf` (optionally without the vocabulary arrays, for starts
that take the tokenizer from the conversion cache) and the typed views of it the loader
uses (`GGUFFile`: metadata with clear errors for missing keys, HF-order tensor shapes, the
values of small side tensors, the file's `ArchSpec`)."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader, GGUFValueType, ReaderField, ReaderTensor
from gguf.quants import dequantize

from pagedllm.loader.errors import UnsupportedModelError
from pagedllm.loader.gguf_arch import ArchSpec, Shapes
from pagedllm.loader.gguf_archs import arch_spec

_REQUIRED = object()


def hf_shape(tensor: ReaderTensor) -> tuple[int, ...]:
    """A tensor's shape in numpy/torch order (GGUF lists dimensions fastest-first)."""
    return tuple(int(dim) for dim in reversed(tensor.shape))


class GGUFFile:
    """What the loader reads from an open `GGUFReader`, by name."""

    def __init__(self, reader: GGUFReader) -> None:
        self.reader = reader
        self.tensors = {tensor.name: tensor for tensor in reader.tensors}

    def meta(self, key: str, default: Any = _REQUIRED) -> Any:
        """The metadata value of `key`; `default` when absent, else a clear error."""
        field = self.reader.get_field(key)
        if field is None:
            if default is _REQUIRED:
                raise UnsupportedModelError(f"GGUF metadata key '{key}' is missing")
            return default
        return field.contents()

    def shapes(self) -> Shapes:
        """Tensor name -> HF-order shape."""
        return {name: hf_shape(tensor) for name, tensor in self.tensors.items()}

    def vector(self, name: str) -> list[float]:
        """The values of a small tensor (RoPE factors) as floats."""
        tensor = self.tensors[name]
        return dequantize(tensor.data, tensor.tensor_type).astype(np.float32).reshape(-1).tolist()

    def spec(self) -> ArchSpec:
        """The `ArchSpec` of ``general.architecture``."""
        return arch_spec(self.meta("general.architecture"))


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


FLOAT_TYPES = ("F32", "F16", "BF16", "F64")


def block_quantized(reader: GGUFReader) -> bool:
    """Whether any tensor of the file is in a block-quantized format (Q8_0, Q4_K, ...), i.e.
    the model's matrices are not all float."""
    return any(t.tensor_type.name not in FLOAT_TYPES for t in reader.tensors)
