"""The real SmolLM2-135M-Instruct with a PEFT adapter (rank 8, every linear): greedy tokens
equal HF transformers + peft on the same weights, and differ from the base model's."""

from __future__ import annotations

import pytest
from lora_adapters import ALL_LINEARS, make_peft_adapter, peft_model

from pagedllm import LLM, LoRARequest, SamplingParams
from pagedllm.loader import ModelNotFoundError, default_model_path, hf_reference_dir

pytestmark = pytest.mark.slow
PROMPTS = ["The capital of France is", "def fibonacci(n):"]
MAX_TOKENS = 16


def test_smollm2_adapter_greedy_matches_peft(tmp_path, hf_reference) -> None:
    try:
        default_model_path()
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))
    llm = LLM(kv_cache_memory=64 * 2**20, max_model_len=512, num_threads=1, enable_lora=True,
              max_loras=2, max_lora_rank=8, int8_activations=False)  # the exact path: peft's
    hf_dir = hf_reference_dir(None)
    adapter = make_peft_adapter(hf_dir, tmp_path / "smol_lora", r=8, targets=ALL_LINEARS,
                                std=0.05, seed=3)
    hf_reference.register(adapter, peft_model(hf_dir, adapter))
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    lr = LoRARequest("smol", 1, str(adapter))
    outs = llm.generate(PROMPTS * 2, params, use_tqdm=False, lora_request=[lr, lr, None, None])
    for out in outs[:2]:
        expected, _ = hf_reference.greedy(adapter, out.prompt_token_ids, MAX_TOKENS)
        assert out.outputs[0].token_ids == expected, out.prompt
    assert [o.outputs[0].token_ids for o in outs[:2]] != [o.outputs[0].token_ids
                                                          for o in outs[2:]]
