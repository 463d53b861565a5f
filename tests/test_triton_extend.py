"""Triton extend (prefix-prefill) attention vs the float64 dense oracle: the grid, masks and
options, and 64-bit offsets.

On the CPU the kernel runs under TRITON_INTERPRET=1: tiny shapes, about 40 launches. Every case
poisons the cache (NaN outside the used tokens, NaN in the new positions when k_new is used) and
the table slack (-1, num_blocks + 7), so an out-of-range read shows up as NaN. bf16 runs on the
GPU only: the interpreter's bf16 tl.dot multiplies raw bit patterns.
"""
import random

import pytest
import torch

import pagedattn as pa
from attn_utils import (FP8, assert_attn_close, assert_lse_close, dense_attention, dense_kv,
                        make_paged_batch, tol_key)

LAYOUTS = ["bhsd", "bshd", "vllm", "hcu"]
HEADS = [(4, 4), (8, 2), (5, 1)]  # MHA, GQA group 4, MQA with a group that is not a power of 2
BLOCK_SIZES = [1, 4, 16]  # SGLang's token pool, a page smaller than a tile, a page = the tile
HAS_GPU = torch.cuda.is_available()
BF16_SKIP = pytest.mark.skipif(not HAS_GPU, reason="the Triton interpreter's bf16 tl.dot "
                               "multiplies raw bit patterns: bf16 is checked on the GPU only")


def _cu(extends, device):
    c = [0]
    for e in extends:
        c.append(c[-1] + e)
    return torch.tensor(c, dtype=torch.int32, device=device)


def _custom_mask(gen, extends, lens, device):
    """Random tree-like masks; row 0 of request 0 is all False (an empty row: out 0, lse -inf)."""
    blocks = []
    for b, (lq, lk) in enumerate(zip(extends, lens)):
        m = torch.rand(lq, lk, generator=gen) < 0.6
        if b == 0 and lq:
            m[0] = False
        blocks.append(m.reshape(-1))
    flat = torch.cat(blocks).to(device)
    indptr = _cu([e * n for e, n in zip(extends, lens)], device)
    return flat, indptr, blocks


def run_case(device, *, layout="bhsd", dtype=torch.float16, kv_dtype=None, heads=(4, 4), d=64,
             bs=4, prefixes=(5, 0), extends=(3, 6), new_from="cache", causal=True, opts=None,
             custom=False, use_out=False, max_q_len=None, seed=0, contiguous=True, check=True):
    """Build a poisoned paged batch, run the Triton kernel, compare every request with the oracle."""
    gen = torch.Generator().manual_seed(seed)
    hq, hkv = heads
    kv_dtype = kv_dtype or dtype
    lens = [p + e for p, e in zip(prefixes, extends)]
    b = make_paged_batch(lens, num_kv_heads=hkv, head_dim=d, block_size=bs, layout=layout,
                         dtype=kv_dtype, device=device, gen=gen, exact_capacity=seed % 2 == 0,
                         fill_upto=list(prefixes) if new_from == "k_new" else lens,
                         contiguous=contiguous)
    t = sum(extends)
    cu = _cu(extends, device)
    q = torch.randn(t, hq, d, generator=gen).to(dtype).to(device)
    kn = vn = None
    if new_from == "k_new":
        kn = torch.randn(t, hkv, d, generator=gen).to(dtype).to(device)
        vn = torch.randn(t, hkv, d, generator=gen).to(dtype).to(device)
    opts = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in (opts or {}).items()}
    mask = indptr = blocks = None
    if custom:
        mask, indptr, blocks = _custom_mask(gen, extends, lens, device)
    out = torch.full_like(q, float("nan")) if use_out else None
    res, lse = pa.extend_attention(q, b.k_cache, b.v_cache, b.block_table, cu, b.seq_lens,
                                   layout=layout, causal=causal, k_new=kn, v_new=vn,
                                   custom_mask=mask, mask_indptr=indptr, max_q_len=max_q_len,
                                   k_scale=b.k_scale, v_scale=b.v_scale, backend="triton",
                                   out=out, return_lse=True, **opts)
    if use_out:
        assert res.data_ptr() == out.data_ptr()
    if not check:
        return res, lse
    key = tol_key(dtype, kv_dtype)
    for i, (p, e, n) in enumerate(zip(prefixes, extends, lens)):
        q0, q1 = int(cu[i]), int(cu[i + 1])
        if e == 0:
            continue
        k, v = dense_kv(b, i, p if kn is not None else n)
        k, v = k.to(device), v.to(device)
        if kn is not None:
            k, v = torch.cat([k, kn[q0:q1].double()]), torch.cat([v, vn[q0:q1].double()])
        ro, rl = dense_attention(
            q[q0:q1], k, v, range(p, n), scale=opts.get("scale", d ** -0.5), causal=causal,
            window=opts.get("sliding_window"), cap=opts.get("logit_cap"),
            alibi=opts.get("alibi_slopes"), sinks=opts.get("sinks"),
            mask=blocks[i].view(e, n).to(device) if custom else None)
        assert_attn_close(res[q0:q1], ro, key, what=f"out of request {i}",
                          magnitude_guard=key != "fp8")
        assert_lse_close(lse[q0:q1], rl, key)
    return res, lse


# ----------------------------------------------------------------------------------------------
# the differential grid (CPU: interpreter)
# ----------------------------------------------------------------------------------------------

# Each case covers one layout x dtype and rotates heads, block size, the source of the new keys,
# and a batch with: a prefix that is not a multiple of the page, a pure prefill (prefix 0), a
# decode-like request (Lq 1) and a request with Lq 0.
GRID = [(layout, dtype, i) for i, (layout, dtype) in enumerate(
    [(lay, dt) for dt in (torch.float16, torch.float32) for lay in LAYOUTS])]


@pytest.mark.parametrize("layout,dtype,i", GRID, ids=[f"{l}-{str(d)[6:]}" for l, d, _ in GRID])
def test_extend_grid(device, layout, dtype, i):
    rng = random.Random(i)
    bs = BLOCK_SIZES[i % 3]
    prefixes = [bs + 1 + rng.randint(0, 2 * bs), 0, rng.randint(1, 20), 7]
    extends = [rng.randint(2, 9), rng.randint(10, 20), 1, 0]
    run_case(device, layout=layout, dtype=dtype, heads=HEADS[i % 3], bs=bs, prefixes=prefixes,
             extends=extends, new_from="k_new" if i % 2 else "cache", seed=i,
             use_out=i % 4 == 1, max_q_len=max(extends) if i % 4 == 3 else None)


@pytest.mark.parametrize("kv_dtype,layout", [(FP8[0], "vllm"), (FP8[1], "bhsd")],
                         ids=["e4m3-vllm", "e5m2-bhsd"])
def test_extend_fp8_kv(device, kv_dtype, layout):
    """Scales 0.37 (K) and 3.1 (V): dropping or swapping either one fails the tolerance."""
    run_case(device, layout=layout, dtype=torch.float16, kv_dtype=kv_dtype, heads=(8, 2), bs=4,
             prefixes=[9, 0], extends=[5, 7], seed=3)


def test_extend_fp8_fp32_q_k_new(device):
    run_case(device, layout="hcu", dtype=torch.float32, kv_dtype=FP8[0], heads=(5, 1), bs=16,
             prefixes=[21, 3], extends=[4, 2], new_from="k_new", seed=4)


def test_extend_head_dim_80(device):
    """head_dim padded to 128 inside the kernel: the masked lanes are never read."""
    run_case(device, layout="bshd", dtype=torch.float16, heads=(8, 2), d=80, bs=4,
             prefixes=[6, 0], extends=[3, 5], seed=5)


def test_extend_noncontiguous_cache_and_fused_q(device):
    gen = torch.Generator().manual_seed(6)
    run_case(device, layout="bhsd", dtype=torch.float32, heads=(4, 4), bs=4, prefixes=[5],
             extends=[3], contiguous=False, seed=6)
    # q as a slice of a fused qkv buffer: stride(0) = (Hq + 2 Hkv) * D
    b = make_paged_batch([8], num_kv_heads=2, head_dim=64, block_size=4, layout="bshd",
                         dtype=torch.float32, device=device, gen=gen)
    qkv = torch.randn(3, 8 + 4, 64, generator=gen).to(device)
    q = qkv[:, :8]
    out = pa.extend_attention(q, b.k_cache, b.v_cache, b.block_table, _cu([3], device),
                              b.seq_lens, layout="bshd", backend="triton")
    k, v = dense_kv(b, 0, 8)
    ro, _ = dense_attention(q, k.to(device), v.to(device), range(5, 8), scale=64 ** -0.5)
    assert_attn_close(out, ro, torch.float32)


@pytest.mark.parametrize("kind", ["window", "cap", "alibi", "sinks", "all"])
def test_extend_options(device, kind):
    hq = 8
    o = {}
    if kind in ("window", "all"):
        o["sliding_window"] = 3 if kind == "window" else 17
    if kind in ("cap", "all"):
        o["logit_cap"] = 0.5 if kind == "cap" else 5.0
    if kind in ("alibi", "all"):
        o["alibi_slopes"] = torch.rand(hq, generator=torch.Generator().manual_seed(1)) * 0.5
    if kind in ("sinks", "all"):
        o["sinks"] = torch.randn(hq, generator=torch.Generator().manual_seed(2)) * 2
    # prefix 40 with window 3: whole prefix tiles lie outside the window and are skipped
    run_case(device, layout="bshd", dtype=torch.float32, heads=(hq, 2), bs=4,
             prefixes=[40, 0], extends=[5, 19], opts=o, seed=7,
             new_from="k_new" if kind == "all" else "cache")


@pytest.mark.parametrize("new_from", ["cache", "k_new"])
def test_extend_not_causal(device, new_from):
    run_case(device, layout="vllm", dtype=torch.float16, heads=(8, 2), bs=4, prefixes=[6, 0],
             extends=[5, 18], causal=False, new_from=new_from, seed=8)


def test_extend_custom_mask_with_empty_row(device):
    """SGLang's tree mask (mask_indptr form) replaces the causal rule; an all-False row gives
    out 0 and lse -inf exactly, never NaN."""
    res, lse = run_case(device, layout="bhsd", dtype=torch.float32, heads=(4, 4), bs=4,
                        prefixes=[5, 3], extends=[4, 2], custom=True, seed=9,
                        opts={"sliding_window": 6})
    assert torch.all(res[0] == 0) and torch.all(torch.isneginf(lse[0]))


# ----------------------------------------------------------------------------------------------
# equivalences
# ----------------------------------------------------------------------------------------------

def test_prefix_zero_is_dense_causal_attention(device):
    """Pure prefill: the shifted mask with P = 0 is plain causal attention (torch SDPA, fp64)."""
    gen = torch.Generator().manual_seed(10)
    b = make_paged_batch([21], num_kv_heads=2, head_dim=64, block_size=4, layout="bhsd",
                         dtype=torch.float32, device=device, gen=gen)
    q = torch.randn(21, 8, 64, generator=gen).to(device)
    out = pa.extend_attention(q, b.k_cache, b.v_cache, b.block_table, _cu([21], device),
                              b.seq_lens, backend="triton")
    k, v = (x.repeat_interleave(4, 1).transpose(0, 1) for x in dense_kv(b, 0, 21))
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.double().transpose(0, 1), k.to(device), v.to(device), is_causal=True).transpose(0, 1)
    assert_attn_close(out, ref, torch.float32)


def test_q_len_one_equals_decode(device):
    gen = torch.Generator().manual_seed(11)
    lens = [1, 17, 33]
    b = make_paged_batch(lens, num_kv_heads=1, head_dim=64, block_size=16, layout="vllm",
                         dtype=torch.float16, device=device, gen=gen)
    q = torch.randn(3, 5, 64, generator=gen).to(torch.float16).to(device)
    ext = pa.extend_attention(q, b.k_cache, b.v_cache, b.block_table, _cu([1, 1, 1], device),
                              b.seq_lens, layout="vllm", backend="triton", logit_cap=5.0)
    dec = pa.paged_decode(q, b.k_cache, b.v_cache, b.block_table, b.seq_lens, layout="vllm",
                          backend="torch", logit_cap=5.0)
    assert_attn_close(ext, dec, torch.float16)


def test_three_request_worked_example(device):
    """A worked extend batch: prefixes 4/0/5, extends 2/3/1 over its kv_indices (a block_size-1
    pool)."""
    kv_indices = torch.tensor([108, 109, 110, 111, 42, 43, 201, 202, 203,
                               80, 81, 82, 83, 84, 99], dtype=torch.int32)
    kv_indptr = torch.tensor([0, 6, 9, 15], dtype=torch.int32)
    table, seq_lens = pa.layouts.kv_indices_to_block_table(kv_indptr, kv_indices)
    gen = torch.Generator().manual_seed(3)
    kc = torch.full((256, 1, 2, 32), float("nan"))
    vc = torch.full((256, 1, 2, 32), float("nan"))
    kc[kv_indices.long()] = torch.randn(15, 1, 2, 32, generator=gen)
    vc[kv_indices.long()] = torch.randn(15, 1, 2, 32, generator=gen)
    q = torch.randn(6, 4, 32, generator=gen)
    qo = torch.tensor([0, 2, 5, 6], dtype=torch.int32)
    out = pa.extend_attention(q.to(device), kc.to(device), vc.to(device), table.to(device),
                              qo.to(device), seq_lens.to(device), layout="bshd", backend="triton")
    slots = [[108, 109, 110, 111, 42, 43], [201, 202, 203], [80, 81, 82, 83, 84, 99]]
    for r, (q0, q1) in enumerate([(0, 2), (2, 5), (5, 6)]):
        s = slots[r]
        ro, _ = dense_attention(q[q0:q1], kc[s, 0], vc[s, 0], range(len(s) - (q1 - q0), len(s)),
                                scale=32 ** -0.5)
        assert_attn_close(out[q0:q1], ro, torch.float32)


def test_chunked_prefill_equals_one_pass(device):
    """Chunked prefill: a 20-token prompt fed as chunks 5/8/7 (each chunk's K/V given as k_new, then
    appended to the cache with store_kv) equals one extend over the whole prompt."""
    gen = torch.Generator().manual_seed(12)
    hq, hkv, d, bs, n = 8, 2, 64, 4, 20
    q = torch.randn(n, hq, d, generator=gen).to(torch.float16).to(device)
    k = torch.randn(n, hkv, d, generator=gen).to(torch.float16).to(device)
    v = torch.randn(n, hkv, d, generator=gen).to(torch.float16).to(device)
    b = make_paged_batch([n], num_kv_heads=hkv, head_dim=d, block_size=bs, layout="hcu",
                         dtype=torch.float16, device=device, gen=gen, fill_upto=[0])
    one = pa.extend_attention(q, b.k_cache, b.v_cache, b.block_table, _cu([n], device),
                              b.seq_lens, layout="hcu", k_new=k, v_new=v, backend="triton")
    parts, start = [], 0
    for size in (5, 8, 7):
        end = start + size
        lens = torch.tensor([end], dtype=torch.int32, device=device)
        parts.append(pa.extend_attention(q[start:end], b.k_cache, b.v_cache, b.block_table,
                                         _cu([size], device), lens, layout="hcu",
                                         k_new=k[start:end], v_new=v[start:end],
                                         backend="triton"))
        pos = torch.arange(start, end, device=device)
        slots = b.block_table[0].long()[pos // bs] * bs + pos % bs
        pa.store_kv(k[start:end], v[start:end], b.k_cache, b.v_cache, slots, layout="hcu",
                    backend="torch")
        start = end
    assert_attn_close(torch.cat(parts), one, torch.float16, what="chunked vs one pass")
    ref, _ = dense_attention(q, k, v, range(n), scale=d ** -0.5)
    assert_attn_close(one, ref, torch.float16)


def test_harness_would_catch_a_zero_output(device):
    """Mutation check: the comparator used above rejects an all-zero output."""
    res, _ = run_case(device, layout="bshd", dtype=torch.float32, bs=4, prefixes=[3],
                      extends=[4], seed=13, check=False)
    with pytest.raises(AssertionError):
        assert_attn_close(torch.zeros_like(res), res, torch.float32)


def test_gluon_kernel_elsewhere_runs_the_triton_kernel(device, monkeypatch):
    """PAGEDATTN_DEV_EXTEND_KERNEL=gluon where the Gluon kernel cannot run (here: the CPU) runs
    the Triton kernel's one-pass loop, correctly."""
    from pagedattn.triton_kernels import _extend_loop as V
    monkeypatch.setenv("PAGEDATTN_DEV_EXTEND_KERNEL", "gluon")
    assert V.kernel() == "gluon"
    assert V.serves(has_mask=False, has_window=False, page=4)
    run_case(device, layout="bhsd", heads=(8, 2), bs=4, prefixes=[21, 0], extends=[9, 20],
             seed=71)
