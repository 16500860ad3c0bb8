"""Rejection sampling of draft tokens (Leviathan et al. 2023; vLLM's rejection_sampler).

For a speculating request with drafts d_0..d_{k-1} drawn from the draft distributions q_j,
and the target's distributions p_0..p_k at the k + 1 verified positions::

    j = 0, 1, ...:  accept d_j  with probability min(1, p_j(d_j) / q_j(d_j))
    first reject:   emit a token drawn from normalise(max(0, p_j - q_j)), stop
    all accepted:   emit a bonus token drawn from p_k

so every emitted token is distributed exactly as the target alone would sample it. When the
drafts are deterministic (q_j a point mass: n-gram lookup, greedy draft model) this is
"accept while the token sampled from p_j equals d_j" (`num_matching`), which the model
runner gets from its ordinary sampler.
"""

from __future__ import annotations

import torch

from pagedllm.model.layers.sampler import inverse_cdf, uniform_draw


def num_matching(sampled: list[int], drafts: list[int]) -> int:
    """Leading positions where the target's token equals the draft (`sampled` has one
    more entry than `drafts`)."""
    for j, d in enumerate(drafts):
        if sampled[j] != d:
            return j
    return len(drafts)


def rejection_sample(target_probs: torch.Tensor, draft_probs: torch.Tensor,
                     drafts: torch.Tensor, num_drafts: torch.Tensor,
                     generators: list[torch.Generator | None]) -> tuple[torch.Tensor,
                                                                         torch.Tensor]:
    """Batched rule of the module doc, R requests padded to K drafts.

    target_probs [R, K + 1, V], draft_probs [R, K, V] (rows past a request's drafts are
    ignored), drafts [R, K] int64, num_drafts [R]. Row r's random numbers come from
    `generators[r]` (None: torch's default). Returns (accepted [R] = a, token [R]): the
    request emits drafts[:a] then `token`.
    """
    r, k1, _ = target_probs.shape
    k = k1 - 1
    dev = target_probs.device
    uniform = torch.empty(r, k, dtype=torch.float32, device=dev)
    final = torch.empty(r, dtype=torch.float64, device=dev)  # the emitted token's draw
    for i, g in enumerate(generators):
        uniform[i].uniform_(generator=g)
        final[i] = uniform_draw(g, dev)
    pos = torch.arange(k, device=dev)
    valid = pos.unsqueeze(0) < num_drafts.unsqueeze(1)
    safe = drafts.clamp(min=0)
    p_d = target_probs[:, :k].gather(2, safe.unsqueeze(2)).squeeze(2)
    q_d = draft_probs.gather(2, safe.unsqueeze(2)).squeeze(2)
    ok = valid & (q_d > 0) & (uniform * q_d <= p_d)
    accepted = ok.to(torch.int64).cumprod(dim=1).sum(dim=1)  # first rejection (or k)
    rows = torch.arange(r, device=dev)
    p = target_probs[rows, accepted]
    # At a rejection sample the residual; after the last draft (accepted == num_drafts)
    # there is no q: the bonus token comes from p itself.
    q = torch.where((accepted < num_drafts).unsqueeze(1),
                    draft_probs[rows, accepted.clamp(max=max(k - 1, 0))] if k else 0.0, 0.0)
    residual = (p - q).clamp(min=0.0)
    mass = residual.sum(dim=1, keepdim=True)
    residual = torch.where(mass > 0, residual / mass.clamp(min=1e-30), p)  # p == q: use p
    token = inverse_cdf(residual, final)
    return accepted, token
