"""ThinkingGate: the grammar waits for the end of the thinking, the budget forces the end
token, and MAYBE lets the model open the thinking or answer at once (a real llguidance
grammar inside, on the tiny tokenizer)."""

from __future__ import annotations

import numpy as np
import pytest

from pagedllm.structured_output.backend import GrammarCompiler, bitmask_words
from pagedllm.structured_output.params import StructuredOutputsParams
from pagedllm.structured_output.thinking import ThinkingParams
from pagedllm.structured_output.thinking_gate import ThinkingGate

START, END = 300, 301  # any two tokens stand for <think> / </think>


@pytest.fixture(scope="module")
def compiler(tiny_tokenizer):
    return GrammarCompiler(tiny_tokenizer, len(tiny_tokenizer), tiny_tokenizer.eos_token_id)


def _allowed(grammar, vocab: int) -> set[int]:
    mask = np.zeros((1, bitmask_words(vocab)), np.int32)
    grammar.fill_bitmask(mask, 0)
    bits = np.unpackbits(mask.view(np.uint8), axis=1, count=vocab, bitorder="little")[0]
    return set(np.flatnonzero(bits).tolist())


def _choice(compiler):
    return compiler.grammar(StructuredOutputsParams(choice=["yes", "no"]))


def test_grammar_starts_after_the_end_token(compiler, tiny_tokenizer):
    vocab = len(tiny_tokenizer)
    inner_allowed = _allowed(_choice(compiler), vocab)
    gate = ThinkingGate(_choice(compiler), ThinkingParams(START, END))
    assert _allowed(gate, vocab) == set(range(vocab))  # thinking: anything
    for t in tiny_tokenizer.encode("{not json", add_special_tokens=False):
        assert gate.accept(t)
    assert not gate.is_terminated and gate.num_thinking > 0
    gate.accept(END)
    assert _allowed(gate, vocab) == inner_allowed
    for t in tiny_tokenizer.encode("yes", add_special_tokens=False):
        assert gate.accept(t)
    assert gate.is_terminated


@pytest.mark.parametrize("budget", [0, 3])
def test_budget_forces_the_end_token(compiler, tiny_tokenizer, budget):
    vocab = len(tiny_tokenizer)
    gate = ThinkingGate(None, ThinkingParams(START, END, budget=budget))
    for _ in range(budget):
        assert _allowed(gate, vocab) == set(range(vocab))
        gate.accept(7)
    assert _allowed(gate, vocab) == {END}
    gate.accept(END)
    assert _allowed(gate, vocab) == set(range(vocab))  # no grammar after: free
    assert not gate.is_terminated


def test_maybe_opens_thinking_or_answers_at_once(compiler, tiny_tokenizer):
    vocab = len(tiny_tokenizer)
    inner_allowed = _allowed(_choice(compiler), vocab)
    params = ThinkingParams(START, END, thinking=False)
    gate = ThinkingGate(_choice(compiler), params)
    assert _allowed(gate, vocab) == inner_allowed | {START}
    thinking = gate.fork()
    thinking.accept(START)
    assert thinking.state == "thinking" and _allowed(thinking, vocab) == set(range(vocab))
    (first, *_) = tiny_tokenizer.encode("no", add_special_tokens=False)
    assert gate.accept(first) and gate.state == "done"
    assert START not in _allowed(gate, vocab)


def test_fill_bitmask_after_drafts_leaves_the_gate_as_it_was(compiler, tiny_tokenizer):
    vocab = len(tiny_tokenizer)
    gate = ThinkingGate(_choice(compiler), ThinkingParams(START, END, budget=5))
    drafts = [9, 10, END]
    mask = np.zeros((1, bitmask_words(vocab)), np.int32)
    gate.fill_bitmask_after(drafts, mask, 0)
    assert gate.state == "thinking" and gate.num_thinking == 0
    ahead = gate.fork()
    for t in drafts:
        ahead.accept(t)
    assert np.array_equal(mask[0], _mask_of(ahead, vocab))


def _mask_of(grammar, vocab: int) -> np.ndarray:
    mask = np.zeros((1, bitmask_words(vocab)), np.int32)
    grammar.fill_bitmask(mask, 0)
    return mask[0]


def test_params_are_checked():
    with pytest.raises(ValueError, match="thinking_token_budget"):
        ThinkingParams(START, END, budget=-1)
    with pytest.raises(ValueError, match="end_token_id"):
        ThinkingParams(START, -2)
