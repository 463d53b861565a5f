"""Eviction for a RadixCache: the incrementally kept order of its evictable leaves
(`EvictionIndex`) and the batched removal of victims (`evict_leaves`).

Never rebuilds anything over all leaves: every operation is O(1) or O(log #promoted).

Order: a leaf's priority is `(bucket, time, nid)`, smallest evicted first; bucket is 0 under LRU
and the node's hit count under LFU (ties by LRU). Two structures hold the leaves:

* fresh buckets: `bucket -> OrderedDict[node]`. A node enters a bucket only at the moment it is
  touched (match, insert, unlock), i.e. with `time == current clock`, so appending keeps every
  bucket sorted by time without any search. Its head is the bucket's minimum.
* promoted heap: a parent that becomes a leaf during `evict` keeps its older time, which may sort
  before fresh entries; it goes to a small lazy-deletion heap. Its stale entries are dropped
  when they reach the top, so the heap only ever holds promotions not yet popped.

`pop()` compares the fresh minimum with the heap minimum.
"""
from __future__ import annotations

from collections import OrderedDict
from heapq import heapify, heappop, heappush

import numpy as np

from .errors import CacheError

__all__ = ["EvictionIndex", "evict_leaves"]

FRESH, PROMOTED = 1, 2  # node.where; 0 = not an evictable leaf


class EvictionIndex:
    """Evictable leaves of one cache. Mutates the nodes' `where`, `tok`, `bucket` slots."""

    def __init__(self, policy: str):
        if policy not in ("lru", "lfu"):
            raise ValueError(f"eviction: expected 'lru' or 'lfu', got {policy!r}")
        self.policy = policy
        self._lfu = policy == "lfu"
        self._buckets: dict[int, OrderedDict] = {}
        self._bucket_heap: list[int] = []    # keys of self._buckets, each exactly once
        self._old: list[tuple] = []           # (bucket, time, nid, tok, node)
        self._tok = 0
        self._len = 0
        self._n_old = 0                       # live entries in self._old

    def __len__(self) -> int:
        return self._len

    def add(self, node) -> None:
        """`node` just became an evictable leaf and was touched (time == current clock)."""
        b = node.hits if self._lfu else 0
        d = self._buckets.get(b)
        if d is None:
            d = self._buckets[b] = OrderedDict()
            heappush(self._bucket_heap, b)
        d[node] = None
        node.where = FRESH
        node.bucket = b
        self._len += 1

    def add_old(self, node) -> None:
        """`node` became an evictable leaf without a touch (promotion): keep its old time."""
        self._tok += 1
        if len(self._old) > 4 * self._n_old + 1024:  # drop stale entries, amortized O(1)
            self._old = [e for e in self._old if e[4].where == PROMOTED and e[4].tok == e[3]]
            heapify(self._old)
        b = node.hits if self._lfu else 0
        heappush(self._old, (b, node.time, node.nid, self._tok, node))
        node.where = PROMOTED
        node.tok = self._tok
        node.bucket = b
        self._len += 1
        self._n_old += 1

    def remove(self, node) -> None:
        """`node` stops being an evictable leaf (locked, got a child, or deleted)."""
        if node.where == FRESH:
            del self._buckets[node.bucket][node]
        else:
            self._n_old -= 1
        node.where = 0
        self._len -= 1

    def touch(self, node) -> None:
        """An evictable leaf was touched; its time (and hits under LFU) are already updated."""
        if node.where == FRESH and (not self._lfu or node.bucket == node.hits):
            self._buckets[node.bucket].move_to_end(node)
            return
        self.remove(node)
        self.add(node)

    def pop(self):
        """Remove and return the leaf with the smallest priority, or None when empty."""
        bh, buckets = self._bucket_heap, self._buckets
        while bh and not buckets[bh[0]]:
            del buckets[heappop(bh)]
        fresh = next(iter(buckets[bh[0]])) if bh else None
        old = self._old
        while old and (old[0][4].where != PROMOTED or old[0][4].tok != old[0][3]):
            heappop(old)
        if old:
            top = old[0]
            if fresh is None or (top[0], top[1], top[2]) < (fresh.bucket, fresh.time, fresh.nid):
                heappop(old)
                node = top[4]
                node.where = 0
                self._len -= 1
                self._n_old -= 1
                return node
        if fresh is None:
            return None
        self.remove(fresh)
        return fresh

    def members(self) -> list:
        """All evictable leaves (for integrity checks)."""
        out = [n for d in self._buckets.values() for n in d]
        out += [e[4] for e in self._old if e[4].where == PROMOTED and e[4].tok == e[3]]
        return out

    def check_order(self) -> None:
        """Each fresh bucket is sorted by time (the property `pop` relies on)."""
        for b, d in self._buckets.items():
            prev = None
            for n in d:
                if n.bucket != b or n.where != FRESH:
                    raise AssertionError(f"node {n.nid} in bucket {b} with stale bookkeeping")
                if prev is not None and n.time < prev.time:
                    raise AssertionError(f"bucket {b} out of time order at node {n.nid}")
                prev = n


def evict_leaves(cache, num_tokens: int) -> int:
    """RadixCache.evict after its argument checks: remove unlocked leaves in priority order
    until `num_tokens` are gathered, then free all their slots with one `pool.free` call.

    Nothing lost, even when the free raises: until the free has succeeded every victim is only
    detached (its slots are in neither the tree nor the pool); on an exception `_reattach` puts
    the victims back in reverse order, so the tree, the size counters and the eviction order
    are as before the call, and the pool (all-or-nothing free) is unchanged.
    """
    index, pb = cache._index, cache._pb
    victims = []                      # (node, parent became a leaf when node left)
    freed = 0
    while freed < num_tokens:
        node = index.pop()
        if node is None:  # pragma: no cover - guarded by the evictable_size check
            _reattach(cache, victims)
            raise CacheError("eviction index empty while evictable_size > 0")
        parent = node.parent
        kids = parent.children
        del kids[node.key[:pb]]
        freed += len(node.value)
        promoted = not kids and parent.parent is not None
        if promoted:
            parent.children = None
            if parent.lock_ref == 0:
                index.add_old(parent)
        victims.append((node, promoted))
    if not victims:
        return 0
    slots = (victims[0][0].value if len(victims) == 1
             else np.concatenate([v[0].value for v in victims]))
    try:
        cache.pool.free(slots)
    except BaseException:
        _reattach(cache, victims)
        raise
    nodes = cache._nodes
    for node, _ in victims:
        del nodes[node.nid]
        node.parent = None            # marks the handle as evicted (RadixCache._check_node)
    cache._evictable -= freed
    return freed


def _reattach(cache, victims) -> None:
    """Undo the detaching part of `evict_leaves`, newest victim first."""
    index, pb = cache._index, cache._pb
    for node, promoted in reversed(victims):
        parent = node.parent
        if promoted:
            if parent.where:
                index.remove(parent)
            parent.children = {}
        parent.children[node.key[:pb]] = node.nid
        index.add_old(node)           # keeps its (bucket, time, nid) priority
