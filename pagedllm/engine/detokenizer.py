"""Incremental detokenization and stop strings for one sequence.

Text is produced by decoding a short window of ids and diffing it against the decode of the window's
head, whose text is already in the output (vLLM's prefix/read offset algorithm):

    ids:  ... | p5 p6 p7 p8 p9 | o0 o1 o2 o3 |
              ^prefix_offset   ^read_offset  ^len(ids)
    prefix_text = decode(ids[prefix_offset:read_offset])    # cached, already emitted
    window_text = decode(ids[prefix_offset:])               # prefix_text + new text

Decoding with a few tokens of left context gets the seams right: SentencePiece decoders drop the
leading space of the *first* token only, so "▁world" decodes to " world" after context. When the new
text is complete (does not end in U+FFFD, the mark of an unfinished multi-byte character), the window
slides: prefix_offset = read_offset, read_offset = len(ids). Otherwise the window grows and only the
characters in front of the trailing U+FFFD run are emitted. Each step decodes O(new tokens).
"""

from __future__ import annotations

from typing import Any

_PROMPT_CONTEXT_TOKENS = 5
_REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """Per-sequence detokenizer: turns token ids appended one (or a few) at a time into text deltas,
    never emitting broken UTF-8 (a partial multi-byte character decodes as U+FFFD; it is held back
    until a following token completes it, or until the sequence finishes), and applies stop strings.

    The output text is what ``tokenizer.decode(prompt + output)`` adds after the prompt's text, so a
    SentencePiece model's first word keeps its leading space. Special tokens produce no text when
    ``skip_special_tokens``. When several stop strings match, the one that completes first (earliest
    end) wins; ties go to the longer one.
    """

    def __init__(
        self,
        tokenizer: Any,
        prompt_token_ids: list[int],
        *,
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
        stop: list[str] | None = None,
        include_stop_str_in_output: bool = False,
        min_tokens: int = 0,
    ) -> None:
        self.stop = list(stop or [])
        if any(not s for s in self.stop):
            raise ValueError(f"stop strings must be non-empty, got {self.stop!r}")
        self.include_stop_str_in_output = include_stop_str_in_output
        # vLLM checks stop strings only once more than min_tokens tokens were generated; text
        # of the first min_tokens tokens is never searched (a match may still span the seam).
        self.min_tokens = min_tokens
        self._num_output_tokens = 0
        self._tokenizer = tokenizer
        self._decode_kwargs: dict[str, Any] = {
            "skip_special_tokens": skip_special_tokens,
            # why: any cleanup ("a ." -> "a.") would make window decodes disagree with their prefixes
            "clean_up_tokenization_spaces": False,
        }
        if not getattr(tokenizer, "is_fast", False):  # fast tokenizers have no such option
            self._decode_kwargs["spaces_between_special_tokens"] = spaces_between_special_tokens
        # A stop string may still be completing in the last (longest stop - 1) characters.
        self._holdback = max(map(len, self.stop), default=1) - 1

        self._ids: list[int] = list(prompt_token_ids[-_PROMPT_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._prefix_text = self._decode(self._ids)
        # Characters of the current window's new text already committed to _text: the complete
        # characters in front of an unfinished one.
        self._window_committed = 0
        self._text = ""
        self._num_sent = 0  # characters of output returned by get_delta so far
        self._stop_str: str | None = None

    @property
    def stop_str(self) -> str | None:
        """The stop string that matched, or None."""
        return self._stop_str

    @property
    def output_text(self) -> str:
        """All text so far (final once finished). A trailing unfinished character shows as U+FFFD,
        as in ``tokenizer.decode``; it is replaced if a later token completes it."""
        if self._stop_str is not None or self._read_offset == len(self._ids):
            return self._text
        return self._text + self._window_new_text()[self._window_committed :]

    def update(self, new_token_ids: list[int]) -> str | None:
        """Append tokens; return the stop string that matched (the sequence must then finish with
        reason 'stop'), else None. After a match, output_text is truncated at the stop string
        (excluded unless include_stop_str_in_output; if included, truncated right after it), and
        tokens after the one that completed the match are ignored, as are further updates."""
        if self._stop_str is not None:
            return None
        for token_id in new_token_ids:
            self._ids.append(token_id)
            self._num_output_tokens += 1
            new_text = self._window_new_text()
            complete = new_text.rstrip(_REPLACEMENT_CHAR)
            old_len = len(self._text)
            if len(complete) > self._window_committed:
                self._text += complete[self._window_committed :]
                self._window_committed = len(complete)
            if new_text and len(complete) == len(new_text):  # no unfinished character: slide
                self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
                self._prefix_text = self._decode(self._ids[self._prefix_offset :])
                self._window_committed = 0
            if (self.stop and self._num_output_tokens > self.min_tokens
                    and len(self._text) > old_len and self._find_stop(old_len)):
                return self._stop_str
        return None

    def get_delta(self, finished: bool) -> str:
        """Text not yet returned by a previous get_delta call. While not finished, hold back the
        last (max stop string length - 1) characters (they might be the start of a stop string), so
        a streamed concatenation of deltas always equals the final output_text."""
        text = self.output_text if finished else self._text
        # Once a stop string matched the text is already truncated and final.
        holdback = 0 if finished or self._stop_str is not None else self._holdback
        end = len(text) - holdback
        if end <= self._num_sent:
            return ""
        delta = text[self._num_sent : end]
        self._num_sent = end
        return delta

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, **self._decode_kwargs) if ids else ""

    def _window_new_text(self) -> str:
        """Text the ids after read_offset add to the window; '' if decoding shrank it (e.g. a
        skipped special token)."""
        window_text = self._decode(self._ids[self._prefix_offset :])
        if len(window_text) <= len(self._prefix_text):
            return ""
        return window_text[len(self._prefix_text) :]

    def _find_stop(self, old_len: int) -> bool:
        """Search text added after old_len (plus the characters a stop string could span before
        it); on a match, truncate the output and record the stop string."""
        best: tuple[int, int, str] | None = None  # (end, -len, stop)
        for s in self.stop:
            start = self._text.find(s, max(0, old_len - len(s) + 1))
            if start != -1 and (best is None or (start + len(s), -len(s)) < best[:2]):
                best = (start + len(s), -len(s), s)
        if best is None:
            return False
        end, neg_len, s = best
        self._text = self._text[: end if self.include_stop_str_in_output else end + neg_len]
        self._stop_str = s
        return True
