"""Offline pooling (`LLM.embed / encode / classify / score`) against HF transformers on tiny
random checkpoints: the decoder's hidden states pooled the same way (last token, mean, CLS;
L2-normalized), a sequence-classification model's score head; under chunked prefill, batched
with prompts of other lengths, with prefix-cache hits, and each request's blocks freed."""

from __future__ import annotations

import pytest
import torch
from hf_pooling import hf_hidden, hf_seq_cls_logits

from pagedllm import EmbeddingRequestOutput, PoolingParams, PoolingRequestOutput, SamplingParams
from tests.conftest import make_tiny_checkpoint

PROMPTS = [
    "The quick brown fox jumps over the lazy dog near the river bank at dawn",
    "hi",
    "Python modules are objects with attributes",
    "a b c d e f g h i j k l m n o p q r s t u v w x y z",
]


def _cos(a, b) -> float:
    return torch.nn.functional.cosine_similarity(torch.as_tensor(a), b, dim=0).item()


def _pool(hidden: torch.Tensor, kind: str) -> torch.Tensor:
    return {"LAST": hidden[-1], "MEAN": hidden.mean(0), "CLS": hidden[0]}[kind]


def _ids(llm, prompt: str) -> list[int]:
    return llm.get_tokenizer().encode(prompt)


def _blocks_all_free(llm) -> bool:
    """No request left and every block back in the free queue (cached ones evictable)."""
    bm = llm.llm_engine.block_manager
    bm.check_invariants([])
    return not llm.llm_engine.has_unfinished_requests() and (
        bm.num_free_blocks == bm.num_usable_blocks
    )


@pytest.mark.parametrize("kind", ["LAST", "MEAN", "CLS"])
def test_embed_equals_hf_pooled_hidden_states(make_llm, tiny_llama_dir, kind):
    """Chunks of 8 tokens: MEAN sums over chunks, LAST / CLS take their chunk's row; the
    batch of mixed lengths equals each prompt run alone."""
    llm = make_llm(
        tiny_llama_dir,
        runner="pooling",
        max_num_batched_tokens=8,
        pooler_config={"pooling_type": kind, "normalize": True},
    )
    outs = llm.embed(PROMPTS, use_tqdm=False)
    assert all(isinstance(o, EmbeddingRequestOutput) for o in outs)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        ids = _ids(llm, prompt)
        assert out.prompt_token_ids == ids
        ref = torch.nn.functional.normalize(_pool(hf_hidden(tiny_llama_dir, ids), kind), dim=0)
        assert len(out.outputs.embedding) == 64
        assert _cos(out.outputs.embedding, ref) > 0.9999
        assert torch.allclose(torch.tensor(out.outputs.embedding), ref, atol=1e-4)
        alone = llm.embed(prompt, use_tqdm=False)[0].outputs.embedding
        assert torch.allclose(torch.tensor(alone), torch.tensor(out.outputs.embedding), atol=1e-5)
    assert _blocks_all_free(llm)
    assert llm.llm_engine.plan.prefix_caching is (kind == "LAST")


def test_converted_decoder_defaults_to_last_token_normalized(make_llm, tiny_llama_dir):
    """--convert embed (runner auto -> pooling): vLLM's defaults, LAST + L2 normalize;
    normalize=False per request gives the raw hidden state; encode returns the tensor."""
    llm = make_llm(tiny_llama_dir, convert="embed")
    ids = _ids(llm, PROMPTS[0])
    hidden = hf_hidden(tiny_llama_dir, ids)
    emb = torch.tensor(llm.embed(PROMPTS[0], use_tqdm=False)[0].outputs.embedding)
    assert torch.allclose(emb, torch.nn.functional.normalize(hidden[-1], dim=0), atol=1e-5)
    raw = llm.embed({"prompt_token_ids": ids}, PoolingParams(normalize=False), use_tqdm=False)[0]
    assert torch.allclose(torch.tensor(raw.outputs.embedding), hidden[-1], atol=1e-4)
    cut = llm.embed(PROMPTS[0], use_tqdm=False, truncate_prompt_tokens=6)[0]
    assert cut.prompt_token_ids == ids[-6:]
    ref = torch.nn.functional.normalize(hf_hidden(tiny_llama_dir, ids[-6:])[-1], dim=0)
    assert torch.allclose(torch.tensor(cut.outputs.embedding), ref, atol=1e-5)
    enc = llm.encode(PROMPTS[0], use_tqdm=False)[0]
    assert isinstance(enc, PoolingRequestOutput) and enc.finished
    assert torch.allclose(enc.outputs.data, emb, atol=1e-6)


def test_last_token_pooling_takes_prefix_cache_hits(make_llm, tiny_llama_dir):
    """LAST pooling needs only the last position: a cached prefix is skipped and the
    embedding is unchanged."""
    llm = make_llm(tiny_llama_dir, runner="pooling", block_size=4)
    prompt = PROMPTS[3]
    first = llm.embed(prompt, use_tqdm=False)[0]
    again = llm.embed(prompt + " again", use_tqdm=False)[0]
    assert first.num_cached_tokens == 0 and again.num_cached_tokens >= 16
    ref = hf_hidden(tiny_llama_dir, again.prompt_token_ids)[-1]
    assert _cos(again.outputs.embedding, ref) > 0.9999


def test_preempted_pooling_request_starts_its_mean_over(make_llm, tiny_llama_dir):
    """A request preempted by recompute after two chunks is prefilled again from position 0;
    its mean pools each position once (the part summed before preemption is dropped)."""
    llm = make_llm(
        tiny_llama_dir,
        runner="pooling",
        max_num_batched_tokens=8,
        pooler_config='{"pooling_type": "MEAN"}',
    )
    engine = llm.llm_engine
    rid = engine.add_request(PROMPTS[0], PoolingParams(task="embed"))
    engine.step()
    engine.step()
    (req,) = engine.scheduler.running
    assert req.num_pooled_positions == 16 and req.pooled is not None
    assert engine.scheduler.preempt(req) is False  # by recompute: back to position 0
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    assert [o.request_id for o in outs] == [rid]
    ref = torch.nn.functional.normalize(
        hf_hidden(tiny_llama_dir, req.prompt_token_ids).mean(0), dim=0
    )
    assert _cos(outs[0].outputs.data, ref) > 0.9999
    assert _blocks_all_free(llm)


def test_matryoshka_dimensions(make_llm, tmp_path, tiny_tokenizer):
    """dimensions keeps the first d values, renormalized (a model whose config says it was
    trained for it); other models refuse dimensions."""
    model_dir = make_tiny_checkpoint(
        tmp_path / "mrl", "llama", tiny_tokenizer, seed=7, is_matryoshka=True
    )
    llm = make_llm(model_dir, runner="pooling", convert="embed")
    out = llm.embed(PROMPTS[2], PoolingParams(dimensions=16), use_tqdm=False)[0]
    ref = torch.nn.functional.normalize(hf_hidden(model_dir, out.prompt_token_ids)[-1][:16], dim=0)
    assert len(out.outputs.embedding) == 16 and _cos(out.outputs.embedding, ref) > 0.9999
    with pytest.raises(ValueError, match="hidden size 64"):
        llm.embed(PROMPTS[2], PoolingParams(dimensions=65), use_tqdm=False)


def test_score_and_classify_equal_hf_sequence_classification(
    make_llm, tiny_scorer_dir, tiny_classifier_dir, tiny_tokenizer
):
    """A *ForSequenceClassification checkpoint runs as pooling by itself: LLM.score joins
    each pair with the tokenizer's pair template and returns sigmoid(logit) (one label),
    in HF's order; LLM.classify the softmax of three labels."""
    llm = make_llm(tiny_scorer_dir, max_num_batched_tokens=8)
    query = "what is a module"
    docs = ["Python modules are objects", "hi", "a b c d e f g", PROMPTS[0]]
    outs = llm.score(query, docs, use_tqdm=False)
    refs = []
    for doc, out in zip(docs, outs, strict=True):
        ids = tiny_tokenizer(query, text_pair=doc)["input_ids"]
        assert out.prompt_token_ids == ids
        refs.append(torch.sigmoid(hf_seq_cls_logits(tiny_scorer_dir, ids))[0].item())
        assert out.outputs.score == pytest.approx(refs[-1], abs=1e-5)
    ranked = sorted(range(len(docs)), key=lambda i: -outs[i].outputs.score)
    assert ranked == sorted(range(len(docs)), key=lambda i: -refs[i])
    cut = llm.score(query, docs[3], use_tqdm=False, truncate_prompt_tokens=8)[0]
    ids = tiny_tokenizer(query, text_pair=docs[3], truncation=True, max_length=8)["input_ids"]
    assert cut.prompt_token_ids == ids and len(ids) == 8
    ref = torch.sigmoid(hf_seq_cls_logits(tiny_scorer_dir, ids))[0].item()
    assert cut.outputs.score == pytest.approx(ref, abs=1e-5)
    pairwise = llm.score([query, "hi"], ["Python modules are objects", "hi"], use_tqdm=False)
    assert pairwise[0].outputs.score == pytest.approx(outs[0].outputs.score, abs=1e-6)

    cls = make_llm(tiny_classifier_dir, runner="pooling")
    out = cls.classify(PROMPTS[0], use_tqdm=False)[0]
    ref = torch.softmax(hf_seq_cls_logits(tiny_classifier_dir, out.prompt_token_ids), 0)
    assert out.outputs.num_classes == 3
    assert torch.allclose(torch.tensor(out.outputs.probs), ref, atol=1e-5)


def test_embedding_model_scores_by_cosine(make_llm, tiny_llama_dir):
    llm = make_llm(tiny_llama_dir, runner="pooling")
    out = llm.score(PROMPTS[0], [PROMPTS[1], PROMPTS[0]], use_tqdm=False)
    a, b = (
        torch.tensor(e.outputs.embedding)
        for e in llm.embed([PROMPTS[0], PROMPTS[1]], use_tqdm=False)
    )
    assert out[0].outputs.score == pytest.approx(_cos(a, b), abs=1e-5)
    assert out[1].outputs.score == pytest.approx(1.0, abs=1e-5)


def test_refusals(make_llm, tiny_llama_dir, tiny_scorer_dir):
    """Each wrong combination is a ValueError that says what to do."""
    pooling = make_llm(tiny_llama_dir, runner="pooling")
    with pytest.raises(ValueError, match="does not generate"):
        pooling.generate("hi", SamplingParams(max_tokens=2), use_tqdm=False)
    with pytest.raises(ValueError, match="Matryoshka"):
        pooling.embed("hi", PoolingParams(dimensions=8), use_tqdm=False)
    with pytest.raises(ValueError, match="activation applies to classification"):
        pooling.embed("hi", PoolingParams(activation=True), use_tqdm=False)
    with pytest.raises(ValueError, match="'classify' is not served"):
        pooling.classify("hi", use_tqdm=False)
    with pytest.raises(ValueError, match="one text_1, or as many"):
        pooling.score(["a", "b"], ["a", "b", "c"], use_tqdm=False)
    generate = make_llm(tiny_llama_dir)
    with pytest.raises(ValueError, match="needs a pooling model"):
        generate.embed("hi", use_tqdm=False)
    for args, match in [
        (dict(runner="pooling", convert="none"), "needs --convert embed"),
        (dict(runner="pooling", convert="classify"), "ForSequenceClassification"),
        (dict(runner="generate", convert="embed"), "needs runner='pooling'"),
        (
            dict(
                runner="pooling",
                speculative_config={"method": "ngram", "num_speculative_tokens": 2},
            ),
            "speculative decoding does not apply",
        ),
        (dict(pooler_config='{"pooling_type": "max"}'), "LAST, MEAN, CLS, ALL"),
        (dict(pooler_config='{"pool": "MEAN"}'), "unknown keys"),
    ]:
        with pytest.raises(ValueError, match=match):
            make_llm(tiny_llama_dir, **args)
    with pytest.raises(ValueError, match="--runner pooling"):
        make_llm(tiny_scorer_dir, runner="generate")
    from pagedllm.config import EngineConfig
    from pagedllm.data_parallel.client import DPEngine

    with pytest.raises(ValueError, match="pooling models .* not supported yet"):
        DPEngine(EngineConfig(model=str(tiny_scorer_dir), data_parallel_size=2, num_threads=1))


def test_embeddings_with_a_lora_adapter(make_llm, tiny_llama_dir, tmp_path):
    """Requests for an adapter and for the base model pool in the same batches: each equals
    HF's hidden states of its own model (peft's LoRA layers for the adapter's)."""
    from lora_adapters import ALL_LINEARS, make_peft_adapter, peft_model

    from pagedllm import LoRARequest

    adapter = make_peft_adapter(tiny_llama_dir, tmp_path / "lora", r=8, targets=ALL_LINEARS)
    llm = make_llm(
        tiny_llama_dir,
        runner="pooling",
        enable_lora=True,
        max_lora_rank=8,
        max_num_batched_tokens=8,
    )
    lora = LoRARequest("emb", 1, str(adapter))
    outs = llm.embed(PROMPTS[:2] * 2, use_tqdm=False, lora_request=[lora, lora, None, None])
    hf = peft_model(tiny_llama_dir, adapter)
    for i, out in enumerate(outs):
        with torch.inference_mode():
            ids = torch.tensor([out.prompt_token_ids])
            hidden = (
                hf.model(ids).last_hidden_state[0]
                if i < 2
                else hf_hidden(tiny_llama_dir, out.prompt_token_ids)
            )
        ref = torch.nn.functional.normalize(hidden[-1].float(), dim=0)
        assert _cos(out.outputs.embedding, ref) > 0.9999, i
    assert _cos(outs[0].outputs.embedding, torch.tensor(outs[2].outputs.embedding)) < 0.999


@pytest.mark.parametrize("kind", ["LAST", "MEAN"])
def test_a_last_chunk_of_one_token(make_llm, tiny_llama_dir, kind):
    """17 tokens in chunks of 8: the last step runs one query token of a computed context,
    shaped as a decode (the CPU backend's fused decode loop may take it)."""
    llm = make_llm(
        tiny_llama_dir,
        runner="pooling",
        max_num_batched_tokens=8,
        pooler_config={"pooling_type": kind},
    )
    ids = list(range(20, 37))
    out = llm.embed({"prompt_token_ids": ids}, use_tqdm=False)[0]
    ref = torch.nn.functional.normalize(_pool(hf_hidden(tiny_llama_dir, ids), kind), dim=0)
    assert _cos(out.outputs.embedding, ref) > 0.9999


def test_reward_pools_every_token(make_llm, tiny_llama_dir, tiny_scorer_dir):
    """--convert reward (vLLM's): ALL pooling, every prompt token's final hidden state as
    is (a decoder) or its score-head output (a *ForSequenceClassification checkpoint),
    rows appended chunk by chunk; such a model serves encode only."""
    llm = make_llm(tiny_llama_dir, runner="pooling", convert="reward", max_num_batched_tokens=8)
    assert not llm.llm_engine.plan.prefix_caching
    outs = llm.reward(PROMPTS[:3], use_tqdm=False)
    for out in outs:
        ref = hf_hidden(tiny_llama_dir, out.prompt_token_ids)
        assert out.outputs.data.shape == ref.shape
        assert torch.allclose(out.outputs.data, ref, atol=1e-4)
    with pytest.raises(ValueError, match="'embed' is not served"):
        llm.embed("hi", use_tqdm=False)
    with pytest.raises(ValueError, match="normalize applies to embeddings"):
        llm.reward("hi", PoolingParams(normalize=True), use_tqdm=False)
    scorer = make_llm(tiny_scorer_dir, convert="reward", max_num_batched_tokens=8)
    out = scorer.reward(PROMPTS[0], use_tqdm=False)[0]
    head = _hf_score_head(tiny_scorer_dir)
    with torch.inference_mode():
        ref = head(hf_hidden(tiny_scorer_dir, out.prompt_token_ids))
    assert out.outputs.data.shape == (len(out.prompt_token_ids), 1)
    assert torch.allclose(out.outputs.data, ref, atol=1e-4)


def _hf_score_head(model_dir):
    import transformers

    return transformers.AutoModelForSequenceClassification.from_pretrained(model_dir).score
