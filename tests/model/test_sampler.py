from __future__ import annotations

import pytest
import torch

from pagedllm.model.layers.logits_processors import Penalties
from pagedllm.model.layers.sampler import (
    Sampler,
    SamplingMetadata,
    SamplingRow,
    make_generator,
    row_argmax,
)
from pagedllm.model.layers.top_k_top_p import apply_top_k_top_p
from pagedllm.sampling_params import SamplingParams

DEVICE = "cpu"
# A small vocabulary with a clear nucleus: probs 0.5, 0.3, 0.1, 0.06, 0.04.
PROBS = torch.tensor([0.5, 0.3, 0.1, 0.06, 0.04])
LOGITS = PROBS.log()


def run(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    md = SamplingMetadata.build(rows, logits.shape[-1], DEVICE)
    return Sampler()(logits, md).sampled_token_ids


def row(params: SamplingParams, out: list[int] | None = None, **kw) -> SamplingRow:
    return SamplingRow(params, kw.pop("prompt", [0]), out or [], **kw)


def draw(params: SamplingParams, n: int = 4000, logits: torch.Tensor = LOGITS) -> torch.Tensor:
    """Sample n times from the same distribution in one batch; returns token counts."""
    torch.manual_seed(0)
    ids = run(logits.expand(n, -1), [row(params) for _ in range(n)])
    return torch.bincount(ids, minlength=logits.shape[-1])


def test_greedy_is_argmax() -> None:
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(1))
    ids = run(logits, [row(SamplingParams(temperature=0.0)) for _ in range(6)])
    assert torch.equal(ids, logits.argmax(-1)) and ids.dtype == torch.int64


def test_greedy_host_path_matches_torch_argmax_ties_and_non_finite_rows() -> None:
    """An all-greedy CPU batch with nothing to process is answered on the host (C++
    greedy_rows; numpy for strided logits): the same ids as torch's argmax (first maximum on
    ties, a NaN wins), and per row whether the chosen logit is finite (what the runner
    reports as a failed request)."""
    logits = torch.randn(6, 300, generator=torch.Generator().manual_seed(3))
    logits[1, 7] = logits[1, 200] = logits[1].max() + 1  # a tie: the first one
    logits[2, 11] = float("nan")
    logits[2, 5] = float("nan")
    logits[3, 40] = float("inf")
    logits[4] = float("-inf")
    md = SamplingMetadata.build([row(SamplingParams(temperature=0.0))] * 6, 300, DEVICE)
    out = Sampler()(logits, md)
    want = logits.argmax(-1)
    assert torch.equal(out.sampled_token_ids, want) and out.sampled_token_ids.dtype == torch.int64
    assert out.host == (want.tolist(), [True, True, False, False, False, True])
    assert out.host[0][1] == 7 and out.host[0][2] == 5  # first max / first NaN
    wide = torch.randn(300, 6, generator=torch.Generator().manual_seed(4)).t()  # strided: numpy
    assert Sampler()(wide, md).host == (wide.argmax(-1).tolist(), [True] * 6)
    big = torch.randn(64, 49152, generator=torch.Generator().manual_seed(5))
    big[9, 100] = big[9, 30000] = big[9].max() + 1  # a tie past the first 64-value block
    md64 = SamplingMetadata.build([row(SamplingParams(temperature=0.0))] * 64, 49152, DEVICE)
    assert Sampler()(big, md64).host == (big.argmax(-1).tolist(), [True] * 64)
    # Anything to process (here: logprobs) takes the tensor path, with no host copy.
    md = SamplingMetadata.build([row(SamplingParams(temperature=0.0, logprobs=1))] * 6, 300,
                                DEVICE)
    assert Sampler()(logits, md).host is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_row_argmax_is_torch_argmax(dtype: torch.dtype) -> None:
    """numpy's argmax on the CPU gives torch's answer: ties, NaN and -inf rows, views."""
    x = torch.randn(5, 1000, generator=torch.Generator().manual_seed(4)).to(dtype)
    x[0, 3] = x[0, 900] = 100.0
    x[1, 50] = x[1, 20] = float("nan")
    x[2] = float("-inf")
    for t in (x, x[:, ::3], x[1:4]):
        got = row_argmax(t)
        assert torch.equal(got, t.argmax(dim=-1)) and got.dtype == torch.int64


def test_top_k_top_p_masks_by_threshold_the_same_on_numpy_and_torch_sorts() -> None:
    """float32 CPU rows are sorted by numpy, others by torch: the same kept sets, which
    are what the definition gives (k largest with ties, then the smallest nucleus)."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(16, 400, generator=g) * 3
    k = torch.randint(1, 400, (16,), generator=g)
    p = torch.rand(16, generator=g).clamp(min=0.05)
    got32 = apply_top_k_top_p(x, k, p)
    got64 = apply_top_k_top_p(x.double(), k, p.double())
    assert torch.equal(got32.isfinite(), got64.isfinite())
    for r in range(16):
        kept = got32[r].isfinite()
        top = x[r].sort(descending=True).values
        assert kept.sum() <= k[r] and (x[r][kept] >= top[k[r] - 1]).all()
        probs = torch.softmax(x[r].masked_fill(x[r] < top[k[r] - 1], float("-inf")), -1)
        mass = probs[kept].sum()
        smallest = probs[kept].min()
        assert mass >= p[r] - 1e-5 and mass - smallest < p[r] + 1e-5  # the smallest such set
    assert torch.equal(got32[got32.isfinite()], x[got32.isfinite()])  # kept values unchanged


@pytest.mark.parametrize("v", [5000, 600])
def test_top_k_top_p_candidates_path_equals_full_sort(v: int) -> None:
    """Rows longer than CANDIDATES (and shorter: sorted whole at once): peaked and flat rows,
    top-k below and above the candidates, top-p alone or with top-k, neither, -inf entries;
    the CPU float32 path (partition, fallback to a full sort) keeps what the full torch sort
    keeps."""
    g = torch.Generator().manual_seed(6)
    scale = torch.tensor([8.0, 8.0, 0.05, 8.0, 0.05, 3.0, 8.0, 1.0])[:, None]
    x = torch.randn(8, v, generator=g) * scale
    x[7, ::2] = float("-inf")
    k = torch.tensor([50, min(3000, v - 100), v, v, v, 20, v, 700 * v // 5000])
    p = torch.tensor([1.0, 1.0, 0.9, 0.9, 0.5, 0.8, 1.0, 0.95])
    for kk, pp in ((k, p), (k, None), (None, p)):
        got = apply_top_k_top_p(x, kk, pp).isfinite()
        want = apply_top_k_top_p(x.double(), kk, None if pp is None else pp.double())
        assert torch.equal(got, want.isfinite())
    kept = apply_top_k_top_p(x, k, p).isfinite().sum(dim=-1)
    assert kept[0] == 50 and kept[1] == k[1] and kept[6] == v and kept[2] > v // 5


def test_top_p_keeps_ties_at_the_cutoff() -> None:
    logits = torch.tensor([[2.0, 1.0, 1.0, 0.0, -1.0]])
    probs = torch.softmax(logits, -1)[0]
    p = torch.tensor([float(probs[0] + probs[1]) - 1e-3])  # the nucleus ends inside the tie
    kept = apply_top_k_top_p(logits, None, p)[0].isfinite()
    assert kept.tolist() == [True, True, True, False, False]


def test_mixed_batch_greedy_rows_stay_argmax() -> None:
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(2))
    greedy, rand = SamplingParams(temperature=0.0), SamplingParams(temperature=5.0)
    ids = run(logits, [row(greedy), row(rand), row(greedy), row(rand)])
    assert ids[0] == logits[0].argmax() and ids[2] == logits[2].argmax()


def test_temperature_distribution_matches_softmax() -> None:
    temperature, n = 0.7, 4000
    counts = draw(SamplingParams(temperature=temperature), n)
    expected = torch.softmax(LOGITS / temperature, -1) * n
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert chi2 < 18.47  # df=4, p=0.001


def test_top_k_one_equals_greedy() -> None:
    logits = torch.randn(8, 100, generator=torch.Generator().manual_seed(3))
    ids = run(logits, [row(SamplingParams(top_k=1, temperature=2.0)) for _ in range(8)])
    assert torch.equal(ids, logits.argmax(-1))


def test_top_k_keeps_k_most_likely() -> None:
    counts = draw(SamplingParams(top_k=3))
    assert counts[3:].sum() == 0 and (counts[:3] > 0).all()


def test_top_p_keeps_exactly_the_nucleus() -> None:
    # 0.5 < 0.75 <= 0.5 + 0.3: the nucleus is {0, 1}.
    counts = draw(SamplingParams(top_p=0.75))
    assert counts[2:].sum() == 0 and (counts[:2] > 0).all()
    assert abs(counts[0].item() / counts.sum().item() - 0.5 / 0.8) < 0.03
    # A tiny top_p still keeps the top token.
    assert draw(SamplingParams(top_p=0.01), 200)[0] == 200


def test_top_p_combined_with_top_k_and_per_row_values() -> None:
    # top_k=2 renormalises to 0.625/0.375, so top_p=0.6 keeps only token 0.
    counts = draw(SamplingParams(top_k=2, top_p=0.6), 500)
    assert counts[0] == 500
    torch.manual_seed(0)
    params = [SamplingParams(top_p=0.75), SamplingParams(top_k=1), SamplingParams()]
    ids = run(LOGITS.expand(3000, -1), [row(params[i % 3]) for i in range(3000)])
    assert ids[0::3].max() <= 1 and (ids[1::3] == 0).all() and ids[2::3].max() == 4


def test_min_p() -> None:
    # Threshold 0.15 * 0.5 = 0.075 keeps {0, 1, 2}.
    counts = draw(SamplingParams(min_p=0.15))
    assert counts[3:].sum() == 0 and (counts[:3] > 0).all()


def naive_penalties(
    logits: torch.Tensor, prompt: list[int], out: list[int], p: SamplingParams
) -> torch.Tensor:
    logits = logits.clone()
    for tok in set(prompt) | set(out):
        if logits[tok] > 0:
            logits[tok] /= p.repetition_penalty
        else:
            logits[tok] *= p.repetition_penalty
    for tok in set(out):
        logits[tok] -= p.frequency_penalty * out.count(tok) + p.presence_penalty
    return logits


@pytest.mark.parametrize(
    "params",
    [
        [SamplingParams(repetition_penalty=1.3), SamplingParams(repetition_penalty=0.8)],
        [SamplingParams(frequency_penalty=0.5), SamplingParams(frequency_penalty=-1.0)],
        [SamplingParams(presence_penalty=1.5), SamplingParams(presence_penalty=-0.5)],
        [
            SamplingParams(repetition_penalty=1.2, frequency_penalty=0.3, presence_penalty=0.7),
            SamplingParams(),
        ],
    ],
)
def test_penalties_match_naive_reference(params: list[SamplingParams]) -> None:
    g = torch.Generator().manual_seed(4)
    vocab = 20
    logits = torch.randn(2, vocab, generator=g) * 3
    prompts = [[1, 2, 2, 3], [4]]
    outputs = [[3, 5, 5, 5, 7], []]
    rows = [SamplingRow(p, pr, o) for p, pr, o in zip(params, prompts, outputs, strict=True)]
    md = SamplingMetadata.build(rows, vocab, DEVICE)
    [penalties] = [p for p in md.processors if isinstance(p, Penalties)]
    got = penalties(logits.clone())
    for i in range(2):
        want = naive_penalties(logits[i], prompts[i], outputs[i], params[i])
        torch.testing.assert_close(got[i], want)


def test_penalties_steer_greedy_choice() -> None:
    logits = torch.tensor([[3.0, 2.9, 0.0]])
    p = SamplingParams(temperature=0.0, presence_penalty=1.0)
    assert run(logits, [row(p, [0])]).item() == 1
    assert run(logits, [row(p, [1])]).item() == 0


def test_neutral_params_build_no_optional_tensors() -> None:
    md = SamplingMetadata.build([row(SamplingParams(), [1, 2])], 10, DEVICE)
    assert md.top_k is md.top_p is md.min_p is None
    assert md.presence_penalties is md.frequency_penalties is md.repetition_penalties is None
    assert md.output_counts is md.prompt_mask is None
    assert md.max_num_logprobs is None and md.all_random and not md.all_greedy


def test_build_pads_and_fills_disabled_top_k() -> None:
    params = [SamplingParams(top_k=3, repetition_penalty=1.1), SamplingParams(top_k=50)]
    rows = [row(params[0], [1, 2], prompt=[7]), row(params[1], [], prompt=[8, 9, 6])]
    rows.append(row(SamplingParams()))
    md = SamplingMetadata.build(rows, 10, DEVICE)
    assert md.top_k.tolist() == [3, 10, 10]
    assert md.prompt_mask.nonzero().tolist() == [[0, 7], [1, 6], [1, 8], [1, 9], [2, 0]]
    assert md.output_counts.nonzero().tolist() == [[0, 1], [0, 2]]
    assert md.output_counts.sum().item() == 2


def test_min_tokens_suppresses_eos_and_stop_ids() -> None:
    eos, vocab = 3, 6
    logits = torch.tensor([[0.0, 1.0, 2.0, 9.0, 8.0, 0.0]])
    p = SamplingParams(temperature=0.0, min_tokens=2, stop_token_ids=[4])

    def greedy(out: list[int], params: SamplingParams = p) -> int:
        return run(logits, [row(params, out, eos_token_id=eos)]).item()

    assert greedy([1]) == 2  # eos and stop id 4 both banned
    assert greedy([1, 1]) == eos  # min_tokens reached
    ignore = SamplingParams(temperature=0.0, min_tokens=2, ignore_eos=True)
    assert greedy([], ignore) == eos  # with ignore_eos, eos is not a stop token
    md = SamplingMetadata.build([row(p, [], eos_token_id=eos)], vocab, DEVICE)
    assert md.min_tokens_stop_ids == {0: {3, 4}}


def test_seeded_rows_independent_of_batch() -> None:
    vocab = 1000
    logits = torch.randn(5, vocab, generator=torch.Generator().manual_seed(5))
    seeded = [SamplingParams(seed=11, temperature=1.5), SamplingParams(seed=22, top_p=0.9)]

    def sample(order: list[int], extra: int) -> list[int]:
        torch.manual_seed(extra)  # unseeded rows must not disturb seeded ones
        rows, batch = [], []
        for i in order:
            p = seeded[i] if i < 2 else SamplingParams(temperature=0.0 if i == 4 else 1.0)
            g = make_generator(p.seed, DEVICE) if p.seed is not None else None
            rows.append(row(p, generator=g))
            batch.append(logits[i])
        ids = run(torch.stack(batch), rows).tolist()
        return [ids[order.index(0)], ids[order.index(1)]]

    first = sample([0, 1, 2, 3, 4], 0)
    assert sample([3, 1, 4, 0], 1) == first
    assert sample([1, 0], 2) == first
    # Draws keep coming from the same generator: a second step differs, but reproducibly.
    g1, g2 = make_generator(11, DEVICE), make_generator(11, DEVICE)
    p = seeded[0]
    steps = [[run(logits[:1], [row(p, generator=g)]).item() for _ in range(5)] for g in (g1, g2)]
    assert steps[0] == steps[1] and len(set(steps[0])) > 1


def test_logprobs_from_raw_logits() -> None:
    g = torch.Generator().manual_seed(6)
    logits = (torch.randn(3, 30, generator=g) * 2).to(torch.bfloat16)
    before = logits.clone()
    params = [
        SamplingParams(logprobs=5, repetition_penalty=1.5, temperature=0.0),
        SamplingParams(logprobs=0, temperature=3.0),
        SamplingParams(),
    ]
    rows = [row(p, [int(logits[i].float().argmax())]) for i, p in enumerate(params)]
    out = Sampler()(logits, SamplingMetadata.build(rows, 30, DEVICE))
    assert torch.equal(logits, before)  # caller's logits untouched
    lp = out.logprobs
    raw = torch.log_softmax(logits.float(), -1)
    ids = out.sampled_token_ids
    torch.testing.assert_close(lp.sampled_logprobs, raw.gather(1, ids[:, None]).squeeze(1))
    ranks = [(raw[i] >= raw[i, ids[i]]).sum().item() for i in range(3)]
    assert lp.sampled_ranks.tolist() == ranks
    assert ranks[0] > 1  # the penalty moved greedy off the raw argmax
    assert lp.topk_token_ids.shape == lp.topk_logprobs.shape == (3, 5)
    assert lp.topk_logprobs.dtype == torch.float32
    assert (lp.topk_logprobs[:, :-1] >= lp.topk_logprobs[:, 1:]).all()
    torch.testing.assert_close(lp.topk_logprobs, raw.gather(1, lp.topk_token_ids))
    assert lp.topk_token_ids[:, 0].tolist() == raw.argmax(-1).tolist()


def test_logprobs_zero_gives_only_sampled_token() -> None:
    md = SamplingMetadata.build([row(SamplingParams(logprobs=0))], 10, DEVICE)
    lp = Sampler()(torch.randn(1, 10), md).logprobs
    assert lp.topk_token_ids.shape == (1, 0) and lp.sampled_logprobs.shape == (1,)


def test_processors_are_built_once_in_order_and_only_when_used() -> None:
    from pagedllm.model.layers.logits_processors import MinTokens, TokenRestrictions
    from pagedllm.model.layers.token_constraints import TokenConstraints

    plain = SamplingMetadata.build([SamplingRow(SamplingParams(), [1], [])], 8, DEVICE)
    assert plain.processors == ()
    rows = [SamplingRow(SamplingParams(min_tokens=2, repetition_penalty=1.3,
                                       logit_bias={3: 5.0}), [1], [], eos_token_id=0)]
    md = SamplingMetadata.build(rows, 8, DEVICE, constraints=TokenConstraints.build(rows))
    assert [type(p) for p in md.processors] == [TokenRestrictions, MinTokens, Penalties]
    logits = Sampler()(torch.zeros(1, 8), md).sampled_token_ids
    assert logits.tolist() == [3]  # the bias wins; EOS (0) is banned until min_tokens


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.8, top_k=3, top_p=0.9, min_p=0.05, logprobs=2),
    SamplingParams(temperature=0.0, repetition_penalty=1.3, logit_bias={1: -5.0}),
    SamplingParams(temperature=0.0, min_tokens=4, stop_token_ids=[1]),
], ids=["greedy", "random-filters", "processors", "min-tokens"])
def test_float32_logits_never_modified(params: SamplingParams) -> None:
    """Without processors the sampler reads float32 logits without copying them; with or
    without, the caller's tensor is left as it was."""
    logits = torch.randn(4, 40, generator=torch.Generator().manual_seed(3))
    before = logits.clone()
    torch.manual_seed(0)
    run(logits, [row(params, [2, 5]) for _ in range(4)])
    assert torch.equal(logits, before)
