"""Eviction for a RadixCache: the incrementally kept order of its evictable leaves
(`EvictionIndex`) and the batched removal of victims (`evict_leaves`).

Never rebuilds anything over all leaves: every operation is O(1) or O(log #promoted), so the
cost of an evict depends on its victims, not on how many leaves the tree has.

Order: a leaf's priority is `(bucket, time, nid)`, smallest evicted first; bucket is 0 under LRU
and the node's hit count under LFU (ties by LRU, then by creation order). Two structures hold
the leaves, all keyed by node id (ints: nothing here is tracked by the garbage collector but
the containers themselves):

* fresh buckets: `bucket -> OrderedDict[nid]`. A node enters a bucket only at the moment it is
  touched (match, insert, unlock, split), i.e. with `time == current clock`, so appending keeps
  every bucket sorted by time without any search. Its head is the bucket's minimum.
* promoted heap: a parent that becomes a leaf during `evict` keeps its older time, which may
  sort before fresh entries; it goes to a small lazy-deletion heap of priorities packed into
  one int. Stale entries are dropped when they reach the top.

`pop()` compares the fresh minimum with the heap minimum.
"""
from __future__ import annotations

from collections import OrderedDict
from heapq import heapify, heappop, heappush

import numpy as np

from .errors import CacheError

__all__ = ["EvictionIndex", "evict_leaves"]

_PROMOTED = -1          # loc value of a promoted entry (fresh entries hold their bucket >= 0)
_M64 = (1 << 64) - 1


class EvictionIndex:
    """Evictable leaves of one cache, by node id. Reads the cache's `time` table and its sparse
    `hits` table (a node without an entry has no hits).

    `loc` maps every member to its bucket (fresh) or -1 (promoted): `nid in index.loc` is the
    membership test of the hot paths.
    """

    def __init__(self, policy: str, time: dict, hits: dict):
        if policy not in ("lru", "lfu"):
            raise ValueError(f"eviction: expected 'lru' or 'lfu', got {policy!r}")
        self.policy = policy
        self.lfu = policy == "lfu"
        self.loc: dict[int, int] = {}
        self._time, self._hits = time, hits
        self._buckets: dict[int, OrderedDict] = {}
        self._bucket_heap: list[int] = []     # keys of self._buckets, each exactly once
        self._old: list[int] = []             # packed priorities of promoted entries
        self._old_prio: dict[int, int] = {}   # live promoted nid -> its packed priority

    def __len__(self) -> int:
        return len(self.loc)

    def _prio(self, nid: int, bucket: int) -> int:
        return (bucket << 128) | (self._time[nid] << 64) | nid

    def add(self, nid: int) -> None:
        """`nid` just became an evictable leaf and was touched (time == current clock)."""
        b = self._hits.get(nid, 0) if self.lfu else 0
        d = self._buckets.get(b)
        if d is None:
            d = self._buckets[b] = OrderedDict()
            heappush(self._bucket_heap, b)
        d[nid] = None
        self.loc[nid] = b

    def add_old(self, nid: int) -> None:
        """`nid` became an evictable leaf without a touch (promotion): keep its old time."""
        old = self._old
        if len(old) > 4 * len(self._old_prio) + 1024:   # drop stale entries, amortized O(1)
            old[:] = [p for p in old if self._old_prio.get(p & _M64) == p]
            heapify(old)
        p = self._prio(nid, self._hits.get(nid, 0) if self.lfu else 0)
        heappush(old, p)
        self._old_prio[nid] = p
        self.loc[nid] = _PROMOTED

    def remove(self, nid: int) -> None:
        """`nid` stops being an evictable leaf (locked, got a child, or deleted)."""
        b = self.loc.pop(nid)
        if b >= 0:
            del self._buckets[b][nid]
        else:
            del self._old_prio[nid]

    def touch(self, nid: int) -> None:
        """A member was touched; its time (and hits under LFU) are already updated."""
        b = self.loc[nid]
        if b >= 0 and (not self.lfu or b == self._hits.get(nid, 0)):
            self._buckets[b].move_to_end(nid)
            return
        self.remove(nid)
        self.add(nid)

    def pop(self):
        """Remove and return the member with the smallest priority, or None when empty."""
        bh, buckets = self._bucket_heap, self._buckets
        while bh and not buckets[bh[0]]:
            del buckets[heappop(bh)]
        fresh = next(iter(buckets[bh[0]])) if bh else None
        old, live = self._old, self._old_prio
        while old and live.get(old[0] & _M64) != old[0]:
            heappop(old)
        if old and (fresh is None or old[0] < self._prio(fresh, bh[0])):
            nid = heappop(old) & _M64
            del live[nid]
            del self.loc[nid]
            return nid
        if fresh is None:
            return None
        buckets[bh[0]].popitem(last=False)     # fresh is the bucket's first entry
        del self.loc[fresh]
        return fresh

    def members(self) -> list:
        """All members (for integrity checks)."""
        return list(self.loc)

    def check_order(self) -> None:
        """Each fresh bucket is sorted by (time, nid), the property `pop` relies on, and the
        bookkeeping agrees; raises AssertionError naming the first problem."""
        seen = 0
        for b, d in self._buckets.items():
            prev = None
            for nid in d:
                if self.loc.get(nid) != b:
                    raise AssertionError(f"node {nid} in bucket {b} with stale bookkeeping")
                if b != (self._hits.get(nid, 0) if self.lfu else 0):
                    raise AssertionError(f"node {nid} in bucket {b}, hits {self._hits.get(nid)}")
                cur = (self._time[nid], nid)
                if prev is not None and cur < prev:
                    raise AssertionError(f"bucket {b} out of (time, nid) order at node {nid}")
                prev = cur
                seen += 1
        for nid, p in self._old_prio.items():
            if self.loc.get(nid) != _PROMOTED:
                raise AssertionError(f"promoted node {nid} with stale bookkeeping")
            b = self._hits.get(nid, 0) if self.lfu else 0
            if p != self._prio(nid, b):
                raise AssertionError(f"promoted node {nid} keeps a stale priority")
        if seen + len(self._old_prio) != len(self.loc):
            raise AssertionError(f"index has {len(self.loc)} members, structures hold "
                                 f"{seen + len(self._old_prio)}")


def evict_leaves(cache, num_tokens: int) -> int:
    """RadixCache.evict after its argument checks: remove unlocked leaves in priority order
    until `num_tokens` are gathered, then free all their slots with one pool call.

    Nothing lost, even when the free raises: until the free has succeeded every victim is only
    detached (its slots are in neither the tree nor the pool); on an exception `_reattach` puts
    the victims back in reverse order, so the tree, the size counters and the eviction order
    are as before the call, and the pool (all-or-nothing free) is unchanged.
    """
    index, first = cache._index, cache._first
    vals, par, kids, lock = cache._val, cache._par, cache._kids, cache._lock
    victims, slots = [], []           # (nid, parent became a leaf when nid left), their values
    freed = 0
    while freed < num_tokens:
        x = index.pop()
        if x is None:  # pragma: no cover - guarded by the evictable_size check
            _reattach(cache, victims)
            raise CacheError("eviction index empty while evictable_size > 0")
        p = par[x]
        k = kids[p]
        del k[first[x]]
        v = vals[x]
        freed += len(v) >> 3
        slots.append(v)
        promoted = not k and par[p] >= 0
        if promoted:
            del kids[p]
            if lock[p] == 0:
                index.add_old(p)
        victims.append((x, promoted))
    if not victims:
        return 0
    slots = np.frombuffer(slots[0] if len(slots) == 1 else b"".join(slots), np.int64)
    try:
        cache.pool._release_cached(slots)
    except BaseException:
        _reattach(cache, victims)
        raise
    keys, time, hits = cache._key, cache._time, cache._hits
    for x, _ in victims:              # a victim is a leaf without locks: no kids/own entry
        del keys[x], vals[x], par[x], lock[x], time[x], first[x]
        if hits:
            hits.pop(x, None)
    cache._evictable -= freed
    return freed


def _reattach(cache, victims) -> None:
    """Undo the detaching part of `evict_leaves`, newest victim first."""
    index, kids = cache._index, cache._kids
    for x, promoted in reversed(victims):
        p = cache._par[x]
        if promoted:
            if p in index.loc:
                index.remove(p)
            kids[p] = {}
        kids[p][cache._first[x]] = x
        index.add_old(x)              # keeps its (bucket, time, nid) priority
