"""A tensor-parallel worker killed mid-request: the request fails, the engine is dead (new
adds refused, /health 503), nothing hangs (collective timeout bounded at 20 s here)."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from fastapi.testclient import TestClient

from pagedllm.engine.async_engine import AsyncEngine, EngineDead, EngineRequest
from pagedllm.engine.llm_engine import LLMEngine
from pagedllm.entrypoints.api_server import build_app
from pagedllm.sampling_params import SamplingParams


def test_killed_worker_fails_the_engine_cleanly(tiny_llama_dir, monkeypatch):
    monkeypatch.setenv("PAGEDLLM_DIST_TIMEOUT_S", "20")
    engine = LLMEngine.from_engine_args(model=str(tiny_llama_dir), tensor_parallel_size=2,
                                        num_threads=1, kv_cache_memory="4MiB",
                                        max_model_len=1024, generation_config="vllm")
    params = SamplingParams(max_tokens=1000, temperature=0, ignore_eos=True)

    async def main():
        front = AsyncEngine(engine)
        front.start()
        try:
            stream = await front.add_requests([EngineRequest("long", list(range(5, 20)),
                                                             params)])
            outputs = stream.__aiter__()
            await asyncio.wait_for(outputs.__anext__(), 60)  # it is generating
            os.kill(engine.executor.procs[0].pid, signal.SIGKILL)

            async def drain():
                async for _ in outputs:
                    pass

            with pytest.raises(EngineDead):
                await asyncio.wait_for(drain(), 60)
            assert front.dead is not None
            with pytest.raises(EngineDead):
                await front.add_requests([EngineRequest("late", [5, 6], params)])
            assert TestClient(build_app(front)).get("/health").status_code == 503
        finally:
            await asyncio.to_thread(front.stop)

    try:
        asyncio.run(main())
    finally:
        engine.shutdown()
