"""Request intake: what a caller hands `LLMEngine.add_request` -> one validated `Request`.

Everything that can be wrong with a request is found here, before anything is queued: the
prompt (type, length, token ids), the sampling fields the engine's limits bound (logprobs,
priority, cache salt), token restrictions, the LoRA adapter and the grammar. Each problem is a
ValueError whose message says what was wrong and what the limit is.
"""

from __future__ import annotations

import operator
import reprlib
from collections.abc import Sequence

from pagedllm.config import EngineConfig
from pagedllm.core.request import Request
from pagedllm.engine.token_restrictions import resolve_token_restrictions
from pagedllm.lora.adapter import LoRAAdapter
from pagedllm.lora.manager import LoRAManager
from pagedllm.lora.request import LoRARequest
from pagedllm.model.layers.sampler import make_generator
from pagedllm.pooling.setup import PoolingSetup, check_pooling_params
from pagedllm.pooling_params import PoolingParams
from pagedllm.sampling_params import SamplingParams
from pagedllm.structured_output.manager import StructuredOutputManager
from pagedllm.structured_output.thinking_gate import ThinkingGate


class RequestIntake:
    def __init__(self, config: EngineConfig, tokenizer, vocab_size: int,
                 eos_token_id: int | None, lora: LoRAManager | None,
                 structured_output: StructuredOutputManager,
                 pooling: PoolingSetup | None = None) -> None:
        self.config = config
        self.pooling = pooling  # the pooling model's setup; None: the engine generates
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self.lora = lora
        self.structured_output = structured_output

    def tokenize_prompt(self, prompt: str | Sequence[int] | dict
                        ) -> tuple[str | None, list[int]]:
        """(text, token ids) of a prompt: a string, token ids, or vLLM's dict with
        "prompt_token_ids" (and its "prompt" text, kept for the output) or "prompt"."""
        if isinstance(prompt, dict) and ("prompt" in prompt or "prompt_token_ids" in prompt):
            text, ids = prompt.get("prompt"), prompt.get("prompt_token_ids")
            return text, self.tokenize_prompt(text if ids is None else ids)[1]
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt)
        try:
            # operator.index takes ints (also numpy / integer tensor scalars), never floats,
            # strings or nested lists that int() would coerce or choke on.
            return None, [operator.index(t) for t in prompt]
        except TypeError:
            raise ValueError(
                "prompt must be a string or a list of token ids (or a dict with "
                f"'prompt_token_ids' or 'prompt'), got {reprlib.repr(prompt)}") from None

    def validate_prompt(self, token_ids: list[int]) -> None:
        if not token_ids:
            raise ValueError("prompt must not be empty")
        if len(token_ids) > self.config.max_model_len:
            raise ValueError(
                f"prompt has {len(token_ids)} tokens, max_model_len is "
                f"{self.config.max_model_len}")
        bad = [t for t in token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prompt token id {bad[0]} is out of range [0, {self.vocab_size})")

    def load_lora(self, lora_request: LoRARequest) -> LoRAAdapter:
        """The validated adapter of `lora_request` (loaded into the CPU cache if needed)."""
        if not isinstance(lora_request, LoRARequest):
            raise ValueError(f"lora_request must be a LoRARequest, got {lora_request!r}")
        if self.lora is None:
            raise ValueError(f"lora_request {lora_request.lora_name!r} given but LoRA is not "
                             "enabled (pass enable_lora=True / --enable-lora)")
        return self.lora.load(lora_request)

    def make_request(self, request_id: str, prompt: str | Sequence[int] | dict,
                     params: SamplingParams | PoolingParams, *, arrival_time: float | None,
                     cache_salt: str | None, lora_request: LoRARequest | None,
                     priority: int) -> Request:
        """The request, validated (see the module doc)."""
        config = self.config
        if isinstance(params, PoolingParams):
            return self.make_pooling_request(request_id, prompt, params, arrival_time,
                                             cache_salt, lora_request, priority)
        if self.pooling is not None:
            raise ValueError(f"this engine runs a pooling model (--runner pooling, "
                             f"{self.pooling.task}): it does not generate text")
        self.check_queueing(priority, cache_salt)
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(params, name)
            if value is not None and value > config.max_logprobs:
                raise ValueError(f"{name} must be <= max_logprobs ({config.max_logprobs}, "
                                 f"--max-logprobs), got {value}")
        text, token_ids = self.tokenize_prompt(prompt)
        self.validate_prompt(token_ids)
        resolve_token_restrictions(params, self.tokenizer, self.vocab_size)
        adapter = self.load_lora(lora_request) if lora_request is not None else None
        grammar = (None if params.structured_outputs is None  # GrammarCompileError: ValueError
                   else self.structured_output.grammar_for(params.structured_outputs))
        if params.thinking is not None:  # the grammar waits for the thinking to end
            grammar = ThinkingGate(grammar, params.thinking)
        generators = (None if params.seed is None else
                      [make_generator(params.seed + i, config.torch_device)
                       for i in range(params.n)])
        return Request(request_id, token_ids, params, eos_token_id=self.eos_token_id,
                       prompt=text, arrival_time=arrival_time, cache_salt=cache_salt,
                       lora=adapter, priority=priority, grammar=grammar,
                       max_tokens=params.max_tokens or config.max_model_len - len(token_ids),
                       generators=generators)

    def check_queueing(self, priority: int, cache_salt: str | None) -> None:
        """A priority needs the priority policy; a cache salt is a non-empty string."""
        if priority and self.config.scheduling_policy != "priority":
            raise ValueError(f"priority {priority} given but the scheduling policy is "
                             f"{self.config.scheduling_policy!r} (--scheduling-policy priority)")
        if cache_salt is not None and not (isinstance(cache_salt, str) and cache_salt):
            raise ValueError(f"cache_salt must be a non-empty string, got {cache_salt!r}")

    def make_pooling_request(self, request_id: str, prompt, params: PoolingParams,
                             arrival_time: float | None, cache_salt: str | None,
                             lora_request: LoRARequest | None, priority: int) -> Request:
        """A pooling request (prefill only): its SamplingParams is the default, unused."""
        check_pooling_params(self.pooling, params)
        self.check_queueing(priority, cache_salt)
        text, token_ids = self.tokenize_prompt(prompt)
        if (k := params.truncate_prompt_tokens) is not None:  # the last k tokens (vLLM's)
            token_ids = token_ids[-(self.config.max_model_len if k == -1 else k):]
            text = None
        self.validate_prompt(token_ids)
        adapter = self.load_lora(lora_request) if lora_request is not None else None
        return Request(request_id, token_ids, SamplingParams(max_tokens=1),
                       eos_token_id=self.eos_token_id, prompt=text, arrival_time=arrival_time,
                       cache_salt=cache_salt, lora=adapter, priority=priority, max_tokens=1,
                       pooling_params=params)
