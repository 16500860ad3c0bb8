"""Units of speculative/: the config's validation, n-gram lookup, the rejection sampler's
output distribution (against the target's, chi-square), adaptive back-off, and trimming a
request's draft slots in the block manager."""

from __future__ import annotations

import pytest
import torch

from pagedllm.config.speculative import METHODS, SpeculativeConfig
from pagedllm.core.block_manager import BlockInvariantError, BlockManager
from pagedllm.core.request import Request
from pagedllm.sampling_params import SamplingParams
from pagedllm.speculative.adaptive import DraftState, num_to_propose, required_acceptance
from pagedllm.speculative.ngram import NgramProposer
from pagedllm.speculative.proposer import Proposer
from pagedllm.speculative.registry import PROPOSERS
from pagedllm.worker.rejection_sampler import num_matching, rejection_sample


def chi2_pvalue(observed: torch.Tensor, expected_probs: torch.Tensor) -> float:
    """Pearson's goodness of fit over the cells with expected count >= 5 (rest pooled)."""
    n = observed.sum()
    expected = expected_probs.double() * n
    big = expected >= 5
    obs = torch.cat([observed[big].double(), observed[~big].double().sum().reshape(1)])
    exp = torch.cat([expected[big], expected[~big].sum().reshape(1)])
    keep = exp > 0
    stat = ((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()
    dof = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), stat / 2))


def test_config_validation_and_parse():
    cfg = SpeculativeConfig.parse('{"method": "ngram", "num_speculative_tokens": 3}')
    assert cfg.num_speculative_tokens == 3 and cfg.method == "ngram"
    assert SpeculativeConfig.parse(None) is None
    for bad, msg in [({"method": "medusa"}, "method must be one of"),
                     ({"num_speculative_tokens": 0}, r"\[1, 16\]"),
                     ({"prompt_lookup_min": 5, "prompt_lookup_max": 2}, "prompt_lookup_min"),
                     ({"method": "draft_model"}, "needs \"model\""),
                     ({"typo": 1}, "unknown speculative_config key"),
                     ({"min_acceptance_rate": "x"}, "invalid speculative_config"),
                     ("{not json", "not valid JSON")]:
        with pytest.raises(ValueError, match=msg):
            SpeculativeConfig.parse(bad)


def test_ngram_proposals():
    p = NgramProposer(SpeculativeConfig(prompt_lookup_min=2, prompt_lookup_max=3))
    # suffix "2 3" (and "1 2 3") occurred before: propose what followed its last occurrence
    assert p.propose_tokens([1, 2, 3, 4, 5, 9, 1, 2, 3], 2) == [4, 5]
    assert p.propose_tokens([7, 2, 3, 8, 2, 3, 6, 6, 2, 3], 3) == [6, 6, 2]  # most recent match
    assert p.propose_tokens([1, 2, 3, 4], 3) == []  # no recurring suffix
    assert p.propose_tokens([5, 5], 3) == []  # too short for min_n = 2 plus a continuation
    assert p.propose_tokens([1, 2, 1, 2], 5) == [1, 2]  # continuation cut by the context's end
    assert p.propose_tokens([4, 4, 4, 4, 4, 4], 3) == [4, 4, 4]  # a run: not the last match
    assert p.propose_tokens([1, 2, 1, 2], 0) == []


def test_every_method_has_a_proposer():
    """config/speculative.METHODS (validated without importing proposers) and the registry
    name the same methods; each proposer implements the interface."""
    assert set(METHODS) == set(PROPOSERS)
    assert all(issubclass(cls, Proposer) for cls in PROPOSERS.values())


def test_num_matching():
    assert num_matching([4, 5, 6], [4, 5]) == 2
    assert num_matching([4, 9, 6], [4, 5]) == 1
    assert num_matching([3, 5, 6], [4, 5]) == 0


@pytest.mark.parametrize("k", [1, 3])
def test_rejection_sampler_emits_the_target_distribution(k):
    """Every emitted position follows p, whatever q is: the first token (position 0) and the
    token at the first rejection or bonus are checked against p; acceptance happens."""
    torch.manual_seed(0)
    v, r = 6, 20000
    p = torch.softmax(torch.randn(k + 1, v) * 1.5, dim=-1)
    q = torch.softmax(torch.randn(k, v) * 1.5, dim=-1)
    drafts = torch.stack([torch.multinomial(q[j], r, replacement=True) for j in range(k)], 1)
    target = p.expand(r, k + 1, v)
    draft_p = q.expand(r, k, v)
    g = torch.Generator().manual_seed(1)
    accepted, token = rejection_sample(target, draft_p, drafts, torch.full((r,), k),
                                       [g] * r)
    first = torch.where(accepted > 0, drafts[:, 0], token)
    assert chi2_pvalue(torch.bincount(first, minlength=v), p[0]) > 1e-3
    assert 0 < accepted.float().mean() < k
    if k > 1:  # second emitted token, given that the first draft was accepted: p_1
        second = torch.where(accepted[accepted > 0] > 1, drafts[accepted > 0, 1],
                             token[accepted > 0])
        assert chi2_pvalue(torch.bincount(second, minlength=v), p[1]) > 1e-3


def test_rejection_sampler_padding_and_identical_q():
    """A request with fewer drafts than the batch's K gets its bonus from p at its own
    length; with q == p every draft is accepted."""
    v = 4
    p = torch.tensor([[0.1, 0.2, 0.3, 0.4]] * 3)
    drafts = torch.tensor([[2, 1], [3, 0]])
    target = torch.stack([p, torch.tensor([[0.0, 0.0, 1.0, 0.0]] * 3)])
    draft = torch.stack([p[:2], torch.tensor([[0.0, 0.0, 0.0, 1.0], [1.0, 0, 0, 0]])])
    accepted, token = rejection_sample(target, draft, drafts, torch.tensor([2, 1]),
                                       [None, None])
    assert accepted.tolist()[0] == 2
    # Request 1: d0 = 3 has p = 0 -> rejected; the residual max(p - q, 0) is token 2.
    assert accepted.tolist()[1] == 0 and token.tolist()[1] == 2
    assert 0 <= token.tolist()[0] < v


def test_backoff_and_limits():
    st = DraftState()
    st.record(4, 0)
    st.record(4, 0)  # EMA 1 -> 0.5 -> 0.25 < 0.5: back off 2 steps
    assert st.num_drafts(4) == 1
    assert [st.may_propose(0.5, 2) for _ in range(4)] == [False, False, False, True]
    st.record(4, 0)  # the retry failed: the back-off doubles
    assert [st.may_propose(0.5, 2) for _ in range(5)] == [False] * 5 and st.skip == 0
    assert st.may_propose(0.5, 2)  # retry
    st.record(4, 4)
    assert st.may_propose(0.5, 2) and st.backoff == 0 and st.num_drafts(4) == 4
    # A larger batch needs a higher acceptance rate.
    assert required_acceptance(0.25, 1) == 0.25
    assert 0.6 < required_acceptance(0.25, 4) < required_acceptance(0.25, 8) < 1
    cfg = SpeculativeConfig()
    assert num_to_propose(cfg, num_output=9, max_tokens=10, num_tokens=20,
                          max_model_len=64) == 0
    assert num_to_propose(cfg, num_output=0, max_tokens=10, num_tokens=62,
                          max_model_len=64) == 2


def test_trim_slots_gives_back_the_tail_blocks():
    bm = BlockManager(8, 4)
    req = Request("r", list(range(6)), SamplingParams(), eos_token_id=None)
    assert bm.allocate_slots(req, 6)
    req.num_computed_tokens = 5
    assert bm.allocate_slots(req, 1 + 5)  # last token + 5 drafts: positions 5..10
    assert len(req.block_ids) == 3
    bm.trim_slots(req, 7)  # one draft accepted: keep positions 0..6
    assert len(req.block_ids) == 2 and bm.num_free_blocks == 6
    bm.check_invariants([req])
    with pytest.raises(BlockInvariantError, match="computed KV"):
        bm.trim_slots(req, 4)
