"""The Triton extend kernels compiled offline for real targets (sm_90, gfx942; no GPU needed)
and the Gluon kernel's gate, checked on the host. Split from test_triton_extend.py (file size);
``make test-gpu-triton`` runs the compile checks again under the H200's triton."""
import pytest
import torch

import pagedattn as pa
from test_triton_extend import _cu


def _compile_offline(target, loop="twostage", new_from_cache=True):
    """Compile the sm_90 default config (bf16, D 128, group 4, page 16) for a real target.

    Runs in a subprocess without TRITON_INTERPRET (the interpreter replaces @triton.jit)."""
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
               ONE_LOOP=loop == "onepass", GUARD=True, HAS_ERR=True, HEAD_DIM_V=128,
               HEAD_DIM_VP=128)
    ptr = {"bt_ptr": "*i32", "cu_ptr": "*i32", "lens_ptr": "*i32", "mask_ptr": "*u8",
           "mask_indptr_ptr": "*i32", "lse_ptr": "*fp32", "kscale_ptr": "*fp32", "err_ptr": "*i32",
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
        if loop == "onepass":  # the point of the carried block ids (_extend_loop.py)
            assert "{num = 2 : i32}" in k.asm["ttgir"], "K/V must stay two tiles in flight"
    else:
        triton.compile(src, target=GPUTarget("hip", arch, 64),
                       options=dict(num_warps=8, num_stages=1, waves_per_eu=2,
                                    matrix_instr_nonkdim=16))


@pytest.mark.parametrize("target,loop", [("cuda:90", "twostage"), ("hip:gfx942", "twostage"),
                                         ("cuda:90", "onepass"), ("hip:gfx942", "onepass"),
                                         ("cuda:90", "onepass+k_new")])
def test_kernel_compiles_for_real_targets(target, loop):
    """The interpreter skips the real compiler (it accepted a non-constexpr global in jit code
    that the compiler rejects): compile offline for sm_90 and gfx942, no GPU needed."""
    triton = pytest.importorskip("triton")
    plugin = {"cuda": "nvidia", "hip": "amd"}[target.split(":")[0]]
    if plugin not in getattr(triton.backends, "backends", {}):
        pytest.skip(f"this triton build has no {plugin} backend")
    name, _, k_new = loop.partition("+")
    _run_offline(f"_compile_offline({target!r}, {name!r}, {not k_new})")


def _run_offline(call: str):
    """Run ``test_triton_extend_compile.<call>`` in a subprocess without TRITON_INTERPRET (the
    interpreter replaces @triton.jit at decoration) and fail with its stderr."""
    import os
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(here), here, env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", f"import test_triton_extend_compile as t; t.{call}"],
                       env=env, cwd=here, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]


def _compile_gluon_offline(head_dim, causal):
    """Compile the Gluon sm_90 kernel (bf16, group 4, page 16) with this triton; check that it
    uses async wgmma and cp.async, fits shared memory and (cuobjdump present) does not spill."""
    import re

    from gluon_offline import compile_sm90, resource_usage

    from pagedattn.triton_kernels import _extend_gluon as G
    from pagedattn.triton_kernels import _extend_gluon_ws as GW
    k = GW.extend_fwd_sm90_ws
    warps = G.NUM_WARPS // 2
    cst = dict(GROUP=4, GROUP_P=4, HEAD_DIM=head_dim, PAGE=16, BLOCK_M=G.BLOCK_M,
               BLOCK_N=G.BLOCK_N, CAUSAL=causal, RETURN_LSE=True, num_warps=warps,
               P_REGS=G.P_REGS, C_REGS=G.C_REGS, GUARD=True, HAS_ERR=True)
    ck = compile_sm90(k, cst, {"bt_ptr": "*i32", "cu_ptr": "*i32", "lens_ptr": "*i32",
                               "lse_ptr": "*fp32", "err_ptr": "*i32"}, warps)
    assert "wgmma.mma_async" in ck.asm["ptx"]
    assert "isAsync = true" in ck.asm["ttgir"], "the loop's wgmmas must be asynchronous"
    assert "async_copy_global_to_local" in ck.asm["ttgir"]
    assert ck.metadata.shared <= 232448, f"{ck.metadata.shared} B of shared memory > the H200's"
    res = resource_usage(ck)
    if res is not None:
        assert "STACK:0" in res and "LOCAL:0" in res, f"register spills: {res}"
    # both roles got their registers (setmaxnreg): 200 for the consumers
    ptx = ck.asm["ptx"]
    assert re.search(rf"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32 \t{G.P_REGS};", ptx)
    # each consumer partition releases a slot from one elected thread: the empty barriers count
    # 2, one arrival per consumer (a count of 256, one per thread, deadlocks the H200)
    assert "mbarrier.init.shared::cta.b64 [%r" in ptx
    counts = [ln.rsplit(",", 1)[1].strip(" ;") for ln in ptx.splitlines() if "mbarrier.init" in ln]
    assert set(counts) == {"128", "2"}, counts


@pytest.mark.parametrize("head_dim,causal", [(128, True), (64, False), (128, False)])
def test_gluon_kernel_compiles_for_sm90(head_dim, causal):
    """The Gluon kernel is written for triton 3.6's Gluon API (the H200's): compile it offline
    under that triton (``make test-gpu-triton``); other versions skip (the launcher does not use
    the kernel under them)."""
    triton = pytest.importorskip("triton")
    from pagedattn.triton_kernels import _extend_loop as V
    if not triton.__version__.startswith(V.GLUON_TRITON):
        pytest.skip(f"triton {triton.__version__}: the Gluon kernel targets {V.GLUON_TRITON}x")
    if "nvidia" not in getattr(triton.backends, "backends", {}):
        pytest.skip("this triton build has no nvidia backend")
    _run_offline(f"_compile_gluon_offline({head_dim}, {causal})")


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
