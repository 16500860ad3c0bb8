"""Training data: JSONL lines -> token ids with a loss mask, and padded batches.

Three line formats (one per line, mixed freely):

    {"messages": [{"role": ..., "content": ...}, ...]}  chat template; loss on assistant turns
    {"prompt": "...", "completion": "..."}              loss on the completion (+ EOS)
    {"text": "..."}                                     loss on every token

For messages, each assistant turn's span is found in the rendered conversation as the text
between the render of the turns before it (with the generation prompt) and the render that
includes it; tokens starting inside a span get loss::

    render(m[:k-1], gen prompt)  "<s>user: hi\\n<s>assistant:"
    render(m[:k])                "<s>user: hi\\n<s>assistant: hello\\n"
    span                                                     " hello\\n"   (loss)

A label is the next token: position t predicts ids[t + 1] where mask[t + 1] is set.
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass
from pathlib import Path

import torch

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Example:
    """One tokenized line: `loss_mask[i]` says whether token i is a training target."""

    ids: list[int]
    loss_mask: list[bool]

    @property
    def num_targets(self) -> int:
        return sum(self.loss_mask[1:])


@dataclass(frozen=True)
class Batch:
    """Right-padded ids [B, L], `valid` [B, L] real tokens, `targets` [B, L] next-token
    labels with -100 where no loss is taken."""

    ids: torch.Tensor
    valid: torch.Tensor
    targets: torch.Tensor

    @property
    def num_targets(self) -> int:
        return int((self.targets >= 0).sum())

    @property
    def num_tokens(self) -> int:
        return int(self.valid.sum())


def _messages_example(tok, messages, where: str) -> tuple[list[int], list[bool]]:
    if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str) for m in messages):
        raise ValueError(f"{where}: 'messages' must be a non-empty list of objects with string "
                         "'role' and 'content'")
    if not any(m["role"] == "assistant" for m in messages):
        raise ValueError(f"{where}: 'messages' has no assistant turn to train on")
    if not getattr(tok, "chat_template", None):
        raise ValueError(f"{where}: the tokenizer has no chat template; use prompt/completion "
                         "or text lines")

    def render(msgs, gen: bool) -> str:
        return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)

    full = render(messages, False)
    spans = []
    for k, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        start, end = render(messages[:k], True) if k else "", render(messages[:k + 1], False)
        if not (full.startswith(end) and end.startswith(start)):
            raise ValueError(f"{where}: the chat template does not render the conversation "
                             "turn by turn as prefixes; cannot tell the assistant tokens apart")
        spans.append((len(start), len(end)))
    enc = tok(full, add_special_tokens=False, return_offsets_mapping=True)
    mask = [any(a <= s < b for a, b in spans) for s, _ in enc["offset_mapping"]]
    return list(enc["input_ids"]), mask


def encode_line(tok, row: dict, where: str) -> Example:
    """Tokenize one parsed JSONL object (see the module docstring)."""
    if "messages" in row:
        ids, mask = _messages_example(tok, row["messages"], where)
    elif "prompt" in row or "completion" in row:
        p, c = row.get("prompt"), row.get("completion")
        if not isinstance(p, str) or not isinstance(c, str) or not c:
            raise ValueError(f"{where}: 'prompt' and 'completion' must both be strings (the "
                             "completion non-empty)")
        pi = tok(p)["input_ids"]
        ci = tok(c, add_special_tokens=False)["input_ids"]
        if tok.eos_token_id is not None:
            ci = [*ci, tok.eos_token_id]
        ids, mask = [*pi, *ci], [False] * len(pi) + [True] * len(ci)
    elif "text" in row:
        if not isinstance(row["text"], str) or not row["text"]:
            raise ValueError(f"{where}: 'text' must be a non-empty string")
        ids = tok(row["text"])["input_ids"]
        mask = [True] * len(ids)
    else:
        raise ValueError(f"{where}: a line needs 'messages', 'prompt'+'completion' or 'text'; "
                         f"got keys {sorted(row)}")
    return Example(list(ids), mask)


def load_jsonl(path: Path, tok, max_seq_len: int) -> list[Example]:
    """Every line of `path` tokenized and truncated to `max_seq_len`; lines left with no
    target token are dropped (with a warning). Raises ValueError naming file:line."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"data file {path} does not exist")
    examples, truncated, empty = [], 0, 0
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not valid JSON: {e}") from None
        if not isinstance(row, dict):
            raise ValueError(f"{where}: each line must be a JSON object")
        ex = encode_line(tok, row, where)
        if len(ex.ids) > max_seq_len:
            truncated += 1
            ex = Example(ex.ids[:max_seq_len], ex.loss_mask[:max_seq_len])
        if ex.num_targets == 0:
            empty += 1
            continue
        examples.append(ex)
    if truncated:
        logger.warning("%s: %d example(s) truncated to max_seq_len %d", path, truncated,
                       max_seq_len)
    if empty:
        logger.warning("%s: %d example(s) have no target token left and were skipped", path,
                       empty)
    if not examples:
        raise ValueError(f"{path} has no example with a target token")
    return examples


def collate(examples: list[Example], pad_id: int = 0) -> Batch:
    n = max(len(e.ids) for e in examples)
    ids = torch.full((len(examples), n), pad_id, dtype=torch.long)
    valid = torch.zeros(len(examples), n, dtype=torch.bool)
    targets = torch.full((len(examples), n), -100, dtype=torch.long)
    for i, e in enumerate(examples):
        k = len(e.ids)
        ids[i, :k] = torch.tensor(e.ids)
        valid[i, :k] = True
        t = torch.tensor(e.ids[1:])
        m = torch.tensor(e.loss_mask[1:], dtype=torch.bool)
        targets[i, :k - 1] = torch.where(m, t, torch.full_like(t, -100))
    return Batch(ids, valid, targets)


def batches(examples: list[Example], batch_size: int, *, shuffle: bool, seed: int,
            epoch: int) -> list[Batch]:
    """One epoch of batches (shuffled with `seed` + `epoch`)."""
    order = list(range(len(examples)))
    if shuffle:
        random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return [collate([examples[j] for j in order[i:i + batch_size]])
            for i in range(0, len(order), batch_size)]
