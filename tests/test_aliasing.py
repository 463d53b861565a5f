"""store_kv refuses K and V caches that share memory (V's writes would land on K) and keeps
accepting disjoint views of one storage; the element-overlap test it uses agrees with brute
force on random strided views."""
import random

import pytest
import torch

import pagedattn as pa
from pagedattn.aliasing import shares_bytes

NB, BS, HKV, D = 6, 4, 2, 32


def _tokens(n=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(n, HKV, D, generator=gen)
    return k, torch.randn(n, HKV, D, generator=gen), torch.tensor([0, 5, 9, 14, 23])


def _overlapping_pairs():
    """(id, k_cache, v_cache) pairs in layout bhsd whose elements meet."""
    kc = torch.zeros(NB, HKV, BS, D)
    buf = torch.zeros(NB + 1, HKV, BS, D)
    wide = torch.zeros(NB, HKV, BS, 2 * D)
    kv = torch.zeros(NB, 2, HKV, BS, D)
    return [
        ("same tensor", kc, kc),
        ("shifted by one block", buf[:NB], buf[1:]),
        ("half a head_dim apart", wide[..., :D], wide[..., D // 2: D // 2 + D]),
        ("one element in common", kv[:, 0],  # V starts at block 0's last K element
         kv.as_strided(kv[:, 1].shape, kv[:, 1].stride(), HKV * BS * D - 1)),
    ]


@pytest.mark.parametrize("validate", [True, False])
@pytest.mark.parametrize("case", _overlapping_pairs(), ids=lambda c: c[0])
def test_store_kv_rejects_overlapping_caches(case, validate):
    _, kc, vc = case
    k, v, slots = _tokens()
    before = kc.clone()
    with pytest.raises(ValueError, match="v_cache: shares memory with k_cache"):
        pa.store_kv(k, v, kc, vc, slots, backend="torch", validate=validate)
    assert torch.equal(kc, before), "nothing written"


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_store_kv_accepts_disjoint_views_of_one_storage(backend, layout):
    """kv[:, 0] / kv[:, 1] of a [num_blocks, 2, ...] tensor (vLLM's and FlashInfer's cache), and
    the two halves of a wide last dimension: extents interleave, elements do not meet."""
    k, v, slots = _tokens()
    ref_k, ref_v = pa.make_kv_cache(NB, BS, HKV, D, layout=layout, dtype=torch.float32)
    ref_k.zero_(), ref_v.zero_()
    pa.store_kv(k, v, ref_k, ref_v, slots, layout=layout, backend="torch")
    kv = torch.zeros((NB, 2) + tuple(ref_k.shape[1:]))
    wide = torch.zeros(tuple(ref_k.shape[:-1]) + (2 * D,))
    for kc, vc in ((kv[:, 0], kv[:, 1]), (wide[..., :D], wide[..., D:])):
        assert not shares_bytes(kc, vc)
        pa.store_kv(k, v, kc, vc, slots, layout=layout, backend=backend, validate=False)
        assert torch.equal(kc, ref_k) and torch.equal(vc, ref_v)


def test_attention_reads_may_share_k_and_v():
    """Only the write op refuses overlap: decode over V = K (one cache read twice) still runs."""
    kc = torch.randn(NB, HKV, BS, D)
    out = pa.paged_decode(torch.randn(1, 4, D), kc, kc, torch.tensor([[1, 2]], dtype=torch.int32),
                          torch.tensor([7], dtype=torch.int32), backend="torch")
    assert torch.isfinite(out).all()


def _bytes_of(t):
    base = t.untyped_storage().data_ptr()
    idx = torch.arange(t.untyped_storage().nbytes() // t.element_size())
    offs = idx.as_strided(t.shape, t.stride(), t.storage_offset()).reshape(-1)
    return {(base + int(o) * t.element_size() + b) for o in offs for b in range(t.element_size())}


def test_shares_bytes_matches_brute_force():
    """Random strided views (any shapes, strides and offsets, overlapping ones included) of one
    small buffer, in two element sizes: the search gives the brute-force answer on each pair."""
    rng = random.Random(0)
    buf = torch.zeros(64, dtype=torch.float64)
    views = {8: buf, 4: buf.view(torch.float32), 2: buf.view(torch.float16)}
    met = interleaved = 0
    for _ in range(600):
        pair = []
        for _ in range(2):
            src = views[rng.choice([8, 4, 2])]
            ndim = rng.randint(1, 3)
            shape = [rng.randint(1, 5) for _ in range(ndim)]
            stride = [rng.randint(0, 12) for _ in range(ndim)]
            span = sum((n - 1) * s for n, s in zip(shape, stride)) + 1
            off = rng.randint(0, src.numel() - span) if span <= src.numel() else None
            if off is None:
                shape, stride, off = [1], [1], 0
            pair.append(src.as_strided(shape, stride, off))
        want = bool(_bytes_of(pair[0]) & _bytes_of(pair[1]))
        assert shares_bytes(*pair) == want, [(p.shape, p.stride(), p.storage_offset(),
                                              p.dtype) for p in pair]
        assert shares_bytes(pair[1], pair[0]) == want
        met += want
        interleaved += not want and _spans_meet(*pair)
    assert met > 100 and interleaved > 50, "the draw covers overlap and interleaved extents"


def _spans_meet(a, b):
    ends = [(t.data_ptr(), t.data_ptr() + t.element_size() * (1 + sum(
        (n - 1) * s for n, s in zip(t.shape, t.stride())))) for t in (a, b)]
    return ends[0][0] < ends[1][1] and ends[1][0] < ends[0][1]
