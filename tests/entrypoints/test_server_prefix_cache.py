"""Prefix caching through the OpenAI server: `cache_salt`, `usage.prompt_tokens_details.
cached_tokens` (full and streamed responses) and the Prometheus counters."""

from __future__ import annotations

import httpx
import openai
import pytest
from server_harness import TINY_SERVER_ARGS, scrape, start_server, wait_idle

from pagedllm.engine.metrics import ServingMetrics
from pagedllm.engine.stats import EngineStats

PROMPT = list(range(100, 140))   # 40 token ids: 2 full blocks of 16 can be served from cache
GREEDY = dict(model="tiny", temperature=0, max_tokens=4)


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_path):
    srv = start_server(tmp_path_factory, tiny_model_path,
                       [*TINY_SERVER_ARGS, "--served-model-name", "tiny"], name="prefix")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


def cached(client, salt: str | None, **kw) -> int:
    out = client.completions.create(prompt=PROMPT, **GREEDY, **kw,
                                    extra_body={"cache_salt": salt} if salt else None)
    return out.usage.prompt_tokens_details.cached_tokens


def test_completions_report_cached_tokens_per_salt(server, client):
    before = scrape(server.base_url)
    assert cached(client, "tenant-a") == 0
    assert cached(client, "tenant-a") == 32
    assert cached(client, "tenant-b") == 0
    # Streamed: the usage chunk carries it too.
    chunks = list(client.completions.create(
        prompt=PROMPT, stream=True, stream_options={"include_usage": True},
        extra_body={"cache_salt": "tenant-b"}, **GREEDY))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 32
    after = wait_idle(server.base_url)
    queries = after["pagedllm:prefix_cache_queries_total"] - (
        before["pagedllm:prefix_cache_queries_total"])
    hits = after["pagedllm:prefix_cache_hits_total"] - before["pagedllm:prefix_cache_hits_total"]
    assert (queries, hits) == (4 * len(PROMPT), 64)


def test_chat_reports_cached_tokens(server, client):
    messages = [{"role": "system", "content": "You are a terse assistant. " * 8},
                {"role": "user", "content": "hi"}]
    usage = [client.chat.completions.create(messages=messages, **GREEDY,
                                            extra_body={"cache_salt": "chat"}).usage
             for _ in range(2)]
    assert usage[0].prompt_tokens_details.cached_tokens == 0
    n = usage[1].prompt_tokens
    assert usage[1].prompt_tokens_details.cached_tokens == (n - 1) // 16 * 16 > 0
    chunks = list(client.chat.completions.create(
        messages=messages, stream=True, stream_options={"include_usage": True},
        extra_body={"cache_salt": "chat"}, **GREEDY))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == (n - 1) // 16 * 16


def test_empty_cache_salt_is_a_400(server):
    r = httpx.post(f"{server.base_url}/v1/completions",
                   json={"prompt": PROMPT, "max_tokens": 2, "cache_salt": ""})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "cache_salt" and "non-empty string" in err["message"]
    wait_idle(server.base_url)


def test_prefix_cache_counters_are_rendered():
    stats = EngineStats(prefix_cache_queries=80, prefix_cache_hits=32)
    text = ServingMetrics("m", lambda: stats).render()
    assert "# TYPE pagedllm:prefix_cache_queries_total counter\n" in text
    assert 'pagedllm:prefix_cache_queries_total{model_name="m"} 80.0\n' in text
    assert 'pagedllm:prefix_cache_hits_total{model_name="m"} 32.0\n' in text
