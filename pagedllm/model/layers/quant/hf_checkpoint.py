"""Quantized Hugging Face checkpoints: detection, per-module grouping, load-time int8.

* AWQ / GPTQ are detected from `quantization_config` in config.json (`quant_method`), as vLLM
  does, and looked up in `CHECKPOINT_FORMATS` (a format registers there with one line).
  `quantized_weights_fn` (called once by loader/hf_loader.py) groups each quantized
  module's qweight / qzeros / scales (/ g_idx) into one weight of that format (its
  `from_parts`) and yields it under the module's `.weight` name; other tensors pass through
  as float32.
* `prepare_weights` (called once by worker/model_setup.py) applies the engine's
  `quantization` choice: `int8` quantizes the dense linear weights of an fp32 / bf16
  checkpoint at load time (int8.py), `none` dequantizes an AWQ / GPTQ checkpoint (the
  reference path), and a choice that contradicts the checkpoint is a ValueError.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from pagedllm.model.layers.quant.awq import AwqWeight
from pagedllm.model.layers.quant.base import QuantizedWeight
from pagedllm.model.layers.quant.gptq import GptqWeight
from pagedllm.model.layers.quant.int8 import Int8Weight

logger = logging.getLogger(__name__)

#: `quant_method` of config.json -> the format that builds one module's weight from its
#: tensors (`checkpoint_parts`, the first three required; `from_parts(parts, HFQuantConfig)`)
CHECKPOINT_FORMATS: dict[str, type[QuantizedWeight]] = {
    "awq": AwqWeight,
    "gptq": GptqWeight,
}
SUPPORTED_METHODS = tuple(CHECKPOINT_FORMATS)
_PARTS = tuple(dict.fromkeys(p for f in CHECKPOINT_FORMATS.values() for p in f.checkpoint_parts))
Weights = Iterator[tuple[str, torch.Tensor | QuantizedWeight]]


@dataclass(frozen=True)
class HFQuantConfig:
    """The parts of `quantization_config` the loader needs (AutoAWQ / AutoGPTQ key names)."""

    method: str
    bits: int = 4
    group_size: int = 128
    zero_point: bool = True       # AWQ: asymmetric (False: zero 8)
    sym: bool = True              # GPTQ (informational: zeros are stored either way)
    desc_act: bool = False        # GPTQ act-order: g_idx permutes the groups
    checkpoint_format: str = "gptq"  # GPTQ: "gptq" (zeros stored minus one) or "gptq_v2"

    def __post_init__(self) -> None:
        if self.method not in SUPPORTED_METHODS:
            raise ValueError(f"unsupported quantization method {self.method!r} in "
                             f"quantization_config; supported: {', '.join(SUPPORTED_METHODS)}")
        if self.bits != 4:
            raise ValueError(f"{self.method} with {self.bits} bits is not supported (4 only)")
        if self.group_size != -1 and self.group_size <= 0:
            raise ValueError(f"{self.method} group_size {self.group_size} is not supported")
        if self.checkpoint_format not in ("gptq", "gptq_v2"):
            raise ValueError(f"GPTQ checkpoint_format {self.checkpoint_format!r} is not "
                             f"supported (gptq, gptq_v2)")

    @classmethod
    def from_dict(cls, d: dict) -> HFQuantConfig:
        method = str(d.get("quant_method", "")).lower()
        if method == "awq":
            version = str(d.get("version", "gemm")).lower()
            if version != "gemm":
                raise ValueError(f"AWQ version {version!r} is not supported (gemm only)")
            return cls(method, bits=int(d.get("bits", d.get("w_bit", 4))),
                       group_size=int(d.get("group_size", d.get("q_group_size", 128))),
                       zero_point=bool(d.get("zero_point", True)))
        return cls(method, bits=int(d.get("bits", 4)), group_size=int(d.get("group_size", 128)),
                   sym=bool(d.get("sym", True)), desc_act=bool(d.get("desc_act", False)),
                   checkpoint_format=str(d.get("checkpoint_format", "gptq")))


def checkpoint_quantization(hf_config) -> HFQuantConfig | None:
    """The checkpoint's quantization (None for a plain float checkpoint)."""
    qc = getattr(hf_config, "quantization_config", None)
    if qc is None:
        return None
    if not isinstance(qc, dict):
        qc = qc.to_dict()
    return HFQuantConfig.from_dict(qc)


def _build(qcfg: HFQuantConfig, name: str, parts: dict[str, torch.Tensor]) -> QuantizedWeight:
    fmt = CHECKPOINT_FORMATS[qcfg.method]
    missing = [p for p in fmt.checkpoint_parts[:3] if p not in parts]
    if missing:
        raise ValueError(f"{qcfg.method} module {name!r} lacks {missing} in the checkpoint")
    try:
        return fmt.from_parts(parts, qcfg)
    except ValueError as exc:
        raise ValueError(f"{qcfg.method} module {name!r}: {exc}") from None


def group_quantized(raw: Iterable[tuple[str, torch.Tensor]], qcfg: HFQuantConfig) -> Weights:
    """Raw checkpoint tensors -> float32 tensors and one QuantizedWeight per quantized module
    (named `<module>.weight`), built as soon as the module's parts have all been read."""
    pending: dict[str, dict[str, torch.Tensor]] = {}
    needed = len(CHECKPOINT_FORMATS[qcfg.method].checkpoint_parts)
    for name, t in raw:
        module, _, part = name.rpartition(".")
        if part not in _PARTS:
            yield name, t.float()
            continue
        parts = pending.setdefault(module, {})
        parts[part] = t
        if len(parts) == needed:
            yield f"{module}.weight", _build(qcfg, module, pending.pop(module))
    for module, parts in pending.items():  # GPTQ checkpoints without g_idx
        yield f"{module}.weight", _build(qcfg, module, parts)


def _iter_raw(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open is not a Mapping
                yield name, handle.get_tensor(name)


def quantized_weights_fn(hf_config, files: list[Path]) -> Callable[[], Weights] | None:
    """The weights of an AWQ / GPTQ checkpoint with its modules grouped (None: not one)."""
    qcfg = checkpoint_quantization(hf_config)
    if qcfg is None:
        return None
    logger.info("%s checkpoint: %d bits, group size %d%s", qcfg.method.upper(), qcfg.bits,
                qcfg.group_size, ", act-order" if qcfg.desc_act else "")
    return lambda: group_quantized(_iter_raw(files), qcfg)


def is_linear_weight(name: str, t: torch.Tensor) -> bool:
    """A dense linear layer's weight that `--quantization int8` converts: 2-D `.weight` of a
    projection; embeddings and lm_head stay in float, as in vLLM's int8 schemes."""
    return (t.dim() == 2 and name.endswith(".weight") and "embed" not in name
            and not name.startswith("lm_head"))


def quantize_int8(weights: Iterable[tuple[str, torch.Tensor]], w8a8: bool) -> Weights:
    for name, t in weights:
        if isinstance(t, torch.Tensor) and is_linear_weight(name, t):
            yield name, Int8Weight.quantize(t, w8a8=w8a8)
        else:
            yield name, t


def _dequantized(weights: Weights) -> Weights:
    for name, t in weights:
        yield name, t.dequantize() if isinstance(t, QuantizedWeight) else t


def prepare_weights(ckpt, config, unbuilt: bool = False) -> Weights:
    """The checkpoint's weights as the engine's `quantization` asks (module docstring);
    `unbuilt`: GGUF matrices kept quantized come unbuilt (for a tensor-parallel shard)."""
    want = config.quantization
    have = checkpoint_quantization(ckpt.config)
    method = have.method if have is not None else None
    if want == "int8":
        if method is not None:
            raise ValueError(f"--quantization int8 quantizes a float checkpoint; "
                             f"{ckpt.source} is already {method}")
        logger.info("quantizing linear weights to int8 per output channel at load time%s",
                    " (W8A8: int8 activations)" if config.int8_activations else "")
        return quantize_int8(ckpt.weights(), config.int8_activations)
    if config.int8_activations and ckpt.quantization != "gguf":
        raise ValueError(f"--int8-activations needs --quantization int8 or a GGUF model kept "
                         f"quantized; {ckpt.source} is {method or 'not quantized'}")
    if want in SUPPORTED_METHODS and want != method:
        raise ValueError(f"--quantization {want} does not match the checkpoint {ckpt.source} "
                         f"({method or 'not quantized'})")
    if want == "none" and method is not None:
        logger.info("--quantization none: dequantizing the %s checkpoint to float", method)
        return _dequantized(ckpt.weights())
    if unbuilt and ckpt.unbuilt_weights is not None:
        return ckpt.unbuilt_weights()
    return ckpt.weights()
