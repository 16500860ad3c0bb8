"""Load a PEFT LoRA adapter directory and validate it against the base model.

    adapter_config.json          r, lora_alpha, use_rslora, target_modules, ...
    adapter_model.safetensors    base_model.model.<module>.lora_A.weight  [r, in]
      (or adapter_model.bin)     base_model.model.<module>.lora_B.weight  [out, r]

delta(x) = scale * (x @ A^T) @ B^T with scale = lora_alpha / r (alpha / sqrt(r) with rslora).
Every refusal is an `AdapterError` (a ValueError) naming the adapter, the module or pattern and
what the model has, so a user sees the mistake instead of silently wrong output.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from pagedllm.errors import ModelLoadError
from pagedllm.lora.targets import EMBEDDING, LINEAR, LM_HEAD, NORM, ModuleSpec, peft_matches

logger = logging.getLogger(__name__)

CONFIG_FILE = "adapter_config.json"
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
_KEY = re.compile(r"^(?:base_model\.model\.)?(?P<mod>.+)\.lora_(?P<ab>A|B)(?:\.[^.]+)?\.weight$")


class AdapterError(ModelLoadError):
    """An adapter that cannot be served correctly on this base model."""


@dataclass(frozen=True)
class AdapterConfig:
    """The fields of a PEFT `LoraConfig` that decide the delta (others are training-only)."""

    r: int
    lora_alpha: float
    target_modules: str | tuple[str, ...]
    use_rslora: bool = False
    exclude_modules: str | tuple[str, ...] | None = None
    layers_to_transform: int | tuple[int, ...] | None = None
    layers_pattern: str | tuple[str, ...] | None = None
    rank_pattern: dict = field(default_factory=dict)
    alpha_pattern: dict = field(default_factory=dict)

    @classmethod
    def parse(cls, raw: dict, name: str) -> AdapterConfig:
        def refuse(why: str) -> AdapterError:
            return AdapterError(f"adapter {name!r}: {why}")

        peft_type = str(raw.get("peft_type", "LORA")).upper()
        if peft_type != "LORA":
            raise refuse(f"peft_type is {peft_type}; only LORA adapters are supported")
        if raw.get("use_dora"):
            raise refuse("uses DoRA (use_dora=true), which is not supported; serve a plain LoRA "
                         "adapter, or merge this one into the base weights with peft first")
        if raw.get("modules_to_save"):
            raise refuse(f"has modules_to_save {raw['modules_to_save']} (fully trained "
                         "modules, not low-rank deltas), which are not supported")
        if raw.get("bias", "none") != "none" or raw.get("lora_bias"):
            raise refuse(f"trains biases (bias={raw.get('bias')!r}, lora_bias="
                         f"{raw.get('lora_bias', False)}); only bias='none' is supported")
        if raw.get("target_parameters"):
            raise refuse("targets parameters (target_parameters), not modules; not supported")
        tm = raw.get("target_modules")
        if not tm:
            raise refuse("adapter_config.json has no target_modules")
        if raw.get("fan_in_fan_out"):
            logger.warning("adapter %r: fan_in_fan_out=true has no effect on nn.Linear "
                           "layers (PEFT resets it to false for them too)", name)
        try:
            r, alpha = int(raw["r"]), float(raw.get("lora_alpha", 8))
        except (KeyError, TypeError, ValueError):
            raise refuse(f"r / lora_alpha must be numbers, got r={raw.get('r')!r}") from None
        if r < 1:
            raise refuse(f"r must be >= 1, got {r}")

        def tup(v):
            return v if v is None or isinstance(v, str | int) else tuple(v)

        return cls(r=r, lora_alpha=alpha, target_modules=tup(tm),
                   use_rslora=bool(raw.get("use_rslora", False)),
                   exclude_modules=tup(raw.get("exclude_modules")),
                   layers_to_transform=tup(raw.get("layers_to_transform")),
                   layers_pattern=tup(raw.get("layers_pattern")),
                   rank_pattern=dict(raw.get("rank_pattern") or {}),
                   alpha_pattern=dict(raw.get("alpha_pattern") or {}))

    def matches(self, key: str) -> bool:
        return peft_matches(key, self.target_modules, self.exclude_modules,
                            self.layers_to_transform, self.layers_pattern)

    def rank_alpha(self, key: str) -> tuple[int, float]:
        """PEFT's per-module overrides: a pattern applies if the name ends in it."""
        def pick(patterns: dict, default):
            for pat, value in patterns.items():
                if re.match(rf"(.*\.)?({pat})$", key):
                    return value
            return default
        return int(pick(self.rank_pattern, self.r)), float(pick(self.alpha_pattern,
                                                                self.lora_alpha))

    def scale(self, key: str) -> float:
        r, alpha = self.rank_alpha(key)
        return alpha / math.sqrt(r) if self.use_rslora else alpha / r

    @property
    def max_rank(self) -> int:
        """The largest rank of any module (PEFT's rank_pattern may raise it per module)."""
        return max([self.r, *(int(v) for v in self.rank_pattern.values())])


@dataclass(frozen=True)
class SubDelta:
    """The delta of one HF linear: rows [offset, offset + B.shape[0]) of sub `sub` of the
    target linear get (x @ a^T) @ b^T; `b` already carries the scale."""

    sub: int
    num_subs: int
    offset: int
    a: torch.Tensor  # [r, in]
    b: torch.Tensor  # [out, r], scaled


@dataclass
class LoRAAdapter:
    """A loaded, validated adapter: deltas grouped by our target linear's name."""

    name: str
    int_id: int
    path: str
    rank: int
    weights_hash: str  # sha256 of the config and weight files: the prefix-cache identity
    deltas: dict[str, list[SubDelta]]

    @property
    def num_bytes(self) -> int:
        return sum(d.a.numel() * d.a.element_size() + d.b.numel() * d.b.element_size()
                   for ds in self.deltas.values() for d in ds)


def _read_weights(path: Path, name: str, digest) -> dict[str, torch.Tensor]:
    for fname in WEIGHT_FILES:
        f = path / fname
        if f.is_file():
            data = f.read_bytes()
            digest.update(data)
            if fname.endswith(".safetensors"):
                from safetensors.torch import load

                return load(data)
            import io

            return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    raise AdapterError(f"adapter {name!r}: {path} has no {' or '.join(WEIGHT_FILES)}")


def _linear_examples(specs: dict[str, ModuleSpec]) -> str:
    leaves = sorted({s.name.rsplit(".", 1)[-1] for s in specs.values() if s.kind == LINEAR})
    first = next((s.name for s in specs.values() if s.kind == LINEAR), "")
    return f"the model's linear layers are {', '.join(leaves)} (e.g. {first})"


def read_adapter_config(path: str | Path, name: str) -> AdapterConfig:
    """The validated adapter_config.json of the PEFT adapter directory `path`."""
    path = Path(path)
    if not path.is_dir() or not (path / CONFIG_FILE).is_file():
        raise AdapterError(f"adapter {name!r}: {path} is not a PEFT adapter directory (no "
                           f"{CONFIG_FILE})")
    try:
        return AdapterConfig.parse(json.loads((path / CONFIG_FILE).read_bytes()), name)
    except json.JSONDecodeError as e:
        raise AdapterError(f"adapter {name!r}: {CONFIG_FILE} is not valid JSON: {e}") from None


def load_adapter(path: str | Path, specs: dict[str, ModuleSpec], *, name: str, int_id: int,
                 max_rank: int | None, dtype: torch.dtype = torch.float32) -> LoRAAdapter:
    """Read and validate the adapter at `path` against the base model's `specs`."""
    path = Path(path)
    cfg = read_adapter_config(path, name)
    digest = hashlib.sha256()
    digest.update((path / CONFIG_FILE).read_bytes())
    tensors = _read_weights(path, name, digest)

    tm = cfg.target_modules
    if not isinstance(tm, str):
        for entry in tm:
            if not any(k == entry or k.endswith(f".{entry}") for k in specs):
                raise AdapterError(f"adapter {name!r}: target module {entry!r} matches no "
                                   f"module of the model; {_linear_examples(specs)}")
    matched = [s for k, s in specs.items() if cfg.matches(k)]
    if not matched:
        raise AdapterError(f"adapter {name!r}: target_modules {tm!r} match no module of the "
                           f"model; {_linear_examples(specs)}")
    for s in matched:
        if s.kind == NORM:
            raise AdapterError(f"adapter {name!r}: target {s.name!r} is a norm layer "
                               f"({s.type_name}); LoRA on norm weights is not a linear adapter")
        if s.kind in (EMBEDDING, LM_HEAD):
            raise AdapterError(f"adapter {name!r}: target {s.name!r} is the "
                               f"{'embedding' if s.kind == EMBEDDING else 'lm_head'}; LoRA on "
                               "embeddings and lm_head is not supported (refused)")
        if s.kind != LINEAR:
            raise AdapterError(f"adapter {name!r}: target_modules {tm!r} match {s.name!r}, a "
                               f"{s.type_name or 'container'} module, not a linear layer")

    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        m = _KEY.match(key)
        if m is None:
            what = ("DoRA magnitudes" if "magnitude" in key else
                    "embedding LoRA" if "lora_embedding" in key else "an unexpected tensor")
            raise AdapterError(f"adapter {name!r}: weight {key!r} is {what}; only lora_A/lora_B "
                               "weights of linear layers are supported")
        pairs.setdefault(m.group("mod"), {})[m.group("ab")] = t
    matched_names = {s.name for s in matched}
    for mod in pairs:
        if mod not in matched_names:
            where = "is not a module of the model" if mod not in specs else \
                "is not matched by target_modules"
            raise AdapterError(f"adapter {name!r}: has weights for {mod!r}, which {where} "
                               f"(base-model mismatch?); {_linear_examples(specs)}")

    deltas: dict[str, list[SubDelta]] = {}
    top_rank = 0
    for s in matched:
        ab = pairs.get(s.name, {})
        if "A" not in ab or "B" not in ab:
            raise AdapterError(f"adapter {name!r}: target_modules match {s.name!r} but the "
                               "weights have no lora_A/lora_B for it")
        a, b = ab["A"], ab["B"]
        r = a.shape[0]
        if a.dim() != 2 or b.dim() != 2 or b.shape[1] != r:
            raise AdapterError(f"adapter {name!r}: {s.name}: lora_A {list(a.shape)} and lora_B "
                               f"{list(b.shape)} are not [r, in] and [out, r]")
        if a.shape[1] != s.in_features or b.shape[0] != s.out_features:
            raise AdapterError(
                f"adapter {name!r}: base-model mismatch at {s.name}: the adapter maps "
                f"{a.shape[1]} -> {b.shape[0]} features, the model's layer "
                f"{s.in_features} -> {s.out_features}")
        cfg_r, _ = cfg.rank_alpha(s.name)
        if r != cfg_r:
            raise AdapterError(f"adapter {name!r}: {s.name} has rank {r} but the config says "
                               f"r={cfg_r}")
        if max_rank is not None and r > max_rank:
            raise AdapterError(f"adapter {name!r}: rank {r} (at {s.name}) exceeds "
                               f"max_lora_rank {max_rank}; raise --max-lora-rank")
        top_rank = max(top_rank, r)
        scale = cfg.scale(s.name)
        deltas.setdefault(s.target, []).append(SubDelta(
            s.sub, s.num_subs, s.offset, a.to(dtype).contiguous(),
            (b.to(torch.float32) * scale).to(dtype).contiguous()))
    logger.info("loaded LoRA adapter %r (rank %d, %d target layers) from %s", name, top_rank,
                len(deltas), path)
    return LoRAAdapter(name, int_id, str(path), top_rank, digest.hexdigest(), deltas)
