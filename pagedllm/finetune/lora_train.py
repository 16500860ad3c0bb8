"""Trainable LoRA on the serving model's linears: target resolution and the delta hook.

Targets are matched exactly as the server matches an adapter (`pagedllm.lora`: HF module
names from `model_module_specs`, PEFT's rules in `AdapterConfig.matches`, scale from
`AdapterConfig.scale`), so what trains here is what `--lora-modules` serves. A fused linear
(qkv_proj, gate_up_proj) gets one (A, B) per targeted HF projection; the delta of each lands
on that projection's rows of the output, zeros elsewhere::

    qkv out:   [ q rows | k rows | v rows ]     targets q_proj, v_proj
    delta:     [ s*B_q A_q x | 0 | s*B_v A_v x ]

A is initialised as PEFT does (kaiming-uniform, a = sqrt(5)), B = 0: step 0 is the base.
"""

from __future__ import annotations

import logging
import math

import torch
from torch import nn

from pagedllm.errors import InvalidInputError
from pagedllm.lora.adapter import AdapterConfig
from pagedllm.lora.layer import install
from pagedllm.lora.targets import EMBEDDING, LINEAR, LM_HEAD, NORM, ModuleSpec, model_module_specs

logger = logging.getLogger(__name__)


class TargetError(InvalidInputError):
    """target_modules that cannot train a servable adapter (refused before training)."""


def _model_names(specs: dict[str, ModuleSpec]) -> str:
    def leaves(kind: str) -> str:
        return ", ".join(sorted({s.name.rsplit(".", 1)[-1] for s in specs.values()
                                 if s.kind == kind})) or "none"
    first = next((s.name for s in specs.values() if s.kind == LINEAR), "")
    return (f"the model's linear layers are {leaves(LINEAR)} (e.g. {first}); lm_head: "
            f"{leaves(LM_HEAD)}; norm layers: {leaves(NORM)}")


def adapter_config(target_modules, r: int, alpha: float, rslora: bool) -> AdapterConfig:
    """The serving side's view of the adapter being trained (same matching and scale)."""
    tm = target_modules if isinstance(target_modules, str) else list(target_modules)
    return AdapterConfig.parse({"r": r, "lora_alpha": alpha, "use_rslora": rslora,
                                "target_modules": tm}, "finetune")


def resolve_targets(model: nn.Module, target_modules) -> tuple[list[str], list[ModuleSpec]]:
    """(target_modules as written to adapter_config.json, the matched HF modules).

    Refuses (TargetError) an entry matching nothing, and norm / embedding / container
    matches, with the module names the model has; warns on lm_head (peft loads such an
    adapter, the pagedllm server refuses it)."""
    specs = model_module_specs(model)
    if target_modules == "all-linear":
        target_modules = sorted({s.name.rsplit(".", 1)[-1] for s in specs.values()
                                 if s.kind == LINEAR})
    names = list(target_modules)
    for entry in names:
        if not any(k == entry or k.endswith(f".{entry}") for k in specs):
            raise TargetError(f"target module {entry!r} matches no module of the model; "
                              f"{_model_names(specs)}")
    cfg = adapter_config(names, 1, 1.0, False)
    matched = [s for k, s in specs.items() if cfg.matches(k)]
    for s in matched:
        if s.kind == NORM:
            raise TargetError(f"target {s.name!r} is a norm layer ({s.type_name}); LoRA trains "
                              f"low-rank deltas of linear layers; {_model_names(specs)}")
        if s.kind == EMBEDDING:
            raise TargetError(f"target {s.name!r} is the embedding; LoRA on embeddings is not "
                              f"supported; {_model_names(specs)}")
        if s.kind not in (LINEAR, LM_HEAD):
            raise TargetError(f"target_modules {names} match {s.name!r}, a {s.type_name} "
                              f"module, not a linear layer; {_model_names(specs)}")
        if s.kind == LM_HEAD:
            logger.warning("target %r is the lm_head: peft loads this adapter, but `pagedllm "
                           "serve --lora-modules` refuses lm_head adapters (train without it "
                           "to serve it)", s.name)
    return names, matched


class TrainableLoRA(nn.Module):
    """The trainable delta of one target linear, installed on the model as the `lora` of a
    `pagedllm.lora.layer.LoRALinear`: `add_delta(x, out)` = out + the targeted deltas."""

    def __init__(self, linear: nn.Module, subs: list[ModuleSpec], r: int,
                 scales: list[float], dropout: float, generator: torch.Generator) -> None:
        super().__init__()
        self.out_features = linear.out_features
        self.subs = subs
        self.scales = scales
        self.dropout = nn.Dropout(dropout) if dropout else nn.Identity()
        self.lora_A = nn.ParameterList()
        self.lora_B = nn.ParameterList()
        for s in subs:
            a = torch.empty(r, s.in_features)
            bound = 1.0 / math.sqrt(s.in_features)  # kaiming_uniform_(a=sqrt(5)), as PEFT
            a.uniform_(-bound, bound, generator=generator)
            self.lora_A.append(nn.Parameter(a))
            self.lora_B.append(nn.Parameter(torch.zeros(s.out_features, r)))

    def add_delta(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        x = self.dropout(x)
        parts, pos = [], 0
        for s, scale, a, b in zip(self.subs, self.scales, self.lora_A, self.lora_B,
                                  strict=True):
            if s.offset > pos:
                parts.append(out.new_zeros(*out.shape[:-1], s.offset - pos))
            parts.append(((x @ a.t()) @ b.t() * scale).to(out.dtype))
            pos = s.offset + s.out_features
        if pos < self.out_features:
            parts.append(out.new_zeros(*out.shape[:-1], self.out_features - pos))
        return out + (parts[0] if len(parts) == 1 else torch.cat(parts, -1))


def attach_lora(model: nn.Module, matched: list[ModuleSpec], cfg: AdapterConfig,
                dropout: float, seed: int) -> dict[str, tuple[TrainableLoRA, int]]:
    """Wrap every target linear in a LoRALinear with a TrainableLoRA (in place, on the
    model); returns HF name -> (TrainableLoRA, index of the HF projection in it)."""
    modules = dict(model.named_modules())
    gen = torch.Generator().manual_seed(seed)
    by_target: dict[str, list[ModuleSpec]] = {}
    for s in matched:
        by_target.setdefault(s.target or s.name, []).append(s)
    index: dict[str, tuple[TrainableLoRA, int]] = {}
    for target, subs in by_target.items():
        subs.sort(key=lambda s: s.offset)
        linear = modules[target]
        device = next(iter(linear.parameters())).device
        lora = TrainableLoRA(linear, subs, cfg.r, [cfg.scale(s.name) for s in subs], dropout,
                             gen).to(device)
        install(model, target, lora)
        for i, s in enumerate(subs):
            index[s.name] = (lora, i)
    return index


def lora_state_dict(index: dict[str, tuple[TrainableLoRA, int]]) -> dict[str, torch.Tensor]:
    """PEFT-named tensors: base_model.model.<module>.lora_A.weight [r, in], lora_B [out, r]."""
    out = {}
    for name, (lora, i) in sorted(index.items()):
        out[f"base_model.model.{name}.lora_A.weight"] = lora.lora_A[i].detach().float()
        out[f"base_model.model.{name}.lora_B.weight"] = lora.lora_B[i].detach().float()
    return out
