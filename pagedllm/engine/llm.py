"""`LLM`: the vLLM-compatible offline API (generate, chat, beam_search)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from tqdm.auto import tqdm

from pagedllm.beam_search import BeamSearchOutput, BeamSearchParams
from pagedllm.engine.beam_search_loop import run_beam_search
from pagedllm.engine.chat_template import check_chat_template, resolve_chat_template
from pagedllm.engine.llm_engine import LLMEngine
from pagedllm.engine.llm_pooling import PoolingAPI
from pagedllm.lora.request import LoRARequest
from pagedllm.outputs import RequestOutput
from pagedllm.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

Prompt = str | Sequence[int] | dict
Conversation = list[dict[str, str]]


class LLM(PoolingAPI):
    """Offline batched generation: all prompts are queued, then the engine steps until done.

    `LLM(model=None)` loads the default model (SmolLM2-135M-Instruct GGUF); engine arguments
    use vLLM's names (block_size, max_model_len, max_num_seqs, max_num_batched_tokens,
    kv_cache_memory, dtype, device, enable_lora, max_loras, max_lora_rank, max_cpu_loras,
    speculative_config, ...).
    """

    def __init__(self, model: str | None = None, *, engine: LLMEngine | None = None,
                 **engine_args) -> None:
        """`engine`: an engine already built (the CLI builds one from its flags)."""
        if engine is not None and (model is not None or engine_args):
            raise ValueError("pass an engine or engine arguments, not both")
        self.llm_engine = engine or LLMEngine.from_engine_args(model=model, **engine_args)

    def get_tokenizer(self):
        return self.llm_engine.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """SamplingParams() with the model's generation_config.json defaults (as vLLM)."""
        return SamplingParams(**self.llm_engine.sampling_defaults)

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 *, use_tqdm: bool = True, cache_salt: str | None = None,
                 lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None
                 ) -> list[RequestOutput]:
        """Generate for one prompt or many (str, token-id list, or {"prompt_token_ids": [...]}).

        Results come back in input order. Invalid input raises ValueError before anything runs.
        `cache_salt` isolates these requests' prefix-cache blocks from other salts'; a dict
        prompt's own "cache_salt" key takes precedence. `lora_request`: one adapter for every
        prompt, or a list with one entry per prompt (None = the base model); needs
        `enable_lora=True`. Prompts for different adapters run in the same batches.
        """
        prompts = self._normalize_prompts(prompts)
        params = sampling_params or self.get_default_sampling_params()
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        elif len(params) != len(prompts):
            raise ValueError(f"got {len(params)} sampling_params for {len(prompts)} prompts")
        if lora_request is None or isinstance(lora_request, LoRARequest):
            loras = [lora_request] * len(prompts)
        else:
            loras = list(lora_request)
            if len(loras) != len(prompts):
                raise ValueError(f"got {len(loras)} lora_requests for {len(prompts)} prompts")
        return self._run(prompts, list(params), use_tqdm, cache_salt, loras)

    def beam_search(self, prompts: Prompt | Sequence[Prompt], params: BeamSearchParams, *,
                    use_tqdm: bool = False,
                    lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None
                    ) -> list[BeamSearchOutput]:
        """vLLM's `LLM.beam_search`: per prompt, the best `params.beam_width` sequences (prompt
        + generated tokens, text, logprobs, score), best first (engine/beam_search_loop.py)."""
        return run_beam_search(self, self._normalize_prompts(prompts), params,
                               use_tqdm=use_tqdm, lora_request=lora_request)

    def chat(self, messages: Conversation | Sequence[Conversation],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None, *,
             use_tqdm: bool = True, add_generation_prompt: bool = True,
             chat_template: str | None = None, cache_salt: str | None = None,
             lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None
             ) -> list[RequestOutput]:
        """Apply the model's chat template (or `chat_template`: Jinja text or a file) to each
        conversation, then generate. A model without a template needs `chat_template`."""
        convs = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        tok = self.get_tokenizer()
        chat_template = resolve_chat_template(chat_template)
        check_chat_template(tok, chat_template)
        prompts = []
        for conv in convs:
            ids = tok.apply_chat_template(conv, add_generation_prompt=add_generation_prompt,
                                          tokenize=True, chat_template=chat_template)
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
            prompts.append({"prompt_token_ids": list(ids),
                            "prompt": tok.decode(ids, skip_special_tokens=False)})
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm, cache_salt=cache_salt,
                             lora_request=lora_request)

    @staticmethod
    def _normalize_prompts(prompts) -> list[Prompt]:
        if isinstance(prompts, str | dict):
            return [prompts]
        prompts = list(prompts)
        if prompts and all(isinstance(p, int) for p in prompts):
            return [prompts]
        return prompts

    def _run(self, prompts: list[Prompt], params: list[SamplingParams], use_tqdm: bool,
             cache_salt: str | None, loras: list[LoRARequest | None]) -> list[RequestOutput]:
        engine = self.llm_engine
        ids: list[str] = []
        try:
            for prompt, p, lora in zip(prompts, params, loras, strict=True):
                salt = prompt.get("cache_salt", cache_salt) if isinstance(prompt, dict) else (
                    cache_salt)
                ids.append(engine.add_request(prompt, p, cache_salt=salt, lora_request=lora))
        except Exception:
            engine.abort_request(ids)
            raise
        results: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(ids), desc="Processed prompts", disable=not use_tqdm)
        try:
            while engine.has_unfinished_requests():
                for out in engine.step(final_only=True):
                    if out.error is not None:
                        raise RuntimeError(
                            f"request {out.request_id} failed in the engine") from out.error
                    if out.finished:
                        results[out.request_id] = out
                        bar.update(1)
        except BaseException:
            engine.abort_request([i for i in ids if i not in results])
            raise
        finally:
            bar.close()
        return [results[i] for i in ids]
