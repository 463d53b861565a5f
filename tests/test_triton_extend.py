"""Triton extend (prefix-prefill) attention vs the float64 dense oracle (TESTING.md §D2, §D4, §D5).

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


def test_reference_3_3_three_request_batch(device):
    """Reference §3.3: prefixes 4/0/5, extends 2/3/1 over its kv_indices (a block_size-1 pool)."""
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
    """§3.5: a 20-token prompt fed as chunks 5/8/7 (each chunk's K/V given as k_new, then
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


def _compile_offline(target, variant="twostage", new_from_cache=True):
    """Compile the sm_90 default config (bf16, D 128, group 4, page 16) for a real target.

    Runs in a subprocess without TRITON_INTERPRET (the interpreter replaces @triton.jit)."""
    from pagedattn.triton_kernels._extend_variants import VARIANTS
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from pagedattn.triton_kernels.extend import _extend_fwd
    backend, arch = target.split(":")
    cst = dict(K_X=8, K_SPLIT=False, K_LO_ONE=True, V_LO_ONE=True, GROUP=4, GROUP_P=4,
               HEAD_DIM=128, HEAD_DIM_P=128, PAGE=16, BLOCK_M=128, BLOCK_N=64, BLOCK_NM=32,
               CAUSAL=True,
               NEW_FROM_CACHE=new_from_cache, HAS_MASK=False, HAS_WINDOW=False, HAS_CAP=False,
               HAS_ALIBI=False, HAS_SINKS=False, KV_FP8=False, RETURN_LSE=True, IEEE=False,
               VARIANT=VARIANTS[variant])
    ptr = {"bt_ptr": "*i32", "cu_ptr": "*i32", "lens_ptr": "*i32", "mask_ptr": "*u8",
           "mask_indptr_ptr": "*i32", "lse_ptr": "*fp32", "kscale_ptr": "*fp32",
           "vscale_ptr": "*fp32", "alibi_ptr": "*fp32", "sinks_ptr": "*fp32"}
    names = _extend_fwd.arg_names

    def ty(n):
        if n in cst:
            return "constexpr"
        if n.endswith("_ptr"):
            return ptr.get(n, "*bf16")  # q, k_new, v_new, caches, out
        if n.startswith("stride"):
            return "i64"
        return "fp32" if n in ("sm_scale", "logit_cap") else "i32"
    # a real bhsd bf16 launch: pointers and strides divisible by 16 (Triton's specialisation);
    # the unit strides stride_kdl/vdl are replaced by the constexpr K_LO_ONE/V_LO_ONE
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if n.endswith("_ptr") or n.startswith("stride")}
    src = ASTSource(_extend_fwd, {n: ty(n) for n in names},
                    constexprs={(names.index(k),): v for k, v in cst.items()}, attrs=attrs)
    if backend == "cuda":
        k = triton.compile(src, target=GPUTarget("cuda", int(arch), 32),
                           options=dict(num_warps=8, num_stages=3))
        assert "wgmma" in k.asm["ptx"], "sm_90 dots must use wgmma"
        assert "async_copy_global_to_local" in k.asm["ttgir"], "K/V loads must be pipelined"
        if variant.startswith("pipe"):  # the point of the carried block ids (NOTES_extend.md)
            assert "{num = 2 : i32}" in k.asm["ttgir"], "K/V must stay two tiles in flight"
    else:
        triton.compile(src, target=GPUTarget("hip", arch, 64),
                       options=dict(num_warps=4, num_stages=1, waves_per_eu=2,
                                    matrix_instr_nonkdim=16))


@pytest.mark.parametrize("target,variant", [("cuda:90", "twostage"), ("hip:gfx942", "twostage")]
                         + [("cuda:90", v)
                            for v in ("onepass", "pages", "pipe", "pipe_fma", "early")]
                         + [("hip:gfx942", "pipe_fma"), ("hip:gfx942", "early"),
                            ("cuda:90", "pipe_fma+k_new"), ("cuda:90", "early+k_new")])
def test_kernel_compiles_for_real_targets(target, variant):
    """The interpreter skips the real compiler (it accepted a non-constexpr global in jit code
    that the compiler rejects): compile offline for sm_90 and gfx942, no GPU needed."""
    triton = pytest.importorskip("triton")
    plugin = {"cuda": "nvidia", "hip": "amd"}[target.split(":")[0]]
    if plugin not in getattr(triton.backends, "backends", {}):
        pytest.skip(f"this triton build has no {plugin} backend")
    name, _, k_new = variant.partition("+")
    _run_offline(f"_compile_offline({target!r}, {name!r}, {not k_new})")


def _run_offline(call: str):
    """Run ``test_triton_extend.<call>`` in a subprocess without TRITON_INTERPRET (the
    interpreter replaces @triton.jit at decoration) and fail with its stderr."""
    import os
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(here), here, env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", f"import test_triton_extend as t; t.{call}"],
                       env=env, cwd=here, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]


def _compile_gluon_offline(head_dim, causal, ws):
    """Compile the Gluon sm_90 kernel (bf16, group 4, page 16) with this triton; check that it
    uses async wgmma and cp.async, fits shared memory and (cuobjdump present) does not spill."""
    import re

    from gluon_offline import compile_sm90, resource_usage

    from pagedattn.triton_kernels import _extend_gluon as G
    from pagedattn.triton_kernels import _extend_gluon_ws as GW
    k = GW.extend_fwd_sm90_ws if ws else G.extend_fwd_sm90
    warps = G.NUM_WARPS // 2 if ws == 2 else G.NUM_WARPS
    cst = dict(GROUP=4, GROUP_P=4, HEAD_DIM=head_dim, PAGE=16, BLOCK_M=G.BLOCK_M,
               BLOCK_N=G.BLOCK_N, CAUSAL=causal, RETURN_LSE=True, LOOP_FENCE=False,
               num_warps=warps)
    if ws:
        cst.update(P_REGS=G.P_REGS, SPLIT=ws == 2, C_REGS=G.C_REGS)
    ck = compile_sm90(k, cst, {"bt_ptr": "*i32", "cu_ptr": "*i32", "lens_ptr": "*i32",
                               "lse_ptr": "*fp32"}, warps)
    assert "wgmma.mma_async" in ck.asm["ptx"]
    assert "isAsync = true" in ck.asm["ttgir"], "the loop's wgmmas must be asynchronous"
    assert "async_copy_global_to_local" in ck.asm["ttgir"]
    assert ck.metadata.shared <= 232448, f"{ck.metadata.shared} B of shared memory > the H200's"
    res = resource_usage(ck)
    if res is not None:
        assert "STACK:0" in res and "LOCAL:0" in res, f"register spills: {res}"
    if ws:  # both roles got their registers (setmaxnreg): 200 for the consumers
        ptx = ck.asm["ptx"]
        assert re.search(rf"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32 \t{G.P_REGS};", ptx)
        # each consumer partition releases a slot from one elected thread: the empty barriers
        # count 1 or 2 (a count of 256 deadlocked the H200, session 11 call 5)
        assert "mbarrier.init.shared::cta.b64 [%r" in ptx
        counts = [ln.rsplit(",", 1)[1].strip(" ;") for ln in ptx.splitlines()
                  if "mbarrier.init" in ln]
        assert set(counts) == {"128", str(ws)}, counts


@pytest.mark.parametrize("head_dim,causal,ws", [(128, True, 1), (64, False, 1), (128, True, 2),
                                               (128, True, 0)])
def test_gluon_kernel_compiles_for_sm90(head_dim, causal, ws):
    """The Gluon kernel is written for triton 3.6's Gluon API (the H200's): compile it offline
    under that triton (``make test-gpu-triton``); other versions skip (the launcher does not use
    the kernel under them)."""
    triton = pytest.importorskip("triton")
    from pagedattn.triton_kernels import _extend_variants as V
    if not triton.__version__.startswith(V.GLUON_TRITON):
        pytest.skip(f"triton {triton.__version__}: the Gluon kernel targets {V.GLUON_TRITON}x")
    if "nvidia" not in getattr(triton.backends, "backends", {}):
        pytest.skip("this triton build has no nvidia backend")
    _run_offline(f"_compile_gluon_offline({head_dim}, {causal}, {ws})")


def test_gluon_variant_elsewhere_runs_the_default(device, monkeypatch):
    """PAGEDATTN_EXTEND_VARIANT=gluon where the Gluon kernel cannot run (here: the CPU) runs the
    default Triton loop, correctly."""
    from pagedattn.triton_kernels import _extend_variants as V
    monkeypatch.setenv(V.ENV, V.GLUON)
    assert V.requested() == V.GLUON
    assert V.resolve(has_mask=False, has_window=False, page=4) == V.VARIANTS[V.TRITON_DEFAULT]
    run_case(device, layout="bhsd", heads=(8, 2), bs=4, prefixes=[21, 0], extends=[9, 20],
             seed=71)


def test_gluon_unsupported_reasons(monkeypatch):
    """The Gluon kernel's gate names every reason a call cannot use it (checked on the host, so
    on any machine); a bench-like call on an sm_90 GPU has none."""
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    from pagedattn import layouts as L
    from pagedattn.triton_kernels import _extend_gluon as G
    from pagedattn.triton_kernels import extend as E
    # CPU tensors through backend="triton" on any machine (E.run is replaced: nothing launches)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    calls = []
    monkeypatch.setattr(E, "run", lambda call: (calls.append(call), call.out.zero_())[0] and None)

    def call_for(layout="bhsd", d=128, bs=16, heads=(32, 8), lq=64, dtype=torch.float16, **kw):
        hq, hkv = heads
        kc, vc = pa.make_kv_cache(8, bs, hkv, d, layout=layout, dtype=dtype)
        q = torch.randn(lq, hq, d, dtype=dtype)
        pa.extend_attention(q, kc, vc, torch.zeros(1, 8, dtype=torch.int32), _cu([lq], "cpu"),
                            torch.tensor([lq], dtype=torch.int32), layout=layout,
                            backend="triton", **kw)
        c = calls.pop()
        return c, L.k_strides(c.k_cache, layout), L.v_strides(c.v_cache, layout)

    def reasons(c, ks, vs, family="sm90", max_q=64):
        return G.unsupported(c, ks, vs, family, 4 if c.q.shape[1] == 32 else 1, max_q)

    base = reasons(*call_for())
    assert base == ["not an sm_90 GPU"], base  # the CPU: only the device is wrong
    assert reasons(*call_for(), family="sm80")[:1] == ["not an sm_90 GPU"]
    assert "head_dim 80 not 64 or 128" in reasons(*call_for(d=80))
    assert "the cache's head dim is not contiguous" in reasons(*call_for(layout="vllm"))
    assert "the cache's head dim is not contiguous" in reasons(*call_for(layout="hcu"))
    assert "window, soft-cap, ALiBi or sinks" in reasons(*call_for(sliding_window=8))
    assert "fewer query rows than one 128-row block" in reasons(*call_for(lq=31), max_q=31)
    assert "q, caches and out must share one 16-bit dtype" \
        in reasons(*call_for(dtype=torch.float32))
    assert reasons(*call_for(layout="bshd", d=64)) == base


# ----------------------------------------------------------------------------------------------
# A/B loop variants (PAGEDATTN_EXTEND_VARIANT; pagedattn/triton_kernels/_extend_variants.py)
# ----------------------------------------------------------------------------------------------

VARIANT_NAMES = ["twostage", "onepass", "pages", "pipe", "pipe_fma", "early"]
# Interpreter tiles are 16 x 16: page 1 (16 ids per tile), 4 (page < tile), 16 (= tile) and
# 32 (a tile is half a page: start % PAGE != 0). Prefixes off the page and tile grid.
_OPT_GEN = torch.Generator().manual_seed(3)  # the options' draws: the same every run
VARIANT_CASES = [
    dict(layout="bhsd", dtype=torch.float16, heads=(8, 2), bs=4, prefixes=[21, 0, 7],
         extends=[9, 20, 1]),
    dict(layout="vllm", dtype=torch.float32, heads=(5, 1), bs=16, prefixes=[35, 3],
         extends=[18, 2]),
    dict(layout="hcu", dtype=torch.float16, heads=(4, 4), bs=1, prefixes=[17, 0],
         extends=[5, 19], causal=False),
    dict(layout="bshd", dtype=torch.float32, heads=(8, 2), bs=32, d=80, prefixes=[40, 0],
         extends=[7, 3], opts={"logit_cap": 5.0,
                               "alibi_slopes": torch.rand(8, generator=_OPT_GEN) * 0.5,
                               "sinks": torch.randn(8, generator=_OPT_GEN)}),
    dict(layout="bhsd", dtype=torch.float16, kv_dtype=FP8[0], heads=(8, 2), bs=4,
         prefixes=[9, 0], extends=[5, 7]),
]


@pytest.mark.parametrize("variant", VARIANT_NAMES)
@pytest.mark.parametrize("case", range(len(VARIANT_CASES)))
def test_extend_variant(device, monkeypatch, variant, case):
    from pagedattn.triton_kernels import _extend_variants as V
    monkeypatch.setenv(V.ENV, variant)
    c = VARIANT_CASES[case]
    assert V.resolve(has_mask=False, has_window=False, page=c["bs"]) \
        == V.VARIANTS[variant], "the variant must actually run for this case"
    monkeypatch.delenv(V.ENV)
    assert V.requested() == V.DEFAULT == "gluon"  # unset: the measured winner (sm_90)
    assert V.resolve(has_mask=False, has_window=False, page=4) == V.VARIANTS["early"]
    monkeypatch.setenv(V.ENV, variant)
    run_case(device, seed=30 + case, **c)


@pytest.mark.parametrize("variant", VARIANT_NAMES[1:])
@pytest.mark.parametrize("case", [0, 3, 4])
def test_extend_variant_prefix_pass_with_k_new(device, monkeypatch, variant, case):
    """k_new/v_new calls run a variant's loop over the cached prefix, then the new-key stage;
    unset, the default variant."""
    from pagedattn.triton_kernels import _extend_variants as V
    monkeypatch.delenv(V.ENV, raising=False)
    assert V.resolve(has_mask=False, has_window=False, page=4) \
        == V.VARIANTS[V.TRITON_DEFAULT]
    monkeypatch.setenv(V.ENV, variant)
    c = VARIANT_CASES[case]
    assert V.resolve(has_mask=False, has_window=False, page=c["bs"]) \
        == V.VARIANTS[variant], "the variant must actually run for this case"
    run_case(device, seed=50 + case, new_from="k_new", **c)


@pytest.mark.parametrize("variant", ["pipe_fma", "early"])
@pytest.mark.parametrize("case", [0, 1, 3])
def test_extend_masked_tiles_narrower_than_unmasked(device, monkeypatch, variant, case):
    """Masked (diagonal) tiles of half the unmasked tile's keys (PAGEDATTN_EXTEND_MASKED_N):
    32-key unmasked tiles, 16-key masked ones, so the masked range starts mid-tile, and with
    page 4 and 16 a masked tile holds several pages or part of one."""
    from pagedattn.triton_kernels import _extend_configs as C
    from pagedattn.triton_kernels import _extend_variants as V
    monkeypatch.setenv(V.ENV, variant)
    monkeypatch.setenv("PAGEDATTN_EXTEND_CONFIG", "32,32,4,1")
    monkeypatch.setenv("PAGEDATTN_EXTEND_MASKED_N", "16")
    assert C.masked_tile(C.config_override()) == 16
    c = VARIANT_CASES[case]
    run_case(device, seed=70 + case, **c)


def test_extend_masked_tile_knob(monkeypatch):
    """PAGEDATTN_EXTEND_MASKED_N: a power of 2 >= 16, capped at the unmasked tile; junk raises."""
    from pagedattn.triton_kernels import _extend_configs as C
    cfg = C.TileConfig(128, 64, 8, 3)
    monkeypatch.delenv("PAGEDATTN_EXTEND_MASKED_N", raising=False)
    assert C.masked_tile(cfg) == 64
    assert C.masked_tile(cfg._replace(block_nm=32)) == 32
    monkeypatch.setenv("PAGEDATTN_EXTEND_MASKED_N", "128")
    assert C.masked_tile(cfg) == 64
    for bad in ("8", "48", "x", "-16"):
        monkeypatch.setenv("PAGEDATTN_EXTEND_MASKED_N", bad)
        with pytest.raises(ValueError, match="PAGEDATTN_EXTEND_MASKED_N"):
            C.masked_tile(cfg)


def test_extend_config_knob(monkeypatch):
    """PAGEDATTN_EXTEND_CONFIG: whole tile configs pass; junk raises before any launch."""
    from pagedattn.triton_kernels import _extend_configs as C
    monkeypatch.delenv("PAGEDATTN_EXTEND_CONFIG", raising=False)
    assert C.config_override() is None
    monkeypatch.setenv("PAGEDATTN_EXTEND_CONFIG", "128,128,8,2,0,0,64")
    assert C.config_override() == C.TileConfig(128, 128, 8, 2, block_nm=64)
    for bad in ("48,64,4,2", "64,8,4,2", "64,64,3,2", "64,64,4,0", "64,64,4", "64,64,4,2,0,0,24",
                "64,64,4,2,-1", "x", "64,64,4,2,0,0,64,1"):
        monkeypatch.setenv("PAGEDATTN_EXTEND_CONFIG", bad)
        with pytest.raises(ValueError, match="PAGEDATTN_EXTEND_CONFIG"):
            C.config_override()


def test_extend_maxnreg_knob(monkeypatch):
    """PAGEDATTN_EXTEND_MAXNREG: validated before any launch; never passed to the interpreter."""
    from pagedattn.triton_kernels import _extend_configs as C
    cpu = torch.device("cpu")
    monkeypatch.delenv("PAGEDATTN_EXTEND_MAXNREG", raising=False)
    assert C.maxnreg_override(cpu) == {}
    monkeypatch.setenv("PAGEDATTN_EXTEND_MAXNREG", "128")
    assert C.maxnreg_override(cpu) == {}
    for bad in ("0", "256", "x", "-1"):
        monkeypatch.setenv("PAGEDATTN_EXTEND_MAXNREG", bad)
        with pytest.raises(ValueError, match="PAGEDATTN_EXTEND_MAXNREG"):
            C.maxnreg_override(cpu)


def test_extend_variant_falls_back_and_rejects_unknown(device, monkeypatch):
    """A window, a custom mask or a page that is not a power of 2 run the two-stage loop, and so
    does ``twostage`` by name; an unknown name is an error."""
    from pagedattn.triton_kernels import _extend_variants as V
    monkeypatch.setenv(V.ENV, "twostage")
    assert V.resolve(has_mask=False, has_window=False, page=16) == 0
    monkeypatch.setenv(V.ENV, "pipe_fma")
    assert V.resolve(has_mask=False, has_window=True, page=16) == 0
    assert V.resolve(has_mask=True, has_window=False, page=16) == 0
    assert V.resolve(has_mask=False, has_window=False, page=12) == 0
    assert V.resolve(has_mask=False, has_window=False, page=16) == V.VARIANTS["pipe_fma"]
    run_case(device, layout="bshd", dtype=torch.float32, heads=(8, 2), bs=4, prefixes=[6, 0],
             extends=[5, 9], new_from="k_new", opts={"sliding_window": 4}, seed=40)
    monkeypatch.setenv(V.ENV, "nope")
    with pytest.raises(ValueError, match="PAGEDATTN_EXTEND_VARIANT"):
        V.requested()
