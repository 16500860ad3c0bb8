"""--distributed-executor-backend ray: TP=2 with rank 1 a Ray actor in a placement group, on
a local Ray cluster this test starts (loopback, 2 CPUs, no dashboard): greedy tokens and
logits identical to the mp backend; then DP=2 with the replicas as Ray actors. Short runs
(Ray is heavy on a 2-core machine)."""

from __future__ import annotations

import time

import pytest
import ray  # in the dev extra (pyproject.toml): CI installs it
import torch

from pagedllm import SamplingParams
from pagedllm.config import EngineConfig
from pagedllm.engine.llm_engine import LLMEngine
from tests.distributed.tp_harness import engine_kwargs, prompts, record_logits, run

BUDGET = 8 * 2 * 2 * 1 * 16 * 4 * 16  # 8 blocks of the tiny Llama's 1 KV head per rank


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, _node_ip_address="127.0.0.1", include_dashboard=False,
             log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def _generate(model_dir, backend: str):
    engine = LLMEngine(EngineConfig(**engine_kwargs(
        model_dir, 2, BUDGET, distributed_executor_backend=backend)))
    try:
        logits = record_logits(engine)
        return run(engine, prompts()), logits
    finally:
        engine.shutdown()


def test_ray_tp2_matches_mp(tiny_llama_dir, local_ray, monkeypatch):
    monkeypatch.setenv("PAGEDLLM_DIST_TIMEOUT_S", "120")
    tokens_ray, logits_ray = _generate(tiny_llama_dir, "ray")
    assert ray.util.placement_group_table()  # the workers were placed with a group
    tokens_mp, logits_mp = _generate(tiny_llama_dir, "mp")
    assert list(tokens_ray.values()) == list(tokens_mp.values())
    for a, b in zip(logits_mp, logits_ray, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=0)


def test_ray_data_parallel_replicas(tiny_llama_dir, local_ray):
    """DP=2 with the replicas as Ray actors (one bundle each): two prompts without a common
    block go one to each replica, and their tokens equal a single engine's."""
    from pagedllm.data_parallel.client import DPEngine

    kwargs = dict(model=str(tiny_llama_dir), num_threads=1, kv_cache_memory="4MiB",
                  max_model_len=256, generation_config="vllm")
    two = [[5, 6, 7, 8], [9, 10, 11]]
    expected = run(LLMEngine(EngineConfig(**kwargs)), two, max_tokens=6)
    dp = DPEngine(EngineConfig(**kwargs, data_parallel_size=2,
                               distributed_executor_backend="ray"))
    try:
        params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
        for rid, p in zip(expected, two, strict=True):
            dp.add_request(p, params, request_id=rid)
        assert dp.router.routed == [1, 1]
        got: dict[str, list[int]] = {rid: [] for rid in expected}
        deadline = time.monotonic() + 120
        while dp.has_unfinished_requests():
            assert time.monotonic() < deadline
            for out in dp.step():
                assert out.error is None
                got[out.request_id] += out.outputs[0].delta_token_ids
        assert got == expected
    finally:
        dp.shutdown()
