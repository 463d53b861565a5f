"""Radix cache: argument checks that change nothing when they fail (lock ownership, slot
ownership, `start` prefixes), LFU vs LRU order, the split's LRU parity with SGLang, and one
result for every token input type (list, tuple, numpy, tensor, bytes), and one rule for the ids
every kind of token and slot input takes or refuses."""
import re
from array import array

import numpy as np
import pytest
import torch

from pagedattn.cache_mgmt.errors import ForeignId, LockError
from pagedattn.cache_mgmt.radix_cache import RadixCache
from pagedattn.cache_mgmt.token_pool import TokenPool

pytestmark = pytest.mark.usefixtures("radix_path")   # C helpers and pure Python


def put(cache, toks, extra_key=None):
    """Insert `toks` with fresh slots, free the duplicates; returns the slots."""
    ps = cache.page_size
    slots = cache.pool.alloc(-(-len(toks) // ps) * ps)
    got = cache.insert(toks, slots, extra_key=extra_key)
    a = len(toks) - len(toks) % ps
    cache.pool.free(torch.cat([slots[:got], slots[a:]]))
    return slots


def state(cache):
    """Everything a call could change: tree and index tables, counters, clock, pool."""
    tables = [dict(t) for t in (cache._key, cache._par, cache._lock, cache._time, cache._own,
                                cache._first, cache._hits)]
    tables += [dict(cache._val),
               {k: dict(v) for k, v in cache._kids.items()}]
    return (tables, sorted(cache._index.members()), cache.evictable_size(),
            cache.protected_size(), cache._clock, (cache.pool._state == 2).nonzero()[0].tolist(),
            sorted(cache.pool.free_slots().tolist()))


# ---------------------------------------------------------------- locks

def test_regression_dec_lock_ref_through_descendant():
    """A node locked only through a descendant's handle was accepted by dec_lock_ref: the real
    handle's unlock then left lock_ref -1, and evict(2) raised with 2 slots stuck."""
    cache = RadixCache(TokenPool(4), page_size=1)
    slots = cache.pool.alloc(2)
    cache.insert([0, 0], slots)
    m = cache.match_prefix([0, 0])
    cache.inc_lock_ref(m.last_node)
    upper = cache.match_prefix([0]).last_node         # splits [0, 0]: [0] -> [0]
    before = state(cache)
    with pytest.raises(LockError, match="no lock of its own"):
        cache.dec_lock_ref(upper)
    assert state(cache) == before
    cache.dec_lock_ref(m.last_node)
    assert cache.evict(2) == 2
    assert cache.pool.available_size() == 4 and cache.total_size() == 0
    cache.check_integrity()


def test_lock_counts_handles_per_node():
    """Two handles on one node and one below it: each unlock names its own node."""
    cache = RadixCache.create_simulated(16)
    put(cache, [1, 2, 3, 4])
    a = cache.match_prefix([1, 2])                    # [1, 2] -> [3, 4]
    b = cache.match_prefix([1, 2, 3, 4])
    cache.inc_lock_ref(a)                             # a MatchResult is a handle too
    cache.inc_lock_ref(a.last_node)
    cache.inc_lock_ref(b.last_node)
    assert cache.node(a.last_node)[5:7] == (3, 2) and cache.node(b.last_node)[5:7] == (1, 1)
    cache.dec_lock_ref(b.last_node)
    with pytest.raises(LockError):
        cache.dec_lock_ref(b.last_node)
    cache.dec_lock_ref(a.last_node)
    cache.dec_lock_ref(a.last_node)
    with pytest.raises(LockError):
        cache.dec_lock_ref(a.last_node)
    assert cache.protected_size() == 0
    cache.check_integrity()


# ---------------------------------------------------------------- slot ownership

def _cache_with_keys(ps):
    cache = RadixCache.create_simulated(64 * ps, page_size=ps)
    held = put(cache, list(range(2 * ps)))            # cached under [0 .. 2ps)
    return cache, held


@pytest.mark.parametrize("ps", [1, 3, 4])    # 3: the page check without the power-of-two mask
@pytest.mark.parametrize("case", ["free", "twice", "cached", "range", "negative"])
def test_insert_rejects_slots_it_does_not_own(ps, case):
    """insert takes new slots only when the caller owns them: handed out by the pool, not in
    the tree, each listed once, in range. A refused call changes nothing."""
    cache, held = _cache_with_keys(ps)
    mine = cache.pool.alloc(4 * ps)
    toks = [99] * ps + [98] * ps + [97] * ps
    bad = {"free": lambda s: torch.cat([s[:2 * ps], torch.tensor([63 * ps + i for i in
                                                                  range(ps)])]),
           "twice": lambda s: torch.cat([s[:2 * ps], s[:ps]]),
           "cached": lambda s: torch.cat([s[:2 * ps], held[:ps]]),
           "range": lambda s: torch.cat([s[:2 * ps], torch.arange(64 * ps, 65 * ps)]),
           "negative": lambda s: torch.cat([s[:2 * ps], torch.arange(-ps, 0)])}[case](mine)
    assert not cache.pool.is_free(mine).any()
    if case == "free":
        assert cache.pool.is_free(bad[2 * ps:]).all()
    before = state(cache)
    with pytest.raises(ForeignId, match="indices"):
        cache.insert(toks, bad)
    assert state(cache) == before
    assert cache.insert(toks, mine[:3 * ps]) == 0     # the caller's own slots are fine
    cache.check_integrity()


@pytest.mark.parametrize("ps", [1, 4])
def test_pool_free_refuses_slots_the_cache_holds(ps):
    """Slots given to the tree go back only through evict: pool.free of a cached slot (a page's
    first slot at ps > 1) raises ForeignId and frees nothing; evict then frees them."""
    cache, held = _cache_with_keys(ps)
    mine = cache.pool.alloc(ps)
    before = state(cache)
    for bad in (held, held[:ps], torch.cat([mine, held[:ps]])):
        with pytest.raises(ForeignId, match="held by a radix cache"):
            cache.pool.free(bad)
        assert state(cache) == before
    cache.pool.free(mine)
    assert cache.evict(2 * ps) == 2 * ps and cache.pool.available_size() == cache.pool.size
    cache.check_integrity()


@pytest.mark.parametrize("ps", [3, 4])    # 3: not a power of two
def test_insert_rejects_partial_pages(ps):
    cache = RadixCache.create_simulated(16 * ps, page_size=ps)
    s = cache.pool.alloc(2 * ps)
    bad = [torch.cat([s[ps - 1:ps], s[ps:2 * ps - 1]]),   # the end of one page, most of the next
           s[1:ps + 1],                                  # a run of ps slots, not page-aligned
           torch.cat([s[ps:2 * ps - 1], s[ps - 1:ps]]),   # a page's slots out of order
           s[:ps].flip(0),
           s[:1].repeat(ps) | torch.arange(ps) // 2 * 2 + 1]  # odd head h: h | j repeats slots
    before = state(cache)
    for b in bad:
        with pytest.raises(ValueError, match="whole pages"):
            cache.insert([5] * ps, b)
    assert state(cache) == before
    assert cache.insert([5] * ps, s[ps:]) == 0


# ---------------------------------------------------------------- start=

def test_regression_insert_start_not_a_prefix():
    """insert([9, 9, 5, 6], start=match_prefix([1, 2])) filed the tokens under [1, 2]."""
    cache = RadixCache.create_simulated(32)
    put(cache, [1, 2])
    m = cache.match_prefix([1, 2])
    slots = cache.pool.alloc(4)
    before = state(cache)
    with pytest.raises(ValueError, match="start"):
        cache.insert([9, 9, 5, 6], slots, start=m)
    with pytest.raises(ValueError, match="start"):
        cache.insert([9, 9, 5, 6], slots, start=(m.last_node, 2))
    with pytest.raises(ValueError, match="start"):
        cache.insert([1], slots, start=m)             # start longer than the tokens
    with pytest.raises(ValueError, match="start"):
        cache.insert([1, 2, 5, 6], slots, start=(m.last_node, 1))   # wrong prefix_len
    assert state(cache) == before
    assert cache.insert([9, 9, 5, 6], slots) == 0
    assert cache.peek_prefix_len([1, 2, 5, 6]) == 2 and cache.peek_prefix_len([9, 9, 5, 6]) == 4


def test_insert_start_in_another_namespace():
    cache = RadixCache.create_simulated(32)
    put(cache, [1, 2], extra_key="a")
    m = cache.match_prefix([1, 2], extra_key="a")
    slots = cache.pool.alloc(3)
    before = state(cache)
    for start in (m, (m.last_node, 2)):
        with pytest.raises(ValueError, match="namespace"):
            cache.insert([1, 2, 3], slots, extra_key="b", start=start)
    assert state(cache) == before
    assert cache.insert([1, 2, 3], slots, extra_key="a", start=m) == 2


def test_insert_start_after_eviction_walks_from_the_root():
    cache = RadixCache.create_simulated(32)
    put(cache, [1, 2])
    m = cache.match_prefix([1, 2])
    cache.evict(2)
    slots = cache.pool.alloc(3)
    assert cache.insert([1, 2, 3], slots, start=m) == 0
    assert cache.match_prefix([1, 2, 3]).indices.tolist() == slots.tolist()


def test_insert_reuses_the_match_key_of_the_same_list():
    """The list given to match_prefix, appended to since, gives what a fresh insert gives."""
    a, b = RadixCache.create_simulated(64), RadixCache.create_simulated(64)
    for cache in (a, b):
        put(cache, [1, 2, 3])
    toks = [1, 2, 3, 4]
    m = a.match_prefix(toks)
    toks += [5, 6]
    sa, sb = a.pool.alloc(6), b.pool.alloc(6)
    assert a.insert(toks, sa, start=m) == b.insert([1, 2, 3, 4, 5, 6], sb) == 3
    assert a.match_prefix(toks).indices[3:].tolist() == sa[3:].tolist()
    assert b.match_prefix(toks).indices[3:].tolist() == sb[3:].tolist()


# ---------------------------------------------------------------- eviction order

def test_lfu_evicts_fewest_hits_not_oldest():
    """[1] is hit 3 times but touched first, [2] once and last: LFU evicts [2], where LRU
    would evict [1]. Hits count matches only."""
    for policy, gone in (("lfu", [2]), ("lru", [1])):
        cache = RadixCache.create_simulated(64, eviction=policy)
        put(cache, [1])
        put(cache, [2])
        for _ in range(3):
            cache.match_prefix([1])
        cache.match_prefix([2])
        assert cache.evict(1) == 1
        assert [cache.peek_prefix_len([t]) for t in (1, 2)] == [int(t != gone[0])
                                                               for t in (1, 2)], policy


def test_split_marks_the_lower_half_used():
    """LRU parity with SGLang: a match that cuts [1, 2, 3, 4] at 2 touches both halves, so the
    lower half [3, 4] outlives [9], inserted after [1, 2, 3, 4] but before the match."""
    cache = RadixCache.create_simulated(32)
    put(cache, [1, 2, 3, 4])
    put(cache, [9])
    cache.match_prefix([1, 2])
    assert cache.evict(1) == 1
    assert cache.peek_prefix_len([9]) == 0 and cache.peek_prefix_len([1, 2, 3, 4]) == 4
    assert cache.evict(2) == 2 and cache.peek_prefix_len([1, 2, 3, 4]) == 2
    cache.check_integrity()


# ---------------------------------------------------------------- input types

CONVERT = {
    "list": lambda t: list(t), "tuple": lambda t: tuple(t),
    "numpy int32": lambda t: np.array(t, np.int32), "numpy int64": lambda t: np.array(t),
    "tensor int32": lambda t: torch.tensor(t, dtype=torch.int32),
    "tensor int64": lambda t: torch.tensor(t, dtype=torch.int64),
    "bytes": lambda t: np.array(t, np.int64).tobytes(),
    "array q": lambda t: array("q", t), "array i": lambda t: array("i", t),
}


@pytest.mark.parametrize("ps", [1, 4])
def test_every_token_type_gives_the_same_results(ps):
    """One random sequence of match / lock / insert(start=) / unlock / evict per input type
    (list, tuple, array.array, numpy and tensors of two dtypes, bytes):
    identical matches, insert results, trees and evictions."""
    logs, trees = {}, {}
    for kind, conv in CONVERT.items():
        rng = np.random.default_rng(7)
        cache = RadixCache.create_simulated(64 * ps, page_size=ps)
        log = []
        for _ in range(120):
            toks = rng.integers(0, 3, rng.integers(1, 6 * ps)).tolist()
            m = cache.match_prefix(conv(toks))
            cache.inc_lock_ref(m.last_node)
            need = -(-len(toks) // ps) * ps
            if cache.pool.available_size() < need:
                short = need - cache.pool.available_size()
                log.append(("evict", cache.evict(min(short, cache.evictable_size()))
                            if cache.evictable_size() >= short else None))
            if cache.pool.available_size() >= need:
                slots = cache.pool.alloc(need)
                got = cache.insert(conv(toks), slots, start=m)
                a = len(toks) - len(toks) % ps
                cache.pool.free(torch.cat([slots[:got], slots[a:]]))
                log.append(("insert", got))
            cache.dec_lock_ref(m.last_node)
            log.append(("match", m.indices.tolist(), cache.peek_prefix_len(conv(toks))))
        cache.check_integrity()
        logs[kind] = log
        trees[kind] = re.sub(r" nid=\d+", "", cache.pretty_print())   # ids differ per cache
    assert sum(1 for e in logs["list"] if e[0] == "evict") > 5      # eviction is exercised
    for kind in CONVERT:
        assert logs[kind] == logs["list"], kind
        assert trees[kind] == trees["list"], kind


def test_bad_token_inputs_are_typed():
    cache = RadixCache.create_simulated(8)
    for bad, err in (([1.5], TypeError), (["a"], TypeError), ([2 ** 70], ValueError),
                     (np.array([1.0]), TypeError), (torch.tensor([1.0]), TypeError),
                     (b"123", ValueError)):
        with pytest.raises(err, match="tokens"):
            cache.match_prefix(bad)
        with pytest.raises(err, match="tokens"):
            cache.insert(bad, cache.pool.alloc(1))
    assert cache.total_size() == 0


# Every integer dtype of each kind, with its smallest and largest id that fits int64 (uint64's
# largest is 2**64 - 1: outside int64, refused below).
INTEGER_KINDS = (
    [(f"numpy {d}", lambda t, d=d: np.array(t, d), np.iinfo(d)) for d in
     (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64)] +
    [(f"tensor {d}", lambda t, d=d: torch.tensor(t, dtype=d), torch.iinfo(d)) for d in
     (torch.int8, torch.uint8, torch.int16, torch.uint16, torch.int32, torch.uint32,
      torch.int64, torch.uint64)] +
    [(f"array {c}", lambda t, c=c: array(c, t), np.iinfo(np.dtype(c))) for c in "bBhHiIlLqQ"])


def test_every_integer_dtype_takes_the_ids_a_list_takes():
    """Each kind's extreme ids (up to 2**63 - 1 for the unsigned 64-bit ones) give the key of
    the same list and match what the list cached, strided views too."""
    cache = RadixCache.create_simulated(512)
    for kind, conv, info in INTEGER_KINDS:
        ids = [int(info.min), 0, 1, min(int(info.max), 2**63 - 1)]
        put(cache, ids)
        want = cache.match_prefix(ids)
        assert len(want.indices) == len(ids)
        for toks in (conv(ids), conv([x for i in ids for x in (i, 0)])[::2]):
            m = cache.match_prefix(toks)
            assert (m.key, m.indices.tolist()) == (want.key, want.indices.tolist()), kind


@pytest.mark.parametrize("value", [2**63, 2**64 - 1])
def test_ids_outside_int64_are_refused_by_every_kind(value):
    """An id >= 2**63 in a uint64 array or tensor is refused like the same int in a list; cast
    to int64 it would match the cached id it wraps onto (2**64 - 1 onto -1). The same for the
    slots of insert and pool.free: one in insert's already cached part would go unchecked."""
    cache = RadixCache.create_simulated(8)
    held = put(cache, [value - 2**64])                # the id a uint64 value wraps onto
    mine = cache.pool.alloc(1)
    kinds = [list, tuple, lambda t: [np.uint64(x) for x in t],
             lambda t: np.array(t, np.uint64), lambda t: torch.tensor(t, dtype=torch.uint64),
             lambda t: array("Q", t)]
    before = state(cache)
    for conv in kinds:
        for call in (cache.match_prefix, cache.peek_prefix_len,
                     lambda t: cache.insert(t, torch.cat([held, mine]))):
            with pytest.raises(ValueError, match=r"^tokens: expected int64 token ids \("):
                call(conv([value]))
        slots = conv([value, int(mine)])          # value: the slot of the cached token
        with pytest.raises(ValueError, match=r"^indices: expected int64 slot ids \("):
            cache.insert([value - 2**64, 5], slots)
        with pytest.raises(ValueError, match=r"^slots: expected int64 slot ids \("):
            cache.pool.free(slots)
        assert state(cache) == before
    big = [2**64, -2**63 - 1]           # beyond uint64 and below int64: lists only
    for bad in (big, [int(held), 2**64], [int(held), -2**63 - 1]):
        with pytest.raises(ValueError, match="^indices: expected int64 slot ids"):
            cache.insert([value - 2**64, 5], bad)
    for bad in (big, [2**64], [-2**63 - 1]):
        with pytest.raises(ValueError, match="^tokens: expected int64 token ids"):
            cache.match_prefix(bad)
    assert state(cache) == before


def test_token_and_slot_arrays_must_be_1d():
    """A 2-D (or 0-d) array or tensor is refused, not flattened."""
    cache = RadixCache.create_simulated(8)
    s = cache.pool.alloc(4)
    before = state(cache)
    for bad in (np.array([[1, 2], [3, 4]]), torch.tensor([[1, 2], [3, 4]], dtype=torch.int32),
                np.zeros((0, 2), np.int64), np.array(5), torch.tensor(5)):
        for call in (cache.match_prefix, cache.peek_prefix_len,
                     lambda t: cache.insert(t, s)):
            with pytest.raises(ValueError, match="^tokens: expected a 1-D"):
                call(bad)
    for bad in (s.reshape(2, 2), s.numpy().reshape(2, 2), s.reshape(1, 4).to(torch.int32),
                s[0], s.numpy()[0:1].reshape(())):
        with pytest.raises(ValueError, match="^indices: expected a 1-D"):
            cache.insert([1, 2, 3, 4], bad)
        with pytest.raises(ValueError, match="^slots: expected a 1-D"):
            cache.pool.free(bad)
    assert state(cache) == before


def test_array_dtype_decides_not_its_contents():
    """Bool, float, complex and object arrays and tensors are refused (TypeError) by dtype,
    empty ones too, as a list of floats is; a bool in a list is the int 0 or 1, as in
    Python."""
    cache = RadixCache.create_simulated(8)
    s = cache.pool.alloc(2)
    before = state(cache)
    for bad in (np.array([], np.float64), np.array([1.0]), np.array([True]), np.array([], bool),
                np.array([1j]), np.array([1], object), torch.tensor([True]),
                torch.tensor([], dtype=torch.bool), torch.tensor([], dtype=torch.float32),
                array("d"), array("d", [1.0]), [1.0], (True, 2.5)):
        with pytest.raises(TypeError, match="^tokens: "):
            cache.match_prefix(bad)
        with pytest.raises(TypeError, match="^indices: "):
            cache.insert([], bad)
        with pytest.raises(TypeError, match="^slots: "):
            cache.pool.free(bad)
    assert state(cache) == before
    assert cache.match_prefix([True, False]).key == cache.match_prefix([1, 0]).key
