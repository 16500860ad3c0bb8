"""Helpers of the LoRA tests: PEFT-made adapters with random non-zero A and B, and the HF +
peft reference (greedy with per-step log_softmax) for them."""

from __future__ import annotations

from pathlib import Path

import torch

ALL_LINEARS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
QV = ["q_proj", "v_proj"]


def make_peft_adapter(base_dir: Path, out_dir: Path, *, r: int, targets, rslora: bool = False,
                      alpha: float | None = None, seed: int = 0, std: float = 0.15,
                      **extra) -> Path:
    """Save a PEFT LoRA adapter for `base_dir` whose lora_A and lora_B are random (PEFT's
    default init has B = 0, a no-op adapter that could not catch a wrong delta)."""
    import transformers
    from peft import LoraConfig, get_peft_model

    base = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    cfg = LoraConfig(r=r, lora_alpha=alpha if alpha is not None else 2 * r,
                     target_modules=targets, use_rslora=rslora, lora_dropout=0.0, **extra)
    model = get_peft_model(base, cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * std)
    model.save_pretrained(out_dir)
    return out_dir


def peft_model(base_dir: Path, adapter_dir: Path) -> torch.nn.Module:
    """HF model with the adapter injected (peft's LoRA layers), for HFReference.register."""
    import transformers
    from peft import PeftModel

    base = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    return PeftModel.from_pretrained(base, adapter_dir).base_model.model.eval()


def write_adapter(path: Path, config: dict, tensors: dict[str, torch.Tensor]) -> Path:
    """A hand-written PEFT adapter directory (config fields default to a plain LoRA)."""
    import json

    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    cfg = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "bias": "none",
           "target_modules": ["q_proj", "v_proj"], **config}
    (path / "adapter_config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in tensors.items()},
              str(path / "adapter_model.safetensors"))
    return path


def lora_tensors(modules: dict[str, tuple[int, int]], r: int = 4, seed: int = 0
                 ) -> dict[str, torch.Tensor]:
    """PEFT-named lora_A [r, in] / lora_B [out, r] for HF module name -> (in, out)."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, (fan_in, fan_out) in modules.items():
        out[f"base_model.model.{name}.lora_A.weight"] = torch.randn(r, fan_in, generator=gen)
        out[f"base_model.model.{name}.lora_B.weight"] = torch.randn(fan_out, r, generator=gen)
    return out
