"""The C++ random-row sampler (kernels/sampling_cpu.cpp) against torch's inverse CDF, and the
top-k / top-p kernels (kernels/top_k_top_p_cpu.cpp) against numpy's selection and the Python
threshold rule.

The kernel draws each row's token from its logits in two passes with no [B, V] temporaries;
it must pick the token torch's softmax -> float64 cumsum -> searchsorted picks for the same
u (they differ only where u lands within rounding of a boundary, which these seeds avoid),
never a token below the row's threshold or at -inf, and a NaN / +inf token where the row
has one (the runner reports the row as not finite from its sampled logit).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pagedllm.kernels import cpu_ops
from pagedllm.model.layers import sampler as sampler_mod
from pagedllm.model.layers.sampler import Sampler, SamplingMetadata, SamplingRow, inverse_cdf
from pagedllm.sampling_params import SamplingParams

OPS = cpu_ops.load()
pytestmark = pytest.mark.skipif(OPS is None, reason="the C++ CPU kernels are not built here")


def reference(logits: torch.Tensor, t: torch.Tensor | None, lo: torch.Tensor | None,
              u: torch.Tensor) -> torch.Tensor:
    x = logits if t is None else logits / torch.where(t == 0, 1.0, t).unsqueeze(1)
    if lo is not None:
        x = x.masked_fill(x < lo.unsqueeze(1), float("-inf"))
    return inverse_cdf(torch.softmax(x, dim=-1), u)


@pytest.mark.parametrize("vocab", [1, 7, 64, 997, 49152])
def test_kernel_draws_what_the_torch_inverse_cdf_draws(vocab: int) -> None:
    g = torch.Generator().manual_seed(vocab)
    b = 24
    logits = torch.randn(b, vocab, generator=g) * 3
    t = torch.rand(b, generator=g) * 1.5
    t[:3] = 0.0  # greedy rows sample with temperature 1 here
    u = torch.rand(b, generator=g, dtype=torch.float64)
    assert torch.equal(OPS.sample_rows(logits, t, None, u), reference(logits, t, None, u))
    assert torch.equal(OPS.sample_rows(logits, None, None, u), reference(logits, None, None, u))


def test_thresholds_keep_only_the_values_at_or_above_them() -> None:
    g = torch.Generator().manual_seed(5)
    b, v = 32, 3000
    logits = torch.randn(b, v, generator=g)
    lo = logits.sort(dim=-1).values[torch.arange(b), v - 1 - torch.randint(0, 40, (b,), generator=g)]
    lo[0] = float("-inf")  # no threshold
    for seed in range(8):
        u = torch.rand(b, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        got = OPS.sample_rows(logits, None, lo, u)
        assert torch.equal(got, reference(logits, None, lo, u))
        assert (logits[torch.arange(b), got] >= lo).all()


def test_min_p_cuts_below_the_rows_largest_plus_log_min_p() -> None:
    """log_min_p: the tokens x < max(x) + log(min_p) (torch's float32 sum) are never drawn;
    the draw equals torch's masked softmax's for the same u."""
    g = torch.Generator().manual_seed(8)
    b, v = 16, 4000
    logits = torch.randn(b, v, generator=g) * 2
    t = torch.rand(b, generator=g) + 0.5
    min_p = torch.rand(b, generator=g) * 0.2
    min_p[0] = 0.0  # log(0) = -inf: no cut
    scaled = logits / t.unsqueeze(1)
    lo = scaled.amax(dim=-1) + torch.log(min_p)
    for seed in range(6):
        u = torch.rand(b, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        got = OPS.sample_rows(logits, t, None, u, torch.log(min_p))
        assert torch.equal(got, reference(scaled, None, lo, u))
        assert (scaled[torch.arange(b), got] >= lo).all()


def test_a_grid_of_u_gives_the_distribution_and_never_a_minus_inf_token() -> None:
    """u = (i + 0.5) / n for i < n: each kept token is drawn its probability times n times
    (to within one), the -inf tokens never."""
    probs = torch.tensor([0.0, 0.5, 0.0, 0.3, 0.1, 0.0, 0.06, 0.04] * 20)
    logits = probs.log().unsqueeze(0)  # zeros -> -inf
    n = 4000
    u = (torch.arange(n, dtype=torch.float64) + 0.5) / n
    ids = OPS.sample_rows(logits.expand(n, -1).contiguous(), None, None, u)
    counts = torch.bincount(ids, minlength=probs.numel()).double()
    assert (counts[probs == 0] == 0).all()
    assert (counts - probs.double() / probs.sum() * n).abs().max() <= 1.0


def test_u_at_the_ends_of_the_unit_interval_stays_on_kept_tokens() -> None:
    logits = torch.full((2, 200), float("-inf"))
    logits[:, 13] = 0.0
    logits[:, 150] = 1.0
    u = torch.tensor([0.0, 1.0 - 2.0 ** -53], dtype=torch.float64)
    assert OPS.sample_rows(logits, None, None, u).tolist() == [13, 150]


def test_a_row_with_nan_or_inf_draws_its_first_such_token() -> None:
    logits = torch.randn(4, 300, generator=torch.Generator().manual_seed(2))
    logits[0, 77] = float("nan")
    logits[0, 201] = float("nan")
    logits[1, 5] = float("inf")
    logits[2] = float("-inf")  # nothing to draw: an in-range id, reported by its logit
    u = torch.full((4,), 0.5, dtype=torch.float64)
    got = OPS.sample_rows(logits, None, None, u).tolist()
    assert got[:2] == [77, 5]
    assert 0 <= got[2] < 300 and not torch.isfinite(logits[2, got[2]])
    assert got[3] == int(reference(logits[3:], None, None, u[3:]))


def test_a_rows_draw_does_not_depend_on_the_batch() -> None:
    g = torch.Generator().manual_seed(9)
    logits = torch.randn(40, 5000, generator=g)
    t = torch.rand(40, generator=g) + 0.2
    u = torch.rand(40, generator=g, dtype=torch.float64)
    batch = OPS.sample_rows(logits, t, None, u)
    alone = [int(OPS.sample_rows(logits[i:i + 1], t[i:i + 1], None, u[i:i + 1]))
             for i in range(40)]
    assert batch.tolist() == alone


@pytest.mark.parametrize("vocab", [1025, 3000, 49152])
def test_top_values_are_the_largest_scaled_values_and_the_row_masses(vocab: int) -> None:
    """top_k_top_p.py's candidates: each row's m largest values of logits / temperature
    (torch's division bit for bit), ascending, as numpy's partition and sort give them; and
    each row's mass over its maximum, torch's sum of exp to float rounding (-inf adds 0)."""
    g = torch.Generator().manual_seed(vocab)
    x = torch.randn(6, vocab, generator=g) * 4
    x[1, ::2] = float("-inf")
    x[2] = 1.5  # all tied
    x[3, :700] = torch.round(x[3, :700])  # many ties among the largest
    x[4, 10] = float("nan")  # numpy sorts NaN last: the largest
    x[5, 3:] = float("-inf")  # fewer finite values than m
    t = torch.tensor([0.7, 1.0, 0.0, 1.3, 2.0, 0.33])
    scaled = x / torch.where(t == 0, 1.0, t).unsqueeze(1)
    for m in (1, 17, 1024):
        top, mass = OPS.top_values(x, t, m, True)
        want = np.sort(np.partition(scaled.numpy(), vocab - m, axis=-1)[:, vocab - m:], axis=-1)
        torch.testing.assert_close(top, torch.from_numpy(want), rtol=0, atol=0, equal_nan=True)
        assert top[4, -1].isnan()
        ref = torch.exp(scaled.double() - scaled.amax(dim=-1, keepdim=True).double()).sum(-1)
        torch.testing.assert_close(mass[[0, 1, 2, 3, 5]], ref[[0, 1, 2, 3, 5]], rtol=1e-6, atol=0)
    top, mass = OPS.top_values(x, None, 5, False)
    assert mass.numel() == 0
    torch.testing.assert_close(top, x.sort(dim=-1).values[:, -5:], rtol=0, atol=0, equal_nan=True)


def test_bad_arguments_are_refused() -> None:
    u = torch.zeros(2, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="logits must be contiguous fp32"):
        OPS.sample_rows(torch.zeros(2, 8, dtype=torch.float64), None, None, u)
    with pytest.raises(RuntimeError, match="u must be contiguous"):
        OPS.sample_rows(torch.zeros(2, 8), None, None, u.float())
    with pytest.raises(RuntimeError, match="threshold must be contiguous"):
        OPS.sample_rows(torch.zeros(2, 8), None, torch.zeros(3), u)
    with pytest.raises(RuntimeError, match="m=8 must be in"):
        OPS.top_values(torch.zeros(2, 8), None, 8, True)
    with pytest.raises(RuntimeError, match="min_p's cut comes before the thresholds"):
        OPS.sample_rows(torch.zeros(2, 8), None, torch.zeros(2), u, torch.zeros(2))
    with pytest.raises(RuntimeError, match="k must be contiguous"):
        OPS.top_k_top_p_thresholds(torch.zeros(2, 8), None, torch.zeros(2), None, 4)


@pytest.mark.parametrize("params", [
    dict(temperature=0.8),
    dict(temperature=1.3, top_p=0.9),
    dict(temperature=0.7, top_k=20),
    dict(temperature=1.0, top_k=50, top_p=0.8),
    dict(temperature=0.9, min_p=0.05),
    dict(temperature=1.1, min_p=0.02, top_p=0.95),
])
def test_sampler_draws_the_same_with_and_without_the_kernel(params: dict,
                                                            monkeypatch) -> None:
    """The Sampler's CPU kernel path and its torch path (CUDA's, and the CPU's without the
    kernels) give the same tokens for the same draws, greedy rows mixed in."""
    g = torch.Generator().manual_seed(11)
    logits = torch.randn(48, 2000, generator=g) * 2.5
    rows = [SamplingRow(SamplingParams(**params) if i % 5 else SamplingParams(temperature=0.0),
                        [0], []) for i in range(48)]

    def sample() -> list[int]:
        md = SamplingMetadata.build(rows, 2000, "cpu")
        return Sampler(torch.Generator().manual_seed(3))(logits, md).sampled_token_ids.tolist()

    with_kernel = sample()
    monkeypatch.setattr(sampler_mod, "_host_sampling_ops", lambda logits: None)
    assert sample() == with_kernel


@pytest.mark.parametrize("k_on,p_on", [(True, False), (False, True), (True, True)])
def test_thresholds_with_and_without_the_kernels_are_equal(k_on: bool, p_on: bool,
                                                           monkeypatch) -> None:
    """top_k_top_p_threshold over logits and temperatures: the kernel's candidates and
    masses, and numpy's over the materialized scaled logits, give the same thresholds
    (rows decided by 1,024 candidates, by 8,192, and by a full sort among them)."""
    from pagedllm.model.layers import top_k_top_p

    g = torch.Generator().manual_seed(21)
    b, v = 12, 20000
    logits = torch.randn(b, v, generator=g) * 3
    logits[3] = torch.randn(v, generator=g) * 0.05  # flat: a nucleus past the candidates
    t = torch.rand(b, generator=g) + 0.3
    t[0] = 0.0
    k = torch.tensor([5, 50, 2000, 9000, 40, 1, v, 300, 1024, 1025, 7, 100]) if k_on else None
    p = (torch.rand(b, generator=g) * 0.9 + 0.05) if p_on else None
    with_kernel = top_k_top_p.top_k_top_p_threshold(logits, k, p, t)
    monkeypatch.setattr(cpu_ops, "load", lambda family="core": None)
    assert torch.equal(top_k_top_p.top_k_top_p_threshold(logits, k, p, t), with_kernel)
    scaled = logits / torch.where(t == 0, 1.0, t).unsqueeze(1)
    assert torch.equal(top_k_top_p.top_k_top_p_threshold(scaled, k, p), with_kernel)
