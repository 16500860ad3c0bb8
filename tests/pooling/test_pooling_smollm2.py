"""SmolLM2-135M-Instruct (the default model, GGUF) served as an embedding model
(`--runner pooling`, vLLM's converted-decoder defaults and MEAN pooling) against HF
transformers' hidden states on the same (dequantized) weights, under chunked prefill."""

from __future__ import annotations

import pytest
import torch
import transformers

from pagedllm import LLM
from pagedllm.loader import ModelNotFoundError, default_model_path, hf_reference_dir

pytestmark = pytest.mark.slow

PROMPTS = [
    "The capital of France is Paris, a city on the Seine.",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
    "Embeddings map text to vectors.",
]


@pytest.fixture(scope="module")
def hf_model():
    try:
        gguf = default_model_path()
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))
    entry = hf_reference_dir(str(gguf))
    if (entry / "model.safetensors").is_file():
        return transformers.AutoModelForCausalLM.from_pretrained(entry, dtype=torch.float32)
    return transformers.AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    ).eval()


@pytest.mark.parametrize("pooler", [None, {"pooling_type": "MEAN", "normalize": True}])
def test_smollm2_embeddings_equal_hf(hf_model, pooler):
    llm = LLM(
        runner="pooling",
        pooler_config=pooler,
        kv_cache_memory=64 * 2**20,
        max_model_len=512,
        max_num_batched_tokens=16,
        num_threads=1,
        int8_activations=False,
    )
    outs = llm.embed(PROMPTS, use_tqdm=False)
    for out in outs:
        with torch.inference_mode():
            hidden = hf_model.model(torch.tensor([out.prompt_token_ids])).last_hidden_state[0]
        pooled = hidden.mean(0) if pooler else hidden[-1]
        ref = torch.nn.functional.normalize(pooled.float(), dim=0)
        got = torch.tensor(out.outputs.embedding)
        assert got.shape == (576,)
        assert torch.nn.functional.cosine_similarity(got, ref, dim=0).item() > 0.9999
