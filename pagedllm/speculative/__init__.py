"""Speculative decoding: proposals verified in the normal mixed batch; exact for greedy,
rejection sampling for sampling (worker/draft_verification.py).

    speculator.py   the engine's one object: adaptive drafting, hands requests to a proposer
    proposer.py     what a method implements       registry.py   method name -> proposer
    ngram/          prompt lookup (no model)        draft_model.py   a smaller model's drafts
"""
