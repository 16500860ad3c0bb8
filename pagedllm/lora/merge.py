"""`pagedllm merge-lora BASE ADAPTER OUT_DIR`: fold an adapter into the base weights.

W' = W + scale * B @ A for every target linear (what peft's `merge_and_unload` computes), in
fp32, written back in each tensor's own dtype. The output is a plain HF checkpoint: the base
directory's files with its safetensors shards rewritten, served at full speed without LoRA.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import torch

from pagedllm.lora.adapter import AdapterError, load_adapter
from pagedllm.lora.targets import checkpoint_module_specs

logger = logging.getLogger(__name__)


def merge_lora(base: str | Path, adapter: str | Path, out_dir: str | Path) -> Path:
    """Write base + adapter merged to `out_dir` (created; must not hold a checkpoint)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    base, adapter, out = Path(base), Path(adapter), Path(out_dir)
    shards = sorted(base.glob("*.safetensors")) if base.is_dir() else []
    if not shards:
        raise ValueError(f"merge-lora needs an HF checkpoint directory with .safetensors "
                         f"weights as BASE; {base} has none")
    if out.resolve() == base.resolve():
        raise ValueError("OUT_DIR must differ from the base checkpoint directory")
    if out.exists() and any(out.glob("*.safetensors")):
        raise ValueError(f"{out} already holds a checkpoint; choose an empty OUT_DIR")
    shapes = {}
    for shard in shards:
        with safe_open(str(shard), "pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                shapes[key] = tuple(f.get_slice(key).get_shape())
    lora = load_adapter(adapter, checkpoint_module_specs(shapes), name=adapter.name, int_id=1,
                        max_rank=None, dtype=torch.float32)
    out.mkdir(parents=True, exist_ok=True)
    for item in base.iterdir():
        if item.is_file() and item.suffix != ".safetensors":
            shutil.copy2(item, out / item.name)
    merged = 0
    for shard in shards:
        tensors = load_file(str(shard))
        for module, deltas in lora.deltas.items():
            key = f"{module}.weight"
            if key in tensors:
                w = tensors[key]
                (d,) = deltas  # unfused names: one delta per module
                tensors[key] = (w.to(torch.float32) + d.b @ d.a).to(w.dtype)
                merged += 1
        save_file(tensors, str(out / shard.name), metadata={"format": "pt"})
    if merged != len(lora.deltas):
        raise AdapterError(f"merged {merged} of {len(lora.deltas)} target weights")
    logger.info("merged %s into %s: %d weights -> %s", adapter, base, merged, out)
    return out
