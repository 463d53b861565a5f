"""Cross-check against SGLang's own RadixCache, loaded by bench/_sglang_peer.py (issue 9).

Needs an unpacked sglang wheel in $PAGEDATTN_PEER_SGLANG (see bench/_sglang_peer.py); without
it the SGLang tests skip with the reason, so CI skips them. No timing here (bench_radix does it).
"""
import os

import numpy as np
import pytest
import torch

from bench._sglang_peer import ENV, PeerUnavailable, make_peer
from bench.bench_radix import workload_a
from pagedattn.cache_mgmt.radix_cache import RadixCache

needs_sglang = pytest.mark.skipif(
    not os.environ.get(ENV), reason=f"${ENV} not set (an unpacked sglang wheel directory)")

PAGE_SIZES = [1, 16]   # 1: token-granular; 16: paged, the 3,000-token prefix is not page-aligned
N_REQ = 200            # workload (a): 3,000-token shared prefix + 50-200 unique tokens each


def _ours_request(c, toks):
    """match, lock, insert, unlock as bench_radix.Ours does; returns the matched length."""
    ps = c.page_size
    slots = c.pool.alloc(-(-len(toks) // ps) * ps)
    m = c.match_prefix(toks)
    c.inc_lock_ref(m.last_node)
    got = c.insert(toks, slots, start=m)
    c.dec_lock_ref(m.last_node)
    a = len(toks) - len(toks) % ps
    c.pool.free(np.concatenate([slots[:got].numpy(), slots[a:].numpy()]))
    return len(m.indices)


def _peer_request(p, toks):
    ps = p.page_size
    slots = p.alloc.alloc(-(-len(toks) // ps) * ps)
    key = p.key(toks)
    n, node = p.match(key)
    p.lock(node)
    got = p.insert(key, slots)
    p.unlock(node)
    a = len(toks) - len(toks) % ps
    p.alloc.free(torch.cat([slots[:got], slots[a:]]))
    return n


@needs_sglang
@pytest.mark.parametrize("page_size", PAGE_SIZES, ids=lambda p: f"page{p}")
def test_same_matches_on_workload_a(page_size):
    reqs = workload_a(np.random.default_rng(0), n_req=N_REQ)
    ours = RadixCache.create_simulated(1_000_000, page_size=page_size)
    peer = make_peer(page_size, size=1_000_000)
    got_ours = [_ours_request(ours, t) for t in reqs]
    got_peer = [_peer_request(peer, t) for t in reqs]
    diff = [i for i, (a, b) in enumerate(zip(got_ours, got_peer)) if a != b]
    assert not diff, f"first mismatch at request {diff[0]}: ours {got_ours[diff[0]]}, " \
                     f"sglang {got_peer[diff[0]]} ({len(diff)} mismatches)"
    prefix = 3000 - 3000 % page_size
    assert got_ours[0] == 0 and min(got_ours[1:]) >= prefix   # the check is not vacuous
    assert ours.evictable_size() == peer.evictable_size()
    assert ours.pool.available_size() == peer.alloc.available_size()


@needs_sglang
@pytest.mark.parametrize("page_size", PAGE_SIZES, ids=lambda p: f"page{p}")
def test_peer_evicts_unlocked_only(page_size):
    p = make_peer(page_size, size=4096)
    a = np.arange(64 * page_size)
    b = np.concatenate([a[:32 * page_size], 10_000 + a[:32 * page_size]])   # shares half of a
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


def test_missing_path_says_how(tmp_path):
    with pytest.raises(PeerUnavailable, match="no sglang/srt/mem_cache/radix_cache.py under"):
        make_peer(1, path=str(tmp_path))
    whl = tmp_path / "sglang-0.0-py3-none-any.whl"
    whl.write_bytes(b"")
    with pytest.raises(PeerUnavailable, match="is a wheel file, not a directory"):
        make_peer(1, path=str(whl))
