"""Loss masks of the three line formats: assistant tokens only, completion (+ EOS) only,
every token of a text; labels are the next token."""

from __future__ import annotations

from pagedllm.finetune.data import collate, encode_line


def test_messages_loss_only_on_assistant_turns(tiny_tokenizer) -> None:
    msgs = [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "more"}, {"role": "assistant", "content": "sure thing"}]
    ex = encode_line(tiny_tokenizer, {"messages": msgs}, "x")
    full = tiny_tokenizer.apply_chat_template(msgs, tokenize=False)
    assert tiny_tokenizer.decode(ex.ids) == full
    trained = tiny_tokenizer.decode([t for t, m in zip(ex.ids, ex.loss_mask, strict=True) if m])
    assert trained == " hello\n sure thing\n"


def test_prompt_completion_and_text(tiny_tokenizer) -> None:
    ex = encode_line(tiny_tokenizer, {"prompt": "count 3:", "completion": " 3 4"}, "x")
    n_prompt = len(tiny_tokenizer("count 3:")["input_ids"])
    assert ex.loss_mask == [False] * n_prompt + [True] * (len(ex.ids) - n_prompt)
    assert ex.ids[-1] == tiny_tokenizer.eos_token_id
    text = encode_line(tiny_tokenizer, {"text": "plain words"}, "x")
    assert all(text.loss_mask)
    b = collate([ex, text])
    assert b.ids.shape == (2, len(ex.ids)) and b.valid[1].sum() == len(text.ids)
    assert b.targets[0, n_prompt - 1] == ex.ids[n_prompt]  # first completion token
    assert (b.targets[0, :n_prompt - 1] == -100).all() and b.targets[0, len(ex.ids) - 1] == -100
    assert b.num_targets == (len(ex.ids) - n_prompt) + (len(text.ids) - 1)
