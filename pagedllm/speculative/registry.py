"""The speculative-decoding methods: `SpeculativeConfig.method` -> its `Proposer` class.

A new method is a folder with its proposer, one line here and its name in
`config/speculative.METHODS` (the config validates names without importing proposers).
"""

from __future__ import annotations

from pagedllm.speculative.draft_model import DraftModel
from pagedllm.speculative.ngram import NgramProposer
from pagedllm.speculative.proposer import Proposer

PROPOSERS: dict[str, type[Proposer]] = {
    "ngram": NgramProposer,
    "draft_model": DraftModel,
}
