"""Sampling with speculation keeps the target's distribution: over a small vocabulary
(allowed_token_ids), the tokens emitted at the verified positions of many seeded samples
match the exact marginals computed with HF transformers (chi-square), with and without
speculation, for n-gram (point-mass) drafts and for a draft model (rejection sampling)."""

from __future__ import annotations

import pytest
import torch

from pagedllm import SamplingParams
from tests.speculative.test_units import chi2_pvalue

N = 400
T = 1.5


@pytest.fixture(scope="module")
def setup(tiny_llama_dir, hf_reference):
    """(prompt, allowed tokens S, exact marginals of output positions 0, 1, 2 over S)."""
    model = hf_reference.model(tiny_llama_dir)

    @torch.inference_mode()
    def dist(prefixes: list[list[int]]) -> torch.Tensor:
        logits = model(torch.tensor(prefixes)).logits[:, -1].float()
        return torch.softmax(logits[:, s] / T, dim=-1)

    first = model(torch.tensor([[41] * 6])).logits[0, -1]
    s = first.topk(6).indices.tolist()
    prompt = [41] * 6 + s + s  # every allowed token occurs earlier: n-gram always proposes
    p0 = dist([prompt])[0]
    p1_given = dist([prompt + [a] for a in s])  # [6, 6]
    p1 = p0 @ p1_given
    p2_given = dist([prompt + [a, b] for a in s for b in s]).view(6, 6, 6)
    p2 = torch.einsum("a,ab,abc->c", p0, p1_given, p2_given)
    return prompt, s, [p0, p1, p2]


@pytest.mark.parametrize("method", [None, "ngram", "draft_model"])
def test_emitted_tokens_follow_the_target_distribution(tiny_llama_dir, close_draft_dir,
                                                       make_llm, setup, method):
    prompt, s, marginals = setup
    spec = None
    if method is not None:
        spec = {"method": method, "num_speculative_tokens": 2, "prompt_lookup_min": 1,
                "min_acceptance_rate": 0.0, "disable_by_batch_size": None}
        if method == "draft_model":
            spec["model"] = str(close_draft_dir)
    llm = make_llm(tiny_llama_dir, speculative_config=spec, kv_cache_memory=32 * 2**20)
    # logprobs: the rejection sampler's resampled tokens get their own logprobs
    params = [SamplingParams(temperature=T, seed=i, max_tokens=3, ignore_eos=True,
                             allowed_token_ids=s, logprobs=1) for i in range(N)]
    outs = llm.generate([prompt] * N, params, use_tqdm=False)
    index = {t: i for i, t in enumerate(s)}
    emitted = torch.tensor([[index[t] for t in o.outputs[0].token_ids] for o in outs])
    for pos in range(3):
        counts = torch.bincount(emitted[:, pos], minlength=len(s))
        assert chi2_pvalue(counts, marginals[pos]) > 1e-3, (pos, counts, marginals[pos])
    for o in outs[:50]:
        c = o.outputs[0]
        assert all(t in entry and entry[t].logprob <= 0 for t, entry in
                   zip(c.token_ids, c.logprobs, strict=True))
    sd = llm.llm_engine.stats.speculative
    if method is not None:  # the verified positions really came from speculation
        assert sd.num_drafts >= N // 2 and 0 < sd.num_accepted_tokens < sd.num_draft_tokens
