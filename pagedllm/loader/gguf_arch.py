"""What one GGUF architecture is in HF terms: the `ArchSpec` every architecture module fills
in, and the pieces most of them share (llama.cpp's tensor names, the common config keys,
llama's q/k row permutation).

A GGUF file names its architecture in ``general.architecture``; `gguf_archs.ARCHES` maps
that name to an `ArchSpec`, and the loader (:mod:`gguf_tensors`, :mod:`gguf_loader`) reads
every file through it alone. Adding an architecture is one `ArchSpec` entry plus its
config builder and fixes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from transformers import PretrainedConfig

from pagedllm.loader.errors import UnsupportedModelError

Meta = Callable[..., Any]  # meta(key, default=<required>) -> the file's metadata value
Shapes = dict[str, tuple[int, ...]]  # GGUF tensor name -> HF-order shape
Vectors = Callable[[str], list[float]]  # name of a small F32 tensor -> its values
RowOrder = Callable[[str, int, PretrainedConfig], "np.ndarray | None"]

GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
LLAMA_LAYER_NAMES = {
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
QK_NORM_NAMES = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


@dataclass(frozen=True)
class ArchSpec:
    """One GGUF architecture.

    `config(meta, shapes, vectors)` builds the HF config from the ``<arch>.*`` metadata, the
    HF-order tensor shapes and the values of `side_tensors` (tensors read into the config,
    never loaded as weights: Llama 3's ``rope_freqs``, Phi-3's LongRoPE factors).
    `layer_names` maps per-layer GGUF names to HF ones (global names are `GLOBAL_NAMES`).
    The per-architecture fixes from the file's values to HF's:
      * `row_order(hf_name, rows, config)`: the HF order of a tensor's rows (llama's q/k
        permutation undone, GLM-4's rotary pairs), None to keep the file's;
      * `norm_offset`: subtracted from every ``*norm.weight`` (Gemma stores ``1 + w``); such
        norms must then be F32/F16/BF16 in the file.
    `hf_tokenizer`: whether HF transformers' GGUF support knows the architecture (it then
    picks the tokenizer class from its config); else the file's tokenizer is built as a
    generic fast tokenizer, which the ``tokenizer.ggml.*`` metadata alone describes.
    `rename(hf_name)`: a last fix of a mapped name (DeepSeek's router bias is a parameter,
    not a ``.bias``); `dense_only`: HF name endings loaded as float even from a quantized
    tensor (small matrices the model only uses reshaped, e.g. DeepSeek's kv_b).
    """

    arch: str
    config: Callable[[Meta, Shapes, Vectors], PretrainedConfig]
    layer_names: Mapping[str, str]
    row_order: RowOrder | None = None
    norm_offset: float = 0.0
    side_tensors: tuple[str, ...] = field(default=())
    hf_tokenizer: bool = True
    rename: Callable[[str], str] | None = None
    dense_only: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.arch or not self.layer_names:
            raise ValueError(f"ArchSpec {self.arch!r} needs an architecture name and layer names")

    def hf_name(self, gguf_name: str) -> str | None:
        """The HF name of a GGUF tensor of this architecture; None if it has none."""
        name = hf_tensor_name(gguf_name, self.layer_names)
        return name if name is None or self.rename is None else self.rename(name)

    def loads_as_float(self, hf_name: str) -> bool:
        """Whether the tensor is dequantized at load whatever its type (`dense_only`)."""
        return any(hf_name.endswith(end) for end in self.dense_only)

    def to_hf(self, hf_name: str, array: np.ndarray, config: PretrainedConfig) -> np.ndarray:
        """A dequantized tensor's HF value: `norm_offset` removed, rows in `row_order`."""
        if self.norm_offset and hf_name.endswith("norm.weight"):
            return array.astype(np.float32) - self.norm_offset
        order = self.hf_row_order(hf_name, array.shape[0], config)
        return array if order is None else array[order]

    def hf_row_order(self, hf_name: str, rows: int, config: PretrainedConfig
                     ) -> np.ndarray | None:
        """Row order a quantized matrix is built with (see `row_order`)."""
        return None if self.row_order is None else self.row_order(hf_name, rows, config)


def hf_tensor_name(gguf_name: str, layer_names: Mapping[str, str] = LLAMA_LAYER_NAMES
                   ) -> str | None:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``; None if unknown."""
    base, _, suffix = gguf_name.rpartition(".")
    if base in GLOBAL_NAMES:
        return f"{GLOBAL_NAMES[base]}.{suffix}"
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


def llama_row_order(hf_name: str, rows: int, config: PretrainedConfig) -> np.ndarray | None:
    """HF row order of a llama-architecture q/k projection (weight or bias)."""
    if ".self_attn.q_proj." in hf_name:
        return reverse_permute(np.arange(rows), config.num_attention_heads)
    if ".self_attn.k_proj." in hf_name:
        return reverse_permute(np.arange(rows), config.num_key_value_heads)
    return None


def common_config(arch: str, meta: Meta, shapes: Shapes) -> dict[str, Any]:
    """The HF config fields every llama-like architecture reads the same way from
    ``<arch>.*`` and ``tokenizer.ggml.*`` (vocabulary from ``token_embd``, tied embeddings
    when the file has no ``output`` tensor)."""
    if "token_embd.weight" not in shapes:
        raise UnsupportedModelError("GGUF file has no token_embd.weight tensor")
    heads = int(meta(f"{arch}.attention.head_count"))
    return {
        "vocab_size": shapes["token_embd.weight"][0],
        "hidden_size": int(meta(f"{arch}.embedding_length")),
        "intermediate_size": int(meta(f"{arch}.feed_forward_length")),
        "num_hidden_layers": int(meta(f"{arch}.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta(f"{arch}.attention.head_count_kv", heads)),
        "max_position_embeddings": int(meta(f"{arch}.context_length")),
        "rms_norm_eps": float(meta(f"{arch}.attention.layer_norm_rms_epsilon")),
        "tie_word_embeddings": "output.weight" not in shapes,
        "bos_token_id": meta("tokenizer.ggml.bos_token_id", None),
        "eos_token_id": meta("tokenizer.ggml.eos_token_id", None),
        "pad_token_id": meta("tokenizer.ggml.padding_token_id", None),
    }


def head_dim(arch: str, meta: Meta) -> int:
    """``<arch>.attention.key_length``, else hidden / heads."""
    hidden = int(meta(f"{arch}.embedding_length"))
    return int(meta(f"{arch}.attention.key_length",
                    hidden // int(meta(f"{arch}.attention.head_count"))))
