"""Per-request sampling parameters, field-compatible with vLLM's ``SamplingParams``."""

from __future__ import annotations

import copy
import enum
from dataclasses import dataclass, field

from pagedllm.structured_output.params import StructuredOutputsParams
from pagedllm.structured_output.thinking import ThinkingParams

__all__ = ["SamplingParams", "SamplingType", "StructuredOutputsParams"]

SAMPLING_EPS = 1e-5
"""Temperatures below this mean greedy decoding."""

MAX_LOGPROBS = 20
"""Default of the engine's `max_logprobs`: the most top logprobs a request may ask for."""

MAX_N = 128
"""Largest `n` (samples per prompt) a request may ask for."""


class SamplingType(enum.Enum):
    GREEDY = enum.auto()
    RANDOM = enum.auto()
    RANDOM_SEED = enum.auto()


@dataclass
class SamplingParams:
    """How to pick the next tokens of one request and when to stop.

    Validated at construction (``ValueError`` naming the field, its value and the allowed
    range). Normalisation: ``stop`` and ``stop_token_ids`` become lists, ``top_k=-1``
    becomes ``0`` (disabled), and a greedy request (``temperature < 1e-5``) has
    ``top_p``, ``top_k`` and ``min_p`` reset to their neutral values.
    ``max_tokens=None`` means "up to max_model_len"; the engine resolves it.

    ``logprobs=k``: each generated token's logprob plus the top k (``0``: its own only).
    ``prompt_logprobs=k`` (vLLM's): the same for every prompt token after the first, scored
    by the forward pass over the prompt (``RequestOutput.prompt_logprobs``; its first entry
    is None, nothing predicts the first token). Both are from the raw logits; the engine
    bounds k by its ``max_logprobs``.

    Token restrictions (vLLM's): ``structured_outputs`` (the output must match a JSON
    schema, regex, choice or grammar), ``logit_bias`` ({token id: bias in [-100, 100]} added
    to the logits), ``allowed_token_ids`` (only these may be sampled) and ``bad_words``
    (strings whose tokens may not be generated; the engine tokenizes them into
    ``bad_words_token_ids``). Token ids are checked against the vocabulary by the engine.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    ignore_eos: bool = False
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = field(default=None)
    include_stop_str_in_output: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    structured_outputs: StructuredOutputsParams | None = None
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    # where a reasoning model's thinking ends: the grammar starts after it and
    # thinking_token_budget caps it (set by the server's --reasoning-parser)
    thinking: ThinkingParams | None = None
    bad_words_token_ids: list[list[int]] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        else:
            self.stop = list(self.stop)
        self.stop_token_ids = [] if self.stop_token_ids is None else list(self.stop_token_ids)
        self._verify()
        if self.top_k == -1:
            self.top_k = 0
        if self.temperature < SAMPLING_EPS:
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0

    def _verify(self) -> None:
        for name in ("n", "top_k", "min_tokens"):
            _check_int(name, getattr(self, name))
        if not 1 <= self.n <= MAX_N:
            raise ValueError(f"n must be in [1, {MAX_N}], got {self.n}")
        if self.temperature < 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be 0 or -1 (disable) or >= 1, got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -2.0 <= value <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {value}")
        if not self.repetition_penalty > 0.0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.seed is not None:
            _check_int("seed", self.seed)
        if self.max_tokens is not None:
            _check_int("max_tokens", self.max_tokens)
            if self.max_tokens < 1:
                raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0, got {self.min_tokens}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens must be <= max_tokens ({self.max_tokens}), got {self.min_tokens}"
            )
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs)
            if self.logprobs < 0:  # the upper bound is the engine's max_logprobs
                raise ValueError(f"logprobs must be >= 0, got {self.logprobs}")
        if self.prompt_logprobs is not None:
            _check_int("prompt_logprobs", self.prompt_logprobs)
            if self.prompt_logprobs < 0:
                raise ValueError(f"prompt_logprobs must be >= 0, got {self.prompt_logprobs}")
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop strings must be non-empty strings, got {s!r}")
        for t in self.stop_token_ids:
            _check_int("stop_token_ids entries", t)
            if t < 0:
                raise ValueError(f"stop_token_ids entries must be >= 0, got {t}")
        self._verify_token_restrictions()

    def _verify_token_restrictions(self) -> None:
        so = self.structured_outputs
        if so is not None and not isinstance(so, StructuredOutputsParams):
            raise ValueError("structured_outputs must be a StructuredOutputsParams, got "
                             f"{type(so).__name__}")
        if self.thinking is not None and not isinstance(self.thinking, ThinkingParams):
            raise ValueError("thinking must be a ThinkingParams, got "
                             f"{type(self.thinking).__name__}")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise ValueError(f"logit_bias must be a dict of token id -> bias, got "
                                 f"{type(self.logit_bias).__name__}")
            for t, b in self.logit_bias.items():
                _check_int("logit_bias keys", t)
                if t < 0:
                    raise ValueError(f"logit_bias keys must be token ids >= 0, got {t}")
                if isinstance(b, bool) or not isinstance(b, int | float) or not -100 <= b <= 100:
                    raise ValueError(f"logit_bias values must be in [-100, 100], got {b!r}")
        if self.allowed_token_ids is not None:
            self.allowed_token_ids = list(self.allowed_token_ids)
            if not self.allowed_token_ids:
                raise ValueError("allowed_token_ids must not be empty")
            for t in self.allowed_token_ids:
                _check_int("allowed_token_ids entries", t)
                if t < 0:
                    raise ValueError(f"allowed_token_ids entries must be >= 0, got {t}")
        if self.bad_words is not None:
            self.bad_words = list(self.bad_words)
            for w in self.bad_words:
                if not isinstance(w, str) or not w.strip():
                    raise ValueError(f"bad_words entries must be non-empty strings, got {w!r}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS

    def ending_token_ids(self, eos_token_id: int | None) -> list[int]:
        """The token ids that end a sequence: `stop_token_ids`, then `eos_token_id` unless
        ignored (or None)."""
        ids = list(self.stop_token_ids or ())
        if not self.ignore_eos and eos_token_id is not None:
            ids.append(eos_token_id)
        return ids

    @property
    def sampling_type(self) -> SamplingType:
        if self.is_greedy:
            return SamplingType.GREEDY
        return SamplingType.RANDOM if self.seed is None else SamplingType.RANDOM_SEED

    def clone(self) -> SamplingParams:
        """A deep copy (the stop lists are not shared)."""
        return copy.deepcopy(self)


def _check_int(name: str, value: object) -> None:
    # bool is an int subclass; True as a seed or count is almost certainly a mistake.
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be an int, got {value!r}")
