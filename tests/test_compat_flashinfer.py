"""pagedattn.compat.flashinfer against pagedattn's float32 reference on scattered pages.

FlashInfer's attention kernels are CUDA; there is no peer kernel to run on the CPU, so every
output is compared with pagedattn.reference over the same pages, addressed through the table
the test built (the page lists handed to the wrapper are derived from it, as an engine does).
Outputs are poisoned before each run.
"""
import pytest
import torch

from attn_utils import assert_attn_close, assert_lse_close, tol_key
from compat_batches import cumsum0, flashinfer_pages, i32, nan_like, paged
from pagedattn import reference as R
from pagedattn.compat import flashinfer as F
from pagedattn.compat._flashinfer_base import alibi_slopes

LAYOUT = {"NHD": "bshd", "HND": "bhsd"}
WS = torch.empty(0)  # the workspace only names the device

# (page_size, kv_layout, cache as a single tensor, dtype, num_qo_heads, num_kv_heads, kv lens):
# page 1 and 16, GQA/MQA/MHA, an empty request, a length one past a page boundary
DECODE_CASES = [
    (16, "NHD", False, torch.float16, 4, 2, [1, 37, 0, 16]),
    (1, "HND", True, torch.float32, 4, 1, [5, 23, 1]),
    (16, "HND", True, torch.float16, 2, 2, [17, 3]),
]


def _cache(batch, single):
    return torch.stack([batch.k_cache, batch.v_cache], 1) if single else \
        (batch.k_cache, batch.v_cache)


@pytest.mark.parametrize("ps,kv_layout,single,dtype,hq,hkv,lens", DECODE_CASES,
                         ids=lambda c: str(c) if not isinstance(c, list) else "lens")
def test_decode_against_reference(ps, kv_layout, single, dtype, hq, hkv, lens):
    gen = torch.Generator().manual_seed(ps + hq)
    w = F.BatchDecodeWithPagedKVCacheWrapper(WS, kv_layout)
    for _ in range(2):  # two batches through one wrapper: the second plan replaces the first
        b = paged(lens, page_size=ps, num_kv_heads=hkv, dtype=dtype, layout=LAYOUT[kv_layout],
                  gen=gen)
        w.plan(*flashinfer_pages(b), hq, hkv, 32, ps, q_data_type=dtype)
        q = torch.randn(len(lens), hq, 32, generator=gen).to(dtype)
        out, lse = nan_like(q), torch.full((len(lens), hq), float("nan"))
        got = w.run(q, _cache(b, single), out=out, lse=lse, return_lse=True)
        assert got[0] is out and got[1] is lse
        ref, ref_lse = R.paged_decode(q, b.k_cache, b.v_cache, b.block_table, b.seq_lens,
                                      layout=b.layout, return_lse=True)
        assert_attn_close(out, ref, dtype)
        assert_lse_close(lse, ref_lse * F.LOG2E, dtype)  # FlashInfer's LSE is base 2


def test_decode_one_plan_serves_every_layer():
    gen = torch.Generator().manual_seed(1)
    b = paged([9, 40], page_size=16, gen=gen)
    w = F.BatchDecodeWithPagedKVCacheWrapper(WS, "NHD")
    w.plan(*flashinfer_pages(b), 4, 2, 32, 16)
    for scale in (1.0, -2.5):  # another layer: other values in the same pages
        k, v = b.k_cache * scale, b.v_cache + scale
        q = torch.randn(2, 4, 32, generator=gen).half()
        ref = R.paged_decode(q, k, v, b.block_table, b.seq_lens, layout="bshd")
        assert_attn_close(w.run(q, (k, v)), ref, torch.float16)


def test_decode_options_match_the_reference():
    """window_left, soft cap, sinks, sm_scale and FlashInfer's q/k/v scale folding."""
    gen = torch.Generator().manual_seed(2)
    b = paged([30, 7, 19], page_size=16, gen=gen, layout="bhsd")
    w = F.BatchDecodeWithPagedKVCacheWrapper(WS, "HND")
    w.plan(*flashinfer_pages(b), 4, 2, 32, 16, window_left=8, logits_soft_cap=2.0,
           sm_scale=0.3, q_data_type=torch.float16)
    q = torch.randn(3, 4, 32, generator=gen).half()
    sinks = torch.randn(4, generator=gen)
    out = w.run(q, (b.k_cache, b.v_cache), sinks=sinks, q_scale=1.5, k_scale=0.5, v_scale=2.0)
    ref = R.paged_decode(q, b.k_cache, b.v_cache, b.block_table, b.seq_lens, layout="bhsd",
                         scale=0.3 * 1.5 * 0.5, sliding_window=9, logit_cap=2.0, sinks=sinks)
    assert_attn_close(out, ref.float() * 2.0, torch.float16)
    plain = w.run(q, (b.k_cache, b.v_cache))  # the same plan without sinks or scales
    ref = R.paged_decode(q, b.k_cache, b.v_cache, b.block_table, b.seq_lens, layout="bhsd",
                         scale=0.3, sliding_window=9, logit_cap=2.0)
    assert_attn_close(plain, ref, torch.float16)


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2],
                         ids=["e4m3", "e5m2"])
def test_decode_fp8_cache_with_run_scales(fp8):
    gen = torch.Generator().manual_seed(3)
    b = paged([33, 4], page_size=16, dtype=fp8, gen=gen, kv_scales=(0.37, 3.1))
    w = F.BatchDecodeWithPagedKVCacheWrapper(WS, "NHD")
    w.plan(*flashinfer_pages(b), 4, 2, 32, 16, q_data_type=torch.float16, kv_data_type=fp8)
    q = torch.randn(2, 4, 32, generator=gen).half()
    out = w.run(q, (b.k_cache, b.v_cache), k_scale=0.37, v_scale=3.1)
    ref = R.paged_decode(q, b.k_cache, b.v_cache, b.block_table, b.seq_lens, layout="bshd",
                         k_scale=0.37, v_scale=3.1)
    assert_attn_close(out, ref, tol_key(torch.float16, fp8))


def test_decode_speculative_rows_and_alibi():
    gen = torch.Generator().manual_seed(4)
    b = paged([12, 40], page_size=16, gen=gen)
    w = F.BatchDecodeWithPagedKVCacheWrapper(WS, "NHD")
    w.plan(*flashinfer_pages(b), 4, 2, 32, 16, q_len_per_req=3, pos_encoding_mode="ALIBI")
    q = torch.randn(6, 4, 32, generator=gen).half()
    out = w.run(q, (b.k_cache, b.v_cache))
    ref = R.paged_decode(q.view(2, 3, 4, 32), b.k_cache, b.v_cache, b.block_table, b.seq_lens,
                         layout="bshd", alibi_slopes=alibi_slopes(4, "cpu"))
    assert_attn_close(out, ref.view(6, 4, 32), torch.float16)


def test_alibi_slopes_follow_flashinfer():
    assert alibi_slopes(8, "cpu").tolist() == [2.0 ** -i for i in range(1, 9)]
    # 12 heads: the first 8 as for 8, then 2^(-4 (2k - 1) / 8) for k = 1..4
    want = [2.0 ** -i for i in range(1, 9)] + [2.0 ** (-0.5 * (2 * k - 1)) for k in range(1, 5)]
    assert torch.allclose(alibi_slopes(12, "cpu"), torch.tensor(want))


def _packbits(mask, sizes):
    """flashinfer.segment_packbits: each request's bits from a fresh byte, little bit order."""
    out, start = [], 0
    for n in sizes:
        bits = mask[start:start + n].to(torch.int64)
        bits = torch.cat([bits, bits.new_zeros((-n) % 8)]).view(-1, 8)
        out.append((bits << torch.arange(8)).sum(1))
        start += n
    return torch.cat(out).to(torch.uint8)


@pytest.mark.parametrize("ps,kv_layout,mask", [(16, "NHD", None), (1, "HND", "packed"),
                                               (16, "NHD", "bool")])
def test_prefill_against_reference(ps, kv_layout, mask):
    gen = torch.Generator().manual_seed(5 + ps)
    q_lens, kv_lens = [3, 1, 6], [5, 1, 20]  # prefixes 2, 0, 14
    b = paged(kv_lens, page_size=ps, layout=LAYOUT[kv_layout], gen=gen)
    cu = cumsum0(q_lens)
    sizes = [a * c for a, c in zip(q_lens, kv_lens)]
    flat = torch.rand(sum(sizes), generator=gen) > 0.4
    kw = {} if mask is None else ({"custom_mask": flat} if mask == "bool" else
                                  {"packed_custom_mask": _packbits(flat, sizes)})
    w = F.BatchPrefillWithPagedKVCacheWrapper(WS, kv_layout)
    w.plan(cu, *flashinfer_pages(b), 4, 2, 32, ps, causal=True, q_data_type=torch.float16,
           **kw)
    q = torch.randn(10, 4, 32, generator=gen).half()
    out, lse = w.run(q, (b.k_cache, b.v_cache), return_lse=True, lse_base="ln",
                     lse_layout="HN")
    mkw = {} if mask is None else {"custom_mask": flat, "mask_indptr": cumsum0(sizes)}
    ref, ref_lse = R.extend_attention(q, b.k_cache, b.v_cache, b.block_table, cu, b.seq_lens,
                                      layout=b.layout, return_lse=True, **mkw)
    assert_attn_close(out, ref, torch.float16)
    assert_lse_close(lse, ref_lse.t(), torch.float16)


def test_prefill_window_override_and_scales():
    gen = torch.Generator().manual_seed(6)
    b = paged([9, 30], page_size=16, gen=gen)
    cu = cumsum0([4, 5])
    w = F.BatchPrefillWithPagedKVCacheWrapper(WS, "NHD")
    w.plan(cu, *flashinfer_pages(b), 4, 2, 32, 16, causal=True, window_left=20)
    q = torch.randn(9, 4, 32, generator=gen).half()
    out = w.run(q, (b.k_cache, b.v_cache), window_left=3, k_scale=0.5, v_scale=3.0)
    ref = R.extend_attention(q, b.k_cache, b.v_cache, b.block_table, cu, b.seq_lens,
                             layout="bshd", sliding_window=4, scale=32 ** -0.5 * 0.5)
    assert_attn_close(out, ref.float() * 3.0, torch.float16)


def test_graph_mode_keeps_metadata_addresses_across_plans():
    """A run captured after one plan must read the next plan's metadata: the buffers stay put."""
    gen = torch.Generator().manual_seed(7)
    bufs = dict(paged_kv_indptr_buffer=torch.empty(3, dtype=torch.int32),
                paged_kv_indices_buffer=torch.empty(16, dtype=torch.int32),
                paged_kv_last_page_len_buffer=torch.empty(2, dtype=torch.int32))
    w = F.BatchDecodeWithPagedKVCacheWrapper(WS, "NHD", use_cuda_graph=True, **bufs)
    ptrs = set()
    for lens in ([3, 40], [70, 1]):
        b = paged(lens, page_size=16, gen=gen)
        w.plan(*flashinfer_pages(b), 4, 2, 32, 16)
        ptrs.add((w._table_buf.data_ptr(), w._lens_buf.data_ptr(),
                  w._plan.plain.block_table.data_ptr(), w._plan.plain.seq_lens.data_ptr()))
        q = torch.randn(2, 4, 32, generator=gen).half()
        ref = R.paged_decode(q, b.k_cache, b.v_cache, b.block_table, b.seq_lens, layout="bshd")
        assert_attn_close(w.run(q, (b.k_cache, b.v_cache)), ref, torch.float16)
    assert len(ptrs) == 1 and w._table_buf.shape == (2, 16)  # len(indices buffer) wide
    with pytest.raises(ValueError, match="batch size"):
        w.plan(i32([0, 1]), i32([1]), i32([3]), 4, 2, 32, 16)


def test_graph_mode_with_caller_block_tables_keeps_their_width():
    gen = torch.Generator().manual_seed(8)
    bufs = dict(paged_kv_indptr_buffer=torch.empty(3, dtype=torch.int32),
                paged_kv_indices_buffer=torch.empty(4096, dtype=torch.int32),
                paged_kv_last_page_len_buffer=torch.empty(2, dtype=torch.int32))
    w = F.BatchDecodeWithPagedKVCacheWrapper(WS, "NHD", use_cuda_graph=True, **bufs)
    b = paged([20, 64], page_size=16, gen=gen)  # 2 and 4 pages; the table has slack columns
    w.plan(*flashinfer_pages(b), 4, 2, 32, 16, block_tables=b.block_table,
           seq_lens=b.seq_lens)
    assert w._table_buf.shape == (2, b.block_table.shape[1])
    q = torch.randn(2, 4, 32, generator=gen).half()
    ref = R.paged_decode(q, b.k_cache, b.v_cache, b.block_table, b.seq_lens, layout="bshd")
    assert_attn_close(w.run(q, (b.k_cache, b.v_cache)), ref, torch.float16)
    wide = torch.ones(2, b.block_table.shape[1] + 4, dtype=torch.int32)
    with pytest.raises(ValueError, match="block_tables"):
        w.plan(i32([0, 1, 2]), i32([1, 1]), i32([3, 3]), 4, 2, 32, 16, block_tables=wide,
               seq_lens=i32([16 * wide.shape[1]] * 2))


def test_plan_rejects_bad_page_lists_and_run_checks_the_cache():
    w = F.BatchDecodeWithPagedKVCacheWrapper(WS, "NHD")
    with pytest.raises(RuntimeError, match="plan"):
        w.run(torch.randn(1, 4, 32).half(), torch.randn(4, 2, 16, 2, 32).half())
    good = (i32([0, 2, 3]), i32([1, 2, 3]), i32([5, 16]))
    with pytest.raises(ValueError, match="last_page_len"):
        w.plan(good[0], good[1], i32([0, 16]), 4, 2, 32, 16)
    with pytest.raises(ValueError, match="last_page_len"):
        w.plan(i32([0, 2, 2]), good[1], i32([5, 3]), 4, 2, 32, 16)  # no pages, length 3
    with pytest.raises(ValueError, match="indptr"):
        w.plan(i32([0, 3, 2]), good[1], good[2], 4, 2, 32, 16)
    with pytest.raises(ValueError, match="negative page id"):
        w.plan(good[0], i32([1, -2, 3]), good[2], 4, 2, 32, 16)
    with pytest.raises(ValueError, match="num_q_heads"):
        w.plan(*good, 3, 2, 32, 16)
    w.plan(*good, 4, 2, 32, 16)
    with pytest.raises(ValueError, match="page id 3"):  # 3 pages: ids 0..2
        w.run(torch.randn(2, 4, 32).half(), torch.randn(3, 2, 16, 2, 32).half())
    with pytest.raises(ValueError, match="q"):
        w.run(torch.randn(3, 4, 32).half(), torch.randn(4, 2, 16, 2, 32).half())
    with pytest.raises(ValueError, match="paged_kv_cache"):  # HND-shaped cache for NHD
        w.run(torch.randn(2, 4, 32).half(), torch.randn(4, 2, 2, 16, 32).half())
