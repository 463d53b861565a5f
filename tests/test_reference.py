"""The float32/float64 reference (pagedattn.reference) against the independent dense oracle."""
import random

import pytest
import torch

import pagedattn as pa
from pagedattn import reference as R
from attn_utils import (FP8, assert_attn_close, assert_lse_close, dense_attention, dense_kv,
                        make_paged_batch)

LAYOUTS = ["bhsd", "bshd", "vllm", "hcu"]
HEADS = [(4, 4), (8, 2), (5, 1)]  # MHA, GQA 4, MQA with an odd group


def _opts(rng, hq):
    kind = rng.choice(["plain", "window", "cap", "alibi", "sinks", "all"])
    o = {}
    if kind in ("window", "all"):
        o["sliding_window"] = rng.choice([1, 3, 17])
    if kind in ("cap", "all"):
        o["logit_cap"] = rng.choice([0.5, 5.0])
    if kind in ("alibi", "all"):
        o["alibi_slopes"] = torch.rand(hq) * 0.5
    if kind in ("sinks", "all"):
        o["sinks"] = torch.randn(hq) * 2
    return o


def _dense_opts(o):
    return dict(window=o.get("sliding_window"), cap=o.get("logit_cap"),
                alibi=o.get("alibi_slopes"), sinks=o.get("sinks"))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("seed", range(6))
def test_decode_reference_matches_dense(layout, seed):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    hq, hkv = rng.choice(HEADS)
    bs = rng.choice([1, 4, 16])
    d = rng.choice([64, 80]) if layout != "vllm" else 64
    lens = [rng.choice([0, 1, bs, 2 * bs, 2 * bs + 1, rng.randint(1, 60)]) for _ in range(3)]
    q_len = rng.choice([1, 1, 3])
    lens = [max(x, q_len) if x else 0 for x in lens] if q_len > 1 else lens
    dtype = rng.choice([torch.float32, torch.float64])
    b = make_paged_batch(lens, num_kv_heads=hkv, head_dim=d, block_size=bs, layout=layout,
                         dtype=dtype, device="cpu", gen=gen, exact_capacity=rng.random() < 0.5)
    q = torch.randn(len(lens), q_len, hq, d, generator=gen, dtype=dtype)
    o = _opts(rng, hq)
    out, lse = R.paged_decode(q, b.k_cache, b.v_cache, b.block_table, b.seq_lens, layout=layout,
                              return_lse=True, compute_dtype=torch.float64, **o)
    for i, n in enumerate(lens):
        if n == 0:
            assert torch.all(out[i] == 0) and torch.all(torch.isneginf(lse[i]))
            continue
        k, v = dense_kv(b, i, n)
        ro, rl = dense_attention(q[i], k, v, range(n - q_len, n), scale=d ** -0.5,
                                 **_dense_opts(o))
        torch.testing.assert_close(out[i].double(), ro, atol=1e-5 if dtype == torch.float32
                                   else 1e-12, rtol=1e-5 if dtype == torch.float32 else 1e-12)
        assert_lse_close(lse[i], rl, torch.float32)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("new_from", ["cache", "k_new"])
def test_extend_reference_matches_dense(layout, seed, new_from):
    rng = random.Random(100 + seed)
    gen = torch.Generator().manual_seed(100 + seed)
    hq, hkv = rng.choice(HEADS)
    bs = rng.choice([1, 4, 16])
    d = 64
    prefixes = [0, rng.randint(1, 20), bs, rng.randint(0, 40)]
    extends = [rng.randint(1, 9), 1, rng.randint(1, 12), 0]
    lens = [p + e for p, e in zip(prefixes, extends)]
    fill = prefixes if new_from == "k_new" else lens
    b = make_paged_batch(lens, num_kv_heads=hkv, head_dim=d, block_size=bs, layout=layout,
                         dtype=torch.float64, device="cpu", gen=gen, fill_upto=fill)
    t = sum(extends)
    cu = torch.tensor([0] + list(torch.cumsum(torch.tensor(extends), 0)), dtype=torch.int32)
    q = torch.randn(t, hq, d, generator=gen, dtype=torch.float64)
    kn = vn = None
    if new_from == "k_new":
        kn = torch.randn(t, hkv, d, generator=gen, dtype=torch.float64)
        vn = torch.randn(t, hkv, d, generator=gen, dtype=torch.float64)
    causal = rng.random() < 0.8
    o = _opts(rng, hq)
    out, lse = R.extend_attention(q, b.k_cache, b.v_cache, b.block_table, cu, b.seq_lens,
                                  layout=layout, causal=causal, k_new=kn, v_new=vn,
                                  return_lse=True, compute_dtype=torch.float64, **o)
    for i in range(len(lens)):
        q0, q1 = int(cu[i]), int(cu[i + 1])
        if q0 == q1:
            continue
        k, v = dense_kv(b, i, prefixes[i] if kn is not None else lens[i])
        if kn is not None:
            k, v = torch.cat([k, kn[q0:q1]]), torch.cat([v, vn[q0:q1]])
        ro, rl = dense_attention(q[q0:q1], k, v, range(prefixes[i], lens[i]), scale=d ** -0.5,
                                 causal=causal, **_dense_opts(o))
        torch.testing.assert_close(out[q0:q1], ro, atol=1e-12, rtol=1e-12)
        assert_lse_close(lse[q0:q1], rl, torch.float32)


def test_reference_matches_sdpa():
    """A second independent oracle: torch SDPA on the dense K/V with the shifted causal mask."""
    gen = torch.Generator().manual_seed(7)
    b = make_paged_batch([37], num_kv_heads=2, head_dim=64, block_size=8, layout="bshd",
                         dtype=torch.float64, device="cpu", gen=gen)
    q = torch.randn(5, 8, 64, generator=gen, dtype=torch.float64)
    cu = torch.tensor([0, 5], dtype=torch.int32)
    out = R.extend_attention(q, b.k_cache, b.v_cache, b.block_table, cu, b.seq_lens,
                             layout="bshd", compute_dtype=torch.float64)
    k, v = dense_kv(b, 0, 37)
    k, v = k.repeat_interleave(4, 1), v.repeat_interleave(4, 1)
    mask = torch.arange(37).view(1, -1) <= torch.arange(32, 37).view(-1, 1)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask)
    torch.testing.assert_close(out, ref.transpose(0, 1), atol=1e-12, rtol=1e-12)


def test_three_request_worked_example():
    """A worked extend batch: prefixes 4/0/5, extends 2/3/1, its kv_indices, as a block_size-1
    pool."""
    kv_indices = torch.tensor([108, 109, 110, 111, 42, 43, 201, 202, 203,
                               80, 81, 82, 83, 84, 99], dtype=torch.int32)
    kv_indptr = torch.tensor([0, 6, 9, 15], dtype=torch.int32)
    qo_indptr = torch.tensor([0, 2, 5, 6], dtype=torch.int32)
    table, seq_lens = pa.layouts.kv_indices_to_block_table(kv_indptr, kv_indices)
    assert seq_lens.tolist() == [6, 3, 6]
    assert (seq_lens - (qo_indptr[1:] - qo_indptr[:-1])).tolist() == [4, 0, 5]
    gen = torch.Generator().manual_seed(3)
    k_cache = torch.randn(256, 1, 2, 32, generator=gen, dtype=torch.float64)  # bshd, block 1
    v_cache = torch.randn(256, 1, 2, 32, generator=gen, dtype=torch.float64)
    q = torch.randn(6, 4, 32, generator=gen, dtype=torch.float64)
    out = R.extend_attention(q, k_cache, v_cache, table, qo_indptr, seq_lens, layout="bshd",
                             compute_dtype=torch.float64)
    # the public op (float32: the dtypes it takes) on every CPU backend gives the same rows
    for backend in ("torch", "triton"):
        got = pa.extend_attention(q.float(), k_cache.float(), v_cache.float(), table, qo_indptr,
                                  seq_lens, layout="bshd", backend=backend)
        assert_attn_close(got, out, torch.float32, what=f"backend {backend}")
    # request 0, query 0 (absolute position 4) sees slots 108..111 and 42 only
    slots = [108, 109, 110, 111, 42]
    ro, _ = dense_attention(q[0:1], k_cache[slots, 0], v_cache[slots, 0], [4], scale=32 ** -0.5)
    torch.testing.assert_close(out[0:1], ro, atol=1e-12, rtol=1e-12)
    # request 1 is a pure prefill: query 2 sees 201..203
    ro, _ = dense_attention(q[4:5], k_cache[[201, 202, 203], 0], v_cache[[201, 202, 203], 0], [2],
                            scale=32 ** -0.5)
    torch.testing.assert_close(out[4:5], ro, atol=1e-12, rtol=1e-12)
    # request 2: one query at position 5 sees all six slots
    s2 = [80, 81, 82, 83, 84, 99]
    ro, _ = dense_attention(q[5:6], k_cache[s2, 0], v_cache[s2, 0], [5], scale=32 ** -0.5)
    torch.testing.assert_close(out[5:6], ro, atol=1e-12, rtol=1e-12)
    indptr2, idx2 = pa.layouts.block_table_to_kv_indices(table, seq_lens, 1)
    assert torch.equal(indptr2, kv_indptr) and torch.equal(idx2, kv_indices)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, *FP8])
def test_store_kv_then_gather_round_trip(layout, dtype):
    gen = torch.Generator().manual_seed(11)
    kc, vc = pa.make_kv_cache(6, 4, 2, 32, layout=layout, dtype=dtype)
    kc.view(torch.uint8).fill_(0x7F) if dtype in FP8 else kc.fill_(float("nan"))
    k = torch.randn(7, 2, 32, generator=gen)
    v = torch.randn(7, 2, 32, generator=gen)
    src = torch.float32 if dtype in FP8 else dtype
    k, v = k.to(src), v.to(src)
    slots = torch.tensor([9, 10, 11, 12, 13, -1, 2])
    ks = vs = None
    if dtype in FP8:
        ks, vs = torch.tensor([0.37, 0.5]), 3.1
    R.store_kv(k, v, kc, vc, slots, layout=layout, k_scale=ks, v_scale=vs)
    table = torch.tensor([[2, 3, 0]], dtype=torch.int32)  # tokens 0..4 -> slots 9..13
    kk, vv = pa.layouts.gather_kv(kc, vc, table[0], 8, layout)
    want_k = R.quantize(k[:5], dtype, ks)
    assert torch.equal(kk[1:6].view(torch.uint8) if dtype in FP8 else kk[1:6],
                       want_k.view(torch.uint8) if dtype in FP8 else want_k)
    back = kk[1:6].float() * (ks.view(1, -1, 1) if ks is not None else 1)
    tol = 0.13 if dtype in FP8 else 1e-3
    assert (back - k[:5].float()).abs().max() <= tol * max(1.0, k.abs().max().item())


def test_copy_blocks_reference():
    kc = torch.randn(5, 2, 4, 8)
    vc = torch.randn(5, 2, 8, 4)
    k0, v0 = kc.clone(), vc.clone()
    R.copy_blocks([kc, vc], torch.tensor([[1, 3], [2, 4]]))
    assert torch.equal(kc[3], k0[1]) and torch.equal(kc[4], k0[2]) and torch.equal(vc[3], v0[1])
    assert torch.equal(kc[:3], k0[:3])


def test_harness_self_test():
    """The comparator's self-test: a zeroed, shifted or page-swapped output must fail it."""
    gen = torch.Generator().manual_seed(5)
    b = make_paged_batch([40], num_kv_heads=2, head_dim=64, block_size=8, layout="bhsd",
                         dtype=torch.float32, device="cpu", gen=gen)
    q = torch.randn(1, 1, 4, 64, generator=gen)
    out = R.paged_decode(q, b.k_cache, b.v_cache, b.block_table, b.seq_lens, layout="bhsd")
    k, v = dense_kv(b, 0, 40)
    ref, _ = dense_attention(q[0], k, v, [39], scale=0.125)
    assert_attn_close(out[0], ref, torch.float16)
    with pytest.raises(AssertionError):
        assert_attn_close(torch.zeros_like(out[0]), ref, torch.float16)
    shifted, _ = dense_attention(q[0], k[:-1], v[:-1], [38], scale=0.125)  # one key short
    with pytest.raises(AssertionError):
        assert_attn_close(shifted, ref, torch.float16)
    swapped = b.block_table.clone()
    swapped[0, [0, 1]] = swapped[0, [1, 0]]
    out2 = R.paged_decode(q, b.k_cache, b.v_cache, swapped, b.seq_lens, layout="bhsd")
    # a swapped page changes positions, not the set of keys: with a window it must differ
    o1 = R.paged_decode(q, b.k_cache, b.v_cache, b.block_table, b.seq_lens, layout="bhsd",
                        sliding_window=12)
    o2 = R.paged_decode(q, b.k_cache, b.v_cache, swapped, b.seq_lens, layout="bhsd",
                        sliding_window=30)
    with pytest.raises(AssertionError):
        assert_attn_close(o2[0], o1[0], torch.float16)
    del out2
    with pytest.raises(AssertionError):
        assert_attn_close(out[0] * float("nan"), ref, torch.float16)


@pytest.mark.parametrize("op", ["decode", "extend"])
def test_kv_scales_are_ignored_for_non_fp8_caches(op):
    """k_scale/v_scale dequantise fp8 caches only: on an fp32 cache every backend gives the
    unscaled result (the torch backend once multiplied by them: off by up to 2.2 at 0.37/3.1)."""
    gen = torch.Generator().manual_seed(21)
    lens = [9, 23]
    b = make_paged_batch(lens, num_kv_heads=2, head_dim=64, block_size=4, layout="bhsd",
                         dtype=torch.float32, device="cpu", gen=gen)
    if op == "decode":
        q = torch.randn(2, 4, 64, generator=gen)
        args = (q, b.k_cache, b.v_cache, b.block_table, b.seq_lens)
        fn, ref = pa.paged_decode, R.paged_decode(*args)
    else:
        q = torch.randn(5, 4, 64, generator=gen)
        cu = torch.tensor([0, 2, 5], dtype=torch.int32)
        args = (q, b.k_cache, b.v_cache, b.block_table, cu, b.seq_lens)
        fn, ref = pa.extend_attention, R.extend_attention(*args)
    for backend in ("torch", "triton"):
        out = fn(*args, k_scale=0.37, v_scale=3.1, backend=backend)
        assert_attn_close(out, ref, torch.float32, what=f"backend {backend}")


TORCH_UNVALIDATED = [
    # (op, block table, seq_lens, cu_seqlens_q or None, match)
    ("decode", [[-1, 2]], [3], None, "block id"),  # -1 would index the last block
    ("decode", [[1, 2]], [9], None, "capacity"),
    ("decode", [[1, 2]], [-1], None, "negative"),
    ("extend", [[1, 2]], [2], [0, 3], "negative prefix"),
    ("extend", [[1, 3]], [5], [0, 3], "block id"),
    ("extend", [[1, 2]], [5], [0, 2], "cu_seqlens_q"),
]


@pytest.mark.parametrize("case", TORCH_UNVALIDATED, ids=lambda c: f"{c[0]}-{c[4]}")
def test_torch_backend_checks_device_data_without_validation(case):
    """validate=False does not make the reference read out of place: it raises as validation."""
    op, table, lens, cu, match = case
    k, v = pa.make_kv_cache(3, 4, 1, 32, dtype=torch.float32)
    k.normal_(), v.normal_()
    table, lens = torch.tensor(table, dtype=torch.int32), torch.tensor(lens, dtype=torch.int32)
    with pytest.raises(ValueError, match=match):
        if op == "decode":
            pa.paged_decode(torch.randn(1, 2, 32), k, v, table, lens, backend="torch",
                            validate=False)
        else:
            pa.extend_attention(torch.randn(3, 2, 32), k, v, table,
                                torch.tensor(cu, dtype=torch.int32), lens, backend="torch",
                                validate=False, max_q_len=3)
