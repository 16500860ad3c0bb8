"""Speculative decoding: n-gram (prompt lookup) and draft-model proposals, verified in the
normal mixed batch; exact for greedy, rejection sampling for sampling (see decoder.py)."""
