"""Request text -> token ids without stalling the server: length bound first, then the work in
a worker thread.

Tokenizing a 7 MB prompt on the event loop once froze every other client for 41 s before the
400 came. Two defences:

* `TokenBound`: one token of this tokenizer covers at most `max_token_bytes` bytes of text
  (measured over the vocabulary once, at start-up), so a text of B UTF-8 bytes has at least
  B / max_token_bytes tokens. A normalizer may shrink text before the model splits it (NFKC
  composes Hangul jamo 3:1), so with one the bound is divided by `NORMALIZER_SLACK`. A prompt
  whose bytes alone prove it longer than max_model_len is refused without tokenizing it.
* whatever passes is tokenized (and chat templates rendered) in a worker thread: the Rust
  tokenizer releases the GIL, so the loop keeps answering.

Chat: the server's own template is trusted; a request's `chat_template` is refused unless the
server runs with --trust-request-chat-template, and then it renders in a child process with a
time and memory limit (template_sandbox.py). `chat_template_kwargs` become template variables
only: names that are parameters of `apply_chat_template` itself (`tokenize`, `padding`,
`tokenizer_kwargs`, ...) are refused, they would reach the tokenizer.
"""

from __future__ import annotations

import asyncio
import inspect
from dataclasses import dataclass

from pagedllm.entrypoints.errors import APIError
from pagedllm.entrypoints.template_sandbox import TemplateRenderError, TemplateSandbox

NORMALIZER_SLACK = 3
_MORE_RESERVED = frozenset({"tokenizer_kwargs", "conversation", "messages", "chat_template",
                            "tools", "documents", "add_generation_prompt",
                            "continue_final_message"})


@dataclass(frozen=True)
class TokenBound:
    """Most UTF-8 bytes of text one token can stand for (see the module docstring)."""

    max_token_bytes: int

    @classmethod
    def of(cls, tokenizer) -> TokenBound:
        longest = 1
        for token_id in range(len(tokenizer)):
            # A partial UTF-8 byte decodes to U+FFFD (3 bytes): an overestimate, still safe.
            text = tokenizer.decode([token_id], skip_special_tokens=False)
            longest = max(longest, len(text.encode("utf-8", "replace")))
        backend = getattr(tokenizer, "backend_tokenizer", None)
        slack = 1 if backend is None or backend.normalizer is None else NORMALIZER_SLACK
        # +1: a SentencePiece piece's leading space is dropped when it decodes alone.
        return cls((longest + 1) * slack)

    def min_tokens(self, num_bytes: int) -> int:
        return -(-num_bytes // self.max_token_bytes)


def reserved_template_kwargs(tokenizer) -> frozenset[str]:
    """Names a request's chat_template_kwargs may not use: apply_chat_template's own."""
    params = inspect.signature(tokenizer.apply_chat_template).parameters
    return frozenset(n for n, p in params.items()
                     if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)) | _MORE_RESERVED


class PromptInputs:
    """Text and conversations of one served model to token ids; 400s name the limit."""

    def __init__(self, tokenizer, max_model_len: int,
                 sandbox: TemplateSandbox | None = None) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.bound = TokenBound.of(tokenizer)
        self.sandbox = sandbox  # None: request-supplied templates are refused
        self.reserved = reserved_template_kwargs(tokenizer)

    def check_size(self, num_bytes: int, param: str) -> None:
        """400 when `num_bytes` of text alone prove more than max_model_len tokens."""
        least = self.bound.min_tokens(num_bytes)
        if least > self.max_model_len:
            raise APIError(400, f"{param} is {num_bytes} bytes, so at least {least} tokens "
                           f"(a token of this model covers at most {self.bound.max_token_bytes}"
                           f" bytes); max_model_len is {self.max_model_len}", param=param,
                           code="context_length_exceeded")

    async def encode(self, text: str, param: str = "prompt",
                     add_special_tokens: bool = True) -> list[int]:
        self.check_size(len(text.encode("utf-8")), param)  # lone surrogates: json_hygiene
        return await asyncio.to_thread(self._encode, text, add_special_tokens)

    async def encode_many(self, texts: list[str], param: str = "prompt") -> list[list[int]]:
        for text in texts:
            self.check_size(len(text.encode("utf-8")), param)
        return await asyncio.to_thread(lambda: [self._encode(t, True) for t in texts])

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    async def chat(self, conv: list[dict], add_generation_prompt: bool, *,
                   tools: list[dict] | None = None, chat_template: str | None = None,
                   chat_template_kwargs: dict | None = None) -> list[int]:
        """Token ids of the rendered conversation (the template adds tokens, so the message
        bytes alone already bound it from below)."""
        kwargs = dict(chat_template_kwargs or {})
        bad = sorted(k for k in kwargs if k in self.reserved or k.startswith("_"))
        if bad:
            raise APIError(400, f"chat_template_kwargs may not set {', '.join(bad)}: they are "
                           "parameters of the tokenizer, not template variables",
                           param="chat_template_kwargs")
        self.check_size(sum(len(str(m.get("content") or "").encode("utf-8")) for m in conv),
                        "messages")
        if chat_template is not None:
            text = await self._render_request_template(conv, add_generation_prompt, tools,
                                                       chat_template, kwargs)
            ids = await self.encode(text, "messages", add_special_tokens=False)
            return ids
        return await asyncio.to_thread(self._own_template, conv, add_generation_prompt,
                                       tools, kwargs)

    async def _render_request_template(self, conv, add_generation_prompt, tools, template,
                                       kwargs) -> str:
        if self.sandbox is None:
            raise APIError(400, "chat_template in a request is refused: this server does not "
                           "run templates from clients (start it with "
                           "--trust-request-chat-template to allow them)", param="chat_template")
        try:
            return await self.sandbox.render(conv, add_generation_prompt=add_generation_prompt,
                                             tools=tools, chat_template=template, **kwargs)
        except TemplateRenderError as exc:
            raise APIError(400, f"chat template failed: {exc}", param="chat_template") from exc

    def _own_template(self, conv, add_generation_prompt, tools, kwargs) -> list[int]:
        try:
            ids = self.tokenizer.apply_chat_template(
                conv, add_generation_prompt=add_generation_prompt, tokenize=True,
                tools=tools or None, **kwargs)
        except Exception as exc:  # jinja errors: the template rejected the conversation
            raise APIError(400, f"chat template failed: {exc}", param="messages") from exc
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return list(ids)
