"""Write the trained adapter in PEFT's format (what `peft` and `serve --lora-modules` load).

    OUT/adapter_config.json          peft_type LORA, r, lora_alpha, use_rslora, target_modules
    OUT/adapter_model.safetensors    base_model.model.<module>.lora_A.weight [r, in] (fp32)
                                     base_model.model.<module>.lora_B.weight [out, r]
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from pagedllm.lora.adapter import CONFIG_FILE


def write_adapter(out: Path, tensors: dict[str, torch.Tensor], *, r: int, alpha: float,
                  rslora: bool, dropout: float, target_modules: list[str],
                  base_model: str | None) -> Path:
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
        "r": r, "lora_alpha": alpha, "lora_dropout": dropout, "use_rslora": rslora,
        "target_modules": sorted(target_modules), "bias": "none", "fan_in_fan_out": False,
        "init_lora_weights": True, "inference_mode": True, "modules_to_save": None,
        "layers_to_transform": None, "layers_pattern": None, "rank_pattern": {},
        "alpha_pattern": {}, "use_dora": False,
    }
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    save_file({k: v.contiguous() for k, v in tensors.items()},
              str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    return out
