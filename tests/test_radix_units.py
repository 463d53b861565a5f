"""Example-based tests of the radix cache: node split, LRU order, locks, fault injection,
regressions (peers' known bugs), token pools, scheduling order, block-hash comparison.
Batched eviction frees and the garbage-collector footprint: test_radix_evict_gc.py; argument
checks, LFU vs LRU, split parity with SGLang and input types: test_radix_checks.py."""
import numpy as np
import pytest
import torch

from pagedattn.cache_mgmt.block_hash_cache import BlockHashCache
from pagedattn.cache_mgmt.errors import DoubleFree, ForeignId, LockError, OutOfBlocks
from pagedattn.cache_mgmt.radix_cache import RadixCache
from pagedattn.cache_mgmt.radix_integrity import iter_nodes
from pagedattn.cache_mgmt.radix_lifecycle import (admit_req, cache_finished_req, owned_slots,
                                                  release_pending, schedule_order)
from pagedattn.cache_mgmt.token_pool import PagedTokenPool, TokenPool
from test_radix_checks import put

pytestmark = pytest.mark.usefixtures("radix_path")   # C helpers and pure Python

PAGE_SIZES = [1, 2, 4, 16]


def test_split_example_abcdef_abcxyz():
    """A node split: "ABCDEF" then "ABCXYZ" splits into ABC -> {DEF, XYZ}."""
    A, B, C, D, E, F, X, Y, Z = range(1, 10)
    cache = RadixCache.create_simulated(32)
    s1 = put(cache, [A, B, C, D, E, F])
    m = cache.match_prefix([A, B, C, X, Y, Z])
    assert m.indices.tolist() == s1[:3].tolist() and len(cache.node(m.last_node).tokens) == 3
    s2 = cache.pool.alloc(6)
    assert cache.insert([A, B, C, X, Y, Z], s2, start=m) == 3
    cache.pool.free(s2[:3])
    (abc,) = cache.child_nodes(cache.root())
    assert cache.node(abc).tokens == (A, B, C)
    tails = sorted(cache.node(c).tokens for c in cache.child_nodes(abc))
    assert tails == [(D, E, F), (X, Y, Z)]
    assert cache.total_size() == 9
    cache.check_integrity()
    assert "len=3" in cache.pretty_print()


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_match_rounds_down_to_pages(ps):
    cache = RadixCache.create_simulated(64 * ps, page_size=ps)
    toks = list(range(3 * ps + 1))
    put(cache, toks)
    assert len(cache.match_prefix(toks).indices) == (3 * ps + 1) // ps * ps
    toks2 = toks[:ps + 1] + [999] * (2 * ps)          # diverges at token ps+1, in page 1
    assert len(cache.match_prefix(toks2).indices) == (ps + 1) // ps * ps
    if ps > 1:
        assert len(cache.match_prefix(toks[:ps - 1]).indices) == 0
    cache.check_integrity()


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_eviction_never_touches_locked_path(ps):
    cache = RadixCache.create_simulated(64 * ps, page_size=ps)
    put(cache, list(range(4 * ps)))
    put(cache, list(range(2 * ps)) + [7] * (2 * ps))
    m = cache.match_prefix(list(range(4 * ps)))
    cache.inc_lock_ref(m.last_node)
    cache.evict(cache.evictable_size())
    assert cache.match_prefix(list(range(4 * ps))).indices.tolist() == m.indices.tolist()
    with pytest.raises(OutOfBlocks):
        cache.evict(cache.evictable_size() + 1)
    cache.dec_lock_ref(m.last_node)
    assert cache.evict(4 * ps) == 4 * ps
    assert cache.total_size() == 0 and cache.pool.available_size() == cache.pool.size
    cache.check_integrity()


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_lru_order_with_parent_promotion(ps):
    """Leaves go oldest first; a parent left childless competes with its own (old) time."""
    P = ps
    cache = RadixCache.create_simulated(64 * ps, page_size=ps)
    put(cache, [1] * P + [2] * P)          # t1: parent [1] with child [2]
    put(cache, [1] * P + [3] * P)          # t2: splits nothing; sibling [3]
    put(cache, [9] * P)                    # t3: another leaf
    cache.match_prefix([1] * P + [3] * P)  # t4: touch [1] and [3]
    # leaves by time: [2] (t1: the insert of [3] touched only [1]), [9] (t3), [3] (t4)
    assert cache.evict(1) == P                         # victim: [2]
    assert len(cache.match_prefix([1] * P + [2] * P).indices) == P
    # now [2] gone; [1] still has child [3]; next is [9], then [3], then promoted [1]
    cache.evict(1)
    assert len(cache.match_prefix([9] * P).indices) == 0
    cache.evict(1)
    assert len(cache.match_prefix([1] * P + [3] * P).indices) == P   # [3] gone, [1] kept
    cache.evict(1)
    assert cache.total_size() == 0
    cache.check_integrity()


def test_promoted_parent_older_than_fresh_leaf_goes_first():
    """A parent promoted during evict keeps its old time and goes before a newer leaf."""
    cache = RadixCache.create_simulated(64)
    put(cache, [1, 2])            # t1: [1,2]
    put(cache, [1, 3])            # t2: [1] -> {[2] (t1), [3] (t2)}
    cache.match_prefix([1, 3])    # t3: [1] and [3]
    put(cache, [5])               # t4: [5] newest
    assert cache.evict(2) == 2    # [2] (t1), then [3] (t3); [1] promoted with t3
    assert cache.peek_prefix_len([1, 3]) == 1 and cache.peek_prefix_len([5]) == 1
    assert cache.evict(1) == 1    # promoted [1] (t3) before [5] (t4)
    assert cache.peek_prefix_len([1]) == 0 and cache.peek_prefix_len([5]) == 1
    cache.check_integrity()


def test_extra_key_namespaces_never_share():
    cache = RadixCache.create_simulated(64)
    put(cache, [1, 2, 3], extra_key="lora-a")
    assert len(cache.match_prefix([1, 2, 3]).indices) == 0
    assert len(cache.match_prefix([1, 2, 3], extra_key="lora-b").indices) == 0
    assert len(cache.match_prefix([1, 2, 3], extra_key="lora-a").indices) == 3
    put(cache, [1, 2, 3])
    a = cache.match_prefix([1, 2, 3], extra_key="lora-a").indices
    b = cache.match_prefix([1, 2, 3]).indices
    assert set(a.tolist()).isdisjoint(b.tolist())
    cache.check_integrity()


def test_lock_errors_name_the_problem():
    cache = RadixCache.create_simulated(16)
    other = RadixCache.create_simulated(16)
    put(cache, [1, 2])
    m = cache.match_prefix([1, 2])
    with pytest.raises(LockError, match="node"):
        other.inc_lock_ref(m.last_node)
    cache.evict(2)
    with pytest.raises(LockError, match="evicted"):
        cache.inc_lock_ref(m.last_node)
    with pytest.raises(LockError, match="node"):
        cache.inc_lock_ref("not a handle")
    cache.dec_lock_ref(cache.root())       # roots are always locked: no-op


def test_bad_arguments_are_typed():
    with pytest.raises(ValueError, match="page_size"):
        RadixCache(TokenPool(8), page_size=0)
    with pytest.raises(ValueError, match="pool"):
        RadixCache(TokenPool(8), page_size=4)
    with pytest.raises(ValueError, match="eviction"):
        RadixCache(TokenPool(8), eviction="fifo")
    cache = RadixCache.create_simulated(8)
    with pytest.raises(ValueError, match="indices"):
        cache.insert([1, 2, 3], torch.tensor([0, 1]))
    with pytest.raises(ForeignId, match="indices"):
        cache.insert([1, 2], torch.tensor([0, 99]))
    with pytest.raises(TypeError, match="tokens"):
        cache.match_prefix([1.5])
    with pytest.raises(ValueError, match="num_tokens"):
        cache.evict(-1)


# ---------------------------------------------------------------- regressions

def test_regression_minisglang_52():
    """mini-sglang PR #52: lock_handle started at node.parent, so the handle node itself stayed
    evictable. Locking a handle must protect the handle node's own tokens."""
    cache = RadixCache.create_simulated(16)
    put(cache, [1, 2, 3])
    put(cache, [1, 2, 3, 4, 5])
    m = cache.match_prefix([1, 2, 3, 4, 5])
    cache.inc_lock_ref(m.last_node)
    assert cache.node(m.last_node).lock_ref == 1 and cache.protected_size() == 5
    assert cache.evictable_size() == 0


@pytest.mark.parametrize("ps", [1, 2, 4])
def test_regression_mllm_656(ps):
    """mllm PR #656: a split skipped the size accounting and dec without inc drove lock_ref to
    -1, so evictable + protected drifted from the tree total. Splits under lock keep the sums;
    an unbalanced dec raises and changes nothing."""
    cache = RadixCache.create_simulated(64 * ps, page_size=ps)
    put(cache, list(range(4 * ps)))
    m = cache.match_prefix(list(range(4 * ps)))
    cache.inc_lock_ref(m.last_node)
    cache.match_prefix(list(range(2 * ps)) + [99] * ps)   # split a locked node
    assert cache.protected_size() == 4 * ps and cache.evictable_size() == 0
    cache.dec_lock_ref(m.last_node)
    with pytest.raises(LockError):
        cache.dec_lock_ref(m.last_node)
    assert (cache.evictable_size(), cache.protected_size()) == (4 * ps, 0)
    cache.check_integrity()


@pytest.mark.parametrize("ps", [2, 4, 16])
def test_regression_sglang_10637(ps):
    """SGLang PR #10637: with page_size > 1 a key shorter than a page was truncated to 0 and
    key/value lengths were used inconsistently. A sub-page insert caches nothing and returns 0;
    sizes stay exact."""
    cache = RadixCache.create_simulated(8 * ps, page_size=ps)
    slots = cache.pool.alloc(ps)
    assert cache.insert(list(range(ps - 1)), slots) == 0
    assert cache.total_size() == 0 and len(cache.match_prefix(list(range(ps - 1))).indices) == 0
    cache.pool.free(slots)
    put(cache, list(range(ps + 1)))
    assert cache.evictable_size() == ps
    cache.check_integrity()


def test_regression_minisglang_94fe255():
    """mini-sglang 94fe255: the node stored a view of the page-table row; later writes to the
    row changed the cached indices. Values must be copies."""
    cache = RadixCache.create_simulated(16)
    row = cache.pool.alloc(4)
    want = row.tolist()
    cache.insert([1, 2, 3, 4], row)
    row.fill_(-1)
    m = cache.match_prefix([1, 2, 3, 4])
    assert m.indices.tolist() == want
    m.indices.fill_(-7)                                    # results are copies too
    assert cache.match_prefix([1, 2, 3, 4]).indices.tolist() == want


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_regression_minisglang_dae78f6(ps):
    """mini-sglang dae78f6: evict(num_pages) where tokens were expected. evict() counts
    tokens at every page size and frees whole pages."""
    cache = RadixCache.create_simulated(16 * ps, page_size=ps)
    put(cache, list(range(3 * ps)))
    put(cache, [77] * ps)
    freed = cache.evict(ps)
    assert freed == ps or freed == 3 * ps
    assert cache.pool.available_size() == 16 * ps - cache.total_size()


# ---------------------------------------------------------------- fault injection

@pytest.mark.parametrize("ps", [1, 4])
def test_free_fails_inside_cache_finished_req(ps, monkeypatch):
    cache = RadixCache.create_simulated(32 * ps, page_size=ps)
    put(cache, list(range(2 * ps)))
    req = admit_req(cache, list(range(2 * ps)) + [5] * (ps + 1))
    put(cache, req.tokens.tolist())                        # another request cached it first
    real = cache.pool.free
    monkeypatch.setattr(cache.pool, "free", lambda s: (_ for _ in ()).throw(RuntimeError("x")))
    with pytest.raises(RuntimeError):
        cache_finished_req(cache, req)
    monkeypatch.setattr(cache.pool, "free", real)
    assert cache.protected_size() == 0                     # unlocked by try/finally
    cache.check_integrity()
    held = np.concatenate([cache.pool.free_slots(), owned_slots(req)] +
                          [np.array(cache.node(x).slots, np.int64) for x in iter_nodes(cache)])
    assert np.array_equal(np.sort(held), np.arange(cache.pool.size))
    release_pending(cache, req)
    assert cache.pool.available_size() + cache.total_size() == cache.pool.size


def test_free_fails_during_evict_keeps_state():
    cache = RadixCache.create_simulated(16)
    put(cache, [1, 2])
    put(cache, [3, 4])
    calls = []

    def boom(slots):
        calls.append(1)
        raise RuntimeError("free failed")
    cache.pool._release_cached = boom
    with pytest.raises(RuntimeError):
        cache.evict(4)
    del cache.pool._release_cached
    cache.check_integrity()
    assert cache.evictable_size() == 4 and cache.evict(4) == 4


def test_admit_rolls_back_on_out_of_blocks():
    cache = RadixCache.create_simulated(8)
    put(cache, [1, 2, 3])
    m = cache.match_prefix([1, 2, 3])
    cache.inc_lock_ref(m.last_node)
    before = cache.pool.available_size()
    with pytest.raises(OutOfBlocks):
        admit_req(cache, [1, 2, 3] + list(range(10, 30)))
    assert cache.pool.available_size() == before and cache.protected_size() == 3
    cache.dec_lock_ref(m.last_node)
    req = admit_req(cache, [1, 2, 3, 4])                  # a smaller one succeeds
    assert req.prefix_len == 3


# ---------------------------------------------------------------- pools

@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_pool_conservation_and_typed_errors(ps):
    pool = TokenPool(32) if ps == 1 else PagedTokenPool(32 * ps, ps)
    a = pool.alloc(4 * ps)
    assert a.dtype == torch.int64 and len(set(a.tolist())) == 4 * ps
    assert pool.available_size() == 28 * ps
    with pytest.raises(OutOfBlocks):
        pool.alloc(29 * ps)
    pool.free(a[:ps])
    with pytest.raises(DoubleFree):
        pool.free(a[:ps])
    with pytest.raises(ForeignId):
        pool.free(torch.tensor([pool.size + 3]))
    with pytest.raises(DoubleFree):
        pool.free(torch.cat([a[ps:2 * ps], a[ps:2 * ps]]))
    assert pool.available_size() == 29 * ps
    pool.check_integrity()
    if ps > 1:
        with pytest.raises(ValueError, match="page"):
            pool.free(a[ps + 1:2 * ps])
        with pytest.raises(ValueError, match="n"):
            pool.alloc(ps + 1)


# ---------------------------------------------------------------- scheduling, block hash

def test_schedule_order_longest_prefix_then_fcfs():
    cache = RadixCache.create_simulated(64)
    put(cache, list(range(10)))
    waiting = [[50, 51], list(range(4)) + [99], list(range(10)) + [7], list(range(4))]
    got = schedule_order(cache, waiting)
    assert got == [waiting[2], waiting[1], waiting[3], waiting[0]]
    assert schedule_order(cache, waiting, fcfs_threshold=3) == waiting
    assert cache.total_size() == 10 and len(cache.child_nodes(cache.root())) == 1   # read-only


def test_45_token_prefix_radix_45_block_hash_32():
    """Radix vs block hash: block_size 16, a 45-token shared prefix: the radix cache reuses 45
    tokens, the block-hash cache only the two full blocks (32)."""
    prefix = list(range(100, 145))
    query = prefix + [1, 2, 3]
    radix = RadixCache.create_simulated(256)
    put(radix, prefix)
    assert len(radix.match_prefix(query).indices) == 45
    bh = BlockHashCache(16, 16)
    got = bh.allocate(prefix)
    bh.release(got.block_ids, prefix)
    assert bh.match(query).num_tokens == 32


def test_block_hash_collision_is_verified():
    bh = BlockHashCache(8, 4, hash_fn=lambda parent, blk: 0)   # every block collides
    a = bh.allocate(list(range(8)))
    bh.release(a.block_ids, list(range(8)))
    assert bh.match(list(range(8))).num_tokens == 4            # one hash slot, verified
    assert bh.match([9, 9, 9, 9, 1]).num_tokens == 0           # collision -> miss, not reuse
    b = bh.allocate(list(range(4)) + [5])
    assert b.num_tokens == 4 and b.block_ids[0] == a.block_ids[0]
    with pytest.raises(DoubleFree):
        bh.release(a.block_ids, list(range(8)))
