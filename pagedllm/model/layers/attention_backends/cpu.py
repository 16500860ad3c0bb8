"""The C++ CPU backend: fp32 queries over an fp32, float16, int8 or fp8 cache (kernels/*_cpu.cpp).

    decode rows      paged_decode_attention(_quant)   one query per sequence, reads the
                                                      blocks in place (float16 and 8-bit
                                                      rows converted to fp32 as they are read)
    decode-only step paged_decode_attention_qkv       writes the new K/V and attends, reading
                                                      the queries inside the qkv rows
    prefill rows     paged_varlen_attention           all sequences' packed rows in one
                                                      flash-style call (varlen_attention_cpu)
    prompt rows      paged_varlen_attention           while the GGUF panels' prompt rows run
                                                      on AMX-bf16 tiles (quant/prompt_rows.py),
                                                      their attention does too, a one-token
                                                      prompt chunk among the decodes included
    K/V write        store_into_cache (fp32 / float16: one pass from the qkv rows),
                     quantize_into_cache (8-bit)
    whole model      decode_layers (model/fused_decode.py), when `fused_decode_applies`

What the kernels do not do runs the torch reference (torch_ref.py): decode rows with Gemma's
logit soft-capping, and prefill rows of head sizes that are not a multiple of the varlen
kernel's vector width or on a CPU without its instructions (AVX2 + FMA + F16C / AVX-512).
The dtypes are settled at selection (`supports`); the head-size check stays per call because
the draft model's layers run on the target's metadata (speculative/draft_model.py).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from pagedllm.kernels import cpu_ops
from pagedllm.model.layers import kv_quant
from pagedllm.model.layers.attention import AttentionMetadata, LayerKVCache
from pagedllm.model.layers.attention_backends.torch_ref import TorchBackend
from pagedllm.model.layers.quant import prompt_rows

KERNEL_KV_DTYPES = (torch.float32, torch.float16, *kv_quant.QMAX)


class CPUBackend(TorchBackend):
    """The C++ kernels where they apply, the torch reference elsewhere (module docstring)."""

    name = "cpu"
    runs_fused_decode = True

    @classmethod
    def supports(cls, device: torch.device, dtype: torch.dtype, kv_dtype: torch.dtype,
                 head_size: int) -> bool:
        # The device first: a CUDA engine must not build the CPU kernels to find out.
        return (device.type == "cpu" and dtype == torch.float32
                and kv_dtype in KERNEL_KV_DTYPES and cpu_ops.load() is not None)

    def __init__(self, device: torch.device | str) -> None:
        super().__init__(device)
        self.ops = cpu_ops.load()
        varlen = cpu_ops.load_with("varlen_attention")
        # 0: this CPU has no varlen kernel; prefill rows run the torch reference.
        self.varlen_multiple = 0 if varlen is None else varlen.varlen_attention_head_multiple()

    def varlen_kernel(self, head_size: int) -> bool:
        """Whether prefill rows of this head size run the C++ varlen kernel."""
        return self.varlen_multiple > 0 and head_size % self.varlen_multiple == 0

    def forward_qkv(self, qkv: torch.Tensor, num_heads: int, num_kv_heads: int,
                    head_dim: int, kv_cache: LayerKVCache, meta: AttentionMetadata,
                    scale: float, softcap: float | None = None) -> torch.Tensor:
        """A step of decodes only is one C++ call that writes the new K/V and attends,
        reading the queries in place (kernels/paged_attention_cpu.cpp); every other batch
        splits the rows and runs `forward`."""
        if (not softcap and qkv.is_contiguous() and meta.num_decodes == qkv.shape[0] > 0
                and prompt_rows.current() is None):
            return self.ops.paged_decode_attention_qkv(
                qkv, kv_cache.k, kv_cache.v, kv_cache.k_scale, kv_cache.v_scale,
                meta.slot_mapping, meta.decode_block_tables, meta.decode_seq_lens, num_heads,
                scale, meta.sliding_window or 0)
        return super().forward_qkv(qkv, num_heads, num_kv_heads, head_dim, kv_cache, meta,
                                   scale, softcap)

    def _prompt_step(self, meta: AttentionMetadata, head_size: int):
        """The step's prompt rows while they run on the bf16 tiles (quant/prompt_rows.py) and
        this head size has the varlen kernel: their attention goes there too, by row (a prompt
        position, never the size of its chunk); None otherwise. The step is the metadata's
        rows (one slot each), decodes first."""
        step = prompt_rows.current(meta.slot_mapping.numel())
        return step if step is not None and self.varlen_kernel(head_size) else None

    def _decodes_by_kind(self, out: torch.Tensor, q: torch.Tensor, kv: LayerKVCache,
                         meta: AttentionMetadata, scale: float, softcap: float | None,
                         prompt: torch.Tensor) -> None:
        """The decode rows: one-token prompt chunks (`prompt`) on the tiles through the varlen
        kernel, one query per sequence; the others on the decode kernel."""
        tables, lens = meta.decode_block_tables, meta.decode_seq_lens
        rows = prompt.nonzero().flatten()
        rest = (~prompt).nonzero().flatten()
        if len(rest):
            o = q.new_empty(len(rest), *q.shape[1:])
            only = replace(meta, num_decodes=len(rest), decode_block_tables=tables[rest],
                           decode_seq_lens=lens[rest], decode_key_mask=None, _windowed={})
            self._decode_kernel(o, q[rest], kv, only, scale, softcap)
            out[rest] = o
        o = q.new_empty(len(rows), *q.shape[1:])
        self._varlen(o, q[rows], kv, tables[rows], lens[rows],
                     torch.arange(len(rows) + 1), scale, meta.sliding_window, softcap,
                     torch.ones(len(rows), dtype=torch.int64))
        out[rows] = o

    def _varlen(self, out: torch.Tensor, q: torch.Tensor, kv: LayerKVCache,
                tables: torch.Tensor, lens: torch.Tensor, starts: torch.Tensor, scale: float,
                window: int | None, softcap: float | None,
                prompt: torch.Tensor | None) -> None:
        if q.stride(2) != 1 or q.stride(1) != q.shape[-1]:
            q = q.contiguous()
        self.ops.paged_varlen_attention(out, q, kv.k, kv.v, kv.k_scale, kv.v_scale, tables,
                                        lens, starts, scale, window or 0, softcap or 0.0,
                                        prompt)

    def fused_decode_applies(self, x: torch.Tensor, meta: AttentionMetadata,
                             kv_caches: list[LayerKVCache]) -> bool:
        """Decode-only steps (every row one token of its own sequence; each KV group's
        tables go to the loop) and no prompt row bound for the bf16 tiles
        (quant/prompt_rows.py: the loop runs the int8 kernels only)."""
        return (meta.num_decodes == x.shape[0] > 0 and meta.prefill_block_tables is None
                and prompt_rows.current() is None)

    def write(self, cache: torch.Tensor, scales: torch.Tensor | None, slots: torch.Tensor,
              x: torch.Tensor) -> None:
        if scales is not None:
            self.ops.quantize_into_cache(x.contiguous(), cache, scales, slots)
        elif x.dtype == torch.float32 and x.stride(-1) == 1 and x.stride(-2) == x.shape[-1]:
            self.ops.store_into_cache(x, cache, slots)  # no converted copy in between
        else:
            super().write(cache, scales, slots, x)

    def decode(self, out: torch.Tensor, q: torch.Tensor, kv: LayerKVCache,
               meta: AttentionMetadata, scale: float, softcap: float | None) -> None:
        step = self._prompt_step(meta, q.shape[-1])
        if step is not None and (prompt := step.mask(0, q.shape[0])).any():
            self._decodes_by_kind(out, q, kv, meta, scale, softcap, prompt)
        else:
            self._decode_kernel(out, q, kv, meta, scale, softcap)

    def _decode_kernel(self, out: torch.Tensor, q: torch.Tensor, kv: LayerKVCache,
                       meta: AttentionMetadata, scale: float, softcap: float | None) -> None:
        if softcap:
            super().decode(out, q, kv, meta, scale, softcap)
        elif kv.k_scale is None:
            self.ops.paged_decode_attention(
                out, q.contiguous(), kv.k, kv.v, meta.decode_block_tables,
                meta.decode_seq_lens, scale, meta.sliding_window or 0)
        else:
            self.ops.paged_decode_attention_quant(
                out, q.contiguous(), kv.k, kv.v, kv.k_scale, kv.v_scale,
                meta.decode_block_tables, meta.decode_seq_lens, scale,
                meta.sliding_window or 0)

    def prefill(self, out: torch.Tensor, q: torch.Tensor, kv: LayerKVCache,
                meta: AttentionMetadata, scale: float, softcap: float | None) -> None:
        if not self.varlen_kernel(q.shape[-1]):
            super().prefill(out, q, kv, meta, scale, softcap)
            return
        step = self._prompt_step(meta, q.shape[-1])
        prompt = None if step is None else step.counts(meta.prefill_query_start +
                                                       meta.num_decodes)
        self._varlen(out, q, kv, meta.prefill_block_tables, meta.prefill_seq_lens,
                     meta.prefill_query_start, scale, meta.sliding_window, softcap, prompt)
