"""Checks on a parsed request body before any model validates it: nesting depth and lone
surrogates.

Python's JSON parser accepts both, and both fail much later in ways that became 500s: a
`structured_outputs.json` nested 900 deep made `SamplingParams.clone` (a deepcopy) raise
RecursionError, and "a\\ud800b" (a lone UTF-16 surrogate, which no UTF-8 text can hold) made
the tokenizer or the response encoder raise. The walk is iterative (it must not itself
recurse) and visits each value once, so it costs O(body size).
"""

from __future__ import annotations

from pagedllm.errors import InvalidRequestError

MAX_JSON_DEPTH = 64  # objects/arrays inside each other; real requests nest a handful deep


class BadRequestBody(InvalidRequestError):
    """The body nests too deeply or holds a string that is not valid Unicode text."""

    def __init__(self, message: str, path: str) -> None:
        super().__init__(message)
        self.path = path  # dotted location of the offending value ("" for the body)


def check_json_tree(body: object, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Raise BadRequestBody if `body` nests deeper than `max_depth` or any string in it
    (keys included) holds a lone surrogate."""
    stack: list[tuple[object, int, str]] = [(body, 0, "")]
    while stack:
        value, depth, path = stack.pop()
        if isinstance(value, str):
            _check_text(value, path)
            continue
        if not isinstance(value, (dict, list)):
            continue
        if depth >= max_depth:
            raise BadRequestBody(f"request JSON nests deeper than {max_depth} levels at "
                                 f"{path or 'the top'}", path)
        if isinstance(value, dict):
            for key, item in value.items():
                sub = f"{path}.{key}" if path else str(key)
                if isinstance(key, str):
                    _check_text(key, sub)
                stack.append((item, depth + 1, sub))
        else:
            stack.extend((item, depth + 1, f"{path}[{i}]") for i, item in enumerate(value))


def _check_text(text: str, path: str) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BadRequestBody(
            f"{_shown(path)} holds a lone UTF-16 surrogate at character {exc.start} "
            "(not valid Unicode text)", path) from None


def _shown(path: str) -> str:
    """The path as printable text (it may itself hold the surrogate), at most ~80 chars."""
    path = path.encode("utf-8", "backslashreplace").decode("utf-8")
    return (path[:80] + "...") if len(path) > 80 else (path or "the body")
