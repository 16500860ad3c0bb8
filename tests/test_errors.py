"""One error hierarchy (pagedllm/errors.py): every exception class defined anywhere in the
package derives from `PagedLLMError` through exactly one kind, user errors stay `ValueError`s
and engine errors `RuntimeError`s (callers' `except` clauses rely on both), and there is one
"model not found".

The package is walked with pkgutil, so a class added later in any module is checked too."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from functools import cache
from types import ModuleType

import pytest

import pagedllm
from pagedllm.entrypoints.errors import APIError
from pagedllm.errors import (
    EngineError,
    EngineFatalError,
    InvalidInputError,
    InvalidRequestError,
    InvariantError,
    ModelLoadError,
    ModelNotFoundError,
    PagedLLMError,
)

# Exception classes not under PagedLLMError, each with the reason (none: keep it so).
NOT_YET_IN_HIERARCHY: dict[str, str] = {}

# The kinds directly below PagedLLMError: each error derives from exactly one.
KINDS = (InvalidInputError, EngineError, InvariantError, APIError)

# Callers catch these as ValueError (the CLI's and the server's `except ValueError` turn them
# into a message or a 400): they must stay user errors.
USER_ERRORS = {
    "pagedllm.engine.admission.RequestNeverAdmittable",
    "pagedllm.engine.request_stream.DuplicateRequestId",
    "pagedllm.engine.chat_template.MissingChatTemplateError",
    "pagedllm.entrypoints.json_hygiene.BadRequestBody",
    "pagedllm.entrypoints.template_sandbox.TemplateRenderError",
    "pagedllm.errors.ModelNotFoundError",
    "pagedllm.finetune.lora_train.TargetError",
    "pagedllm.loader.errors.UnsupportedModelError",
    "pagedllm.lora.adapter.AdapterError",
    "pagedllm.model.layers.quant.gguf.UnsupportedQuantTypeError",
    "pagedllm.model.registry.UnsupportedArchitectureError",
    "pagedllm.structured_output.backend.GrammarCompileError",
}

# Callers catch these as RuntimeError.
RUNTIME_ERRORS = {
    "pagedllm.data_parallel.client.ReplicaDied",
    "pagedllm.distributed.errors.WorkerDied",
    "pagedllm.engine.admission.EngineOverloaded",
    "pagedllm.engine.request_stream.EngineDead",
    "pagedllm.engine.request_stream.EngineShuttingDown",
    "pagedllm.engine.request_stream.RequestFailed",
    "pagedllm.engine.request_stream.RequestAborted",
    "pagedllm.errors.EngineFatalError",
    "pagedllm.finetune.trainer.FrozenBaseError",
    "pagedllm.finetune.trainer.NonFiniteLossError",
}


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


@cache
def _walk() -> tuple[tuple[ModuleType, ...], tuple[tuple[str, str], ...]]:
    """Every importable module of pagedllm, and (module, reason) for those left out."""
    modules, skipped = [], []
    for info in pkgutil.walk_packages(pagedllm.__path__, "pagedllm."):
        if info.name.endswith(".__main__"):
            skipped.append((info.name, "runs the CLI when imported"))
            continue
        try:
            modules.append(importlib.import_module(info.name))
        except ModuleNotFoundError as exc:
            # An optional dependency this environment lacks (e.g. a CUDA-only package); a
            # missing pagedllm module is a real failure.
            if exc.name is None or exc.name.split(".")[0] == "pagedllm":
                raise
            skipped.append((info.name, f"needs {exc.name}, which is not installed"))
    return tuple(modules), tuple(skipped)


@cache
def _exception_classes() -> dict[str, type[Exception]]:
    """Exception classes by qualified name, each from the module that defines it. (A
    BaseException that is not an Exception, like InjectedEngineDeath, is meant to escape
    `except Exception` and is left out.)"""
    found = {}
    for module in _walk()[0]:
        for obj in vars(module).values():
            if (inspect.isclass(obj) and issubclass(obj, Exception)
                    and obj.__module__ == module.__name__):
                found[_name(obj)] = obj
    return found


def test_the_walk_found_the_package() -> None:
    modules, _ = _walk()
    names = {m.__name__ for m in modules}
    assert {"pagedllm.core.block_manager", "pagedllm.entrypoints.serving",
            "pagedllm.loader.hub"} <= names
    assert len(_exception_classes()) >= 25


def test_modules_left_out() -> None:
    skipped = [(name, why) for name, why in _walk()[1] if not name.endswith(".__main__")]
    if skipped:
        pytest.skip("not imported: " + "; ".join(f"{n} ({why})" for n, why in skipped))


def test_every_exception_derives_from_pagedllm_error() -> None:
    outside = sorted(name for name, cls in _exception_classes().items()
                     if not issubclass(cls, PagedLLMError) and name not in NOT_YET_IN_HIERARCHY)
    assert outside == [], "derive these from a kind in pagedllm/errors.py"


def test_every_error_has_exactly_one_kind() -> None:
    for name, cls in _exception_classes().items():
        if name in NOT_YET_IN_HIERARCHY or cls is PagedLLMError or cls in KINDS:
            continue
        kinds = [k.__name__ for k in KINDS if issubclass(cls, k)]
        assert len(kinds) == 1, f"{name} has kinds {kinds}"


def test_kinds_keep_the_builtin_bases_callers_catch() -> None:
    assert issubclass(InvalidInputError, ValueError)
    for sub in (InvalidRequestError, ModelLoadError, ModelNotFoundError):
        assert issubclass(sub, InvalidInputError)
    assert issubclass(EngineError, RuntimeError)
    assert issubclass(EngineFatalError, EngineError)
    assert not issubclass(InvariantError, ValueError | AssertionError)
    assert not issubclass(APIError, ValueError)  # `except ValueError` re-wraps as a 400


def test_user_errors_are_value_errors() -> None:
    classes = _exception_classes()
    assert not USER_ERRORS - classes.keys(), "renamed or moved: update the list"
    for name in USER_ERRORS:
        assert issubclass(classes[name], InvalidInputError), name
        assert issubclass(classes[name], ValueError), name


def test_engine_errors_are_runtime_errors() -> None:
    classes = _exception_classes()
    assert not RUNTIME_ERRORS - classes.keys(), "renamed or moved: update the list"
    for name in RUNTIME_ERRORS:
        assert issubclass(classes[name], RuntimeError), name
        assert not issubclass(classes[name], ValueError), name


def test_one_model_not_found() -> None:
    found = [name for name in _exception_classes() if "notfound" in name.lower()]
    assert found == ["pagedllm.errors.ModelNotFoundError"]
    assert issubclass(ModelNotFoundError, LookupError)  # the server's lookup by name


def test_not_yet_in_hierarchy_list_is_current() -> None:
    classes = _exception_classes()
    for name in NOT_YET_IN_HIERARCHY:
        assert name in classes, f"{name} is gone: remove it from NOT_YET_IN_HIERARCHY"
        assert not issubclass(classes[name], PagedLLMError), (
            f"{name} is a PagedLLMError now: remove it from NOT_YET_IN_HIERARCHY")
