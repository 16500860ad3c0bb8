"""The training forward (the serving layers over a right-padded batch, causal attention, no
KV cache) gives HF transformers' logits on every architecture we serve, with sequences
longer than the Mistral / Gemma 3 sliding windows."""

from __future__ import annotations

import pytest
import torch

from pagedllm.finetune import model as tm
from pagedllm.loader import load_checkpoint


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral", "qwen3", "gemma3"])
def test_training_forward_matches_hf(arch, request, hf_reference) -> None:
    path = request.getfixturevalue(f"tiny_{arch}_dir")
    model = tm.load_base(load_checkpoint(str(path), quantization="none"), torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    lengths = [40, 23, 33]
    ids = torch.randint(2, 512, (3, max(lengths)), generator=gen)
    valid = torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]
    ids = ids.masked_fill(~valid, 0)
    ours = tm.logits(model, ids, valid)
    with torch.no_grad():
        hf = hf_reference.model(path)(ids, attention_mask=valid.long()).logits
    torch.testing.assert_close(ours[valid], hf[valid], atol=2e-4, rtol=1e-4)
