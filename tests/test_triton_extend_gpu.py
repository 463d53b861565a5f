"""GPU tier of the Triton extend tests: real sizes, bf16, int32 overflow (64-bit offsets).

Split from test_triton_extend.py (file size); the CPU grid and run_case live there.
"""
import pytest
import torch

import pagedattn as pa
from attn_utils import FP8, assert_attn_close, dense_attention
from test_triton_extend import BF16_SKIP, LAYOUTS, _cu, run_case

@pytest.mark.gpu
@BF16_SKIP
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("new_from", ["cache", "k_new"])
def test_gpu_bf16_real_sizes(device, layout, new_from):
    run_case(device, layout=layout, dtype=torch.bfloat16, heads=(32, 8), d=128, bs=16,
             prefixes=[1000, 0, 517, 64], extends=[300, 257, 1, 129], new_from=new_from,
             seed=20)


@pytest.mark.gpu
@BF16_SKIP
@pytest.mark.parametrize("dtype,kv", [(torch.bfloat16, None), (torch.float16, FP8[0])])
def test_gpu_options_real_sizes(device, dtype, kv):
    o = {"sliding_window": 200, "logit_cap": 30.0, "sinks": torch.randn(32)}
    run_case(device, layout="bshd", dtype=dtype, kv_dtype=kv, heads=(32, 8), d=128, bs=16,
             prefixes=[700, 0], extends=[333, 200], opts=o, seed=21)


@pytest.mark.gpu
def test_gpu_overflow_query_offsets(device):
    """SGLang #20389: total query tokens x Hq x D > 2^31 elements (q and out offsets)."""
    hq, hkv, d, lq = 64, 8, 128, 128
    nseq = 262_144 // lq + 8
    t = nseq * lq
    assert t * hq * d > 2 ** 31, "the case must pass the int32 range"
    q = torch.randn(t, hq, d, device=device, dtype=torch.float16)
    kn = torch.randn(t, hkv, d, device=device, dtype=torch.float16)
    vn = torch.randn_like(kn)
    kc = torch.full((2, hkv, 16, d), float("nan"), device=device, dtype=torch.float16)
    table = torch.zeros(nseq, 1, dtype=torch.int32, device=device)
    lens = torch.full((nseq,), lq, dtype=torch.int32, device=device)
    cu = torch.arange(0, t + 1, lq, dtype=torch.int32, device=device)
    out = pa.extend_attention(q, kc, kc.clone(), table, cu, lens, k_new=kn, v_new=vn,
                              max_q_len=lq, backend="triton")
    for i in (0, nseq - 1):  # the last request's rows sit past 2^31 elements
        s = slice(i * lq, (i + 1) * lq)
        ro, _ = dense_attention(q[s], kn[s], vn[s], range(lq), scale=d ** -0.5)
        assert_attn_close(out[s], ro, torch.float16, what=f"request {i}")


def overflow_cache_case(device, layout, dtype, lq, seed):
    """One request whose pages are the top ids of a cache whose last block starts past 2^31
    elements (block x stride computed in int32 would wrap); the pool outside them is NaN.
    Runs the Triton backend and checks it against the oracle."""
    hkv, d, bs, nblk = 8, 128, 16, 140_000
    kc, vc = pa.make_kv_cache(nblk, bs, hkv, d, layout=layout, dtype=dtype, device=device)
    assert (nblk - 1) * kc.stride(0) > 2 ** 31, "last block must start past the int32 range"
    prefix = 1000
    n = prefix + lq
    pages = (n + bs - 1) // bs
    ids = torch.arange(nblk - pages, nblk, device=device).flip(0)  # top ids, reversed
    kc.fill_(float("nan")), vc.fill_(float("nan"))  # poison: the pool outside the request
    gen = torch.Generator(device=device).manual_seed(seed)
    kc[ids.long()] = torch.randn(kc[ids.long()].shape, generator=gen, device=device).to(dtype)
    vc[ids.long()] = torch.randn(vc[ids.long()].shape, generator=gen, device=device).to(dtype)
    table = ids.to(torch.int32).view(1, -1)
    lens = torch.tensor([n], dtype=torch.int32, device=device)
    q = torch.randn(lq, 32, d, generator=gen, device=device).to(dtype)
    out = pa.extend_attention(q, kc, vc, table, _cu([lq], device), lens, layout=layout,
                              backend="triton")
    k, v = pa.layouts.gather_kv(kc, vc, table[0], n, layout)
    ro, _ = dense_attention(q, k, v, range(prefix, n), scale=d ** -0.5)
    assert_attn_close(out, ro, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["bhsd", "vllm"])
def test_gpu_overflow_cache_offsets(device, layout):
    """vLLM PR #47671: cache offsets past the int32 range."""
    overflow_cache_case(device, layout, torch.float16, lq=24, seed=22)


@pytest.mark.gpu
@BF16_SKIP
@pytest.mark.parametrize("window", [None, 300], ids=["one-pass-loop", "two-stage-loop"])
def test_gpu_triton_loops_bf16_real_sizes(device, monkeypatch, window):
    """The Triton kernel's two loops at the default GPU tiles (128 x 128, 64-key masked tiles on
    sm_90): page 16 and page 1; the Gluon kernel kept out."""
    monkeypatch.setenv("PAGEDATTN_DEV_EXTEND_KERNEL", "triton")
    opts = {} if window is None else {"sliding_window": window}
    for bs in (16, 1):
        run_case(device, layout="bhsd", dtype=torch.bfloat16, heads=(32, 8), d=128, bs=bs,
                 prefixes=[1000, 0, 517, 64], extends=[300, 257, 1, 129], seed=23, opts=opts)


# ----------------------------------------------------------------------------------------------
# the Gluon sm_90 kernel (_extend_gluon.py)
# ----------------------------------------------------------------------------------------------

GLUON_CASES = [  # every case must reach the Gluon kernel (asserted): rows >= one 128-row block
    # the extend table's heads; prefixes on/off the page and the 128-key tile grid; Lq 1 and 0
    dict(layout="bhsd", dtype=torch.bfloat16, heads=(32, 8), d=128, bs=16,
         prefixes=[1000, 0, 517, 64, 256, 9], extends=[300, 257, 1, 129, 128, 0]),
    dict(layout="bshd", dtype=torch.float16, heads=(32, 8), d=128, bs=1,
         prefixes=[383, 0, 128], extends=[97, 1000, 33], use_out=True),
    dict(layout="bhsd", dtype=torch.bfloat16, heads=(16, 16), d=64, bs=256,  # MHA, pages > tile
         prefixes=[700, 0, 255], extends=[200, 385, 3]),
    dict(layout="bhsd", dtype=torch.bfloat16, heads=(32, 4), d=128, bs=64,  # group 8
         prefixes=[130, 0], extends=[77, 640], causal=False),
    dict(layout="bshd", dtype=torch.float16, heads=(12, 4), d=64, bs=32,  # group 3 (padded to 4)
         prefixes=[31, 2048, 0], extends=[250, 64, 1]),
]


def gluon_launches(monkeypatch):
    """Select the Gluon kernel (skip where it cannot run) and count its launches."""
    from pagedattn.triton_kernels import _extend_loop as V
    gk = V.gluon_kernel()
    if gk is None or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon kernel needs sm_90 and triton " + V.GLUON_TRITON)
    launches = []
    real = gk.launch
    monkeypatch.setattr(gk, "launch", lambda *a, **k: (launches.append(1), real(*a, **k)))
    return launches


@pytest.mark.gpu
@BF16_SKIP
@pytest.mark.parametrize("case", range(len(GLUON_CASES)))
def test_gpu_gluon_kernel(device, monkeypatch, case):
    """The warp-specialized kernel (a producer warpgroup, two 4-warp consumers)."""
    launches = gluon_launches(monkeypatch)
    run_case(device, seed=60 + case, **GLUON_CASES[case])
    assert launches, "the call fell back to the Triton kernel"


@pytest.mark.gpu
@BF16_SKIP
def test_gpu_gluon_overflow_cache_offsets(device, monkeypatch):
    """64-bit offsets under the Gluon kernel: pages past 2^31 elements, the pool outside NaN."""
    launches = gluon_launches(monkeypatch)
    overflow_cache_case(device, "bhsd", torch.bfloat16, lq=64, seed=24)
    assert launches, "the call fell back to the Triton kernel"
