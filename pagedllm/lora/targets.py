"""Which modules an adapter targets: the model's modules under their HF names, and PEFT's
matching rules for `target_modules` / `exclude_modules` / `layers_to_transform`.

Our models fuse q/k/v and gate/up, so one HF name maps onto a slice of a fused linear:

    HF name                               target linear                  sub  out rows
    model.layers.3.self_attn.q_proj   ->  model.layers.3.self_attn.qkv_proj  0  [0, q)
    model.layers.3.self_attn.k_proj   ->  model.layers.3.self_attn.qkv_proj  1  [q, q+kv)
    model.layers.3.self_attn.v_proj   ->  model.layers.3.self_attn.qkv_proj  2  [q+kv, q+2kv)
    model.layers.3.mlp.gate_proj      ->  model.layers.3.mlp.gate_up_proj    0  [0, i)
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from torch import nn

# fused linear leaf name -> the HF projections stacked in it, in output order
PACKED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
LINEAR, NORM, EMBEDDING, LM_HEAD, OTHER = "linear", "norm", "embedding", "lm_head", "module"


@dataclass(frozen=True)
class ModuleSpec:
    """One module of the base model under its HF name; for linears, where its output rows
    live in our (possibly fused) linear `target`."""

    name: str
    kind: str
    type_name: str = ""
    in_features: int = 0
    out_features: int = 0
    target: str = ""
    sub: int = 0
    num_subs: int = 1
    offset: int = 0


def _packed_sizes(parent: nn.Module, leaf: str, out: int) -> tuple[int, ...]:
    if leaf == "qkv_proj" and hasattr(parent, "q_size") and hasattr(parent, "kv_size"):
        return (parent.q_size, parent.kv_size, parent.kv_size)
    n = len(PACKED[leaf])
    return (out // n,) * n


def model_module_specs(model: nn.Module) -> dict[str, ModuleSpec]:
    """HF-named specs of every module of one of our models (fused linears expanded)."""
    from pagedllm.model.layers.linear import Linear

    modules = dict(model.named_modules())
    specs: dict[str, ModuleSpec] = {}
    for name, mod in modules.items():
        if not name:
            continue
        prefix, _, leaf = name.rpartition(".")
        tname = type(mod).__name__
        if isinstance(mod, Linear):
            if leaf == "lm_head":
                specs[name] = ModuleSpec(name, LM_HEAD, tname, mod.in_features, mod.out_features)
            elif leaf in PACKED:
                sizes = _packed_sizes(modules[prefix], leaf, mod.out_features)
                off = 0
                for j, (sub, size) in enumerate(zip(PACKED[leaf], sizes, strict=True)):
                    hf = f"{prefix}.{sub}" if prefix else sub
                    specs[hf] = ModuleSpec(hf, LINEAR, "Linear", mod.in_features, size, name, j,
                                           len(sizes), off)
                    off += size
            else:
                specs[name] = ModuleSpec(name, LINEAR, tname, mod.in_features, mod.out_features,
                                         name)
        elif isinstance(mod, nn.Embedding) or "embedding" in tname.lower():
            specs[name] = ModuleSpec(name, EMBEDDING, tname)
        elif "norm" in tname.lower():
            specs[name] = ModuleSpec(name, NORM, tname)
        else:
            specs[name] = ModuleSpec(name, OTHER, tname)
    return specs


def checkpoint_module_specs(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, ModuleSpec]:
    """HF-named specs from a checkpoint's tensor names and shapes (no fusion: target = name)."""
    specs: dict[str, ModuleSpec] = {}
    for tensor, shape in shapes.items():
        if not tensor.endswith(".weight"):
            continue
        name = tensor.removesuffix(".weight")
        parts = name.split(".")
        for i in range(1, len(parts)):
            specs.setdefault(".".join(parts[:i]), ModuleSpec(".".join(parts[:i]), OTHER))
        leaf = parts[-1]
        if len(shape) == 2 and "embed" in leaf:
            specs[name] = ModuleSpec(name, EMBEDDING, "Embedding")
        elif len(shape) == 2 and leaf == "lm_head":
            specs[name] = ModuleSpec(name, LM_HEAD, "Linear", shape[1], shape[0])
        elif len(shape) == 2:
            specs[name] = ModuleSpec(name, LINEAR, "Linear", shape[1], shape[0], name)
        elif "norm" in leaf:
            specs[name] = ModuleSpec(name, NORM, "RMSNorm")
        else:
            specs[name] = ModuleSpec(name, OTHER)
    return specs


def _in_list(key: str, names: Iterable[str]) -> bool:
    return any(key == n or key.endswith(f".{n}") for n in names)


def _layer_index(key: str, layers_pattern) -> int | None:
    if not layers_pattern:
        m = re.match(r".*?\.[^.]*\.(?P<idx>\d+)\.", key)
    else:
        pats = [layers_pattern] if isinstance(layers_pattern, str) else layers_pattern
        m = next((mm for p in pats
                  if (mm := re.match(rf"(?:^|.*?\.){p}\.(?P<idx>\d+)\.", key))), None)
    return int(m.group("idx")) if m else None


def peft_matches(key: str, target_modules, exclude_modules=None, layers_to_transform=None,
                 layers_pattern=None) -> bool:
    """PEFT's `check_target_module_exists`: a string is a regex that must fullmatch the module
    name; a list matches a name equal to an entry or ending in "." + entry (then
    `layers_to_transform` filters by layer index)."""
    if exclude_modules:
        if isinstance(exclude_modules, str):
            if re.fullmatch(exclude_modules, key):
                return False
        elif _in_list(key, exclude_modules):
            return False
    if isinstance(target_modules, str):
        return re.fullmatch(target_modules, key) is not None
    if not _in_list(key, target_modules):
        return False
    if layers_to_transform is None or layers_to_transform == []:
        return True
    idx = _layer_index(key, layers_pattern)
    if idx is None:
        return False
    if isinstance(layers_to_transform, int):
        return idx == layers_to_transform
    return idx in layers_to_transform
