"""Radix cache: batched eviction frees (one pool call per evict, victims put back when it
raises: "nothing lost" under fault injection) and the garbage-collector footprint (no tracked
object per node, no reference cycles)."""
import gc

import numpy as np
import pytest

from pagedattn.cache_mgmt.radix_cache import RadixCache
from pagedattn.cache_mgmt.radix_integrity import iter_nodes

pytestmark = pytest.mark.usefixtures("radix_path")   # C helpers and pure Python


def put(cache, toks, extra_key=None):
    """Insert `toks` with fresh slots, free the duplicates; returns the slots."""
    ps = cache.page_size
    slots = cache.pool.alloc(-(-len(toks) // ps) * ps)
    got = cache.insert(toks, slots, extra_key=extra_key)
    a = len(toks) - len(toks) % ps
    cache.pool.free(np.concatenate([slots[:got].numpy(), slots[a:].numpy()]))
    return slots


def _snapshot(cache):
    """Everything observable about the tree, its accounting and the pool (NodeInfo lists
    children in ascending order: the order of a children dict carries no meaning)."""
    return (sorted(cache.node(x) for x in iter_nodes(cache)), cache.evictable_size(),
            cache.protected_size(), sorted(cache.pool.free_slots().tolist()),
            sorted(cache._index.members()), np.flatnonzero(cache.pool._state == 2).tolist())


def _spy_release(cache):
    """Record the slots of every pool call that evict makes (the pool's _release_cached)."""
    calls, real = [], cache.pool._release_cached
    cache.pool._release_cached = lambda slots: (calls.append(np.asarray(slots).tolist()),
                                                real(slots))
    return calls


@pytest.mark.parametrize("ps", [1, 4])
def test_evict_frees_all_victims_in_one_call(ps):
    """Batched frees: one pool call per evict, the victims' slots concatenated in eviction
    order (promoted parents included); a call that evicts nothing does not call the pool."""
    cache = RadixCache.create_simulated(64 * ps, page_size=ps)
    s1 = put(cache, [1] * ps + [2] * ps)
    s2 = put(cache, [1] * ps + [3] * ps)
    s3 = put(cache, [5] * ps)
    calls = _spy_release(cache)
    assert cache.evict(0) == 0 and calls == []
    assert cache.evict(3 * ps) == 3 * ps        # [2], [3], then the promoted parent [1]
    want = s1[ps:2 * ps].tolist() + s2[ps:2 * ps].tolist() + s1[:ps].tolist()
    assert calls == [want]
    assert cache.evict(ps) == ps and calls[1] == s3[:ps].tolist()
    del cache.pool._release_cached
    assert cache.total_size() == 0 and cache.pool.available_size() == cache.pool.size
    cache.check_integrity()


@pytest.mark.parametrize("ps", [1, 4])
def test_evict_free_failure_puts_victims_back(ps):
    """Nothing lost when the batched free raises: victims (a promoted parent among them, a
    locked path beside them) go back exactly, and the next evict frees the same slots in the
    same order as a twin cache that never failed."""
    def build():
        cache = RadixCache.create_simulated(64 * ps, page_size=ps)
        for toks in ([1, 2], [1, 3], [4, 6], [4, 7], [5]):
            put(cache, [t for t in toks for _ in range(ps)])
        m = cache.match_prefix([4] * ps + [7] * ps)
        cache.inc_lock_ref(m.last_node)
        return cache, m


    cache, m = build()
    twin, _ = build()
    n = cache.evictable_size() - ps              # leaves [5] (the newest) in the tree
    before = _snapshot(cache)

    def boom(slots):
        raise RuntimeError("free failed")
    cache.pool._release_cached = boom
    with pytest.raises(RuntimeError):
        cache.evict(n)
    del cache.pool._release_cached
    cache.check_integrity()
    assert _snapshot(cache) == before
    got, want = _spy_release(cache), _spy_release(twin)
    assert cache.evict(n) == twin.evict(n) >= n
    assert got == want and len(got) == 1
    assert cache.peek_prefix_len([4] * ps + [7] * ps) == 2 * ps     # locked path intact
    cache.dec_lock_ref(m.last_node)
    cache.check_integrity()


def _tracked_growth(build):
    """GC-tracked objects that `build()` leaves alive (its result held)."""
    gc.collect()
    before = len(gc.get_objects())
    kept = build()
    gc.collect()
    return len(gc.get_objects()) - before, kept


@pytest.mark.parametrize("ps", [1, 4])
def test_nodes_are_not_gc_objects(ps):
    """The tree adds no object to the collector's lists per node: 2,000 nodes (leaves, splits,
    namespaces, locks, LFU hits) leave as many tracked objects as 20 do."""
    def build(n):
        def go():
            cache = RadixCache.create_simulated(8192 * ps, page_size=ps, eviction="lfu")
            rng = np.random.default_rng(0)
            handles = []
            for i in range(n):
                toks = [t for t in rng.integers(0, 6, 5).tolist() for _ in range(ps)]
                m = cache.match_prefix(toks, extra_key=i % 2)
                put(cache, toks, extra_key=i % 2)
                cache.inc_lock_ref(m.last_node)
                handles.append(m.last_node)
            for h in handles[::2]:
                cache.dec_lock_ref(h)
            return cache, len(list(iter_nodes(cache)))
        return go
    small, (_, n_small) = _tracked_growth(build(20))
    large, (_, n_large) = _tracked_growth(build(2000))
    assert n_large >= 10 * n_small          # the check is not vacuous: many more nodes
    assert large - small <= 4, f"{large - small} tracked objects for {n_large - n_small} nodes"


def test_dropped_cache_is_freed_without_the_collector():
    """No reference cycles: a tree (with splits, locks, evictions, promotions) is freed by
    reference counting alone, so the cyclic collector finds nothing when it is dropped."""
    gc.collect()
    gc.disable()
    try:
        cache = RadixCache.create_simulated(64, page_size=2)
        for toks in ([1, 2, 3, 4], [1, 2, 5, 6], [1, 2, 5, 6, 7, 8], [9, 9], [3, 3, 3, 3]):
            put(cache, toks)
        m = cache.match_prefix([1, 2, 5, 6])
        cache.inc_lock_ref(m.last_node)
        cache.evict(4)
        cache.dec_lock_ref(m.last_node)
        cache.evict(cache.evictable_size() // 2)
        del cache, m
        found = gc.collect()
    finally:
        gc.enable()
    assert found == 0
