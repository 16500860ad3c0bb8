"""`pagedllm merge-lora` writes a plain HF checkpoint equal to peft's merge_and_unload."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import transformers
from lora_adapters import lora_tensors, write_adapter
from peft import PeftModel

from pagedllm import SamplingParams


def test_merge_lora_equals_merge_and_unload(tmp_path, tiny_llama_dir, adapters, make_llm,
                                             hf_reference) -> None:
    adapter = adapters["llama_r8_all_rs"]
    out = tmp_path / "merged"
    proc = subprocess.run([sys.executable, "-m", "pagedllm.entrypoints.cli", "merge-lora",
                           str(tiny_llama_dir), str(adapter), str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    merged = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    base = transformers.AutoModelForCausalLM.from_pretrained(tiny_llama_dir,
                                                             dtype=torch.float32)
    ref = PeftModel.from_pretrained(base, adapter).merge_and_unload().eval()
    ids = torch.tensor([[5, 17, 99, 300, 42, 7, 250, 11]])
    with torch.no_grad():
        got, want = merged(ids).logits, ref(ids).logits
    assert not any("lora" in k for k in merged.state_dict())
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    # The merged checkpoint serves like any model: greedy equals base + adapter.
    llm = make_llm(out)
    prompt = [3, 9, 27, 81, 243]
    res = llm.generate([{"prompt_token_ids": prompt}],
                       SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
                       use_tqdm=False)[0]
    assert res.outputs[0].token_ids == hf_reference.greedy(adapter, prompt, 8)[0]


def test_merge_lora_errors(tmp_path, tiny_llama_dir, adapters) -> None:
    from pagedllm.lora.merge import merge_lora

    with pytest.raises(ValueError, match="safetensors"):
        merge_lora(tmp_path / "nope", adapters["llama_r4_qv"], tmp_path / "o")
    # An adapter trained on a wider model: refused before anything is written.
    wide = write_adapter(tmp_path / "wide", {}, lora_tensors(
        {f"model.layers.0.self_attn.{p}": (128, 128) for p in ("q_proj", "v_proj")}))
    with pytest.raises(ValueError, match="base-model mismatch at model.layers.0.self_attn.q_proj"):
        merge_lora(tiny_llama_dir, wide, tmp_path / "o2")
    assert not (tmp_path / "o2").exists()
