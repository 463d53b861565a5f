"""Layouts: shapes, the address function against direct indexing, converters, int64 offsets."""
import pytest
import torch

import pagedattn as pa
from pagedattn import layouts as L
from attn_utils import dense_get


@pytest.mark.parametrize("layout", L.LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float8_e5m2])
def test_address_function_matches_indexing(layout, dtype):
    n, bs, h, d = 5, 8, 3, 32
    k, v = pa.make_kv_cache(n, bs, h, d, layout=layout, dtype=dtype)
    if k.element_size() == 1:
        k.view(torch.uint8).copy_(torch.randint(0, 120, k.shape, dtype=torch.uint8))
    else:
        k.copy_(torch.arange(k.numel()).view(k.shape).to(dtype))
    g = L.cache_geometry(k, layout)
    assert g == (n, bs, h, d, d) and L.v_geometry(v, layout) == g
    ks = L.k_strides(k, layout)
    flat = k.reshape(-1)
    for blk, off in [(0, 0), (3, 5), (4, 7)]:
        want = dense_get(k, layout, "k", blk, off)
        hh = torch.arange(h).view(-1, 1)
        dd = torch.arange(d).view(1, -1)
        got = flat[L.element_offset(ks, blk, off, hh, dd)]
        assert torch.equal(got.view(torch.uint8), want.contiguous().view(torch.uint8))


@pytest.mark.parametrize("layout", L.LAYOUTS)
def test_gather_of_noncontiguous_view(layout):
    k, v = pa.make_kv_cache(6, 4, 2, 16, layout=layout, dtype=torch.float32)
    big_k = torch.randn((k.shape[0], k.shape[1] + 1) + tuple(k.shape[2:]))
    big_v = torch.randn((v.shape[0], v.shape[1] + 1) + tuple(v.shape[2:]))
    kv, vv = big_k[:, : k.shape[1]], big_v[:, : v.shape[1]]
    table = torch.tensor([5, 2, 3], dtype=torch.int32)
    gk, gv = L.gather_kv(kv, vv, table, 10, layout)
    for t in range(10):
        blk, off = int(table[t // 4]), t % 4
        assert torch.equal(gk[t], dense_get(kv, layout, "k", blk, off))
        assert torch.equal(gv[t], dense_get(vv, layout, "v", blk, off))


def test_offsets_are_int64_past_2_31():
    """Block 140,000 x stride 16,384 elements = 2.29e9 > 2^31: the offset must not wrap."""
    s = L.KVStrides(block=16 * 8 * 128, token=128, head=16 * 128, dim_hi=0, dim_lo=1, x=128)
    blk = torch.tensor([139_999], dtype=torch.int32)
    off = L.element_offset(s, blk, torch.tensor([15], dtype=torch.int32), 7, 127)
    want = 139_999 * 16_384 + 15 * 128 + 7 * 2048 + 127
    assert want > 2 ** 31 and off.dtype == torch.int64 and int(off) == want


def test_vllm_x_and_shapes():
    assert L.vllm_x(torch.float16) == 8 and L.vllm_x(torch.float8_e4m3fn) == 16
    ks, vs = L.kv_cache_shapes(3, 16, 2, 128, "vllm", torch.bfloat16)
    assert ks == (3, 2, 16, 16, 8) and vs == (3, 2, 128, 16)
    with pytest.raises(ValueError, match="layout"):
        L.kv_cache_shapes(3, 16, 2, 128, "nope", torch.float16)


def test_kv_indices_round_trip_with_pages():
    table = torch.tensor([[3, 1, 0], [2, 0, 0]], dtype=torch.int32)
    lens = torch.tensor([6, 3], dtype=torch.int32)
    indptr, idx = L.block_table_to_kv_indices(table, lens, 4)
    assert indptr.tolist() == [0, 6, 9]
    assert idx.tolist() == [12, 13, 14, 15, 4, 5, 8, 9, 10]
    t1, l1 = L.kv_indices_to_block_table(indptr, idx)
    assert l1.tolist() == [6, 3] and t1[0, :6].tolist() == idx[:6].tolist()


def test_public_ops_torch_backend_out_and_lse():
    gen = torch.Generator().manual_seed(0)
    k, v = pa.make_kv_cache(8, 4, 2, 64, dtype=torch.float32)
    k.copy_(torch.randn(k.shape, generator=gen)); v.copy_(torch.randn(v.shape, generator=gen))
    q = torch.randn(2, 4, 64, generator=gen)
    table = torch.tensor([[1, 2, 3], [4, 5, 0]], dtype=torch.int32)
    lens = torch.tensor([9, 0], dtype=torch.int32)
    out = torch.full_like(q, float("nan"))
    o2, lse = pa.paged_decode(q, k, v, table, lens, backend="torch", out=out, return_lse=True)
    assert o2 is out and torch.all(out[1] == 0) and torch.all(torch.isneginf(lse[1]))
    o3 = pa.paged_decode(q, k, v, table, lens, backend="torch")
    assert torch.equal(o3, out)
