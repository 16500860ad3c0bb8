"""Test-only fault injection, installed by the tests as wrappers around pagedllm's own classes
(the engine knows nothing of it): a request whose prompt contains a marker fails inside the
engine, to check that a fault stays contained (tests/engine/test_fault_containment.py,
tests/entrypoints/test_server_overload_faults.py).

    PAGEDLLM_TEST_FAULTS="output=MARK1;logits=MARK2;die=MARK3"

MARK1: the request's detokenizer raises `InjectedFault` (as a detokenizer or stop-check bug
would); MARK2: its logits rows are NaN when the runner samples them (a bad logits row);
MARK3: scheduling it kills the engine thread (`InjectedEngineDeath`, a BaseException so that
no per-step handler catches it). The server tests start `python tests/fault_injection.py
serve ...`, which installs the wrappers from the environment variable, then serves.
"""

from __future__ import annotations

import os
import sys
import weakref

ENV = "PAGEDLLM_TEST_FAULTS"
KINDS = ("output", "logits", "die")


class InjectedFault(RuntimeError):
    """A fault injected into one request's output processing."""


class InjectedEngineDeath(BaseException):
    """Kills the engine thread (not an Exception, so step-level handlers let it through)."""


def parse(text: str) -> dict[str, str]:
    """KIND=MARKER;... -> {kind: marker}."""
    markers = {}
    for item in text.split(";"):
        kind, _, marker = item.partition("=")
        if kind not in KINDS or not marker:
            raise ValueError(f"{ENV}: expected KIND=MARKER with KIND in {KINDS}, got {item!r}")
        markers[kind] = marker
    return markers


def install(markers: dict[str, str], setattr_=setattr) -> None:
    """Wrap add_request (which marks the targets), the detokenizer, the runner's sampling
    and the scheduler (`setattr_`: pytest's
    `monkeypatch.setattr` to undo it after a test; plain setattr in a server process)."""
    from pagedllm.core.scheduler import Scheduler
    from pagedllm.engine.detokenizer import IncrementalDetokenizer
    from pagedllm.engine.llm_engine import LLMEngine
    from pagedllm.worker import model_runner

    def hit(kind: str, text: str) -> bool:
        return kind in markers and markers[kind] in text

    targets: dict[str, set[str]] = {kind: set() for kind in KINDS}  # kind -> group ids
    add_request = LLMEngine.add_request

    def marking_add_request(self, *args, **kwargs) -> str:
        request_id = add_request(self, *args, **kwargs)
        text = self.tokenizer.decode(self.output_processor.sequences(request_id)[0]
                                     .prompt_token_ids)
        for kind in KINDS:
            (targets[kind].add if hit(kind, text) else targets[kind].discard)(request_id)
        return request_id

    faulty = weakref.WeakSet()  # detokenizers of "output" requests
    init, update = IncrementalDetokenizer.__init__, IncrementalDetokenizer.update

    def faulty_init(self, tokenizer, prompt_token_ids, **kwargs) -> None:
        init(self, tokenizer, prompt_token_ids, **kwargs)
        if hit("output", tokenizer.decode(prompt_token_ids)):
            faulty.add(self)

    def faulty_update(self, token_ids):
        if self in faulty:
            raise InjectedFault("injected output-processing fault")
        return update(self, token_ids)

    sample = model_runner.ModelRunner._sample

    def nan_sample(self, logits, plan):
        row = 0
        for req, n in plan.owners:
            if req.group_id in targets["logits"]:
                logits[row:row + n] = float("nan")
            row += n
        return sample(self, logits, plan)

    schedule = Scheduler.schedule

    def deadly_schedule(self):
        out = schedule(self)
        if any(s.request.group_id in targets["die"] for s in out.scheduled):
            raise InjectedEngineDeath("injected engine thread death")
        return out

    setattr_(LLMEngine, "add_request", marking_add_request)
    setattr_(IncrementalDetokenizer, "__init__", faulty_init)
    setattr_(IncrementalDetokenizer, "update", faulty_update)
    setattr_(model_runner.ModelRunner, "_sample", nan_sample)
    setattr_(Scheduler, "schedule", deadly_schedule)


if __name__ == "__main__":  # a server with the faults of $PAGEDLLM_TEST_FAULTS
    install(parse(os.environ[ENV]))
    from pagedllm.entrypoints.cli import main

    sys.exit(main(sys.argv[1:]))
