"""The shapes today's model families use, on the Triton backend (the interpreter on the CPU) and
the torch backend, against the independent float64 oracle of attn_utils:

* head dims outside the power-of-2 list (1, 13, 24, 72, 120, 448, 512, 576);
* K and V of different widths: MLA's absorbed decode and extend (one latent KV head of 576
  columns, V its first 512, ``v_cache=None``; 16 and 128 query heads) and MLA-style prefill
  (K 192, V 128);
* block sizes that are not powers of 2 (5, 48, 528: hybrid models' pages) and 1;
* non-causal extend with more queries than keys (FlashInfer's rule).

Caches hold NaN wherever no valid token lives and outputs are poisoned before each call, so an
unwritten row or a read of a wrong slot fails.
"""
import pytest
import torch

import pagedattn as pa
from attn_utils import (assert_attn_close, assert_lse_close, dense_attention, dense_kv,
                        make_paged_batch, nan_tensor)
from pagedattn.triton_kernels import decode as D

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
GEN_SEED = 45
# (head_dim, layout): 1 and 13 are narrower than one 16-column tile; 24, 72 and 120 pad to the
# next power of 2; 448 pads to 512; 512 is a power of 2 past 256; 576 = 512 + a 64-column tail
HEAD_DIMS = [(1, "bhsd"), (13, "bshd"), (24, "hcu"), (72, "bshd"), (120, "vllm"),
             (448, "bhsd"), (512, "bshd"), (576, "bhsd")]
BACKENDS = ["triton", "torch"]


def _gen(i=0):
    return torch.Generator().manual_seed(GEN_SEED + i)


def _decode_ref(b, q, dv=None):
    """float64 oracle of each sequence's last query; dv: V = K's first dv columns (MLA)."""
    outs, lses = [], []
    hq, dq = q.shape[1], q.shape[2]
    for i, n in enumerate(b.seq_lens.tolist()):
        if n == 0:  # no key: out 0, lse -inf
            outs.append(torch.zeros(hq, dv or _v_width(b), dtype=torch.float64))
            lses.append(torch.full((hq,), float("-inf"), dtype=torch.float64))
            continue
        k, v = dense_kv(b, i, n)
        if dv is not None:
            v = k[..., :dv]
        o, lse = dense_attention(q[i:i + 1].cpu(), k.cpu(), v.cpu(), [n - 1], scale=dq ** -0.5)
        outs.append(o[0])
        lses.append(lse[0])
    return torch.stack(outs), torch.stack(lses)


def _v_width(b):
    return b.v_cache.shape[-1] if b.layout in ("bhsd", "bshd") else b.v_cache.shape[2]


def _poisoned(shape, dtype):
    return nan_tensor(shape, dtype, DEV)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("d,layout", HEAD_DIMS, ids=[f"D{d}-{lay}" for d, lay in HEAD_DIMS])
def test_decode_head_dims(d, layout, backend):
    dtype = torch.float32 if d >= 448 else torch.float16
    if layout == "vllm" and d % (16 // torch.empty((), dtype=dtype).element_size()):
        dtype = torch.float32
    b = make_paged_batch([0, 1, 37], num_kv_heads=2, head_dim=d, block_size=16, layout=layout,
                         dtype=dtype, device=DEV, gen=_gen(d))
    q = torch.randn(3, 4, d, generator=_gen(d + 1)).to(DEV, dtype)
    out = _poisoned((3, 4, d), dtype)
    _, lse = pa.paged_decode(q, b.k_cache, b.v_cache, b.block_table, b.seq_lens, layout=layout,
                             out=out, return_lse=True, backend=backend)
    ref, ref_lse = _decode_ref(b, q)
    assert_attn_close(out, ref, dtype)
    assert_lse_close(lse, ref_lse, dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("d,dv,layout", [(64, 24, "bhsd"), (24, 72, "hcu"), (32, 13, "vllm"),
                                         (192, 128, "bshd")])
def test_decode_v_width_differs(d, dv, layout, backend):
    b = make_paged_batch([5, 0, 33], num_kv_heads=2, head_dim=d, head_dim_v=dv, block_size=4,
                         layout=layout, dtype=torch.float32, device=DEV, gen=_gen(dv))
    q = torch.randn(3, 2, d, generator=_gen(dv + 1)).to(DEV)
    out = pa.paged_decode(q, b.k_cache, b.v_cache, b.block_table, b.seq_lens, layout=layout,
                          backend=backend, out=_poisoned((3, 2, dv), torch.float32))
    assert out.shape == (3, 2, dv)
    assert_attn_close(out, _decode_ref(b, q)[0], torch.float32)


def _mla_batch(lens, page, dtype=torch.float16, i=0, kv_scales=None):
    return make_paged_batch(lens, num_kv_heads=1, head_dim=576, block_size=page, layout="bshd",
                            dtype=dtype, device=DEV, gen=_gen(100 + i), kv_scales=kv_scales)


@pytest.mark.parametrize("hq", [16, 128])
@pytest.mark.parametrize("page", [1, 16, 64])
def test_mla_decode(hq, page):
    """DeepSeek's absorbed decode: q [B, Hq, 576] over one latent KV head; V = its first 512."""
    b = _mla_batch([0, 1, 70], page, i=page)
    q = torch.randn(3, hq, 576, generator=_gen(hq)).to(DEV, torch.float16)
    out = _poisoned((3, hq, 512), torch.float16)
    _, lse = pa.paged_decode(q, b.k_cache, None, b.block_table, b.seq_lens, layout="bshd",
                             head_dim_v=512, out=out, return_lse=True, backend="triton")
    ref, ref_lse = _decode_ref(b, q, dv=512)
    assert_attn_close(out, ref, torch.float16)
    assert_lse_close(lse, ref_lse, torch.float16)


@pytest.mark.parametrize("mode", ["split", "one_pass", "balance"])
def test_mla_decode_launch_shapes_bitwise(monkeypatch, mode):
    """Several row chunks per KV head (32 heads: 2 programs each) through every launch shape and
    the split combine (partitions of 16 tokens): the same bits as one pass."""
    b = _mla_batch([34, 3], 16, i=7)
    q = torch.randn(2, 32, 576, generator=_gen(7)).to(DEV, torch.float16)
    outs = []
    for m in ("one_pass", mode):
        monkeypatch.setattr(D, "FORCE_MODE", m)
        outs.append(pa.paged_decode(q, b.k_cache, None, b.block_table, b.seq_lens,
                                    layout="bshd", head_dim_v=512, partition_size=16,
                                    backend="triton"))
    assert torch.equal(outs[0], outs[1])
    assert_attn_close(outs[1], _decode_ref(b, q, dv=512)[0], torch.float16)


def test_mla_decode_fp8_cache():
    b = _mla_batch([40, 2], 16, dtype=torch.float8_e4m3fn, i=3, kv_scales=(0.5, 0.5))
    q = torch.randn(2, 16, 576, generator=_gen(3)).to(DEV, torch.float16)
    out = pa.paged_decode(q, b.k_cache, None, b.block_table, b.seq_lens, layout="bshd",
                          head_dim_v=512, k_scale=0.5, v_scale=0.5, backend="triton")
    assert_attn_close(out, _decode_ref(b, q, dv=512)[0], "fp8")


def test_mla_plan_run():
    b = _mla_batch([33, 0, 1], 16, i=4)
    plan = pa.plan_decode(b.block_table, b.seq_lens, num_q_heads=32, num_kv_heads=1,
                          head_dim=576, head_dim_v=512, block_size=16,
                          num_blocks=b.k_cache.shape[0], q_dtype=torch.float16, layout="bshd",
                          backend="triton")
    q = torch.randn(3, 32, 576, generator=_gen(4)).to(DEV, torch.float16)
    out = pa.run_decode(plan, q, b.k_cache, None, out=_poisoned((3, 32, 512), torch.float16))
    assert_attn_close(out, _decode_ref(b, q, dv=512)[0], torch.float16)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bs,layout", [(1, "bshd"), (5, "bhsd"), (48, "vllm"), (528, "hcu")])
def test_decode_block_sizes(bs, layout, backend):
    b = make_paged_batch([0, 1, 3 * bs + 2, bs], num_kv_heads=2, head_dim=64, block_size=bs,
                         layout=layout, dtype=torch.float16, device=DEV, gen=_gen(bs))
    q = torch.randn(4, 8, 64, generator=_gen(bs + 1)).to(DEV, torch.float16)
    out = pa.paged_decode(q, b.k_cache, b.v_cache, b.block_table, b.seq_lens, layout=layout,
                          backend=backend, out=_poisoned((4, 8, 64), torch.float16))
    assert_attn_close(out, _decode_ref(b, q)[0], torch.float16)


# ----------------------------------------------------------------------------------------------
# extend
# ----------------------------------------------------------------------------------------------

def _extend_ref(b, q, cu, causal=True, k_new=None, v_new=None, dv=None):
    outs, lses = [], []
    for i, lk in enumerate(b.seq_lens.tolist()):
        q0, q1 = int(cu[i]), int(cu[i + 1])
        lq = q1 - q0
        if lq == 0:
            continue
        if lk == 0:  # non-causal with no key: out 0, lse -inf
            w = dv or (v_new.shape[-1] if v_new is not None else _v_width(b))
            outs.append(torch.zeros(lq, q.shape[1], w, dtype=torch.float64))
            lses.append(torch.full((lq, q.shape[1]), float("-inf"), dtype=torch.float64))
            continue
        if k_new is None:
            k, v = dense_kv(b, i, lk)
        else:
            k, v = dense_kv(b, i, lk - lq)
            k = torch.cat([k, k_new[q0:q1].cpu().double()])
            v = torch.cat([v, v_new[q0:q1].cpu().double()])
        if dv is not None:
            v = k[..., :dv]
        o, lse = dense_attention(q[q0:q1].cpu(), k.cpu(), v.cpu(), torch.arange(lk - lq, lk),
                                 scale=q.shape[-1] ** -0.5, causal=causal)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


def _cu(lqs):
    out = [0]
    for n in lqs:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device=DEV)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("d,bs,layout", [(13, 5, "bshd"), (72, 48, "bhsd"), (448, 16, "hcu"),
                                         (24, 1, "vllm")])
def test_extend_head_dims_and_blocks(d, bs, layout, backend):
    lqs, lks = [3, 1, 0, 6], [10, 1, 4, 6]
    dtype = torch.float32
    b = make_paged_batch(lks, num_kv_heads=2, head_dim=d, block_size=bs, layout=layout,
                         dtype=dtype, device=DEV, gen=_gen(200 + d))
    cu = _cu(lqs)
    q = torch.randn(int(cu[-1]), 4, d, generator=_gen(201 + d)).to(DEV, dtype)
    out = _poisoned(q.shape, dtype)
    _, lse = pa.extend_attention(q, b.k_cache, b.v_cache, b.block_table, cu, b.seq_lens,
                                 layout=layout, out=out, return_lse=True, backend=backend)
    ref, ref_lse = _extend_ref(b, q, cu)
    assert_attn_close(out, ref, dtype)
    assert_lse_close(lse, ref_lse, dtype)


@pytest.mark.parametrize("page", [1, 16])
def test_mla_extend_absorbed(page):
    """Chunked prefill in the absorbed form: q [T, 16, 576] over the latent cache (new tokens
    written first), V = its first 512 columns."""
    lqs, lks = [4, 1], [20, 3]
    b = _mla_batch(lks, page, i=20 + page)
    cu = _cu(lqs)
    q = torch.randn(5, 16, 576, generator=_gen(20)).to(DEV, torch.float16)
    out = pa.extend_attention(q, b.k_cache, None, b.block_table, cu, b.seq_lens, layout="bshd",
                              head_dim_v=512, backend="triton",
                              out=_poisoned((5, 16, 512), torch.float16))
    assert_attn_close(out, _extend_ref(b, q, cu, dv=512)[0], torch.float16)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mla_prefill_192_128_with_k_new(backend):
    """MLA's MHA-style prefill: K 192 (128 nope + 64 rope), V 128; new K/V read directly."""
    lqs, lks = [5, 2], [12, 2]
    b = make_paged_batch([7, 0], num_kv_heads=4, head_dim=192, head_dim_v=128, block_size=16,
                         layout="bshd", dtype=torch.float32, device=DEV, gen=_gen(30),
                         exact_capacity=False)
    b.seq_lens = torch.tensor(lks, dtype=torch.int32, device=DEV)
    cu = _cu(lqs)
    q = torch.randn(7, 4, 192, generator=_gen(31)).to(DEV)
    kn = torch.randn(7, 4, 192, generator=_gen(32)).to(DEV)
    vn = torch.randn(7, 4, 128, generator=_gen(33)).to(DEV)
    out = pa.extend_attention(q, b.k_cache, b.v_cache, b.block_table, cu, b.seq_lens,
                              layout="bshd", k_new=kn, v_new=vn, backend=backend,
                              out=_poisoned((7, 4, 128), torch.float32))
    assert_attn_close(out, _extend_ref(b, q, cu, k_new=kn, v_new=vn)[0], torch.float32)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bs", [5, 16])  # 5: the two-stage loop; 16: the one-pass loop
def test_extend_noncausal_more_queries_than_keys(bs, backend):
    """causal=False: every query sees all Lk keys, Lq may exceed Lk (Lk 0: zero rows)."""
    lqs, lks = [9, 4, 3], [5, 0, 3]
    b = make_paged_batch(lks, num_kv_heads=2, head_dim=32, block_size=bs, layout="bhsd",
                         dtype=torch.float32, device=DEV, gen=_gen(40 + bs))
    cu = _cu(lqs)
    q = torch.randn(16, 4, 32, generator=_gen(41)).to(DEV)
    out = _poisoned(q.shape, torch.float32)
    _, lse = pa.extend_attention(q, b.k_cache, b.v_cache, b.block_table, cu, b.seq_lens,
                                 layout="bhsd", causal=False, out=out, return_lse=True,
                                 backend=backend)
    ref, ref_lse = _extend_ref(b, q, cu, causal=False)
    assert_attn_close(out, ref, torch.float32)
    assert_lse_close(lse, ref_lse, torch.float32)
    assert torch.equal(out[9:13], torch.zeros_like(out[9:13]))  # no keys: out 0, lse -inf


def test_causal_extend_still_refuses_more_queries_than_keys():
    b = make_paged_batch([3], num_kv_heads=1, head_dim=32, block_size=4, layout="bhsd",
                         dtype=torch.float32, device=DEV, gen=_gen(50))
    q = torch.randn(5, 1, 32).to(DEV)
    with pytest.raises(ValueError, match="query_len > seq_len"):
        pa.extend_attention(q, b.k_cache, b.v_cache, b.block_table, _cu([5]), b.seq_lens,
                            backend="torch")


# ----------------------------------------------------------------------------------------------
# store_kv, copy_blocks, guards, dispatch
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_store_kv_mla_and_v_width(backend):
    mc = pa.make_mla_cache(4, 5, dtype=torch.float16, device=DEV).fill_(3)
    k = torch.randn(3, 1, 576, generator=_gen(60)).to(DEV, torch.float16)
    pa.store_kv(k, None, mc, None, torch.tensor([1, 7, 19], device=DEV), layout="bshd",
                backend=backend)
    assert torch.equal(mc[0, 1, 0], k[0, 0]) and torch.equal(mc[1, 2, 0], k[1, 0])
    assert torch.equal(mc[3, 4, 0], k[2, 0]) and bool((mc[0, 0] == 3).all())
    kc, vc = pa.make_kv_cache(3, 5, 2, 24, layout="hcu", dtype=torch.float32, device=DEV,
                              head_dim_v=40)
    kc.fill_(3), vc.fill_(3)
    kv = torch.randn(2, 2, 24).to(DEV), torch.randn(2, 2, 40).to(DEV)
    pa.store_kv(*kv, kc, vc, torch.tensor([14, -1], device=DEV), layout="hcu", backend=backend)
    assert torch.equal(kc[2, :, 4], kv[0][0]) and torch.equal(vc[2, :, :, 4], kv[1][0])
    assert int((vc != 3).sum()) == 2 * 40
    with pytest.raises(ValueError, match="v, v_cache"):
        pa.store_kv(k, None, mc, mc, torch.tensor([0, 1, 2], device=DEV), layout="bshd")


@pytest.mark.parametrize("backend", BACKENDS)
def test_copy_blocks_block_528(backend):
    kc, vc = pa.make_kv_cache(3, 528, 1, 16, layout="bshd", dtype=torch.float16, device=DEV)
    kc.normal_(), vc.normal_()
    k0, v0 = kc.clone(), vc.clone()
    pa.copy_blocks(kc, vc, [(2, 0)], backend=backend)
    assert torch.equal(kc[0], k0[2]) and torch.equal(vc[0], v0[2])
    assert torch.equal(kc[1:], k0[1:]) and torch.equal(vc[1:], v0[1:])


def test_mla_decode_guards_bad_block_id():
    """Default mode (no validation): a bad block id makes its sequence's rows NaN and is
    counted; the other sequence stays exact."""
    b = _mla_batch([40, 20], 16, i=9)
    b.block_table[0, 1] = b.k_cache.shape[0] + 3
    q = torch.randn(2, 16, 576, generator=_gen(9)).to(DEV, torch.float16)
    errors = torch.zeros(1, dtype=torch.int32, device=DEV)
    out = pa.paged_decode(q, b.k_cache, None, b.block_table, b.seq_lens, layout="bshd",
                          head_dim_v=512, backend="triton", errors=errors)
    assert bool(torch.isnan(out[0]).all()) and int(errors) > 0
    b.block_table[0, 1] = 0
    assert_attn_close(out[1:], _decode_ref(b, q, dv=512)[0][1:], torch.float16)


def test_dispatch_reports_new_shapes():
    b = _mla_batch([8], 16, i=11)
    q = torch.randn(1, 16, 576).to(DEV, torch.float16)
    v = b.k_cache[..., :512]
    text = pa.dispatch.explain("paged_decode", q, b.k_cache, v, b.block_table, b.seq_lens,
                               layout="bshd")
    assert "triton" in str(text)
    from pagedattn.dispatch import capabilities as C
    from pagedattn.dispatch import arch_facts
    gfx = arch_facts("gfx942")
    why = C.unsupported("hip", "paged_decode", gfx, head_dim=576, head_dim_v=512,
                        block_size=528, features=frozenset({"head_dim_v"}))
    assert any("head_dim 576" in w for w in why) and any("block_size 528" in w for w in why)
    assert any("head_dim_v" in w for w in why)
    assert not C.unsupported("triton", "paged_decode", gfx, head_dim=576, head_dim_v=512,
                             block_size=528, features=frozenset({"head_dim_v"}))


def test_head_tiles_rule():
    """Past 256 columns a power-of-2 main tile and a tail tile replace one padded tile when
    narrower; below, one tile of the next power of 2 >= 16."""
    assert D.head_tiles(576) == (512, 64, True)
    assert D.head_tiles(448)[2] is False and D.head_tiles(448)[0] == 512
    assert D.head_tiles(320) == (256, 64, True)
    assert D.head_tiles(13) == (16, 16, False) and D.head_tiles(192) == (256, 16, False)
    assert D._head_split(128, 1024) == (8, 16) and D._head_split(16, 1024) == (1, 16)
    assert D._head_split(300, 128) == (2, 150)
