"""Per-request pooling parameters, field-compatible with vLLM's ``PoolingParams``.

A request with PoolingParams runs its prompt through the model once (prefill only, chunked
like any prompt) and returns one pooled vector instead of tokens: an embedding (task
"embed"), class probabilities ("classify"), a cross-encoder relevance ("score") or the
model's default output ("encode"). The engine answers which tasks its model serves
(`--runner pooling`, pagedllm/pooling/setup.py).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["POOLING_TASKS", "PoolingParams"]

POOLING_TASKS = ("embed", "classify", "score", "encode")


@dataclass
class PoolingParams:
    """``dimensions``: keep the first d dimensions of the embedding (Matryoshka models only),
    renormalized when the embedding is normalized. ``normalize``: L2-normalize the embedding
    (None: the model's pooler config). ``activation``: apply the classifier's sigmoid /
    softmax (None: the pooler config's, on by default). ``task``: set by the API that
    made the request (LLM.embed -> "embed", ...). ``truncate_prompt_tokens``: keep only the
    prompt's last k tokens (-1: the last max_model_len), as vLLM."""

    dimensions: int | None = None
    normalize: bool | None = None
    activation: bool | None = None
    task: str = "encode"
    truncate_prompt_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.task not in POOLING_TASKS:
            raise ValueError(
                f"pooling task must be one of {', '.join(POOLING_TASKS)}; got {self.task!r}"
            )
        if self.dimensions is not None and not (_is_int(self.dimensions) and self.dimensions >= 1):
            raise ValueError(f"dimensions must be an int >= 1, got {self.dimensions!r}")
        k = self.truncate_prompt_tokens
        if k is not None and not (_is_int(k) and (k >= 1 or k == -1)):
            raise ValueError(
                f"truncate_prompt_tokens must be an int >= 1 or -1 (max_model_len), got {k!r}"
            )
        for name in ("normalize", "activation"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise ValueError(f"{name} must be true, false or null, got {value!r}")


def _is_int(value) -> bool:
    """An int that is not a bool (True is not a dimension count)."""
    return isinstance(value, int) and not isinstance(value, bool)
