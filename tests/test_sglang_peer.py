"""Cross-check against SGLang's own RadixCache from the released wheels (pagedattn/bench/_sglang_peer.py).

Each supported release is fetched with pip on first use (cached afterwards); without network or
package index the SGLang tests skip with the reason. No timing here (pagedattn-bench radix does it).
"""
import functools

import numpy as np
import pytest

from pagedattn.bench._sglang_peer import (VERSIONS, PeerUnavailable, fetch, load,
                                          make_peer)
from pagedattn.bench.radix import few_shot, multi_turn, tree_search
from pagedattn.cache_mgmt.radix_cache import RadixCache

PAGE_SIZES = [1, 16]   # 1: token-granular; 16: paged, the 3,000-token prefix is not page-aligned


@functools.lru_cache(maxsize=None)
def _peer_ns(version):
    try:
        return load(fetch(version)), None
    except PeerUnavailable as e:
        return None, str(e)


@pytest.fixture(params=VERSIONS)
def version(request):
    ns, why = _peer_ns(request.param)
    if ns is None:
        pytest.skip(f"sglang {request.param} unavailable: {why}")
    return request.param


def _ours_request(c, toks):
    """match, lock, insert(start=), unlock, as pagedattn.bench.radix.Ours; returns the matched length."""
    ps = c.page_size
    need = -(-len(toks) // ps) * ps
    if c.pool.available_size() < need:
        c.evict(min(c.evictable_size(), need * 8))
    slots = c.pool.alloc(need)
    m = c.match_prefix(toks)
    c.inc_lock_ref(m.last_node)
    got = c.insert(toks, slots, start=m)
    c.dec_lock_ref(m.last_node)
    a = len(toks) - len(toks) % ps
    c.pool.free(np.concatenate([slots[:got].numpy(), slots[a:].numpy()]))
    return len(m.indices)


def _peer_request(p, toks):
    ps = p.page_size
    need = -(-len(toks) // ps) * ps
    if p.alloc.available_size() < need:
        p.evict(min(p.evictable_size(), need * 8))
    slots = p.alloc.alloc(need)
    n, node = p.match(toks)
    p.lock(node)
    got = p.insert(toks, slots)
    p.unlock(node)
    a = len(toks) - len(toks) % ps
    p.alloc.free(np.concatenate([slots[:got].numpy(), slots[a:].numpy()]))
    return n


def _replay_both(version, page_size, reqs, size):
    ours = RadixCache.create_simulated(size, page_size=page_size)
    peer = make_peer(page_size, size=size, version=version)
    got_ours = [_ours_request(ours, t.tolist()) for t in reqs]
    got_peer = [_peer_request(peer, t.tolist()) for t in reqs]
    diff = [i for i, (a, b) in enumerate(zip(got_ours, got_peer)) if a != b]
    assert not diff, f"first mismatch at request {diff[0]}: ours {got_ours[diff[0]]}, " \
                     f"sglang {got_peer[diff[0]]} ({len(diff)} of {len(reqs)} mismatch)"
    assert ours.evictable_size() == peer.evictable_size()
    assert ours.pool.available_size() == peer.alloc.available_size()
    ours.check_integrity()
    return got_ours


@pytest.mark.parametrize("page_size", PAGE_SIZES, ids=lambda p: f"page{p}")
def test_same_matches_on_few_shot(version, page_size):
    reqs = few_shot(np.random.default_rng(0), n_req=200)
    got = _replay_both(version, page_size, reqs, 1_000_000)
    prefix = 3000 - 3000 % page_size
    assert got[0] == 0 and min(got[1:]) >= prefix   # the check is not vacuous


@pytest.mark.parametrize("page_size", PAGE_SIZES, ids=lambda p: f"page{p}")
def test_same_matches_under_eviction(version, page_size):
    """LRU parity: with a pool far smaller than the workloads, every request evicts, and the
    matched lengths (which depend on the eviction order, splits included) agree request by
    request."""
    rng = np.random.default_rng(3)
    reqs = multi_turn(rng, n_conv=40, turns=6) + tree_search(rng, n_prob=3)
    rng.shuffle(reqs)
    got = _replay_both(version, page_size, reqs, 24_000 - 24_000 % page_size)
    hits = sum(1 for g in got if g)
    assert hits > len(reqs) // 3 and hits < len(reqs)   # some prefixes survive, some are gone


@pytest.mark.parametrize("page_size", PAGE_SIZES, ids=lambda p: f"page{p}")
def test_peer_evicts_unlocked_only(version, page_size):
    p = make_peer(page_size, size=4096, version=version)
    a = list(range(64 * page_size))
    b = a[:32 * page_size] + [10_000 + t for t in a[:32 * page_size]]   # shares half of a
    p.insert(a, p.alloc.alloc(len(a)))
    dup = p.insert(b, s := p.alloc.alloc(len(b)))
    assert dup == 32 * page_size
    p.alloc.free(s[:dup])
    n, node = p.match(b)
    p.lock(node)                                   # b's whole path is protected
    free0 = p.alloc.available_size()
    assert p.evict(10**9) == 32 * page_size        # only a's unshared tail can go
    assert p.alloc.available_size() == free0 + 32 * page_size
    assert p.match(a)[0] == 32 * page_size and p.match(b)[0] == len(b)
    p.unlock(node)
    p.evict(10**9)
    assert p.evictable_size() == 0 and p.alloc.available_size() == 4096


def test_unloadable_tree_says_why(tmp_path):
    with pytest.raises(PeerUnavailable, match="evict_policy.py is missing"):
        load(str(tmp_path))
