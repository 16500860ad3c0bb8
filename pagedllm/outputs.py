"""vLLM-compatible result objects returned by `LLM.generate` and the engine."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class RequestOutputKind(enum.Enum):
    """What `LLMEngine.step` reports for a request that is still running (vLLM's names).

    CUMULATIVE: every output carries copies of all tokens, logprobs and text so far.
    DELTA: outputs carry what is new (`delta_*`) plus the cumulative text; the cumulative
    `token_ids` / `logprobs` lists are filled in on the final output only, so a step costs
    O(new tokens), not O(tokens so far) (the server streams this way).
    FINAL_ONLY: nothing until the request finishes (offline `LLM.generate`).
    """

    CUMULATIVE = "cumulative"
    DELTA = "delta"
    FINAL_ONLY = "final_only"


@dataclass
class Logprob:
    """Log-probability of one token at one position (from the raw model logits)."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


SampleLogprobs = list[dict[int, Logprob]]
# One entry per prompt token: None for the first (nothing predicts it), then the logprob of
# the actual token and the top-k at that position (vLLM's `PromptLogprobs`).
PromptLogprobs = list[dict[int, Logprob] | None]


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: SampleLogprobs | None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort" | None while running
    stop_reason: int | str | None = None  # the stop string or stop token id that matched
    # Streaming: what this output gained since the previous RequestOutput of its request.
    delta_text: str = ""
    delta_token_ids: list[int] = field(default_factory=list)
    delta_logprobs: SampleLogprobs | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    num_preemptions: int = 0

    @property
    def time_to_first_token(self) -> float | None:
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    metrics: RequestMetrics | None = None
    num_cached_tokens: int = 0
    # SamplingParams.prompt_logprobs: set once the whole prompt is scored (DELTA outputs:
    # on the first output after that and on the final one).
    prompt_logprobs: PromptLogprobs | None = None
    # Set when the engine failed this request (finished, blocks freed; other requests go on).
    error: BaseException | None = None
