"""Top-k and top-p (nucleus) filtering of a batch of logits rows, as per-row thresholds.

Each row keeps the tokens at or above one value (everything below it becomes -inf):

    top-k   the k-th largest logit (ties with it are all kept, as vLLM)
    top-p   over what top-k keeps, token t stays iff the probability mass of the tokens
            ranked strictly above it is < p: the smallest set with mass >= p (the top token
            always stays; ties with its smallest member stay too)

Only a row's largest values matter, in order, never their positions. On the CPU (float32)
each row's CANDIDATES largest values are selected in linear time (numpy's partition) and only
they are sorted; a row whose k-th value or nucleus lies past them (k above CANDIDATES, a flat
distribution) tries 8x as many, then sorts all its values (numpy). For a 49,152-token row
torch's sort (values and indices) took ~8 ms. Elsewhere (CUDA) torch sorts the rows.
"""

from __future__ import annotations

import numpy as np
import torch

CANDIDATES = 1024  # the largest values per row sorted first (CPU)


def apply_top_k_top_p(logits: torch.Tensor, k: torch.Tensor | None,
                      p: torch.Tensor | None) -> torch.Tensor:
    """`logits` [B, V] with everything below each row's threshold set to -inf (module doc).
    k [B] int64 (V where a row does not use it), p [B] (1.0 where off); None: no row."""
    lo = top_k_top_p_threshold(logits, k, p)
    return logits.masked_fill(logits < lo.unsqueeze(1), float("-inf"))


def top_k_top_p_threshold(logits: torch.Tensor, k: torch.Tensor | None,
                          p: torch.Tensor | None) -> torch.Tensor:
    """[B] each row's threshold in the logits' dtype: the row keeps the values >= it."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        lo = _cpu_thresholds(logits, k, p)
    else:
        lo = _thresholds(logits.sort(dim=-1).values, logits.shape[-1], k, p, None)[0]
    return lo.to(logits.dtype)


def _cpu_thresholds(logits: torch.Tensor, k: torch.Tensor | None,
                    p: torch.Tensor | None) -> torch.Tensor:
    """The thresholds from each row's CANDIDATES largest values, then 8x as many for the
    rows they do not decide, then every value."""
    x = logits.detach().numpy()
    b, v = x.shape
    lo = torch.empty(b, dtype=torch.float64)
    todo = torch.arange(b)
    mass = None
    for m in (CANDIDATES, 8 * CANDIDATES):
        if m >= v or not todo.numel():
            break
        rows = x if len(todo) == b else x[todo.numpy()]
        top = torch.from_numpy(np.sort(np.partition(rows, v - m, axis=-1)[:, v - m:], axis=-1))
        if p is not None and mass is None:  # the first pass (every row): its mass over its max
            mass = _exp_sums(logits, top[:, -1].contiguous())
        got, decided = _thresholds(top, v, None if k is None else k[todo],
                                   None if p is None else p[todo],
                                   None if p is None else mass[todo])
        lo[todo[decided]] = got[decided]
        todo = todo[~decided]
    if todo.numel():
        lo[todo] = _thresholds(torch.from_numpy(np.sort(x[todo.numpy()], axis=-1)), v,
                               None if k is None else k[todo],
                               None if p is None else p[todo], None)[0]
    return lo


def _exp_sums(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """[B] float64 sum of exp(x - m) over each row of float32 CPU `x` [B, V]: the C++
    kernel's (no [B, V] temporaries), torch's without the kernels."""
    from pagedllm.kernels import cpu_ops

    ops = cpu_ops.load()
    if ops is None:
        return torch.exp(x - m.unsqueeze(1)).sum(dim=-1).double()
    return ops.exp_sums(x.contiguous(), m)


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
