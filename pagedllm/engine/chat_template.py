"""Chat templates: vLLM's `--chat-template` (a file or inline Jinja) and the error a model
without one gives.

`resolve_chat_template` turns the flag's value into template text once, at start-up; the
engine sets it on the tokenizer, so the server, `pagedllm chat` and `LLM.chat` all use it.
"""

from __future__ import annotations

from pathlib import Path

from pagedllm.errors import InvalidRequestError

NO_TEMPLATE_HINT = (
    "the model has no chat template (base models usually do not); pass one with "
    "--chat-template FILE_OR_JINJA (offline: LLM(model, chat_template=...) or "
    "LLM.chat(..., chat_template=...)), or use the completions API with a plain prompt")


class MissingChatTemplateError(InvalidRequestError):
    """Chat was asked of a model that has no chat template and none was given."""

    def __init__(self) -> None:
        super().__init__(NO_TEMPLATE_HINT)


def resolve_chat_template(value: str | None) -> str | None:
    """The template text of `value`: the contents of the file it names, else `value` itself
    when it looks like Jinja ("{{" or "{%"); anything else is an error (a mistyped path)."""
    if value is None:
        return None
    looks_inline = "{{" in value or "{%" in value
    if not looks_inline:
        path = Path(value).expanduser()
        try:
            return path.read_text()
        except OSError as exc:
            raise ValueError(
                f"chat_template {value!r} is neither a readable file ({exc.strerror}) nor an "
                "inline Jinja template (it contains no '{{' or '{%')") from None
    return value


def check_chat_template(tokenizer, override: str | None = None) -> None:
    """Raise MissingChatTemplateError unless the tokenizer or `override` has a template."""
    if not override and not getattr(tokenizer, "chat_template", None):
        raise MissingChatTemplateError()
