"""`APIError`: an error answered in OpenAI's shape (used by every serving module)."""

from __future__ import annotations

from pagedllm.entrypoints.protocol import ErrorInfo, ErrorResponse
from pagedllm.errors import PagedLLMError

MAX_MESSAGE_CHARS = 2000  # messages quote request values; a 4 MB model name is not echoed


class APIError(PagedLLMError):
    """An error answered as {"error": {"message", "type", "param", "code"}} with `status`."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        message = _printable(message)
        super().__init__(message)
        self.status, self.message, self.type, self.code = status, message, type, code
        self.param = _printable(param) if param is not None else None
        self.headers = headers

    def body(self) -> dict:
        return ErrorResponse(error=ErrorInfo(message=self.message, type=self.type,
                                             param=self.param, code=self.code)).model_dump()


def _printable(text: str) -> str:
    """`text` as valid UTF-8 (a lone surrogate quoted from a request would make the response
    encoder fail: a 500 instead of the 4xx) and at most MAX_MESSAGE_CHARS long."""
    if not text.isascii():
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) > MAX_MESSAGE_CHARS:
        text = f"{text[:MAX_MESSAGE_CHARS]}... ({len(text)} characters)"
    return text
