"""The server with LoRA: `model` picks an adapter, /v1/models lists adapters with their
parent, runtime load / unload (gated), 404 / 400 errors, lora metrics; a real process."""

from __future__ import annotations

import json

import httpx
import pytest
from lora_adapters import (
    ALL_LINEARS,
    QV,
    lora_tensors,
    make_peft_adapter,
    peft_model,
    write_adapter,
)
from server_harness import TINY_SERVER_ARGS, pagedllm_server, start_server, wait_idle

PROMPT = [5, 17, 99, 300, 42, 7, 250, 11]
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def lora_dirs(tmp_path_factory, tiny_llama_dir, hf_reference):
    out = {}
    for i, (name, r, targets) in enumerate((("qv", 4, QV), ("all", 8, ALL_LINEARS),
                                           ("late", 16, ALL_LINEARS))):
        path = make_peft_adapter(tiny_llama_dir, tmp_path_factory.mktemp(f"srv_{name}"), r=r,
                                 targets=targets, seed=10 + i)
        hf_reference.register(path, peft_model(tiny_llama_dir, path))
        out[name] = path
    return out


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_llama_dir, lora_dirs):
    spec = json.dumps({"name": "all", "path": str(lora_dirs["all"])})
    args = [*TINY_SERVER_ARGS, "--enable-lora", "--max-loras", "2", "--max-lora-rank", "16",
            "--lora-modules", f"qv={lora_dirs['qv']}", spec]
    srv = start_server(tmp_path_factory, str(tiny_llama_dir), args, name="lora_server",
                       env={"PAGEDLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"})
    yield srv
    srv.stop()


def complete(base_url: str, model: str) -> httpx.Response:
    return httpx.post(f"{base_url}/v1/completions", timeout=60, json={
        "model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0,
        "ignore_eos": True, "logprobs": 0})


def check_tokens(resp: httpx.Response, ref_key, hf_reference, tokenizer) -> None:
    assert resp.status_code == 200, resp.text
    expected, _ = hf_reference.greedy(ref_key, PROMPT, MAX_TOKENS)
    tokens = resp.json()["choices"][0]["logprobs"]["tokens"]
    assert tokens == [tokenizer.decode([t]) for t in expected]


def test_adapters_selected_by_model(server, lora_dirs, tiny_llama_dir, hf_reference,
                                    tiny_tokenizer) -> None:
    url = server.base_url
    cards = {c["id"]: c for c in httpx.get(f"{url}/v1/models").json()["data"]}
    base = str(tiny_llama_dir)
    assert set(cards) == {base, "qv", "all"}
    assert cards["qv"]["parent"] == base and cards["qv"]["root"] == str(lora_dirs["qv"])
    assert cards[base]["parent"] is None
    outs = {}
    for model, key in ((base, tiny_llama_dir), ("qv", lora_dirs["qv"]),
                       ("all", lora_dirs["all"])):
        resp = complete(url, model)
        check_tokens(resp, key, hf_reference, tiny_tokenizer)
        outs[model] = resp.json()["choices"][0]["text"]
        assert resp.json()["model"] == model  # the adapter that answered (vLLM's)
    assert len(set(outs.values())) == 3
    chat = httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
        "model": "all", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert chat.status_code == 200, chat.text
    assert chat.json()["model"] == "all"
    with httpx.stream("POST", f"{url}/v1/chat/completions", timeout=60, json={
            "model": "qv", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
            "stream": True}) as sse_resp:
        events = [json.loads(line[6:]) for line in sse_resp.iter_lines()
                  if line.startswith("data: {")]
    assert events and {e["model"] for e in events} == {"qv"}
    resp = complete(url, "nope")
    assert resp.status_code == 404
    assert resp.json()["error"]["code"] == "model_not_found"
    assert "qv" in resp.json()["error"]["message"]
    text = httpx.get(f"{url}/metrics").text
    assert 'pagedllm:lora_requests_info{' in text and 'max_lora="2"' in text
    wait_idle(url)


def test_runtime_load_unload(server, lora_dirs, tmp_path, hf_reference, tiny_tokenizer) -> None:
    url = server.base_url

    def load(name, path):
        return httpx.post(f"{url}/v1/load_lora_adapter", timeout=60,
                          json={"lora_name": name, "lora_path": str(path)})

    assert load("late", lora_dirs["late"]).status_code == 200
    assert "late" in {c["id"] for c in httpx.get(f"{url}/v1/models").json()["data"]}
    check_tokens(complete(url, "late"), lora_dirs["late"], hf_reference, tiny_tokenizer)
    dup = load("late", lora_dirs["qv"])
    assert dup.status_code == 400 and "already served" in dup.json()["error"]["message"]
    bad = load("bad", tmp_path / "missing")
    assert bad.status_code == 400 and "not a PEFT adapter directory" in bad.text
    qv = {f"model.layers.{i}.self_attn.{p}": (64, 64 if p == "q_proj" else 32)
          for i in range(2) for p in ("q_proj", "v_proj")}
    cases = [({"target_modules": ["query_key_value"]}, qv, "matches no module"),
             ({"target_modules": ["input_layernorm"]}, qv, "is a norm layer"),
             ({"target_modules": ["lm_head"]}, qv, "LoRA on embeddings and lm_head"),
             ({"r": 32}, qv, "exceeds max_lora_rank 16"),
             ({}, {k: (32, 32) for k in qv}, "base-model mismatch"),
             ({"use_dora": True}, qv, "uses DoRA"),
             ({"modules_to_save": ["lm_head"]}, qv, "modules_to_save")]
    for i, (cfg, mods, message) in enumerate(cases):
        path = write_adapter(tmp_path / f"bad{i}", cfg, lora_tensors(mods, r=cfg.get("r", 4)))
        resp = load(f"bad{i}", path)
        assert resp.status_code == 400 and message in resp.json()["error"]["message"], resp.text
    assert httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "late"}).status_code \
        == 200
    assert complete(url, "late").status_code == 404
    gone = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "late"})
    assert gone.status_code == 404
    check_tokens(complete(url, "qv"), lora_dirs["qv"], hf_reference, tiny_tokenizer)
    assert wait_idle(url)["pagedllm:kv_cache_usage_perc"] == 0


def test_runtime_updates_gated(tiny_llama_dir, lora_dirs, monkeypatch) -> None:
    """In-process: without PAGEDLLM_ALLOW_RUNTIME_LORA_UPDATING (or without --enable-lora)
    the routes answer 404 and name what is missing; served adapters still work."""
    import asyncio

    from pagedllm.engine.async_engine import AsyncEngine
    from pagedllm.engine.llm_engine import LLMEngine
    from pagedllm.entrypoints.api_server import build_app
    from pagedllm.lora.request import LoRARequest

    monkeypatch.delenv("PAGEDLLM_ALLOW_RUNTIME_LORA_UPDATING", raising=False)
    qv = LoRARequest("qv", 1, str(lora_dirs["qv"]))
    lora_engine = AsyncEngine(LLMEngine.from_engine_args(
        model=str(tiny_llama_dir), kv_cache_memory="4MiB", enable_lora=True, num_threads=1))
    plain = AsyncEngine(LLMEngine.from_engine_args(model=str(tiny_llama_dir),
                                                   kv_cache_memory="4MiB", num_threads=1))
    body = {"lora_name": "x", "lora_path": str(lora_dirs["all"])}

    async def go(engine, modules, message):
        engine.start()
        try:
            transport = httpx.ASGITransport(app=build_app(engine, lora_modules=modules))
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
                r = await c.post("/v1/load_lora_adapter", json=body)
                assert r.status_code == 404 and message in r.json()["error"]["message"]
                if modules:
                    r = await c.post("/v1/completions", json={"model": "qv", "prompt": PROMPT,
                                                              "max_tokens": 2})
                    assert r.status_code == 200, r.text
        finally:
            await asyncio.to_thread(engine.stop)

    asyncio.run(go(lora_engine, [qv], "PAGEDLLM_ALLOW_RUNTIME_LORA_UPDATING=1"))
    asyncio.run(go(plain, None, "start it with --enable-lora"))


def test_bad_lora_module_stops_startup(tiny_llama_dir, tmp_path) -> None:
    bad = write_adapter(tmp_path / "bad", {"target_modules": ["query_key_value"]},
                        lora_tensors({"model.layers.0.self_attn.q_proj": (64, 64)}))
    proc = pagedllm_server(str(tiny_llama_dir), [*TINY_SERVER_ARGS, "--enable-lora",
                                                 "--lora-modules", f"bad={bad}"],
                           tmp_path / "bad.log")
    assert proc.proc.wait(timeout=120) != 0
    assert "target module 'query_key_value' matches no module" in proc.log()
    assert "Traceback" not in proc.log()
