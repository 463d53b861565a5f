"""Request lifecycle over a RadixCache (the serving replay's, docs/bench.md) and cache-aware
scheduling (longest cached prefix first).

    admit_req            match_prefix + inc_lock_ref + alloc the uncached part (evicts if needed)
    extend_req           decode / next chunk: more tokens, more slots (whole pages)
    cache_unfinished_req chunked prefill: put the computed prefix in the tree, move the lock down
    cache_finished_req   insert, free duplicates and the partial tail page, unlock

"Nothing lost" (the invariant the model-based tests check): at every moment each pool slot is
exactly one of free, in the tree (locked or not), or owned by one live request
(`owned_slots(req)`): the slots after its locked prefix plus `pending_free` (slots whose free
failed and will be retried).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from .errors import CacheError, OutOfBlocks
from .radix_cache import RadixCache
from .radix_node import slots_tensor

__all__ = ["Req", "admit_req", "extend_req", "cache_unfinished_req", "cache_finished_req",
           "owned_slots", "release_pending", "schedule_order"]

_EMPTY = np.empty(0, np.int64)


@dataclass(eq=False)
class Req:
    """One request's cache state. `tokens`: int64 array of the tokens that have (or will have)
    KV; `indices`: slot per token, length `len(tokens)` rounded up to a page. `indices[:prefix_len]`
    are tree slots kept alive by the lock on `last_node` (a node id); the rest belong to the
    request."""
    tokens: np.ndarray
    indices: torch.Tensor
    last_node: int | None
    prefix_len: int
    extra_key: object = None
    pending_free: np.ndarray = field(default_factory=lambda: _EMPTY)
    finished: bool = False


def owned_slots(req: Req) -> np.ndarray:
    """Slots this request owns outside the tree (the 'owned_uncached' term of the partition)."""
    mine = req.indices[req.prefix_len:].numpy()
    return np.concatenate([mine, req.pending_free]) if req.pending_free.size else mine.copy()


def admit_req(cache: RadixCache, tokens, *, extra_key=None) -> Req:
    """Match, lock, and allocate slots for the uncached part of `tokens` (evicting if needed).

    Mutates: the tree (split/touch/lock), the pool. On OutOfBlocks nothing stays locked or
    allocated (evictions already done stay done).
    """
    toks = np.ascontiguousarray(np.asarray(tokens), dtype=np.int64)
    m = cache.match_prefix(toks, extra_key=extra_key)
    cache.inc_lock_ref(m.last_node)
    try:
        new = _alloc(cache, _round_up(cache, len(toks)) - len(m.indices))
    except BaseException:
        cache.dec_lock_ref(m.last_node)
        raise
    return Req(toks, torch.cat([m.indices, new]), m.last_node, len(m.indices), extra_key)


def extend_req(cache: RadixCache, req: Req, new_tokens) -> None:
    """Append `new_tokens` (decode output or the next chunk) and allocate their slots."""
    _check_live(req)
    add = np.asarray(new_tokens, dtype=np.int64).reshape(-1)
    need = _round_up(cache, len(req.tokens) + len(add)) - len(req.indices)
    if need > 0:
        req.indices = torch.cat([req.indices, _alloc(cache, need)])
    req.tokens = np.concatenate([req.tokens, add])


def cache_unfinished_req(cache: RadixCache, req: Req) -> None:
    """Chunked prefill: cache `req.tokens` (page-aligned part) and move the lock to its end.

    Regions of `req.indices` (P = prefix_len, C = already cached, A = aligned length)::

        [0, P)     tree, locked by req          -> unchanged
        [P, C)     req's duplicates of cached   -> freed; replaced by the tree's slots
        [C, A)     new                          -> now in the tree (same slots), locked
        [A, end)   partial last page            -> still the request's

    Mutates the tree, the pool and req (indices, prefix_len, last_node, pending_free).
    """
    _check_live(req)
    p, a = req.prefix_len, _round_down(cache, len(req.tokens))
    idx = req.indices
    n_cached, node, cached = cache._insert(req.tokens[:a].tobytes(), idx[:a], req.extra_key,
                                           (req.last_node, p))
    cache.inc_lock_ref(node)
    cache.dec_lock_ref(req.last_node)
    dup = idx[p:n_cached].numpy()
    req.indices = torch.cat([idx[:p], slots_tensor(cached), idx[n_cached:]])
    req.last_node, req.prefix_len = node, a
    req.pending_free = np.concatenate([req.pending_free, dup])
    _flush(cache, req)


def cache_finished_req(cache: RadixCache, req: Req) -> None:
    """The request is done: cache its tokens, free what the tree does not keep, unlock.

    Regions of `req.indices` (P = prefix_len, C = already cached, A = aligned length)::

        [0, P)     tree, locked by req          -> unlocked (stays cached, evictable)
        [P, C)     req's duplicates of cached   -> freed
        [C, A)     new                          -> now in the tree, evictable
        [A, end)   partial last page            -> freed

    The unlock runs even if freeing fails (try/finally); unfreed slots stay in
    `req.pending_free` (still owned by req) so that nothing is lost. Mutates tree, pool, req.
    """
    _check_live(req)
    p, a = req.prefix_len, _round_down(cache, len(req.tokens))
    idx, old = req.indices, req.last_node
    try:
        n_cached, _, _ = cache._insert(req.tokens[:a].tobytes(), idx[:a], req.extra_key,
                                       (old, p))
        req.pending_free = np.concatenate([req.pending_free, idx[p:n_cached].numpy(),
                                           idx[a:].numpy()])
        req.indices, req.prefix_len, req.last_node = idx[:0], 0, None
        req.finished = True
        _flush(cache, req)
    finally:
        if req.last_node is None and old is not None:
            cache.dec_lock_ref(old)


def release_pending(cache: RadixCache, req: Req) -> None:
    """Retry freeing `req.pending_free` (left by a failed free); works on finished requests."""
    _flush(cache, req)


def schedule_order(cache: RadixCache, waiting: list, *, fcfs_threshold: int = 128) -> list:
    """Waiting requests (Req, or anything with `.tokens`, or token sequences) ordered by
    longest cached prefix, ties in arrival order; plain FCFS when more than `fcfs_threshold`
    wait (matching every one would cost more than it saves). Read-only on the cache."""
    if len(waiting) > fcfs_threshold:
        return list(waiting)
    keyed = []
    for pos, item in enumerate(waiting):
        toks = getattr(item, "tokens", item)
        ek = getattr(item, "extra_key", None)
        keyed.append((-cache.peek_prefix_len(toks, extra_key=ek), pos, item))
    keyed.sort(key=lambda t: (t[0], t[1]))
    return [t[2] for t in keyed]


##### Internal #####

def _round_up(cache: RadixCache, n: int) -> int:
    ps = cache.page_size
    return -(-n // ps) * ps


def _round_down(cache: RadixCache, n: int) -> int:
    return n - n % cache.page_size


def _check_live(req: Req) -> None:
    if not isinstance(req, Req):
        raise TypeError(f"req: expected a Req, got {type(req).__name__}")
    if req.finished:
        raise CacheError("req: already finished (cache_finished_req was called)")


def _alloc(cache: RadixCache, n: int) -> torch.Tensor:
    pool = cache.pool
    short = n - pool.available_size()
    if short > 0:
        if short > cache.evictable_size():
            raise OutOfBlocks(f"n={n} slots needed, {pool.available_size()} free and "
                              f"{cache.evictable_size()} evictable")
        cache.evict(short)
    return pool.alloc(n)


def _flush(cache: RadixCache, req: Req) -> None:
    """Free `req.pending_free`; on failure they stay pending (still owned by req)."""
    if req.pending_free.size:
        cache.pool.free(req.pending_free)
        req.pending_free = _EMPTY
