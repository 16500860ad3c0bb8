"""Multi-LoRA vs HF transformers + peft on tiny random Llama / Qwen2 (fp32, CPU).

Adapters of ranks 4/8/16 on q/v only or on every linear, rslora on and off, with random
non-zero A and B: greedy tokens equal peft's, logprobs within 1e-4; a batch mixing three
adapters and the base model gives every row what it gets alone; adapters never share
prefix-cache blocks (the same adapter does)."""

from __future__ import annotations

import random

import pytest

from pagedllm import LoRARequest, SamplingParams

MAX_TOKENS = 12
rng = random.Random(0)
PROMPTS = [[rng.randrange(2, 512) for _ in range(n)] for n in (5, 17, 33)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=3)
BY_ARCH = {"llama": ["llama_r4_qv", "llama_r8_all_rs", "llama_r16_all"],
           "qwen2": ["qwen2_r16_all_rs", "qwen2_r8_qv"]}


def lora(adapters, name: str) -> LoRARequest:
    return LoRARequest(name, list(adapters).index(name) + 1, str(adapters[name]))


@pytest.fixture(scope="module")
def engines(make_llm, tiny_llama_dir, tiny_qwen2_dir):
    return {arch: make_llm(d, enable_lora=True, max_loras=4, max_lora_rank=16)
            for arch, d in (("llama", tiny_llama_dir), ("qwen2", tiny_qwen2_dir))}


def check_vs_reference(out, ref_key, prompt, hf_reference) -> None:
    expected, logprobs = hf_reference.greedy(ref_key, prompt, MAX_TOKENS)
    got = out.outputs[0]
    assert got.token_ids == expected
    for step, entry in enumerate(got.logprobs):
        for tid, lp in entry.items():
            assert lp.logprob == pytest.approx(logprobs[step, tid].item(), abs=1e-4)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_each_adapter_matches_peft(arch, engines, adapters, hf_reference, request) -> None:
    llm = engines[arch]
    base_dir = request.getfixturevalue(f"tiny_{arch}_dir")
    base_out = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY, use_tqdm=False)
    for name in BY_ARCH[arch]:
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY, use_tqdm=False,
                            lora_request=lora(adapters, name))
        changed = False
        for prompt, out, base in zip(PROMPTS, outs, base_out, strict=True):
            check_vs_reference(out, adapters[name], prompt, hf_reference)
            changed |= out.outputs[0].token_ids != base.outputs[0].token_ids
        assert changed, f"{name} did not change any output: the test could not catch a no-op"
    for prompt, base in zip(PROMPTS, base_out, strict=True):
        check_vs_reference(base, base_dir, prompt, hf_reference)
    engine = llm.llm_engine
    assert engine.block_manager.num_free_blocks == engine.num_blocks


def test_mixed_batch_equals_each_alone(engines, adapters, hf_reference, tiny_llama_dir) -> None:
    """3 adapters + the base in one batch; prompts chunked (small token budget) so prefill
    chunks and decodes of different adapters share steps."""
    llm = engines["llama"]
    names = [*BY_ARCH["llama"], None]
    prompts, loras, keys = [], [], []
    for i, prompt in enumerate(PROMPTS * 2):
        name = names[i % 4]
        prompts.append({"prompt_token_ids": prompt})
        loras.append(None if name is None else lora(adapters, name))
        keys.append(tiny_llama_dir if name is None else adapters[name])
    steps = []
    schedule = llm.llm_engine.scheduler.schedule

    def recording():
        out = schedule()
        steps.append({s.request.lora.name if s.request.lora else None for s in out.scheduled})
        return out

    llm.llm_engine.scheduler.schedule = recording
    try:
        outs = llm.generate(prompts, GREEDY, use_tqdm=False, lora_request=loras)
    finally:
        del llm.llm_engine.scheduler.schedule
    assert max(len(s) for s in steps) == 4, "the adapters never ran in the same step"
    for p, out, key in zip(prompts, outs, keys, strict=True):
        check_vs_reference(out, key, p["prompt_token_ids"], hf_reference)


def test_more_adapters_than_slots(make_llm, tiny_llama_dir, adapters, hf_reference) -> None:
    """max_loras=2 and a CPU cache of 2 with 3 adapters: requests wait for a slot, slots and
    the CPU cache evict LRU, outputs stay right."""
    llm = make_llm(tiny_llama_dir, enable_lora=True, max_loras=2, max_lora_rank=16,
                   max_cpu_loras=2)
    names = BY_ARCH["llama"]
    prompts = [{"prompt_token_ids": p} for p in PROMPTS for _ in names]
    loras = [lora(adapters, n) for _ in PROMPTS for n in names]
    outs = llm.generate(prompts, GREEDY, use_tqdm=False, lora_request=loras)
    for p, out, lr in zip(prompts, outs, loras, strict=True):
        check_vs_reference(out, adapters[lr.lora_name], p["prompt_token_ids"], hf_reference)
    assert len(llm.llm_engine.lora.cached_ids) == 2


def test_prefix_cache_never_shared_between_adapters(engines, adapters, hf_reference,
                                                    tiny_llama_dir) -> None:
    llm = engines["llama"]
    fresh = [random.Random(7).randrange(2, 512) for _ in range(40)]  # two full blocks of 16
    prompt = {"prompt_token_ids": fresh}
    a, b = lora(adapters, "llama_r4_qv"), lora(adapters, "llama_r16_all")
    # Same name and id but a different path (other weights) is another adapter too.
    b_renamed = LoRARequest("llama_r4_qv", 9, str(adapters["llama_r16_all"]))
    runs = [(a, "a"), (a, "a"), (b, "b"), (None, "base"), (b_renamed, "b"), (None, "base")]
    cached = []
    for lr, who in runs:
        out = llm.generate([prompt], GREEDY, use_tqdm=False, lora_request=lr)[0]
        key = {"a": adapters["llama_r4_qv"], "b": adapters["llama_r16_all"],
               "base": tiny_llama_dir}[who]
        check_vs_reference(out, key, fresh, hf_reference)
        cached.append(out.num_cached_tokens)
    # a computes, a hits, b misses, base misses, b (renamed) hits b's blocks, base hits.
    assert cached == [0, 32, 0, 0, 32, 32]


def test_lora_request_errors(engines, make_llm, tiny_llama_dir, adapters) -> None:
    llm = engines["llama"]
    with pytest.raises(ValueError, match="got 1 lora_requests for 2 prompts"):
        llm.generate(["a", "b"], lora_request=[lora(adapters, "llama_r4_qv")])
    with pytest.raises(ValueError, match="lora_int_id must be an integer >= 1"):
        LoRARequest("x", 0, "/tmp")
    plain = make_llm(tiny_llama_dir)
    with pytest.raises(ValueError, match="LoRA is not enabled"):
        plain.generate(["a"], lora_request=lora(adapters, "llama_r4_qv"))
    assert not plain.llm_engine.has_unfinished_requests()


def test_lora_is_a_wrapper_installed_on_the_model(engines) -> None:
    """The manager replaced each target linear (every one but lm_head) on its parent with a
    LoRALinear around the untouched Linear; the C++ decode loop stays off (no delta there)."""
    from pagedllm.lora.layer import LoRALinear
    from pagedllm.model.layers.linear import Linear

    model = engines["llama"].llm_engine.model
    layer = model.model.layers[0]
    for lin in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj,
                layer.mlp.down_proj):
        assert type(lin) is LoRALinear and type(lin.base_layer) is Linear
        assert lin.fused_ref(None) is None
    assert type(model.lm_head) is Linear
    assert model.model.fused_decode() is None
