"""The pooling routes over a real `pagedllm serve --runner pooling` (tiny random checkpoints,
chunked prefill on) with the openai SDK and httpx: /v1/embeddings (strings, token ids, float
and base64, Matryoshka dimensions, usage), /pooling, /classify, /score, /rerank and /v1/rerank against
HF transformers; each runner refusing the other's routes with a 400 naming the runner."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import openai
import pytest
import torch
from hf_pooling import hf_hidden, hf_seq_cls_logits

from tests.conftest import make_tiny_checkpoint
from tests.entrypoints.server_harness import TINY_SERVER_ARGS, start_server, wait_idle

ARGS = [*TINY_SERVER_ARGS, "--served-model-name", "tiny", "--max-num-batched-tokens", "8"]
TEXTS = [
    "The quick brown fox jumps over the lazy dog",
    "hi",
    "Python modules are objects with attributes and a namespace",
]


@pytest.fixture(scope="module")
def embed_dir(tmp_path_factory, tiny_tokenizer):
    """A decoder whose config says it was trained for Matryoshka embeddings."""
    return make_tiny_checkpoint(
        tmp_path_factory.mktemp("mrl"), "llama", tiny_tokenizer, seed=7, is_matryoshka=True
    )


@pytest.fixture(scope="module")
def embed_server(tmp_path_factory, embed_dir):
    srv = start_server(tmp_path_factory, str(embed_dir), [*ARGS, "--runner", "pooling"])
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def score_server(tmp_path_factory, tiny_scorer_dir):
    srv = start_server(tmp_path_factory, str(tiny_scorer_dir), ARGS, name="scorer")
    yield srv
    srv.stop()


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x")


def _ref(model_dir, ids: list[int], dims: int | None = None) -> torch.Tensor:
    return torch.nn.functional.normalize(hf_hidden(model_dir, ids)[-1][:dims], dim=0)


def _close(got, ref: torch.Tensor) -> bool:
    got = torch.tensor(got, dtype=torch.float32)
    return torch.nn.functional.cosine_similarity(got, ref, dim=0).item() > 0.9999


def test_openai_sdk_embeddings(embed_server, embed_dir, tiny_tokenizer):
    """Floats, base64 (the SDK's default, decoded by it), dimensions, token-id inputs."""
    client = _client(embed_server)
    ids = [tiny_tokenizer.encode(t) for t in TEXTS]
    floats = client.embeddings.create(model="tiny", input=TEXTS, encoding_format="float")
    assert [d.index for d in floats.data] == [0, 1, 2] and floats.model == "tiny"
    assert floats.usage.prompt_tokens == floats.usage.total_tokens == sum(map(len, ids))
    for d, i in zip(floats.data, ids, strict=True):
        assert len(d.embedding) == 64 and _close(d.embedding, _ref(embed_dir, i))
    b64 = client.embeddings.create(model="tiny", input=TEXTS)  # SDK asks for base64
    for d, f in zip(b64.data, floats.data, strict=True):
        assert np.allclose(d.embedding, f.embedding, atol=1e-6)
    raw = httpx.post(
        f"{embed_server.base_url}/v1/embeddings",
        timeout=30,
        json={"model": "tiny", "input": TEXTS[0], "encoding_format": "base64"},
    ).json()
    decoded = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    assert np.allclose(decoded, floats.data[0].embedding, atol=1e-6)
    small = client.embeddings.create(
        model="tiny", input=TEXTS[2], dimensions=16, encoding_format="float"
    )
    assert len(small.data[0].embedding) == 16
    assert _close(small.data[0].embedding, _ref(embed_dir, ids[2], 16))
    by_ids = client.embeddings.create(model="tiny", input=ids[0], encoding_format="float")
    assert np.allclose(by_ids.data[0].embedding, floats.data[0].embedding, atol=1e-5)
    tagged = httpx.post(
        f"{embed_server.base_url}/v1/embeddings",
        timeout=30,
        headers={"X-Request-Id": "mine-1"},
        json={"model": "tiny", "input": "hi"},
    )
    assert tagged.headers["x-request-id"] == "mine-1" and tagged.json()["id"] == "embd-mine-1"
    cut = httpx.post(
        f"{embed_server.base_url}/v1/embeddings",
        timeout=30,
        json={"model": "tiny", "input": TEXTS[2], "truncate_prompt_tokens": 5},
    ).json()
    assert cut["usage"]["prompt_tokens"] == 5
    assert _close(cut["data"][0]["embedding"], _ref(embed_dir, ids[2][-5:]))
    many = client.embeddings.create(model="tiny", input=ids, encoding_format="float")
    for d, f in zip(many.data, floats.data, strict=True):
        assert np.allclose(d.embedding, f.embedding, atol=1e-5)
    assert wait_idle(embed_server.base_url)["pagedllm:kv_cache_usage_perc"] == 0


def test_pooling_and_cosine_score_routes(embed_server, embed_dir, tiny_tokenizer):
    base = embed_server.base_url
    out = httpx.post(
        f"{base}/pooling", timeout=30, json={"model": "tiny", "input": [TEXTS[1], TEXTS[0]]}
    ).json()
    assert out["object"] == "list" and [d["index"] for d in out["data"]] == [0, 1]
    assert _close(out["data"][1]["data"], _ref(embed_dir, tiny_tokenizer.encode(TEXTS[0])))
    score = httpx.post(
        f"{base}/score",
        timeout=30,
        json={"model": "tiny", "text_1": TEXTS[0], "text_2": [TEXTS[1], TEXTS[0]]},
    ).json()
    a, b = (_ref(embed_dir, tiny_tokenizer.encode(t)) for t in TEXTS[:2])
    assert score["data"][0]["score"] == pytest.approx(torch.dot(a, b).item(), abs=1e-4)
    assert score["data"][1]["score"] == pytest.approx(1.0, abs=1e-5)


def test_pooling_server_refuses_generation_and_bad_fields(embed_server):
    client = _client(embed_server)
    with pytest.raises(openai.BadRequestError, match="--runner pooling"):
        client.completions.create(model="tiny", prompt="hi", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="--runner pooling"):
        client.chat.completions.create(
            model="tiny", max_tokens=2, messages=[{"role": "user", "content": "hi"}]
        )
    for body, match in [
        ({"input": "hi", "dimensions": 65}, "hidden size 64"),
        ({"input": "hi", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens must be"),
        ({"input": "hi", "mm_processor_kwargs": {"a": 1}}, "mm_processor_kwargs is not"),
        ({"input": []}, "must not be empty"),
        ({"input": [99999]}, "out of range"),
        ({"input": "hi", "encoding_format": "int8"}, "encoding_format"),
    ]:
        r = httpx.post(
            f"{embed_server.base_url}/v1/embeddings", timeout=30, json={"model": "tiny", **body}
        )
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and match in err["message"], err
    r = httpx.post(
        f"{embed_server.base_url}/rerank",
        timeout=30,
        json={"model": "tiny", "query": "a", "documents": []},
    )
    assert r.status_code == 400 and "documents" in r.json()["error"]["message"]
    r = httpx.post(
        f"{embed_server.base_url}/score",
        timeout=30,
        json={"model": "tiny", "text_1": "a", "text_2": "b", "activation": True},
    )
    assert r.status_code == 400 and "activation applies" in r.json()["error"]["message"]


def test_rerank_and_score_equal_hf_cross_encoder(score_server, tiny_scorer_dir, tiny_tokenizer):
    """Relevance = sigmoid of the one-label head over query + document joined by the
    tokenizer's pair template; results ordered by it, top_n cut, documents echoed."""
    query = "what is a module"
    docs = ["Python modules are objects", "hi", "a b c d e f g", TEXTS[0]]
    refs = [
        torch.sigmoid(
            hf_seq_cls_logits(tiny_scorer_dir, tiny_tokenizer(query, text_pair=d)["input_ids"])
        )[0].item()
        for d in docs
    ]
    order = sorted(range(len(docs)), key=lambda i: -refs[i])
    for path in ("rerank", "v1/rerank"):
        out = httpx.post(
            f"{score_server.base_url}/{path}",
            timeout=30,
            json={"model": "tiny", "query": query, "documents": docs, "top_n": 3},
        ).json()
        assert [r["index"] for r in out["results"]] == order[:3]
        for r in out["results"]:
            assert r["relevance_score"] == pytest.approx(refs[r["index"]], abs=1e-5)
            assert r["document"] == {"text": docs[r["index"]]}
        assert out["usage"]["total_tokens"] == sum(
            len(tiny_tokenizer(query, text_pair=d)["input_ids"]) for d in docs
        )
    score = httpx.post(
        f"{score_server.base_url}/score",
        timeout=30,
        json={"model": "tiny", "text_1": [query, query], "text_2": docs[:2]},
    ).json()
    assert [d["score"] for d in score["data"]] == pytest.approx(refs[:2], abs=1e-5)
    cls = httpx.post(
        f"{score_server.base_url}/classify",
        timeout=30,
        json={"model": "tiny", "input": [docs[0], docs[3]]},
    ).json()
    for d, doc in zip(cls["data"], (docs[0], docs[3]), strict=True):
        ref = torch.sigmoid(hf_seq_cls_logits(tiny_scorer_dir, tiny_tokenizer.encode(doc)))
        assert d["num_classes"] == 1 and d["label"] == "LABEL_0"
        assert d["probs"] == pytest.approx(ref.tolist(), abs=1e-5)
    r = httpx.post(
        f"{score_server.base_url}/v1/embeddings", timeout=30, json={"model": "tiny", "input": "hi"}
    )
    assert r.status_code == 400 and "'embed' is not served" in r.json()["error"]["message"]


def test_generate_server_refuses_pooling_routes(tmp_path_factory, tiny_llama_dir):
    srv = start_server(tmp_path_factory, str(tiny_llama_dir), ARGS, name="generate")
    try:
        for path, body in [
            ("v1/embeddings", {"input": "hi"}),
            ("pooling", {"input": "hi"}),
            ("classify", {"input": "hi"}),
            ("score", {"text_1": "a", "text_2": "b"}),
            ("v1/rerank", {"query": "a", "documents": ["b"]}),
        ]:
            r = httpx.post(f"{srv.base_url}/{path}", json={"model": "tiny", **body}, timeout=30)
            assert r.status_code == 400, r.text
            assert "--runner generate" in r.json()["error"]["message"]
    finally:
        srv.stop()


def test_concurrent_embedding_calls_batch_together(embed_server, embed_dir, tiny_tokenizer):
    """Twelve calls at once (prompts of mixed lengths, chunks of 8) sent at once:
    each answer equals HF on its own prompt; the KV pool is empty after and the idle
    invariant checks found nothing."""
    from concurrent.futures import ThreadPoolExecutor

    texts = [" ".join(TEXTS[i % 3] for _ in range(1 + i % 4)) for i in range(12)]

    def embed(text: str) -> list[float]:
        r = httpx.post(
            f"{embed_server.base_url}/v1/embeddings",
            timeout=60,
            json={"model": "tiny", "input": text},
        )
        assert r.status_code == 200, r.text
        return r.json()["data"][0]["embedding"]

    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(embed, texts))
    for text, emb in zip(texts, results, strict=True):
        assert _close(emb, _ref(embed_dir, tiny_tokenizer.encode(text)))
    m = wait_idle(embed_server.base_url)
    assert m["pagedllm:kv_cache_usage_perc"] == 0
    assert m["pagedllm:invariant_checks_total"] > 0  # run whenever the engine went idle
    assert m["pagedllm:invariant_violations_total"] == 0


def test_chat_embeddings(embed_server, embed_dir, tiny_tokenizer):
    """vLLM's chat embeddings: `messages` rendered by the model's chat template (no
    generation prompt unless asked), then embedded like a prompt; input and messages
    together, or neither, is a 400."""
    conv = [{"role": "user", "content": "What is a fox?"}]
    for gen in (False, True):
        out = httpx.post(
            f"{embed_server.base_url}/v1/embeddings",
            timeout=30,
            json={"model": "tiny", "messages": conv, "add_generation_prompt": gen},
        ).json()
        ids = tiny_tokenizer.apply_chat_template(conv, add_generation_prompt=gen, tokenize=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        assert out["usage"]["prompt_tokens"] == len(ids)
        assert _close(out["data"][0]["embedding"], _ref(embed_dir, ids))
    for body in ({"input": "hi", "messages": conv}, {}):
        r = httpx.post(
            f"{embed_server.base_url}/v1/embeddings", timeout=30, json={"model": "tiny", **body}
        )
        assert r.status_code == 400 and "either input or messages" in r.text
    r = httpx.post(
        f"{embed_server.base_url}/score",
        timeout=30,
        json={"model": "tiny", "text_1": "a", "text_2": "b", "messages": conv},
    )
    assert r.status_code == 400 and "messages is not supported" in r.text


def test_reward_server_pools_every_token(tmp_path_factory, tiny_llama_dir, tiny_tokenizer):
    """--convert reward: /pooling answers one row per prompt token (floats or base64)."""
    srv = start_server(
        tmp_path_factory,
        str(tiny_llama_dir),
        [*ARGS, "--runner", "pooling", "--convert", "reward"],
        name="reward",
    )
    try:
        ids = tiny_tokenizer.encode(TEXTS[0])
        ref = hf_hidden(tiny_llama_dir, ids)
        out = httpx.post(
            f"{srv.base_url}/pooling", timeout=30, json={"model": "tiny", "input": TEXTS[0]}
        ).json()
        assert torch.allclose(torch.tensor(out["data"][0]["data"]), ref, atol=1e-4)
        b64 = httpx.post(
            f"{srv.base_url}/pooling",
            timeout=30,
            json={"model": "tiny", "input": ids, "encoding_format": "base64"},
        ).json()
        flat = np.frombuffer(base64.b64decode(b64["data"][0]["data"]), dtype="<f4")
        assert np.allclose(flat.reshape(ref.shape), ref.numpy(), atol=1e-4)
        r = httpx.post(
            f"{srv.base_url}/v1/embeddings", timeout=30, json={"model": "tiny", "input": "hi"}
        )
        assert r.status_code == 400 and "'embed' is not served" in r.text
    finally:
        srv.stop()
