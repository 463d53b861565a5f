"""pagedattn.compat.sglang against SGLang's own Triton kernels (sglang 0.5.23, from its wheel,
under the interpreter on the CPU) and against pagedattn's float32 reference.

The pools hold scattered pages with NaN wherever no valid token lives; outputs are poisoned
before each call. The peer comparisons skip with pip's reason when the wheel is unreachable.
"""
import pytest
import torch

from attn_utils import assert_attn_close, assert_lse_close, tol_key
from compat_batches import cumsum0, i32, nan_like, new_tokens, paged, token_pool, token_slots
from compat_peers import PeerUnavailable, sglang_ops
from pagedattn import reference as R
from pagedattn.compat import sglang as S


@pytest.fixture(scope="module")
def peer():
    try:
        return sglang_ops()
    except PeerUnavailable as e:
        pytest.skip(f"SGLang's kernels unavailable: {e}")


def _peer_workspace(b, hq, d, splits=4):
    """SGLang's split-KV scratch: attn_logits [B, H, S, D], attn_lse [B, H, S], num_kv_splits."""
    return (torch.empty(b, hq, splits, d), torch.empty(b, hq, splits),
            torch.tensor([1 + i % splits for i in range(b)], dtype=torch.int32), splits)


# (page_size, dtype, num_q_heads, num_kv_heads, kv lens, options): SGLang's grouped kernel
# (GQA) and its MHA kernel, token and page pools, cap + sinks, a 16-bit pool with scales
DECODE_CASES = [
    (1, torch.float16, 4, 2, [5, 17, 1], {}),
    (16, torch.float32, 2, 2, [1, 37, 16], {"logit_cap": 3.0, "sinks": True}),
    (16, torch.float16, 4, 1, [40, 2], {"k_scale": 0.5, "v_scale": 2.0}),
]


@pytest.mark.parametrize("ps,dtype,hq,hkv,lens,opts", DECODE_CASES,
                         ids=["page1-gqa", "page16-mha-cap-sinks", "page16-mqa-scales"])
def test_decode_matches_sglang_and_reference(peer, ps, dtype, hq, hkv, lens, opts):
    gen = torch.Generator().manual_seed(10 + ps)
    b = paged(lens, page_size=ps, num_kv_heads=hkv, dtype=dtype, gen=gen)
    kb, vb = token_pool(b)
    indptr, indices = token_slots(b, lens)
    q = torch.randn(len(lens), hq, 32, generator=gen).to(dtype)
    sinks = torch.randn(hq, generator=gen) if opts.get("sinks") else None
    ks, vs, cap = opts.get("k_scale", 1.0), opts.get("v_scale", 1.0), opts.get("logit_cap", 0.0)
    args = (indptr, indices, *_peer_workspace(len(lens), hq, 32), 0.2, ks, vs)
    kw = dict(logit_cap=cap, sinks=sinks, page_size=ps)
    o_peer, o_ours = torch.zeros_like(q), nan_like(q)
    peer.decode.decode_attention_fwd(q, kb, vb, o_peer, *args, **kw)
    S.decode_attention_fwd(q, kb, vb, o_ours, *args, **kw)
    ref = R.paged_decode(q, b.k_cache, b.v_cache, b.block_table, b.seq_lens, layout="bshd",
                         scale=0.2 * ks, logit_cap=cap or None, sinks=sinks).float() * vs
    assert_attn_close(o_ours, o_peer, dtype)
    assert_attn_close(o_ours, ref, dtype)
    assert_attn_close(o_peer, ref, dtype)  # the peer agrees with the oracle: not vacuous


def test_decode_fp8_pool_against_reference():
    gen = torch.Generator().manual_seed(11)
    b = paged([20, 3], page_size=1, dtype=torch.float8_e4m3fn, gen=gen, kv_scales=(0.37, 3.1))
    kb, vb = token_pool(b)
    q = torch.randn(2, 4, 32, generator=gen).half()
    o = nan_like(q)
    S.decode_attention_fwd(q, kb, vb, o, *token_slots(b, [20, 3]), None, None, None, 4, 0.25,
                           0.37, 3.1)
    ref = R.paged_decode(q, b.k_cache, b.v_cache, b.block_table, b.seq_lens, layout="bshd",
                         scale=0.25, k_scale=0.37, v_scale=3.1)
    assert_attn_close(o, ref, tol_key(torch.float16, torch.float8_e4m3fn))


def _extend_case(ps, dtype, gen, prefix=(5, 0, 17), ext=(3, 6, 1)):
    b = paged(list(prefix), page_size=ps, dtype=dtype, gen=gen)
    q = new_tokens(ext, 4, 32, dtype, gen)
    k_new, v_new = new_tokens(ext, 2, 32, dtype, gen), new_tokens(ext, 2, 32, dtype, gen)
    lens = i32([p + e for p, e in zip(prefix, ext)])
    return b, q, k_new, v_new, cumsum0(list(ext)), lens, list(prefix), list(ext)


# (page_size, dtype, mask: None | "skip" (SGLang's default) | "full", window W, sinks + cap)
EXTEND_CASES = [
    (1, torch.float16, None, -1, False),
    (16, torch.float32, None, 4, True),
    (1, torch.float16, "skip", -1, True),
    (16, torch.float16, "full", -1, False),
]


@pytest.mark.parametrize("ps,dtype,mask,window,extras", EXTEND_CASES,
                         ids=["page1", "page16-window-sinks", "mask-skip-prefix", "mask-full"])
def test_extend_matches_sglang_and_reference(peer, ps, dtype, mask, window, extras):
    gen = torch.Generator().manual_seed(20 + ps)
    b, q, k_new, v_new, cu, lens, prefix, ext = _extend_case(ps, dtype, gen)
    kb, vb = token_pool(b)
    kv_indptr, kv_indices = token_slots(b, prefix)
    sizes = [e * (p + e) for p, e in zip(prefix, ext)]
    flat = torch.rand(sum(sizes), generator=gen) > 0.4 if mask else None
    mi = cumsum0(sizes) if mask else None
    sinks = torch.randn(4, generator=gen) if extras else None
    cap = 4.0 if extras else 0.0
    common = (kb, vb, cu, kv_indptr, kv_indices, flat, True, mi, max(ext), 1.0, 1.0)
    kw = dict(sm_scale=0.2, logit_cap=cap, skip_prefix_custom_mask=mask == "skip",
              sliding_window_size=window, sinks=sinks, page_size=ps)
    outs = []
    for fn in (peer.extend.extend_attention_fwd, S.extend_attention_fwd):
        o, lse = nan_like(q), torch.full((q.shape[0], 4), float("nan"))
        fn(q, k_new, v_new, o, *common, lse_extend=lse, **kw)
        outs.append((o, lse))
    ref_mask = flat
    if mask == "skip":  # SGLang reads no prefix column of the mask
        ref_mask = flat.clone()
        for r, (p, e) in enumerate(zip(prefix, ext)):
            ref_mask[int(mi[r]):int(mi[r + 1])].view(e, p + e)[:, :p] = True
    ref, ref_lse = R.extend_attention(
        q, b.k_cache, b.v_cache, b.block_table, cu, lens, layout="bshd", k_new=k_new,
        v_new=v_new, custom_mask=ref_mask, mask_indptr=mi, scale=0.2,
        sliding_window=window + 1 if window > 0 else None, logit_cap=cap or None, sinks=sinks,
        return_lse=True)
    if sinks is not None:
        ref_lse = torch.logaddexp(ref_lse, sinks.view(1, -1))  # SGLang's LSE counts the sink
    (o_peer, l_peer), (o_ours, l_ours) = outs
    assert_attn_close(o_ours, o_peer, dtype)
    assert_attn_close(o_ours, ref, dtype)
    assert_attn_close(o_peer, ref, dtype)
    assert_lse_close(l_ours, l_peer, dtype)
    assert_lse_close(l_ours, ref_lse, dtype)


def test_extend_identity_indices_and_skip_prefix(peer):
    gen = torch.Generator().manual_seed(30)
    prefix, ext = [4, 9], [2, 3]
    q, k_new, v_new = (new_tokens(ext, h, 32, torch.float16, gen) for h in (4, 2, 2))
    kb = torch.randn(sum(prefix), 2, 32, generator=gen).half()  # prefixes back to back
    vb = torch.randn(sum(prefix), 2, 32, generator=gen).half()
    cu, kv_indptr = cumsum0(ext), cumsum0(prefix)
    empty = torch.zeros(0, dtype=torch.int32)
    for skip in (False, True):
        outs = []
        for fn in (peer.extend.extend_attention_fwd, S.extend_attention_fwd):
            o = nan_like(q)
            fn(q, k_new, v_new, o, kb, vb, cu, kv_indptr, empty, None, True, None, 3, 1.0, 1.0,
               skip_prefix=skip, identity_kv_indices=True)
            outs.append(o)
        p = [0, 0] if skip else prefix
        table = torch.zeros(2, max(p + [1]), dtype=torch.int32)
        for r in range(2):
            table[r, :p[r]] = torch.arange(p[r]) + int(kv_indptr[r])
        ref = R.extend_attention(q, kb.unsqueeze(1), vb.unsqueeze(1), table, cu,
                                 i32([a + e for a, e in zip(p, ext)]), layout="bshd",
                                 k_new=k_new, v_new=v_new)
        assert_attn_close(outs[1], outs[0], torch.float16)
        assert_attn_close(outs[1], ref, torch.float16)


def test_context_bound_gives_the_same_result_and_pages_are_checked(validation_mode):
    gen = torch.Generator().manual_seed(31)
    lens = [37, 5]
    b = paged(lens, page_size=16, gen=gen)
    kb, vb = token_pool(b)
    indptr, indices = token_slots(b, lens)
    q = torch.randn(2, 4, 32, generator=gen).half()
    ws = _peer_workspace(2, 4, 32)
    want = nan_like(q)
    S.decode_attention_fwd(q, kb, vb, want, indptr, indices, *ws, 0.2, 1.0, 1.0, page_size=16)
    S.set_max_context_len(64)
    try:
        got = nan_like(q)
        S.decode_attention_fwd(q, kb, vb, got, indptr, indices, *ws, 0.2, 1.0, 1.0, page_size=16)
    finally:
        S.set_max_context_len(None)
    assert torch.equal(got, want)
    bad = indices.clone()
    bad[[3, 4]] = bad[[4, 3]]  # two slots of one page swapped: not page-aligned
    with pytest.raises(ValueError, match="kv_indices: request 0 token 3"):
        S.decode_attention_fwd(q, kb, vb, got, indptr, bad, *ws, 0.2, 1.0, 1.0, page_size=16)
    # the same list is fine as a token-granular pool
    S.decode_attention_fwd(q, kb, vb, got, indptr, bad, *ws, 0.2, 1.0, 1.0, page_size=1)
    with pytest.raises(ValueError, match="n:"):
        S.set_max_context_len(0)
