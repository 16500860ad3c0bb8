"""N-gram (prompt lookup) speculation: drafts copied from the request's own context."""

from pagedllm.speculative.ngram.proposer import NgramProposer

__all__ = ["NgramProposer"]
