"""Reference quantizers and packers written from the published AWQ (AutoAWQ `WQLinear_GEMM`)
and GPTQ (AutoGPTQ `QuantLinear.pack`) formats, independent of pagedllm's unpacking code, and a
writer of tiny quantized checkpoints (with `quantization_config`) plus their dequantized twins."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

AWQ_ORDER_MAP = [0, 2, 4, 6, 1, 3, 5, 7]
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SHARED_INPUT = {"k_proj": "q_proj", "v_proj": "q_proj", "up_proj": "gate_proj"}


def _int32(packed: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(packed.astype(np.uint32).view(np.int32).copy())


def quantize_groups(w: torch.Tensor, group_size: int, sym: bool, g_idx: torch.Tensor | None = None):
    """Asymmetric (or symmetric, zero 8) 4-bit quantization of W[N, K] per group of input
    channels: returns q [N, K] 0..15, zeros [N, G], scales fp16 [N, G], g_idx [K]."""
    n, k = w.shape
    if g_idx is None:
        g_idx = torch.arange(k) // group_size
    n_groups = int(g_idx.max()) + 1
    scales = torch.empty(n, n_groups)
    zeros = torch.empty(n, n_groups, dtype=torch.int64)
    for g in range(n_groups):
        cols = w[:, g_idx == g]
        lo, hi = cols.min(dim=1).values.clamp(max=0), cols.max(dim=1).values.clamp(min=0)
        if sym:
            s = torch.maximum(hi.abs(), lo.abs()) / 7.5
            z = torch.full((n,), 8)
        else:
            s = (hi - lo) / 15
            z = torch.round(-lo / s).clamp(1, 15).long()  # v1 GPTQ cannot store a zero of 0
        scales[:, g], zeros[:, g] = s, z
    scales = scales.half()
    sk, zk = scales.float()[:, g_idx], zeros[:, g_idx]
    q = torch.clamp(torch.round(w / sk) + zk, 0, 15).long()
    return q, zeros, scales, g_idx


def dequantize(q, zeros, scales, g_idx) -> torch.Tensor:
    return (q - zeros[:, g_idx]).float() * scales.float()[:, g_idx]


def pack_awq(q, zeros, scales) -> dict[str, torch.Tensor]:
    """AutoAWQ gemm: qweight [K, N/8], qzeros [G, N/8] in the order map, scales [G, N]."""
    intweight = q.t().numpy().astype(np.uint32)  # [K, N]
    qweight = np.zeros((intweight.shape[0], intweight.shape[1] // 8), dtype=np.uint32)
    for col in range(intweight.shape[1] // 8):
        for i in range(8):
            qweight[:, col] |= intweight[:, col * 8 + AWQ_ORDER_MAP[i]] << (i * 4)
    z = zeros.t().numpy().astype(np.uint32)  # [G, N]
    qzeros = np.zeros((z.shape[0], z.shape[1] // 8), dtype=np.uint32)
    for col in range(z.shape[1] // 8):
        for i in range(8):
            qzeros[:, col] |= z[:, col * 8 + AWQ_ORDER_MAP[i]] << (i * 4)
    return {"qweight": _int32(qweight), "qzeros": _int32(qzeros),
            "scales": scales.t().contiguous()}


def pack_gptq(q, zeros, scales, g_idx) -> dict[str, torch.Tensor]:
    """AutoGPTQ: qweight [K/8, N] (8 rows per word), qzeros [G, N/8] storing zero - 1."""
    intweight = q.t().numpy().astype(np.uint32)  # [K, N]
    qweight = np.zeros((intweight.shape[0] // 8, intweight.shape[1]), dtype=np.uint32)
    for row in range(qweight.shape[0]):
        for j in range(8):
            qweight[row] |= intweight[row * 8 + j] << (4 * j)
    z = (zeros.t().numpy() - 1).astype(np.uint32)  # [G, N]
    qzeros = np.zeros((z.shape[0], z.shape[1] // 8), dtype=np.uint32)
    for col in range(z.shape[1] // 8):
        for j in range(8):
            qzeros[:, col] |= z[:, col * 8 + j] << (4 * j)
    return {"qweight": _int32(qweight), "qzeros": _int32(qzeros),
            "scales": scales.t().contiguous(), "g_idx": g_idx.to(torch.int32)}


def write_quantized(src: Path, dst_q: Path, dst_ref: Path, method: str, group_size: int,
                    sym: bool = False, desc_act: bool = False, seed: int = 0) -> None:
    """From the float checkpoint `src`: `dst_q` with every projection quantized and packed
    (`method` awq | gptq, quantization_config in config.json), and `dst_ref` holding the
    dequantized weights as a plain float checkpoint (the reference)."""
    gen = torch.Generator().manual_seed(seed)
    dense = load_file(str(src / "model.safetensors"))
    quant, ref = {}, {}
    act_orders: dict[tuple[str, str], torch.Tensor] = {}
    for name, t in dense.items():
        module = name.removesuffix(".weight")
        if not (name.endswith(".weight") and module.rpartition(".")[2] in LINEARS):
            quant[name] = ref[name] = t
            continue
        g_idx = None
        if desc_act:  # projections of the same input share GPTQ's act order (same Hessian)
            parent, _, proj = module.rpartition(".")
            key = (parent, SHARED_INPUT.get(proj, proj))
            if key not in act_orders:
                k = t.shape[1]
                act_orders[key] = torch.empty(k, dtype=torch.long)
                act_orders[key][torch.randperm(k, generator=gen)] = torch.arange(k) // group_size
            g_idx = act_orders[key]
        q, z, s, g_idx = quantize_groups(t.float(), group_size, sym, g_idx)
        ref[name] = dequantize(q, z, s, g_idx)
        packed = pack_awq(q, z, s) if method == "awq" else pack_gptq(q, z, s, g_idx)
        quant.update({f"{module}.{part}": v for part, v in packed.items()})
    for dst, tensors in ((dst_q, quant), (dst_ref, ref)):
        dst.mkdir(parents=True, exist_ok=True)
        for f in src.iterdir():
            if f.name != "model.safetensors":
                shutil.copy(f, dst / f.name)
        save_file(tensors, str(dst / "model.safetensors"))
    config = json.loads((dst_q / "config.json").read_text())
    if method == "awq":
        config["quantization_config"] = {"quant_method": "awq", "bits": 4,
                                         "group_size": group_size, "zero_point": True,
                                         "version": "gemm"}
    else:
        config["quantization_config"] = {"quant_method": "gptq", "bits": 4,
                                         "group_size": group_size, "sym": sym,
                                         "desc_act": desc_act, "checkpoint_format": "gptq"}
    (dst_q / "config.json").write_text(json.dumps(config, indent=2))
