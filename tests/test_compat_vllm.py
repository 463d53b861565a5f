"""pagedattn.compat.vllm against vLLM's own Triton ``unified_attention`` (vllm 0.34.0, from its
wheel, under the interpreter on the CPU) and against pagedattn's float32 reference; the legacy
``paged_attention_v1``/``v2`` (CUDA ops in vLLM) against the reference only.

Caches hold scattered pages with NaN wherever no valid token lives; outputs are poisoned.
"""
import pytest
import torch

from attn_utils import assert_attn_close, tol_key
from compat_batches import cumsum0, nan_like, paged
from compat_peers import PeerUnavailable, vllm_unified_attention
from pagedattn import reference as R
from pagedattn.compat import vllm as VL


@pytest.fixture(scope="module")
def peer():
    try:
        return vllm_unified_attention()
    except PeerUnavailable as e:
        pytest.skip(f"vLLM's unified_attention unavailable: {e}")


# (block_size, dtype, num_q_heads, num_kv_heads, query lens, kv lens, options): a mixed
# prefill/decode batch, a pure decode batch (pagedattn's decode kernels), block size 1, MQA
UNIFIED_CASES = [
    (16, torch.float16, 4, 2, [1, 4, 7], [20, 4, 35], {"sinks": True}),
    (16, torch.float32, 4, 2, [1, 1, 1], [17, 1, 40], {"window": 5, "softcap": 3.0}),
    (1, torch.float16, 4, 1, [2, 5], [9, 5], {"alibi": True}),
    (16, torch.float16, 2, 2, [3, 1], [3, 30], {"causal": False, "window": 7}),
    (16, torch.float16, 4, 2, [1, 1], [33, 2], {"sinks": True, "alibi": True}),
]
IDS = ["mixed-sinks", "decode-window-cap", "block1-alibi", "noncausal-window",
       "decode-sinks-alibi"]


@pytest.mark.parametrize("bs,dtype,hq,hkv,q_lens,kv_lens,opts", UNIFIED_CASES, ids=IDS)
def test_unified_attention_matches_vllm_and_reference(peer, bs, dtype, hq, hkv, q_lens,
                                                      kv_lens, opts):
    gen = torch.Generator().manual_seed(40 + bs + len(q_lens))
    b = paged(kv_lens, page_size=bs, num_kv_heads=hkv, dtype=dtype, gen=gen)
    q = torch.randn(sum(q_lens), hq, 32, generator=gen).to(dtype)
    cu = cumsum0(q_lens)
    window = opts.get("window")
    sinks = torch.randn(hq, generator=gen) if opts.get("sinks") else None
    alibi = torch.rand(hq, generator=gen) if opts.get("alibi") else None
    causal, cap = opts.get("causal", True), opts.get("softcap", 0.0)
    args = (cu, max(q_lens), b.seq_lens, max(kv_lens), 0.25, causal,
            (window - 1, 0) if window else (-1, -1), b.block_table, cap, None, None, None)
    outs = []
    for fn in (peer.unified_attention, VL.unified_attention):
        o = nan_like(q)
        fn(q, b.k_cache, b.v_cache, o, *args, alibi_slopes=alibi, sinks=sinks)
        outs.append(o)
    ref = R.extend_attention(q, b.k_cache, b.v_cache, b.block_table, cu, b.seq_lens,
                             layout="bshd", causal=causal, scale=0.25, sliding_window=window,
                             logit_cap=cap or None, alibi_slopes=alibi, sinks=sinks)
    assert_attn_close(outs[1], outs[0], dtype)
    assert_attn_close(outs[1], ref, dtype)
    assert_attn_close(outs[0], ref, dtype)


def test_unified_attention_fp8_per_tensor():
    """FP8_PER_TENSOR dequantises by element 0 of the descales (an expanded view here, as vLLM
    passes it); NONE reads the fp8 values unscaled."""
    gen = torch.Generator().manual_seed(41)
    fp8 = torch.float8_e4m3fn
    b = paged([21, 6], page_size=16, dtype=fp8, gen=gen, kv_scales=(0.37, 3.1))
    q = torch.randn(4, 4, 32, generator=gen).half()
    cu = cumsum0([3, 1])
    ks, vs = torch.tensor([0.37]).expand(2, 2), torch.tensor([3.1]).expand(2, 2)
    for mode, k_ref, v_ref in ((VL.KVQuantMode.FP8_PER_TENSOR, 0.37, 3.1),
                               (VL.KVQuantMode.NONE, 1.0, 1.0)):
        o = nan_like(q)
        VL.unified_attention(q, b.k_cache, b.v_cache, o, cu, 3, b.seq_lens, 21, 0.25, True,
                             (-1, -1), b.block_table, 0, None, ks, vs, kv_quant_mode=mode)
        ref = R.extend_attention(q, b.k_cache, b.v_cache, b.block_table, cu, b.seq_lens,
                                 layout="bshd", scale=0.25, k_scale=k_ref, v_scale=v_ref)
        assert_attn_close(o, ref, tol_key(torch.float16, fp8))


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8_e5m2"])
def test_legacy_paged_attention_against_reference(version, kv_cache_dtype):
    gen = torch.Generator().manual_seed(42 + len(kv_cache_dtype))
    fp8 = kv_cache_dtype != "auto"
    dtype = torch.float8_e5m2 if fp8 else torch.float16
    lens = [19, 1, 50]
    b = paged(lens, page_size=16, dtype=dtype, layout="vllm", gen=gen, kv_scales=(0.37, 3.1))
    kc, vc = (b.k_cache.view(torch.uint8), b.v_cache.view(torch.uint8)) if fp8 else \
        (b.k_cache, b.v_cache)  # vLLM keeps fp8 caches as bytes
    q = torch.randn(3, 4, 32, generator=gen).half()
    o = nan_like(q)
    scales = (torch.tensor([0.37]), torch.tensor([3.1]))
    tail = (2, 0.3, b.block_table, b.seq_lens, 16, 50, None, kv_cache_dtype, *scales)
    if version == "v1":
        VL.paged_attention_v1(o, q, kc, vc, *tail)
    else:
        VL.paged_attention_v2(o, None, None, None, q, kc, vc, *tail)
    ref = R.paged_decode(q, b.k_cache, b.v_cache, b.block_table, b.seq_lens, layout="vllm",
                         scale=0.3, k_scale=0.37 if fp8 else None, v_scale=3.1 if fp8 else None)
    assert_attn_close(o, ref, tol_key(torch.float16, dtype))


def test_legacy_checks_heads_and_block_size():
    gen = torch.Generator().manual_seed(43)
    b = paged([5], page_size=16, layout="vllm", gen=gen)
    q = torch.randn(1, 4, 32, generator=gen).half()
    tail = (b.block_table, b.seq_lens, 16, 5, None, "auto", 1.0, 1.0)
    with pytest.raises(ValueError, match="num_kv_heads=4"):
        VL.paged_attention_v1(nan_like(q), q, b.k_cache, b.v_cache, 4, 0.3, *tail)
    with pytest.raises(ValueError, match="block_size=8"):
        VL.paged_attention_v1(nan_like(q), q, b.k_cache, b.v_cache, 2, 0.3, b.block_table,
                              b.seq_lens, 8, 5, None, "auto", 1.0, 1.0)
