"""SamplingParams.prompt_logprobs on a tiny random Llama, against HF transformers' log-softmax
over the prompt positions: chunked prefill (a chunk's last position scores the next chunk's
first token), prefix caching (a cached prefix is still scored, and the request's blocks still
enter the cache), batched with requests that do not ask, preemption by recompute, and the
validation of the field."""

from __future__ import annotations

import pytest
import torch

from pagedllm import SamplingParams
from pagedllm.core.request import PromptLogprobsOrderError, Request

TOP = 3


@pytest.fixture(scope="module")
def hf_model(tiny_llama_dir):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(
        tiny_llama_dir, dtype=torch.float32
    ).eval()


@torch.inference_mode()
def hf_logprobs(model, ids: list[int]) -> torch.Tensor:
    """[len(ids), V]: row p is the log-softmax predicting token p + 1."""
    return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)


def check_against_hf(model, ids: list[int], prompt_logprobs, k: int) -> None:
    ref = hf_logprobs(model, ids)
    assert len(prompt_logprobs) == len(ids)
    assert prompt_logprobs[0] is None
    for p in range(len(ids) - 1):
        entry, row, tok = prompt_logprobs[p + 1], ref[p], ids[p + 1]
        assert entry[tok].logprob == pytest.approx(float(row[tok]), abs=1e-4)
        assert entry[tok].rank == int((row >= row[tok]).sum())
        assert entry[tok].decoded_token is not None
        top_ids = row.topk(k).indices.tolist()
        # The actual token, then the top k (one of which may be the actual token).
        assert set(entry) == {tok, *top_ids}
        for rank, tid in enumerate(top_ids, start=1):
            assert entry[tid].logprob == pytest.approx(float(row[tid]), abs=1e-4)
            if tid != tok:
                assert entry[tid].rank == rank


def prompts(tokenizer) -> list[list[int]]:
    texts = [
        "The quick brown fox jumps over the lazy dog and keeps on running far away "
        "into the distant hills where nobody can find it again",
        "Hello world",
        "x",
    ]
    return [tokenizer.encode(t) for t in texts] + [[5, 6]]


def test_chunked_prefill_matches_hf(tiny_llama_dir, make_llm, hf_model, tiny_tokenizer):
    """Chunks of at most 8 tokens, four prompts (one of one token) scored beside two requests
    that do not ask; those generate exactly what they generate alone."""
    llm = make_llm(
        tiny_llama_dir, block_size=8, max_num_batched_tokens=8, enable_prefix_caching=False
    )
    ids = prompts(tiny_tokenizer)
    assert len(ids[0]) > 16 and len(ids[2]) == 1
    scored = SamplingParams(temperature=0.0, max_tokens=3, prompt_logprobs=TOP)
    plain = SamplingParams(temperature=0.0, max_tokens=5)
    alone = [
        o.outputs[0].token_ids
        for o in llm.generate(
            [{"prompt_token_ids": ids[0]}, {"prompt_token_ids": ids[1]}], plain, use_tqdm=False
        )
    ]
    inputs = [{"prompt_token_ids": x} for x in ids]
    outs = llm.generate(
        inputs[:2] + inputs + inputs[:2],
        [plain, plain] + [scored] * 4 + [plain, plain],
        use_tqdm=False,
    )
    for out, x in zip(outs[2:6], ids, strict=True):
        check_against_hf(hf_model, x, out.prompt_logprobs, TOP)
    for out in outs[:2] + outs[6:]:
        assert out.prompt_logprobs is None
    assert [o.outputs[0].token_ids for o in outs[:2]] == alone
    assert [o.outputs[0].token_ids for o in outs[6:]] == alone


def test_prompt_logprobs_zero_keeps_only_the_actual_token(
    tiny_llama_dir, make_llm, hf_model, tiny_tokenizer
):
    llm = make_llm(tiny_llama_dir)
    ids = prompts(tiny_tokenizer)[1]
    out = llm.generate(
        {"prompt_token_ids": ids}, SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False
    )[0]
    assert [list(e) for e in out.prompt_logprobs[1:]] == [[t] for t in ids[1:]]
    check_against_hf(hf_model, ids, out.prompt_logprobs, 0)


def test_cached_prefix_is_still_scored(tiny_llama_dir, make_llm, hf_model, tiny_tokenizer):
    """A prefix in the cache is recomputed for a request that scores it (vLLM's rule), the
    request's own blocks enter the cache, and a later ordinary request hits them."""
    llm = make_llm(
        tiny_llama_dir, block_size=8, max_num_batched_tokens=16, enable_prefix_caching=True
    )
    ids = prompts(tiny_tokenizer)[0]
    prefix = ids[:16]
    greedy = SamplingParams(temperature=0.0, max_tokens=2)
    llm.generate({"prompt_token_ids": prefix}, greedy, use_tqdm=False)
    scored = llm.generate(
        {"prompt_token_ids": ids},
        SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=TOP),
        use_tqdm=False,
    )[0]
    assert scored.num_cached_tokens == 0
    check_against_hf(hf_model, ids, scored.prompt_logprobs, TOP)
    again = llm.generate({"prompt_token_ids": ids}, greedy, use_tqdm=False)[0]
    assert again.num_cached_tokens == len(ids) // 8 * 8
    assert again.outputs[0].token_ids == scored.outputs[0].token_ids


def test_preempted_request_is_scored_once(tiny_llama_dir, make_llm, hf_model, tiny_tokenizer):
    """A KV pool too small for all requests: some are preempted by recompute mid-prompt or
    mid-output; each prompt position is still scored exactly once and matches HF."""
    llm = make_llm(
        tiny_llama_dir,
        block_size=8,
        max_num_batched_tokens=8,
        max_num_seqs=4,
        max_model_len=64,
        kv_cache_memory=10 * 8 * 512,  # 10 blocks of 8
        enable_prefix_caching=False,
    )
    ids = prompts(tiny_tokenizer)[0]
    params = SamplingParams(temperature=0.0, max_tokens=12, prompt_logprobs=1, ignore_eos=True)
    outs = llm.generate(
        [{"prompt_token_ids": ids[: 20 + i]} for i in range(4)], params, use_tqdm=False
    )
    assert llm.llm_engine.stats.num_preemptions_total > 0
    for i, out in enumerate(outs):
        check_against_hf(hf_model, ids[: 20 + i], out.prompt_logprobs, 1)


def test_n_samples_share_the_prompt_logprobs(tiny_llama_dir, make_llm, tiny_tokenizer):
    llm = make_llm(tiny_llama_dir)
    ids = prompts(tiny_tokenizer)[1]
    out = llm.generate(
        {"prompt_token_ids": ids},
        SamplingParams(n=3, max_tokens=4, seed=1, prompt_logprobs=2),
        use_tqdm=False,
    )[0]
    assert len(out.outputs) == 3 and len(out.prompt_logprobs) == len(ids)


@pytest.mark.parametrize("value", [-1, 1.5, True])
def test_prompt_logprobs_must_be_a_non_negative_int(value):
    with pytest.raises(ValueError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=value)


def test_prompt_logprobs_bounded_by_max_logprobs(tiny_llama_dir, make_llm):
    llm = make_llm(tiny_llama_dir, max_logprobs=4)
    with pytest.raises(ValueError, match=r"prompt_logprobs must be <= max_logprobs \(4"):
        llm.generate("hi", SamplingParams(prompt_logprobs=5), use_tqdm=False)


def test_chunks_must_arrive_in_order():
    req = Request("r", [1, 2, 3, 4], SamplingParams(prompt_logprobs=0), eos_token_id=None)
    assert req.prompt_scoring_pending
    req.add_prompt_logprobs(0, [{2: None}])
    with pytest.raises(PromptLogprobsOrderError, match="from position 2"):
        req.add_prompt_logprobs(2, [{4: None}])
    req.add_prompt_logprobs(1, [{3: None}, {4: None}])
    assert not req.prompt_scoring_pending


def test_logits_in_bounded_slices(tiny_llama_dir, make_llm, hf_model, tiny_tokenizer, monkeypatch):
    """Slices of 3 rows: sampling rows split over slices, a slice mixing sampling and prompt
    rows, prompt rows over many slices; no compute_logits call sees more than 3 rows and the
    results are those of one big slice."""
    from pagedllm.worker import prompt_logprobs

    monkeypatch.setattr(prompt_logprobs, "SLICE_ELEMENTS", 1)
    monkeypatch.setattr(prompt_logprobs, "MIN_SLICE_ROWS", 3)
    llm = make_llm(tiny_llama_dir, enable_prefix_caching=False)
    model = llm.llm_engine.model
    inner, sizes = model.compute_logits, []

    def compute_logits(hidden):
        sizes.append(hidden.shape[0])
        return inner(hidden)

    monkeypatch.setattr(model, "compute_logits", compute_logits)
    ids = prompts(tiny_tokenizer)
    plain = SamplingParams(temperature=0.0, max_tokens=4)
    scored = SamplingParams(temperature=0.0, max_tokens=4, prompt_logprobs=TOP)
    inputs = [{"prompt_token_ids": x} for x in ids]
    outs = llm.generate(inputs + inputs, [plain] * 4 + [scored] * 4, use_tqdm=False)
    assert max(sizes) == 3 and len(sizes) > 10
    for out, x in zip(outs[4:], ids, strict=True):
        check_against_hf(hf_model, x, out.prompt_logprobs, TOP)
    monkeypatch.setattr(model, "compute_logits", inner)
    alone = llm.generate(inputs, plain, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs[:4]] == [o.outputs[0].token_ids for o in alone]


@pytest.mark.parametrize("checkpoint", ["tiny_gemma3_dir", "tiny_qwen3_dir", "tiny_mistral_dir"])
def test_other_families_match_hf(checkpoint, request, make_llm, tiny_tokenizer):
    """Sliding windows shorter than the prompt (Gemma 3: 16 on 3 of 4 layers, Mistral: 24),
    several KV groups, per-head q/k norms, chunks of 8."""
    import transformers

    model_dir = request.getfixturevalue(checkpoint)
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    llm = make_llm(model_dir, block_size=8, max_num_batched_tokens=8)
    ids = prompts(tiny_tokenizer)
    ids = [ids[0] + ids[0], *ids]
    params = SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=2)
    outs = llm.generate([{"prompt_token_ids": x} for x in ids], params, use_tqdm=False)
    for out, x in zip(outs, ids, strict=True):
        check_against_hf(hf.eval(), x, out.prompt_logprobs, 2)
