"""Test-only fault injection: make chosen requests fail inside the engine, to test that a
fault stays contained (tests/entrypoints/test_faults.py). Off unless the environment variable
PAGEDLLM_TEST_FAULTS is set; production never sets it.

    PAGEDLLM_TEST_FAULTS="output=MARK1;logits=MARK2;die=MARK3"

A request whose prompt decodes to text containing MARK1 raises `InjectedFault` while its
sampled token is processed (as a detokenizer or stop-check bug would); MARK2 makes its logits
row NaN (a bad logits row); MARK3 kills the engine thread when the request is first
scheduled (`InjectedEngineDeath`, a BaseException so that no per-step handler catches it).
"""

from __future__ import annotations

import logging
import os

import torch

ENV = "PAGEDLLM_TEST_FAULTS"
KINDS = ("output", "logits", "die")
logger = logging.getLogger(__name__)


class InjectedFault(RuntimeError):
    """A fault injected into one request's output processing."""


class InjectedEngineDeath(BaseException):
    """Kills the engine thread (not an Exception, so step-level handlers let it through)."""


class FaultInjector:
    def __init__(self, markers: dict[str, str], tokenizer) -> None:
        self.markers = markers
        self.tokenizer = tokenizer
        self.targets: dict[str, str] = {}  # group id -> fault kind

    @classmethod
    def from_env(cls, tokenizer) -> FaultInjector | None:
        markers_text = os.environ.get(ENV)
        if not markers_text:
            return None
        markers = {}
        for item in markers_text.split(";"):
            kind, _, marker = item.partition("=")
            if kind not in KINDS or not marker:
                raise ValueError(f"{ENV}: expected KIND=MARKER with KIND in {KINDS}, got "
                                 f"{item!r}")
            markers[kind] = marker
        logger.warning("%s is set: test fault injection is ON (%s)", ENV, markers_text)
        return cls(markers, tokenizer)

    def register(self, group_id: str, prompt_token_ids: list[int]) -> None:
        text = self.tokenizer.decode(prompt_token_ids)
        for kind, marker in self.markers.items():
            if marker in text:
                self.targets[group_id] = kind

    def on_output(self, group_id: str) -> None:
        if self.targets.get(group_id) == "output":
            raise InjectedFault(f"injected output-processing fault in request {group_id}")

    def on_schedule(self, group_ids: list[str]) -> None:
        if any(self.targets.get(g) == "die" for g in group_ids):
            raise InjectedEngineDeath("injected engine thread death")

    def corrupt_logits(self, logits: torch.Tensor, row_groups: list[str]) -> None:
        for row, gid in enumerate(row_groups):
            if self.targets.get(gid) == "logits":
                logits[row] = float("nan")
