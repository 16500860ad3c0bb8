"""The language model inside a vision-language checkpoint (`Gemma3ForConditionalGeneration`,
`Mistral3ForConditionalGeneration`): served as its text-only architecture, the vision tower
and projector left unread.

    config      config.text_config, architectures = [the text model's class]
    weights     language_model.model.X | model.language_model.X  ->  model.X
                language_model.lm_head.weight                      ->  lm_head.weight
                vision_tower.* / multi_modal_projector.* (either prefix): skipped
    tied        lm_head tied to the embeddings exactly when the checkpoint has no lm_head

Image inputs have nowhere to go: the server refuses non-text content parts with a 400.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

logger = logging.getLogger(__name__)

# Vision-language architecture -> the architecture of its language model.
TEXT_ARCHITECTURES = {
    "Gemma3ForConditionalGeneration": "Gemma3ForCausalLM",
    "Mistral3ForConditionalGeneration": "MistralForCausalLM",
}
_RENAMES = (
    ("language_model.model.", "model."),
    ("model.language_model.", "model."),
    ("language_model.lm_head.", "lm_head."),
)
_SKIPPED = (
    "vision_tower.",
    "multi_modal_projector.",
    "model.vision_tower.",
    "model.multi_modal_projector.",
)


def text_architecture(config) -> str | None:
    """The text-only architecture to serve a vision-language `config` as, or None."""
    archs = getattr(config, "architectures", None) or []
    return TEXT_ARCHITECTURES.get(archs[0]) if archs else None


def text_config(config, weight_names: list[str]):
    """The language model's config, named by its text architecture; tied embeddings as the
    checkpoint's tensors say (`weight_names`: every tensor name in the checkpoint)."""
    arch = text_architecture(config)
    text = config.text_config
    text.architectures = [arch]
    text.tie_word_embeddings = not any(
        text_weight_name(n) == "lm_head.weight" for n in weight_names
    )
    if getattr(text, "dtype", None) is None:
        text.dtype = getattr(config, "dtype", None)
    logger.info(
        "%s: serving its language model as %s; the vision tower is not loaded "
        "(image inputs are refused)",
        config.architectures[0],
        arch,
    )
    return text


def text_weight_name(name: str) -> str | None:
    """The language model's name for checkpoint tensor `name`; None for vision weights."""
    if name.startswith(_SKIPPED):
        return None
    for old, new in _RENAMES:
        if name.startswith(old):
            return new + name[len(old) :]
    return name


def weight_names(files: list[Path]) -> list[str]:
    """Every tensor name in the safetensors `files` (headers only)."""
    names: list[str] = []
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            names.extend(handle.keys())
    return names


def iter_text_weights(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    """The language model's tensors, under text names, as float32 CPU tensors one at a time;
    vision tensors are never read."""
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open is not a Mapping
                if (renamed := text_weight_name(name)) is not None:
                    yield renamed, handle.get_tensor(name).float()
