"""Page rounding of the radix cache above page size 1, on both paths: match, peek and insert
of lengths that are not a multiple of the page use whole pages only, the matched indices are
whole pages, and the slots of a partial last page stay the caller's."""
import numpy as np
import pytest
import torch

from pagedattn.cache_mgmt.errors import ForeignId
from pagedattn.cache_mgmt.radix_cache import RadixCache
from test_radix_checks import put

pytestmark = pytest.mark.usefixtures("radix_path")   # C helpers and pure Python

PAGE_SIZES = [2, 4, 16]   # 2: the smallest paged case; 4: the tests' usual; 16: the bench's


def unaligned(ps: int) -> list:
    """Lengths that are not a multiple of ps: inside the first page, just past one, a page less
    one token, and past three pages by one token and by half a page."""
    lens = sorted({1, ps - 1, ps + 1, 2 * ps - 1, 3 * ps + 1, 3 * ps + max(ps // 2, 1)})
    assert all(n % ps for n in lens)
    return lens


def path_len(cache, node) -> int:
    """Tokens from the root to `node`."""
    n = 0
    while cache.node(node).parent >= 0:
        n += len(cache.node(node).tokens)
        node = cache.node(node).parent
    return n


def check_match(cache, q, want: int, slots) -> None:
    """`q` matches `want` tokens (whole pages) of the prompt cached with `slots`."""
    m = cache.match_prefix(q)
    assert len(m.indices) == want and want % cache.page_size == 0, q
    assert m.indices.tolist() == slots[:want].tolist()
    assert path_len(cache, m.last_node) == want
    assert (m.last_node == cache.root()) == (want == 0)
    assert cache.peek_prefix_len(q) == want
    cache.check_integrity()                  # every node a whole number of pages (R2)


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_match_and_peek_round_every_length_down_to_pages(ps):
    """Every prefix of a cached prompt of 4 pages less a token, and every prefix that then
    diverges in its last token: `k // ps * ps` tokens matched (the cached slots, whole pages,
    ending at last_node), the same peeked. Each query on a fresh cache (the match ends inside
    the prompt's one node) and in turn on one cache (inside nodes earlier matches cut)."""
    make = lambda: RadixCache.create_simulated(16 * ps, page_size=ps)   # noqa: E731
    toks = list(range(100, 100 + 4 * ps - 1))
    shared = make()
    slots = put(shared, toks)
    assert shared.total_size() == 3 * ps
    for k in range(len(toks) + 2):
        for q, same in ((toks[:k], k), (toks[:k - 1] + [-5], k - 1) if k else ([], 0)):
            want = min(same, 3 * ps) // ps * ps
            fresh = make()
            check_match(fresh, q, want, put(fresh, toks))
            check_match(shared, q, want, slots)


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_insert_unaligned_lengths_caches_whole_pages(ps):
    """Inserts of unaligned lengths, each extending or cutting the last: the page-aligned part
    is cached, the return value is the page-aligned length cached before, the partial last
    page's slots stay the caller's (held, not cached) and are not needed."""
    cache = RadixCache.create_simulated(64 * ps, page_size=ps)
    base = np.random.default_rng(ps).integers(0, 1000, 4 * ps).tolist()
    cached = 0
    for n in unaligned(ps) + unaligned(ps)[::-1]:
        toks = base[:n]
        m = cache.match_prefix(toks)
        assert len(m.indices) == min(n // ps * ps, cached)
        aligned = n // ps * ps
        slots = cache.pool.alloc(-(-n // ps) * ps)       # the partial page's slots too
        given = slots if n % 2 else slots[:aligned]       # with them or without
        got = cache.insert(toks, given, start=m)
        assert got == min(aligned, cached) and got % ps == 0
        cached = max(cached, aligned)
        assert cache.total_size() == cached
        after = cache.match_prefix(toks).indices.tolist()
        assert after == m.indices.tolist() + slots[got:aligned].tolist()
        if got < aligned:                                 # the new pages are the tree's now
            with pytest.raises(ForeignId, match="held by a radix cache"):
                cache.pool.free(slots[got:got + ps])
        cache.pool.free(torch.cat([slots[:got], slots[aligned:]]))  # duplicates, partial page
        cache.check_integrity()
    assert cache.peek_prefix_len(base) == cached == 3 * ps


@pytest.mark.parametrize("ps", PAGE_SIZES)
def test_indices_of_the_whole_pages_are_enough(ps):
    """insert of n tokens needs slots for its whole pages only; one slot fewer is refused."""
    cache = RadixCache.create_simulated(16 * ps, page_size=ps)
    toks = list(range(2 * ps + 1))
    slots = cache.pool.alloc(2 * ps)
    with pytest.raises(ValueError, match="indices"):
        cache.insert(toks, slots[:2 * ps - 1])
    assert cache.insert(toks, slots) == 0
    assert cache.total_size() == 2 * ps and cache.peek_prefix_len(toks) == 2 * ps
    cache.check_integrity()
