"""The grammar engine: llguidance (see docs/benchmarks.md for why it and not xgrammar).

`GrammarCompiler` turns `StructuredOutputsParams` into an llguidance grammar, checks it
against the tokenizer once per distinct spec (an LRU cache keyed by the spec), and hands each
request its own `RequestGrammar`: a copy of the cached initial matcher that advances with
the request's tokens and writes its allowed-token bitmask into one row of a batch bitmask.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict

import llguidance
import llguidance.hf
import numpy as np

from pagedllm.errors import InvalidRequestError
from pagedllm.structured_output.params import StructuredOutputsParams

logger = logging.getLogger(__name__)

# Compact JSON: bounded schemas have bounded output (see StructuredOutputsParams).
_COMPACT_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarCompileError(InvalidRequestError):
    """The backend cannot compile a request's schema / regex / grammar (its message)."""


def bitmask_words(vocab_size: int) -> int:
    """int32 words per row of a token bitmask (bit j of word w = token 32 * w + j)."""
    return (vocab_size + 31) // 32


class RequestGrammar:
    """One sequence's matcher: its allowed tokens now, and the tokens it accepted."""

    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self.matcher = matcher

    def fill_bitmask(self, bitmask: np.ndarray, row: int) -> None:
        """Write the allowed next tokens (EOS only where the grammar may end) into `bitmask[row]`."""
        view = bitmask[row]
        self.matcher.unsafe_compute_mask_ptr(view.ctypes.data, view.nbytes)

    def fill_bitmask_after(self, tokens: list[int], bitmask: np.ndarray, row: int) -> None:
        """The mask as it would be after `tokens` (speculative decoding's draft tokens); the
        matcher is left as it was. Tokens past one the grammar rejects are not consumed (the
        row is then never used: that draft is rejected first)."""
        n = self.matcher.try_consume_tokens(tokens) if tokens else 0
        try:
            self.fill_bitmask(bitmask, row)
        finally:
            if n:
                self.matcher.rollback(n)

    def accept(self, token_id: int) -> bool:
        """Advance by one sampled token; False if the grammar rejects it (error state: the
        request then stops, see `is_terminated`). Only possible when another restriction
        (allowed_token_ids, bad_words) left no token the grammar allows."""
        ok = self.matcher.consume_token(token_id)
        if not ok:
            logger.warning("grammar rejected token %d: %s", token_id, self.matcher.get_error())
        return ok

    @property
    def is_terminated(self) -> bool:
        """Nothing but EOS can follow: the output is complete (or the matcher failed)."""
        return self.matcher.is_stopped()

    @property
    def error(self) -> str:
        return self.matcher.get_error()

    def fork(self) -> RequestGrammar:
        return RequestGrammar(self.matcher.deep_copy())


class GrammarCompiler:
    """Compiles specs for one tokenizer; the llguidance tokenizer is built on first use (~1 s)."""

    def __init__(self, hf_tokenizer, vocab_size: int, eos_token_id: int | None,
                 cache_size: int = 256) -> None:
        self._hf_tokenizer = hf_tokenizer
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self.cache_size = cache_size
        self._ll_tokenizer: llguidance.LLTokenizer | None = None
        self._cache: OrderedDict[tuple, llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def ll_tokenizer(self) -> llguidance.LLTokenizer:
        if self._ll_tokenizer is None:
            logger.info("building the llguidance tokenizer (%d tokens)", self.vocab_size)
            self._ll_tokenizer = llguidance.hf.from_tokenizer(
                self._hf_tokenizer, n_vocab=self.vocab_size, eos_token=self.eos_token_id)
        return self._ll_tokenizer

    def grammar(self, params: StructuredOutputsParams) -> RequestGrammar:
        """A fresh matcher for `params`; raises GrammarCompileError with the backend's message."""
        return RequestGrammar(self.template(params).deep_copy())

    def template(self, params: StructuredOutputsParams) -> llguidance.LLMatcher:
        """The compiled initial matcher of `params` (cached). Thread-safe: the server compiles
        a request's spec in a worker thread before the engine thread adds the request, so a
        slow compile (a huge JSON schema: seconds) never stalls the engine's steps."""
        key = params.cache_key()
        with self._lock:
            template = self._cache.get(key)
            if template is not None:
                self._cache.move_to_end(key)
                return template
        template = self._compile(params)  # outside the lock: lookups go on meanwhile
        with self._lock:
            self._cache[key] = template
            if len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return template

    def _compile(self, params: StructuredOutputsParams) -> llguidance.LLMatcher:
        try:
            text = grammar_text(params)
        except ValueError as exc:
            raise GrammarCompileError(f"invalid {params.kind}: {exc}") from None
        error = llguidance.LLMatcher.validate_grammar(text, self.ll_tokenizer)
        if error:
            raise GrammarCompileError(f"invalid {params.kind}: {error.strip()}")
        matcher = llguidance.LLMatcher(self.ll_tokenizer, text, log_level=0)
        if matcher.is_error():
            raise GrammarCompileError(f"invalid {params.kind}: {matcher.get_error()}")
        return matcher


def grammar_text(params: StructuredOutputsParams) -> str:
    """The llguidance grammar definition for `params` (raises ValueError on malformed input)."""
    kind = params.kind
    if kind in ("json", "json_object"):
        schema = {"type": "object"} if kind == "json_object" else params.json
        options = dict(_COMPACT_JSON)
        if params.whitespace_pattern is not None:
            options = {"whitespace_flexible": True, "whitespace_pattern": params.whitespace_pattern}
        text = schema if isinstance(schema, str) else json.dumps(schema)
        return llguidance.LLMatcher.grammar_from_json_schema(text, defaults=options)
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(params.regex)
    if kind == "choice":
        return llguidance.grammar_from("choice", json.dumps(params.choice))
    return llguidance.grammar_from("grammar", params.grammar)  # Lark, or GBNF converted
