"""Top-k and top-p (nucleus) filtering of a batch of logits rows, as per-row thresholds.

Each row keeps the tokens at or above one value (everything below it becomes -inf):

    top-k   the k-th largest logit (ties with it are all kept, as vLLM)
    top-p   over what top-k keeps, token t stays iff the probability mass of the tokens
            ranked strictly above it is < p: the smallest set with mass >= p (the top token
            always stays; ties with its smallest member stay too)

Only a row's largest values matter, in order, never their positions. On the CPU (float32)
each row's CANDIDATES largest values are selected in linear time and only they are sorted (the
C++ kernels of kernels/top_k_top_p_cpu.cpp, straight from the logits and temperatures; numpy's
partition without them); a row whose k-th value or nucleus lies past them (k above
CANDIDATES, a flat distribution) tries 8x as many, then sorts all its values. For a
49,152-token row torch's sort (values and indices) took ~8 ms. Elsewhere (CUDA) torch sorts
the rows.
"""

from __future__ import annotations

import numpy as np
import torch

from pagedllm.kernels import cpu_ops

CANDIDATES = 1024  # the largest values per row sorted first (CPU)


def apply_top_k_top_p(logits: torch.Tensor, k: torch.Tensor | None,
                      p: torch.Tensor | None) -> torch.Tensor:
    """`logits` [B, V] with everything below each row's threshold set to -inf (module doc).
    k [B] int64 (V where a row does not use it), p [B] (1.0 where off); None: no row."""
    lo = top_k_top_p_threshold(logits, k, p)
    return logits.masked_fill(logits < lo.unsqueeze(1), float("-inf"))


def top_k_top_p_threshold(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None,
                          temperature: torch.Tensor | None = None) -> torch.Tensor:
    """[B] each row's threshold in the logits' dtype: the row keeps the values >= it. With
    `temperature` [B] (0 counting as 1) the thresholds are those of logits / temperature,
    which the CPU kernels compute as they go, never writing the scaled [B, V] logits."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        lo = _cpu_thresholds(logits, k, p, temperature)
    else:
        x = logits if temperature is None else scaled_logits(logits, temperature)
        lo = _thresholds(x.sort(dim=-1).values, logits.shape[-1], k, p, None)[0]
    return lo.to(logits.dtype)


def scaled_logits(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """logits / temperature [B] per row, a temperature of 0 (a greedy row) counting as 1."""
    return logits / torch.where(temperature == 0.0, 1.0, temperature).unsqueeze(1)


def _cpu_thresholds(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None,
                    temperature: torch.Tensor | None) -> torch.Tensor:
    """The thresholds from each row's CANDIDATES largest values, then 8x as many for the
    rows they do not decide, then every value: one C++ call (each row's largest values of
    logits / temperature, its mass and `_thresholds`' rule, in float64 as here:
    kernels/top_k_top_p_cpu.cpp, which the multi-step decode calls too); without the kernels
    numpy selects the values from the scaled logits."""
    if (ops := cpu_ops.load()) is not None:
        return ops.top_k_top_p_thresholds(
            logits.contiguous(), None if temperature is None else temperature.contiguous(),
            None if k is None else k.contiguous(), None if p is None else p.contiguous(),
            CANDIDATES)
    b, v = logits.shape
    scaled = (logits if temperature is None else scaled_logits(logits, temperature)).numpy()
    lo = torch.empty(b, dtype=torch.float64)
    todo = torch.arange(b)
    mass = None
    for m in (CANDIDATES, 8 * CANDIDATES):
        if m >= v or not todo.numel():
            break
        rows = scaled if len(todo) == b else scaled[todo.numpy()]
        top = torch.from_numpy(np.sort(np.partition(rows, v - m, axis=-1)[:, v - m:], axis=-1))
        if p is not None and mass is None:  # the first pass: every row's mass over its max
            mass = torch.exp(torch.from_numpy(rows) - top[:, -1:]).sum(dim=-1).double()
        got, decided = _thresholds(top, v, None if k is None else k[todo],
                                   None if p is None else p[todo],
                                   None if p is None else mass[todo])
        lo[todo[decided]] = got[decided]
        todo = todo[~decided]
    if todo.numel():
        rows = scaled if len(todo) == b else scaled[todo.numpy()]
        lo[todo] = _thresholds(torch.from_numpy(np.sort(rows, axis=-1)), v,
                               None if k is None else k[todo],
                               None if p is None else p[todo], None)[0]
    return lo


def _thresholds(s: torch.Tensor, v: int, k: torch.Tensor | None, p: torch.Tensor | None,
                mass: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(threshold [B] float64, decided [B] bool) from `s` [B, m]: each row's m largest
    values in ascending order, all V of them when `mass` is None, else the m largest and
    `mass` [B] = sum(exp(x - max)) over the whole row. A row is undecided when its k-th
    value or its nucleus may lie past the m values."""
    b, m = s.shape
    rows = torch.arange(b, device=s.device)
    s = s.double()
    lo = torch.full((b,), float("-inf"), dtype=torch.float64, device=s.device)
    decided = torch.ones(b, dtype=torch.bool, device=s.device)
    if k is not None:
        cut = k < v
        lo = torch.where(cut, s[rows, m - k.clamp(1, m)], lo)
        decided &= ~cut | (k <= m)
    if p is not None:
        e = torch.where(s >= lo.unsqueeze(1), torch.exp(s - s[:, -1:]), 0.0)
        # A row top-k cuts keeps only tokens among the m (else it is undecided already).
        total = e.sum(dim=-1) if mass is None else torch.where(lo > float("-inf"),
                                                               e.sum(dim=-1), mass)
        desc = e.flip(-1) / total.unsqueeze(1)
        above = desc.cumsum(dim=-1) - desc  # the mass ranked strictly above each token
        pp = p.double()
        kept = (above < pp.unsqueeze(1)).sum(dim=-1).clamp(min=1)  # a prefix, descending
        cut = pp < 1.0
        lo = torch.where(cut, torch.maximum(lo, s[rows, m - kept]), lo)
        if mass is not None:  # the m values must hold the nucleus
            decided &= ~cut | (desc.sum(dim=-1) >= pp)
    return lo, decided
