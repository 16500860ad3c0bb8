"""The root of every error pagedllm raises on purpose, and the four kinds below it.

    PagedLLMError                          catch this to catch anything pagedllm raised
    |-- InvalidInputError   (ValueError)   what the caller gave is wrong: fix it, do not retry
    |   |-- InvalidRequestError            one request's content (HTTP 400)
    |   |-- ModelLoadError                 the model / adapter named cannot be served as is
    |   `-- ModelNotFoundError (LookupError)  no model by that name or path (start-up or 404)
    |-- EngineError         (RuntimeError) the input may be fine, the engine could not do it:
    |   |                                  overload (429), shutdown / death (503), a failed
    |   |                                  request (500), a failed kernel build or training run
    |   `-- EngineFatalError               the engine cannot go on (a worker or replica gone)
    |-- InvariantError                     pagedllm's own bookkeeping broke: a bug, never the
    |                                      caller's fault
    `-- APIError (entrypoints/errors.py)   an error already shaped as an HTTP response

Each concrete error lives beside the code that raises it (`BlockInvariantError` in
core/block_manager.py, `EngineOverloaded` in engine/admission.py, ...) and derives from one
of these kinds. User errors stay `ValueError`s and engine errors `RuntimeError`s, so the
`except ValueError` of a CLI or an HTTP handler keeps turning bad input into a clean message
or a 400. `tests/test_errors.py` checks that every exception class in the package has a kind.
"""

from __future__ import annotations


class PagedLLMError(Exception):
    """Base of every exception pagedllm defines (see the tree in this module's docstring)."""


class InvalidInputError(PagedLLMError, ValueError):
    """What the caller gave (a request, a CLI argument, a model path, an adapter, a training
    option) is wrong; the message says what and, where there is one, the limit. Retrying the
    same input cannot succeed. A `ValueError`, as the callers that turn bad input into a
    message or an HTTP 400 (`except ValueError`) expect."""


class InvalidRequestError(InvalidInputError):
    """One request's content cannot be served (a grammar that does not compile, a chat
    template that fails, a duplicate request id, more prompt than the queue may ever hold):
    the server answers 400 and goes on."""


class ModelLoadError(InvalidInputError):
    """The model or adapter that was named exists but cannot be served as it is (an
    unsupported architecture, file format or quantization type, an adapter that does not fit
    the base model); raised while loading, at start-up or by a runtime adapter load (400)."""


class ModelNotFoundError(InvalidInputError, LookupError):
    """No model answers to the name or path that was given. One class for both places a
    name is looked up, since both mean "that name names nothing here":

    - at start-up the loader finds no checkpoint at the path, Hub id or default model (the
      message says what was looked for and where);
    - while serving, a request's `model` is neither a served base-model name nor a loaded
      LoRA adapter (`ServingModels.resolve` / `unload`); the server answers 404 with code
      "model_not_found", as OpenAI does.

    A `ValueError` like every user error, and a `LookupError` as the serving side was (a
    failed lookup by name)."""


class EngineError(PagedLLMError, RuntimeError):
    """The engine could not do what was asked although the input may be fine: it is full
    (429, retry later), shutting down or dead (503), a request failed inside a step (500),
    or a build or training run failed. A `RuntimeError`, as callers have always caught."""


class EngineFatalError(EngineError):
    """The engine cannot go on (a worker or replica it needs is gone): the server fails every
    request in flight, answers /health with 503 and exits non-zero."""


class InvariantError(PagedLLMError):
    """pagedllm's own bookkeeping is inconsistent: a bug in pagedllm, never the caller's
    fault. Not a `ValueError` (no handler may answer it as bad input with a 400) and not an
    `AssertionError`: it comes from explicit checks that also run under `python -O`, and
    code that catches failed `assert`s (test helpers) must not take it for one."""
