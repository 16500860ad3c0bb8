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


@pytest.mark.parametrize("slides", [False, True])
def test_training_forward_qwen2_window_follows_layer_types(slides, tmp_path, tiny_tokenizer,
                                                           hf_reference) -> None:
    """A Qwen2 config with `use_sliding_window` slides the layers from `max_window_layers` on
    (HF transformers 5's `layer_types`): none of them when it is the layer count, all of them
    when it is 0. Training applies the window exactly where HF (and the engine) do, on
    sequences longer than the window."""
    from tests.conftest import make_tiny_checkpoint

    path = make_tiny_checkpoint(tmp_path / "qwen2_window", "qwen2", tiny_tokenizer, seed=5,
                                use_sliding_window=True, sliding_window=8,
                                max_window_layers=0 if slides else 2)
    model = tm.load_base(load_checkpoint(str(path), quantization="none"), torch.device("cpu"))
    assert tm.sliding_window(model) == (8 if slides else None)
    ids = torch.randint(2, 512, (2, 30), generator=torch.Generator().manual_seed(1))
    valid = torch.ones_like(ids, dtype=torch.bool)
    ours = tm.logits(model, ids, valid)
    with torch.no_grad():
        hf = hf_reference.model(path)(ids, attention_mask=valid.long()).logits
    torch.testing.assert_close(ours, hf, atol=2e-4, rtol=1e-4)
