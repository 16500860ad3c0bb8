"""A GGUF file's weights under HF names, through its `ArchSpec`.

Two paths, both with HF parameter names and the architecture's fixes applied (q/k row
orders, Gemma's norm offset):
  * `iter_gguf_quantized`: block-quantized matrices stay quantized (`quant.gguf.gguf_weight`,
    repacked for the CPU kernel, rows reordered while repacking; `GGUFMatrix` unbuilt for a
    tensor-parallel rank to cut); F32/F16/BF16 tensors load as float32 tensors;
  * `iter_gguf_tensors`: every tensor dequantized to float32 (``gguf.quants.dequantize``),
    one at a time: the dense reference path and the cache writer's source.
Stacked MoE experts become one tensor per expert (:mod:`gguf_moe`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import numpy as np
import torch
from gguf import GGUFReader, ReaderTensor
from gguf.quants import dequantize
from transformers import PretrainedConfig

from pagedllm.loader import gguf_moe
from pagedllm.loader.errors import UnsupportedModelError
from pagedllm.loader.gguf_reader import GGUFFile, hf_shape
from pagedllm.model.layers.quant import QuantizedWeight, gguf_a8_panels
from pagedllm.model.layers.quant import gguf as gguf_quant
from pagedllm.model.layers.quant.gguf_matrix import GGUFMatrix

logger = logging.getLogger(__name__)


def planned_tensors(reader: GGUFReader) -> list[tuple[ReaderTensor, str]]:
    """GGUF tensors that have an HF equivalent, with their HF names (side tensors, read into
    the config, are left out; unknown tensors are skipped with a warning)."""
    spec = GGUFFile(reader).spec()
    planned = []
    for tensor in reader.tensors:
        if tensor.name in spec.side_tensors:
            continue
        name = spec.hf_name(tensor.name)
        if name is None:
            logger.warning("skipping GGUF tensor %s: no HF %s equivalent", tensor.name, spec.arch)
            continue
        planned.append((tensor, name))
    return planned


def hf_specs(reader: GGUFReader) -> list[tuple[str, tuple[int, ...]]]:
    """(HF name, shape) of every tensor `iter_gguf_tensors` yields, in its order."""
    return [spec for tensor, name in planned_tensors(reader)
            for spec in gguf_moe.hf_specs(name, hf_shape(tensor))]


def iter_gguf_tensors(reader: GGUFReader, config: PretrainedConfig
                      ) -> Iterator[tuple[str, np.ndarray]]:
    """Yield ``(hf_name, float32 array in HF shape)``, dequantizing one tensor at a time."""
    spec = GGUFFile(reader).spec()
    for tensor, name in planned_tensors(reader):
        array = dequantize(tensor.data, tensor.tensor_type).reshape(hf_shape(tensor))
        for hf_name, part in gguf_moe.split(name, spec.to_hf(name, array, config)):
            yield hf_name, np.ascontiguousarray(part, dtype=np.float32)


def iter_gguf_quantized(
    reader: GGUFReader, config: PretrainedConfig, int8_activations: bool = False,
    unbuilt: bool = False,
) -> Iterator[tuple[str, torch.Tensor | QuantizedWeight | GGUFMatrix]]:
    """Yield ``(hf_name, weight)``: block-quantized matrices as `GGUFWeight` (kept quantized;
    `GGUFA8PanelWeight` panels with `int8_activations`), F32/F16/BF16 tensors as
    float32 tensors (the architecture's value fixes applied). `unbuilt`: each 2-D quantized
    matrix as a `GGUFMatrix` (the file's bytes, for a tensor-parallel rank to cut)."""
    make = gguf_a8_panels.gguf_a8_weight if int8_activations else gguf_quant.gguf_weight
    if unbuilt:
        def make(tensor: ReaderTensor, row_order: np.ndarray | None = None) -> GGUFMatrix:
            qtype, shape = gguf_quant.matrix_type_and_shape(tensor)
            return GGUFMatrix.of(qtype, np.asarray(tensor.data), shape, tensor.name, row_order,
                                 int8_activations)
    spec = GGUFFile(reader).spec()
    for tensor, name in planned_tensors(reader):
        qtype = tensor.tensor_type
        if qtype in gguf_quant.DENSE_TYPES or spec.loads_as_float(name):
            array = dequantize(tensor.data, qtype).reshape(hf_shape(tensor))
            for hf_name, part in gguf_moe.split(name, spec.to_hf(name, array, config)):
                yield hf_name, torch.from_numpy(np.array(part, dtype=np.float32))
            continue
        if "{}" in name:  # stacked MoE experts: each expert's matrix stays quantized
            for e, view in enumerate(gguf_moe.expert_views(tensor)):
                yield name.format(e), make(view)
            continue
        if spec.norm_offset and name.endswith("norm.weight"):
            raise UnsupportedModelError(f"GGUF {spec.arch} norm {tensor.name} is {qtype.name}; "
                                        "only F32/F16/BF16 norms are supported")
        if len(tensor.shape) != 2:
            raise UnsupportedModelError(
                f"GGUF tensor {tensor.name} ({qtype.name}) has {len(tensor.shape)} dimensions; "
                f"only quantized matrices are supported")
        rows = hf_shape(tensor)[0]
        yield name, make(tensor, row_order=spec.hf_row_order(name, rows, config))
