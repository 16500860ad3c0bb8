"""Automatic prefix caching: full KV blocks found again by a hash chained over their prefix.

    token ids    | t0 ......... t15 | t16 ........ t31 | t32 .. t37 |      (block_size 16)
    block hash     h0 = H(None, t0..t15, x)             (partial block: never cached)
                                      h1 = H(h0, t16..t31, x)
    x = extra keys = (adapter weights hash, cache_salt)

A block is registered once it is full and its KV computed. It stays findable after its last
holder frees it (refcount 0, back in the block manager's free queue) until the free queue
hands it out for other tokens: eviction, least recently freed first.

A hash is only a hint. A hit must also match the stored token ids and extra keys and be the
child of the block matched one position earlier, so the cache is a tree of real blocks, and
evicting a block uncaches its whole subtree. A hash collision (even a forced one) can cost a
miss, never hand out KV computed for another prefix. SHA-256 keeps collisions out of reach
of prompts crafted to push other tenants' blocks out (Python's `hash` would not).
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pagedllm.core.block_manager import KVBlock
    from pagedllm.core.request import Request

BlockHash = bytes


def hash_block_tokens(parent: BlockHash | None, token_ids: Sequence[int],
                      extra_keys: tuple) -> BlockHash:
    """H(parent block's hash, this block's token ids, extra keys): SHA-256 of their pickle."""
    data = pickle.dumps((parent, tuple(token_ids), extra_keys), protocol=5)
    return hashlib.sha256(data).digest()


def extra_keys(request: Request) -> tuple:
    """What besides the tokens decides a block's KV: the LoRA adapter, by the hash of its
    weights (so changed weights under an old name never hit stale blocks; None for the base
    model), and the tenant's `cache_salt` so that requests with different salts never share."""
    return (None if request.lora is None else request.lora.weights_hash, request.cache_salt)


def update_block_hashes(request: Request, block_size: int) -> list[BlockHash]:
    """Extend `request.block_hashes` to every full block of its tokens (they only grow)."""
    hashes = request.block_hashes
    tokens = request.all_token_ids
    extra = extra_keys(request)
    for i in range(len(hashes), len(tokens) // block_size):
        parent = hashes[i - 1] if i else None
        hashes.append(hash_block_tokens(parent, tokens[i * block_size:(i + 1) * block_size],
                                        extra))
    return hashes


@dataclass
class CachedBlock:
    """What the cache stores about one registered block."""

    block_id: int
    block_hash: BlockHash
    parent: int | None            # block id holding the previous block of the prefix
    token_ids: tuple[int, ...]
    extra_keys: tuple
    children: set[int] = field(default_factory=set)


class PrefixCache:
    """hash -> registered block, as a tree. Owned by the BlockManager, which decides when
    blocks are taken, shared and freed; this class only answers "which block holds this"."""

    def __init__(self, blocks: list[KVBlock], block_size: int) -> None:
        self.blocks = blocks
        self.block_size = block_size
        self.entries: dict[BlockHash, CachedBlock] = {}

    def __len__(self) -> int:
        return len(self.entries)

    def entry(self, block_id: int) -> CachedBlock | None:
        h = self.blocks[block_id].block_hash
        return None if h is None else self.entries[h]

    def match(self, block_hash: BlockHash, parent: int | None, token_ids: tuple[int, ...],
              extra: tuple) -> int | None:
        """The cached block with exactly this content after `parent`, if any."""
        e = self.entries.get(block_hash)
        if e is None or e.parent != parent or e.token_ids != token_ids or e.extra_keys != extra:
            return None
        return e.block_id

    def lookup(self, request: Request) -> list[int]:
        """Block ids holding the longest cached prefix of `request`'s tokens, in order.

        Stops one token short of the end: the last token is always recomputed so that its
        logits exist (a 32-token prompt with block_size 16 hits at most its first block).
        """
        bs = self.block_size
        hashes = update_block_hashes(request, bs)
        tokens = request.all_token_ids
        extra = extra_keys(request)
        hits: list[int] = []
        parent = None
        for i in range((request.num_tokens - 1) // bs):
            parent = self.match(hashes[i], parent, tuple(tokens[i * bs:(i + 1) * bs]), extra)
            if parent is None:
                break
            hits.append(parent)
        return hits

    def insert(self, block_id: int, block_hash: BlockHash, parent: int | None,
               token_ids: tuple[int, ...], extra: tuple) -> bool:
        """Register a full, computed block; False if another block already has this hash."""
        if block_hash in self.entries:
            return False
        self.entries[block_hash] = CachedBlock(block_id, block_hash, parent, token_ids, extra)
        self.blocks[block_id].block_hash = block_hash
        if parent is not None:
            self.entry(parent).children.add(block_id)
        return True

    def evict(self, block_id: int) -> list[int]:
        """Uncache a block about to be reused, and its subtree; returns the uncached ids.

        Every holder of a cached block also holds its parent, so when the block's refcount
        is 0 its whole subtree's is too (the block manager checks).
        """
        root = self.entry(block_id)
        if root is None:
            return []
        if root.parent is not None:
            self.entry(root.parent).children.discard(block_id)
        gone, stack = [], [root]
        while stack:
            e = stack.pop()
            stack.extend(self.entry(c) for c in e.children)
            del self.entries[e.block_hash]
            self.blocks[e.block_id].block_hash = None
            gone.append(e.block_id)
        return gone

    # ------------------------------------------------------------ invariants
    def problems(self, requests: Iterable[Request]) -> Iterator[str]:
        """Inconsistencies between the map, the blocks and the block tables (none if sound)."""
        for h, e in self.entries.items():
            if self.blocks[e.block_id].block_hash != h:
                yield f"cache entry for block {e.block_id} does not match the block's hash"
        num_hashed = sum(1 for b in self.blocks if b.block_hash is not None)
        if num_hashed != len(self.entries):
            yield f"{num_hashed} blocks carry a hash but the cache has {len(self.entries)}"
        for h, e in self.entries.items():
            parent_hash = None
            if e.parent is not None:
                parent = self.entry(e.parent)
                if parent is None or e.block_id not in parent.children:
                    yield f"cached block {e.block_id} has an uncached parent {e.parent}"
                    continue
                parent_hash = parent.block_hash
            if hash_block_tokens(parent_hash, e.token_ids, e.extra_keys) != h:
                yield f"cached block {e.block_id}: stored hash is not H(parent, tokens, extra)"
            for c in e.children:
                child = self.entry(c)
                if child is None or child.parent != e.block_id:
                    yield f"cached block {e.block_id} lists {c} as a child, which it is not"
        for req in requests:
            if req.is_finished:
                continue
            for i, bid in enumerate(req.block_ids):
                e = self.entry(bid)
                if e is None:
                    if i < req.num_cached_blocks:
                        yield f"{req}: block {i} ({bid}) counted as cached but is not"
                    continue
                parent = req.block_ids[i - 1] if i else None
                if e.parent != parent or i >= len(req.block_hashes) \
                        or req.block_hashes[i] != e.block_hash:
                    yield f"{req}: cached block {bid} at index {i} is not its prefix's block"
