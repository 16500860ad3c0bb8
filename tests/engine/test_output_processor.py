"""OutputProcessor.process with StepUpdates made by hand (no model, no scheduler): it only
detokenizes, finds stop strings (where in a speculative run), leaves a stop token's text out
unless asked, registers forked siblings and names the sequences of failed groups."""

from __future__ import annotations

import pytest

from pagedllm.core.request import Request
from pagedllm.core.scheduler_output import StepUpdate
from pagedllm.engine.output_processor import OutputProcessor
from pagedllm.outputs import RequestOutputKind
from pagedllm.sampling_params import SamplingParams


@pytest.fixture
def proc(tiny_tokenizer) -> OutputProcessor:
    return OutputProcessor(tiny_tokenizer)


def add(proc: OutputProcessor, tokenizer, text: str = "The", **params) -> Request:
    req = Request("g", tokenizer.encode(text), SamplingParams(**params),
                  eos_token_id=tokenizer.eos_token_id)
    proc.add(req)
    return req


def appended(req: Request, tokens: list[int]) -> StepUpdate:
    for t in tokens:
        req.append_token(t)
    return StepUpdate(appended={req: len(tokens)})


def test_detokenizes_what_was_appended(proc, tiny_tokenizer) -> None:
    req = add(proc, tiny_tokenizer)
    words = tiny_tokenizer.encode(" the value of")
    step = proc.process(appended(req, words))
    assert step.touched == {"g"} and not step.stop_strings and not step.to_abort
    out = proc.make_output("g", kind=RequestOutputKind.CUMULATIVE)
    assert out.outputs[0].text == tiny_tokenizer.decode(words)
    assert "g" in proc and len(proc) == 1


def test_a_stop_string_inside_a_run_says_where(proc, tiny_tokenizer) -> None:
    words = tiny_tokenizer.encode(" the value of the")
    stop = tiny_tokenizer.decode(words[:2]).strip()
    req = add(proc, tiny_tokenizer, stop=[stop])
    step = proc.process(appended(req, words))          # e.g. a speculative run of 4 tokens
    [hit] = step.stop_strings
    assert hit.request is req and hit.stop == stop
    assert hit.num_output_tokens < len(words)             # the tokens after it are dropped


@pytest.mark.parametrize("include", [False, True])
def test_a_stop_tokens_text_only_with_include_stop_str(proc, tiny_tokenizer, include) -> None:
    word = tiny_tokenizer.encode(" value")
    stop_id = word[-1]
    req = add(proc, tiny_tokenizer, stop_token_ids=[stop_id],
              include_stop_str_in_output=include)
    proc.process(appended(req, word))
    text = proc.make_output("g").outputs[0].text
    assert (text == tiny_tokenizer.decode(word)) == include


def test_forked_siblings_get_detokenizers_and_join_the_group(proc, tiny_tokenizer) -> None:
    req = add(proc, tiny_tokenizer, n=2)
    req.forked = True
    child = req.fork("g-1", 1)
    a, b = tiny_tokenizer.encode(" value")[0], tiny_tokenizer.encode(" the")[0]
    req.append_token(a)
    child.append_token(b)
    proc.process(StepUpdate(appended={req: 1, child: 1}, forked=[child]))
    assert proc.sequences("g") == [req, child]
    texts = [c.text for c in proc.make_output("g").outputs]
    assert texts == [tiny_tokenizer.decode([a]), tiny_tokenizer.decode([b])]


def test_a_failed_group_names_its_sequences_to_abort(proc, tiny_tokenizer) -> None:
    req = add(proc, tiny_tokenizer)
    step = proc.process(StepUpdate(errors={"g": "logits are NaN"}))
    assert step.to_abort == [req] and step.touched == {"g"}
    out = proc.make_output("g")
    assert out.finished and "logits are NaN" in str(out.error)
    assert "g" not in proc and proc.remove("g") is None
