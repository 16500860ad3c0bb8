"""`--runner`, `--convert` and `--pooler-config` (vLLM's names): whether the engine generates
or pools, what a decoder checkpoint is converted to, and how hidden states are pooled.

    --runner   auto | generate | pooling   auto: pooling for *ForSequenceClassification
    --convert  auto | none | embed | classify | reward   auto: embed for a decoder run as
                                                pooling, classify for a sequence-classification one
    --pooler-config '{"pooling_type": "MEAN", "normalize": true}'

The model-dependent defaults are settled by pagedllm/pooling/setup.py once the checkpoint's
config is known; this module only validates what the user wrote.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields

RUNNERS = ("auto", "generate", "pooling")
CONVERTS = ("auto", "none", "embed", "classify", "reward")
POOLING_TYPES = ("LAST", "MEAN", "CLS", "ALL")


@dataclass(frozen=True)
class PoolerConfig:
    """How hidden states become one vector (vLLM's PoolerConfig): `pooling_type` LAST (the
    prompt's last token), MEAN (every prompt token), CLS (the first token) or ALL (one
    vector per prompt token, --convert reward's default); `normalize`
    L2-normalizes an embedding; `activation` applies the classifier's sigmoid / softmax.
    None: the default for the model (setup.py)."""

    pooling_type: str | None = None
    normalize: bool | None = None
    activation: bool | None = None

    def __post_init__(self) -> None:
        if self.pooling_type is not None:
            kind = str(self.pooling_type).upper()
            if kind not in POOLING_TYPES:
                raise ValueError(
                    f"pooler_config pooling_type must be one of "
                    f"{', '.join(POOLING_TYPES)}; got {self.pooling_type!r}"
                )
            object.__setattr__(self, "pooling_type", kind)
        for name in ("normalize", "activation"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise ValueError(f"pooler_config {name} must be true or false, got {value!r}")

    @classmethod
    def parse(cls, value: PoolerConfig | dict | str | None) -> PoolerConfig | None:
        """A PoolerConfig from itself, its dict or JSON text (--pooler-config)."""
        if value is None or isinstance(value, PoolerConfig):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"pooler_config is not valid JSON: {exc}") from None
        if not isinstance(value, dict):
            raise ValueError(f"pooler_config must be a JSON object, got {value!r}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(
                f"pooler_config has unknown keys {unknown}; known: {', '.join(sorted(known))}"
            )
        return cls(**value)


def validate_runner(runner: str, convert: str) -> None:
    """--runner / --convert are among vLLM's names, and consistent."""
    if runner not in RUNNERS:
        raise ValueError(f"runner must be one of {', '.join(RUNNERS)}; got {runner!r}")
    if convert not in CONVERTS:
        raise ValueError(f"convert must be one of {', '.join(CONVERTS)}; got {convert!r}")
    if runner == "generate" and convert not in ("auto", "none"):
        raise ValueError(
            f"convert={convert!r} makes a pooling model; it needs "
            "runner='pooling' (--runner pooling), not 'generate'"
        )
