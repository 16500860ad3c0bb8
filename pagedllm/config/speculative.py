"""`SpeculativeConfig`: vLLM's --speculative-config, validated at construction.

    {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
     "prompt_lookup_min": 2}
    {"method": "draft_model", "model": "PATH", "num_speculative_tokens": 3}

Adaptivity (pagedllm's knobs, same JSON object): a request whose recent acceptance rate
falls below `min_acceptance_rate` stops proposing for `backoff_steps` decode steps (doubling
while it keeps failing, up to 16x); no request proposes while more than
`disable_by_batch_size` requests decode in one step (a large batch is compute-bound, so
verifying drafts costs real time there).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields

METHODS = ("ngram", "draft_model")


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str = "ngram"
    num_speculative_tokens: int = 4
    prompt_lookup_max: int = 4  # ngram: longest suffix looked up in the context
    prompt_lookup_min: int = 2  # ngram: shortest suffix that counts as a match
    model: str | None = None  # draft_model: HF directory (same vocabulary as the target)
    min_acceptance_rate: float = 0.25
    backoff_steps: int = 8
    disable_by_batch_size: int | None = 8

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"speculative method must be one of {', '.join(METHODS)}; "
                             f"got {self.method!r}")
        k = self.num_speculative_tokens
        if not (isinstance(k, int) and 1 <= k <= 16):
            raise ValueError(f"num_speculative_tokens must be an int in [1, 16], got {k!r}")
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi):
            raise ValueError("prompt_lookup_min and prompt_lookup_max must be ints with "
                             f"1 <= prompt_lookup_min <= prompt_lookup_max, got {lo!r}, {hi!r}")
        if self.method == "draft_model" and not self.model:
            raise ValueError('speculative method "draft_model" needs "model" (a directory '
                             "of a smaller model with the target's vocabulary)")
        if self.method != "draft_model" and self.model is not None:
            raise ValueError(f'"model" is only for method "draft_model", not {self.method!r}')
        if not 0.0 <= self.min_acceptance_rate <= 1.0:
            raise ValueError(f"min_acceptance_rate must be in [0, 1], got "
                             f"{self.min_acceptance_rate!r}")
        if not (isinstance(self.backoff_steps, int) and self.backoff_steps >= 0):
            raise ValueError(f"backoff_steps must be an int >= 0, got {self.backoff_steps!r}")
        b = self.disable_by_batch_size
        if b is not None and not (isinstance(b, int) and b >= 1):
            raise ValueError(f"disable_by_batch_size must be an int >= 1 or null, got {b!r}")

    @classmethod
    def parse(cls, value: SpeculativeConfig | dict | str | None) -> SpeculativeConfig | None:
        """From a config, a dict or JSON text (the CLI flag); None stays None."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"speculative_config is not valid JSON: {exc}") from None
        if not isinstance(value, dict):
            raise ValueError(f"speculative_config must be a JSON object, got {value!r}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"unknown speculative_config key(s) {', '.join(unknown)}; "
                             f"known: {', '.join(sorted(known))}")
        try:
            return cls(**value)
        except TypeError as exc:  # a value of the wrong type in a comparison
            raise ValueError(f"invalid speculative_config {value!r}: {exc}") from None
