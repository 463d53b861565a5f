"""Block-level hash prefix cache (vLLM-style), for comparison with RadixCache.

Only *full* blocks are cached, under a chained hash `H_k = hash(H_{k-1}, tokens of block k)`;
a hit is re-verified against the block's stored tokens, so a hash collision is a miss, never
wrong KV. A prefix of 45 tokens with block_size 16 reuses 32 tokens here and 45 in RadixCache.

Blocks with ref 0 sit in a free queue in release order; allocation takes the oldest first and
drops its hash then (LRU reuse of cached blocks).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable, NamedTuple

import numpy as np

from .errors import DoubleFree, ForeignId, OutOfBlocks

__all__ = ["BlockHashCache", "BlockMatch"]


def _default_hash(parent: int, block: bytes) -> int:
    return hash((parent, block))


class BlockMatch(NamedTuple):
    """block_ids: cached full blocks of the prefix, in order; num_tokens = len * block_size."""
    block_ids: list
    num_tokens: int


class BlockHashCache:
    """`num_blocks` blocks of `block_size` tokens. `hash_fn(parent_hash, block_bytes) -> int`."""

    def __init__(self, num_blocks: int, block_size: int,
                 hash_fn: Callable[[int, bytes], int] | None = None):
        if not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks: expected a positive int, got {num_blocks!r}")
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size: expected a positive int, got {block_size!r}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self._hash = hash_fn or _default_hash
        self.ref = [0] * num_blocks
        self._tokens: list = [None] * num_blocks     # bytes of a cached full block
        self._hash_of: list = [None] * num_blocks
        self._table: dict[int, int] = {}             # hash -> block id
        self._free: OrderedDict = OrderedDict((b, None) for b in range(num_blocks))

    ##### Public API #####

    def match(self, tokens) -> BlockMatch:
        """Cached full-block prefix of `tokens`. Read-only."""
        ids, _ = self._walk(self._blocks_of(tokens))
        return BlockMatch(ids, len(ids) * self.block_size)

    def allocate(self, tokens) -> BlockMatch:
        """Blocks for a sequence of `tokens`: cached prefix blocks reused (ref +1), the rest
        taken from the free queue (oldest first, its hash dropped). Returns all blocks and the
        number of reused tokens. Raises OutOfBlocks (nothing changed) if the queue is short."""
        blocks = self._blocks_of(tokens)
        hit, _ = self._walk(blocks)
        need = -(-len(np.asarray(tokens).reshape(-1)) // self.block_size) - len(hit)
        avail = len(self._free) - sum(1 for b in hit if self.ref[b] == 0)
        if need > avail:
            raise OutOfBlocks(f"tokens: {need} new blocks needed, {avail} free")
        for b in hit:
            if self.ref[b] == 0:
                del self._free[b]
            self.ref[b] += 1
        new = []
        for _ in range(need):
            b, _ = self._free.popitem(last=False)
            h = self._hash_of[b]
            if h is not None:
                del self._table[h]
                self._hash_of[b] = self._tokens[b] = None
            self.ref[b] = 1
            new.append(b)
        return BlockMatch(hit + new, len(hit) * self.block_size)

    def release(self, block_ids: list, tokens) -> None:
        """The sequence is done: register its full blocks' hashes (first writer wins), ref -1;
        blocks reaching ref 0 join the free queue's young end. Raises DoubleFree/ForeignId."""
        for b in block_ids:
            if not 0 <= b < self.num_blocks:
                raise ForeignId(f"block_ids: {b} out of range [0, {self.num_blocks})")
            if self.ref[b] <= 0:
                raise DoubleFree(f"block_ids: block {b} is not in use")
        h = 0
        for b, blk in zip(block_ids, self._blocks_of(tokens)):
            h = self._hash(h, blk)
            if self._hash_of[b] is None and h not in self._table:
                self._table[h], self._hash_of[b], self._tokens[b] = b, h, blk
        for b in block_ids:
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self._free[b] = None

    def num_free_blocks(self) -> int:
        return len(self._free)

    ##### Internal #####

    def _blocks_of(self, tokens) -> list:
        key = np.ascontiguousarray(np.asarray(tokens).reshape(-1), dtype=np.int64).tobytes()
        bb = self.block_size * 8
        return [key[i:i + bb] for i in range(0, len(key) - bb + 1, bb)]

    def _walk(self, blocks: list):
        ids, h = [], 0
        for blk in blocks:
            h = self._hash(h, blk)
            b = self._table.get(h)
            if b is None or self._tokens[b] != blk:   # re-verify: a collision is a miss
                break
            ids.append(b)
        return ids, h
