"""`use_beam_search` through `pagedllm serve --data-parallel-size 2`: each step's beams are
routed by prefix (so they find their ancestors' blocks on one replica), and the beams equal
HF `generate(num_beams=4)`."""

from __future__ import annotations

import openai
import pytest
import torch
import transformers

from tests.beam_search_reference import PROMPTS, hf_beams, make_beam_checkpoint
from tests.entrypoints.server_harness import TINY_SERVER_ARGS, start_server, wait_idle

BEAMS, MAX_TOKENS = 4, 10


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tiny_tokenizer):
    return make_beam_checkpoint(tmp_path_factory.mktemp("beam_dp"), tiny_tokenizer)


@pytest.fixture(scope="module")
def dp_server(tmp_path_factory, model_dir):
    args = [
        *TINY_SERVER_ARGS,
        "--data-parallel-size",
        "2",
        "--block-size",
        "4",
        "--served-model-name",
        "m",
    ]
    server = start_server(tmp_path_factory, str(model_dir), args, name="dp_beam")
    yield server
    server.stop()


def test_beams_equal_hf(dp_server, model_dir, tiny_tokenizer):
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    client = openai.OpenAI(base_url=f"{dp_server.base_url}/v1", api_key="x", max_retries=0)
    prompts = [tiny_tokenizer.encode(t) for t in PROMPTS[:3]]
    resp = client.completions.create(
        model="m",
        prompt=prompts,
        n=BEAMS,
        max_tokens=MAX_TOKENS,
        extra_body={"use_beam_search": True, "return_token_ids": True, "length_penalty": 0.5},
    )
    for p, prompt in enumerate(prompts):
        want, _ = hf_beams(hf, prompt, BEAMS, MAX_TOKENS, length_penalty=0.5)
        got = resp.choices[p * BEAMS : (p + 1) * BEAMS]
        assert [c.token_ids for c in got] == want
    assert wait_idle(dp_server.base_url)["pagedllm:kv_cache_usage_perc"] == 0
