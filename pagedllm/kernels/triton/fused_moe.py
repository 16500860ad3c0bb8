"""Fused mixture-of-experts for the CUDA path: two grouped GEMMs over the token rows sorted by
expert (vLLM's `fused_moe` idea), the contract of `StackedExperts.forward`:

    y[t] = sum_j weights[t, j] * down_e(silu(gate_e(x[t])) * up_e(x[t])),  e = ids[t, j]

Assignment a = t * k + j (token t's j-th expert). `align_by_expert` sorts the assignments by
expert and pads every expert's run to a multiple of BLOCK_M with the sentinel T * k, so each
M block of rows belongs to one expert::

    ids (T=3, k=2)   [[2, 0], [0, 1], [2, 0]]        flat: a = 0..5 -> experts 2 0 0 1 2 0
    sorted (BM=4)    | 1 2 5 - | 3 - - - | 0 4 - - |  ('-' = sentinel 6)
    block expert     |    0    |    1    |    2    |  (an expert with no rows has no block)

    _gate_up_kernel  grid (M blocks, I / BLOCK_N): rows x[a // k] times the expert's gate and
                     up rows of the same N block -> silu(gate) * up -> h[a]       [T*k, I]
    _down_kernel     grid (M blocks, H / BLOCK_N): h[a] times down_e -> * weights.flat[a]
                     -> o[a]                                                      [T*k, H]
    y = o.view(T, k, H).sum(1)                       the weighted combine, per token

Everything stays on the device (no host read of the group sizes): the grid is sized for the
most padding possible, and blocks past the padded total return at once. Under expert
parallelism the ids of experts held by other ranks are -1: those assignments get no rows. fp32 inputs are
multiplied in IEEE fp32 (no TF32), bf16 / fp16 on the tensor cores accumulating in fp32
(under TRITON_INTERPRET in fp32: the interpreter's bf16 dot is not usable).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagedllm.kernels.triton import interpreted
from pagedllm.kernels.triton.bits import cast


def align_by_expert(ids: torch.Tensor, num_experts: int, block_m: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sorted assignment ids [cap], expert of each M block [cap / block_m], padded total [1])
    for ids [T, k] (see the module doc; cap bounds the padded total without reading it). An
    id of -1 (an expert not held here) goes to a last bucket that gets no blocks."""
    e = num_experts
    flat = ids.reshape(-1)
    n = flat.numel()
    flat = torch.where(flat < 0, e, flat)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=e + 1)
    padded = (counts[:e] + block_m - 1) // block_m * block_m
    ends = padded.cumsum(0)
    run_start = ends - padded  # where each expert's padded run begins
    first = counts.cumsum(0) - counts  # where its rows begin in `order`
    experts = flat.index_select(0, order)
    cap = -(-(n + min(e, n) * (block_m - 1)) // block_m) * block_m
    dest = run_start[experts.clamp(max=e - 1)] + torch.arange(n, device=ids.device) - first[
        experts]
    dest = torch.where(experts < e, dest, cap)  # the skipped rows land past the end
    sorted_ids = torch.full((cap + 1,), n, dtype=torch.int64, device=ids.device)
    sorted_ids[dest] = order
    starts = torch.arange(0, cap, block_m, device=ids.device)
    block_expert = torch.searchsorted(ends, starts, right=True).clamp_(max=e - 1)
    return sorted_ids[:cap], block_expert, ends[-1:]


@triton.jit
def _dot(a, b, acc, IEEE: tl.constexpr):
    if IEEE:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, b, acc)


@triton.jit
def _gate_up_kernel(x_ptr, w_ptr, h_ptr, sorted_ptr, expert_ptr, total_ptr, num_rows, H, INTER,
                    stride_x, stride_we, stride_wn, stride_h, TOP_K: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    IEEE: tl.constexpr):
    pid_m = tl.program_id(0)
    if pid_m * BLOCK_M >= tl.load(total_ptr):
        return
    a = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = a < num_rows
    tok = tl.where(valid, a // TOP_K, 0)
    e = tl.load(expert_ptr + pid_m).to(tl.int64)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < INTER
    w = w_ptr + e * stride_we
    gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        k_ok = kk < H
        xa = tl.load(x_ptr + tok[:, None] * stride_x + kk[None, :],
                     mask=valid[:, None] & k_ok[None, :], other=0.0)
        wmask = k_ok[:, None] & n_ok[None, :]
        wg = tl.load(w + n[None, :] * stride_wn + kk[:, None], mask=wmask, other=0.0)
        wu = tl.load(w + (n[None, :] + INTER) * stride_wn + kk[:, None], mask=wmask, other=0.0)
        gate = _dot(xa, wg, gate, IEEE)
        up = _dot(xa, wu, up, IEEE)
    h = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(h_ptr + a[:, None] * stride_h + n[None, :], cast(h, h_ptr.dtype.element_ty),
             mask=valid[:, None] & n_ok[None, :])


@triton.jit
def _down_kernel(h_ptr, w_ptr, o_ptr, weights_ptr, sorted_ptr, expert_ptr, total_ptr, num_rows,
                 H, INTER, stride_h, stride_we, stride_wn, stride_o, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr):
    pid_m = tl.program_id(0)
    if pid_m * BLOCK_M >= tl.load(total_ptr):
        return
    a = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = a < num_rows
    row = tl.where(valid, a, 0)
    e = tl.load(expert_ptr + pid_m).to(tl.int64)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < H
    w = w_ptr + e * stride_we
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, INTER, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        k_ok = kk < INTER
        ha = tl.load(h_ptr + row[:, None] * stride_h + kk[None, :],
                     mask=valid[:, None] & k_ok[None, :], other=0.0)
        wd = tl.load(w + n[None, :] * stride_wn + kk[:, None], mask=k_ok[:, None] & n_ok[None, :],
                     other=0.0)
        acc = _dot(ha, wd, acc, IEEE)
    acc *= tl.load(weights_ptr + row, mask=valid, other=0.0).to(tl.float32)[:, None]
    tl.store(o_ptr + a[:, None] * stride_o + n[None, :], cast(acc, o_ptr.dtype.element_ty),
             mask=valid[:, None] & n_ok[None, :])


def fused_moe(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
              weights: torch.Tensor, ids: torch.Tensor, block_m: int = 16, block_n: int = 32,
              block_k: int = 32) -> torch.Tensor:
    """x [T, H], gate_up [E, 2I, H], down [E, H, I], weights / ids [T, k] -> [T, H]. An id
    of -1 is an expert not held here (expert parallelism): that assignment adds nothing."""
    t, hidden = x.shape
    e, two_i, _ = gate_up.shape
    inter = two_i // 2
    if x.stride(-1) != 1 or not gate_up.is_contiguous() or not down.is_contiguous():
        raise ValueError("fused_moe needs x with contiguous rows and contiguous expert weights")
    if gate_up.shape[2] != hidden or tuple(down.shape) != (e, hidden, inter):
        raise ValueError(f"expert weights gate_up {tuple(gate_up.shape)} / down "
                         f"{tuple(down.shape)} do not fit x [{t}, {hidden}]")
    if ids.shape != weights.shape or ids.dim() != 2 or ids.shape[0] != t:
        raise ValueError(f"ids {tuple(ids.shape)} and weights {tuple(weights.shape)} must both "
                         f"be [{t}, top_k]")
    k = ids.shape[1]
    if t == 0:
        return torch.zeros_like(x)
    sorted_ids, block_expert, total = align_by_expert(ids, e, block_m)
    rows = t * k
    h = torch.empty(rows, inter, dtype=x.dtype, device=x.device)
    o = torch.zeros(rows, hidden, dtype=x.dtype, device=x.device)  # skipped rows stay 0
    ieee = x.dtype == torch.float32 or interpreted()  # the interpreter's bf16 dot is wrong
    blocks = sorted_ids.numel() // block_m
    _gate_up_kernel[(blocks, triton.cdiv(inter, block_n))](
        x, gate_up, h, sorted_ids, block_expert, total, rows, hidden, inter, x.stride(0),
        gate_up.stride(0), gate_up.stride(1), h.stride(0), TOP_K=k, BLOCK_M=block_m,
        BLOCK_N=block_n, BLOCK_K=block_k, IEEE=ieee)
    _down_kernel[(blocks, triton.cdiv(hidden, block_n))](
        h, down, o, weights.reshape(-1).float().contiguous(), sorted_ids, block_expert, total,
        rows, hidden, inter, h.stride(0), down.stride(0), down.stride(1), o.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, IEEE=ieee)
    return o.view(t, k, hidden).sum(1)
