"""`LLM.beam_search` with LoRA adapters, one per prompt or none: each prompt's beams equal HF
`generate(num_beams=4)` on the base model + the peft adapter (or the base model alone)."""

from __future__ import annotations

import pytest
import torch
import transformers
from lora_adapters import ALL_LINEARS, make_peft_adapter, peft_model

from pagedllm import BeamSearchParams, LoRARequest
from tests.beam_search_reference import PROMPTS, hf_beams, make_beam_checkpoint

BEAMS, MAX_TOKENS = 4, 10


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory, tiny_tokenizer):
    return make_beam_checkpoint(tmp_path_factory.mktemp("beam_lora_base"), tiny_tokenizer)


@pytest.fixture(scope="module")
def adapter_dir(tmp_path_factory, base_dir):
    return make_peft_adapter(
        base_dir, tmp_path_factory.mktemp("beam_lora"), r=8, targets=ALL_LINEARS, seed=3
    )


def test_per_prompt_adapters(base_dir, adapter_dir, make_llm, tiny_tokenizer):
    llm = make_llm(base_dir, enable_lora=True, max_lora_rank=8, block_size=4, max_model_len=128)
    lora = LoRARequest("a", 1, str(adapter_dir))
    prompts = [tiny_tokenizer.encode(t) for t in PROMPTS[:2]]
    outs = llm.beam_search(
        [{"prompt_token_ids": p} for p in prompts * 2],
        BeamSearchParams(beam_width=BEAMS, max_tokens=MAX_TOKENS),
        lora_request=[lora, lora, None, None],
    )
    hf_lora = peft_model(base_dir, adapter_dir)
    hf_base = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    pairs = zip(prompts * 2, outs, strict=True)
    got = [[s.tokens[len(p) :] for s in out.sequences] for p, out in pairs]
    want = [hf_beams(m, p, BEAMS, MAX_TOKENS)[0] for m in (hf_lora, hf_base) for p in prompts]
    assert got == want
    assert got[:2] != got[2:]  # the adapter changed the beams
    engine = llm.llm_engine
    assert engine.block_manager.num_free_blocks == engine.num_blocks
