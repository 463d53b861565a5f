"""The Triton kernels `auto` runs on AMD (and, through the same gfx9 tables, on Hygon DCU),
compiled offline for gfx90a and gfx942 with the default tiles and the guards on: each must
compile, keep out of scratch (no VGPR spill, no private segment) and fit the LDS of a workgroup.

No GPU is needed; Triton's AMD backend writes the code object. Hygon's gfx936 is not a target any
local compiler knows: its builds take the gfx9 tables checked here and stay unverified."""
import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.compile

LDS_BYTES = 65536  # per workgroup on gfx90a and gfx942


def _targets():
    triton = pytest.importorskip("triton")
    if "amd" not in getattr(triton.backends, "backends", {}):
        pytest.skip("this triton build has no AMD backend")


def _compile_all(arch: str):
    """Compile every case for ``arch``; print one ``name vgpr spill scratch lds`` line per case.
    Runs without TRITON_INTERPRET (the interpreter replaces @triton.jit at decoration)."""
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from pagedattn.triton_kernels import _decode_configs as DC
    from pagedattn.triton_kernels import _extend_configs as EC
    from pagedattn.triton_kernels import _extend_loop as EL
    from pagedattn.triton_kernels._decode_combine import _combine_kernel
    from pagedattn.triton_kernels._decode_kernels import _decode_kernel
    from pagedattn.triton_kernels import block_copy as BC
    from pagedattn.triton_kernels import kv_store as KS
    from pagedattn.triton_kernels.block_copy import _copy_blocks_kernel
    from pagedattn.triton_kernels.extend import _extend_fwd
    from pagedattn.triton_kernels.kv_store import _FP8_GRID, _store_kv_kernel

    target = GPUTarget("hip", arch, 64)
    int_ptrs = {"block_table_ptr", "seq_lens_ptr", "bt_ptr", "cu_ptr", "lens_ptr",
                "mask_indptr_ptr", "slot_mapping_ptr", "err_ptr"}
    f32_ptrs = {"lse_ptr", "ws_ml_ptr", "ws_o_ptr", "k_scale_ptr", "v_scale_ptr", "slopes_ptr",
                "sinks_ptr", "kscale_ptr", "vscale_ptr", "alibi_ptr"}
    floats = {"scale", "cap", "sm_scale", "logit_cap"}

    def build(name, fn, cst, warps, stages=1, ptrs=None, extra=None):
        names = fn.arg_names
        missing = [p.name for p in fn.params if p.is_constexpr and p.name not in cst]
        assert not missing, f"{name}: constexprs not set: {missing}"
        ptrs = ptrs or {}

        def ty(n):
            if n in cst:
                return "constexpr"
            if n.endswith("_ptr"):
                return ptrs.get(n) or ("*i32" if n in int_ptrs else "*fp32" if n in f32_ptrs
                                       else "*u8" if n == "mask_ptr" else "*bf16")
            if n.startswith("stride"):
                return "i64"
            return "fp32" if n in floats else "i32"
        attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
                 if n.endswith("_ptr") or n.startswith("stride")}
        src = ASTSource(fn, {n: ty(n) for n in names},
                        constexprs={(names.index(k),): v for k, v in cst.items() if k in names},
                        attrs=attrs)
        k = triton.compile(src, target=target,
                           options=dict(num_warps=warps, num_stages=stages, **(extra or {})))
        text = k.asm["amdgcn"]

        def meta(key):
            m = re.search(rf"\.{key}:\s+(\d+)", text)
            return int(m.group(1)) if m else -1
        print(name, meta("vgpr_count"), meta("vgpr_spill_count"),
              meta("private_segment_fixed_size"), k.metadata.shared, flush=True)

    guard = dict(GUARD=True, HAS_ERR=True)
    fp8 = {torch.float8_e4m3fn: "*fp8e4nv", torch.float8_e5m2: "*fp8e5"}
    # decode: D 128, group 4 (rows bucket 16) and group 8 x 8 query tokens (bucket 64)
    for rows, lq in ((4, 1), (64, 8)):
        for kv in (torch.bfloat16, torch.float8_e4m3fn):
            kv_bytes = 1 if kv != torch.bfloat16 else 2
            fam = "amd"
            key = (128, 16 if rows <= 16 else 64)
            block_n, warps, stages = (DC._FP8_CONFIGS.get((fam, key)) if kv_bytes == 1 else None
                                      ) or DC._CONFIGS[fam][key]
            block_m = max(16, triton.next_power_of_2(rows))
            for mode in ("one_pass", "balance", "split_multi"):
                cst = dict(G=rows // lq, R=rows, D=128, BLOCK_D=128, HAS_SINK=False,
                           HAS_KV_SCALE=kv_bytes == 1, RETURN_LSE=True, BS=16,
                           K_X=128, K_SPLIT=False, K_LO_ONE=True, V_LO_ONE=True,
                           BLOCK_N=block_n, ONE_BLOCK=False, ONE_PASS=mode == "one_pass",
                           MULTI=mode == "split_multi", LAZY_L=DC._lazy_rowsum(block_m, block_n),
                           PDL=False, PPP=2 if mode == "split_multi" else 1, CAUSAL=lq > 1,
                           HAS_WINDOW=False, HAS_CAP=False, HAS_ALIBI=False, IEEE=False,
                           F16_DOT=DC._f16_dot(torch.bfloat16, kv, None), BLOCK_M=block_m,
                           NB=8, FILL_N=9, SLOTS=1, FINE=1, BAL=mode == "balance", NB_BLOCK=256, PART=512,
                           DV=128, BLOCK_DV=128, HAS_TAIL=False, BLOCK_DT=16, V_IS_K=False,
                           HSPLIT=1, **guard)
                kvt = fp8.get(kv, "*bf16")
                build(f"decode_rows{rows}_{str(kv)[6:]}_{mode}", _decode_kernel, cst, warps,
                      stages, ptrs={"k_ptr": kvt, "v_ptr": kvt})
    # MLA's absorbed decode: K 576 = 512 + a 64-column tail, V the K tile, 16 rows a program
    mbn, mwarps, mstages = DC._CONFIGS["amd"][(1024, 16)]
    for mode in ("one_pass", "balance"):
        build(f"decode_mla_{mode}", _decode_kernel, dict(
            G=128, R=16, D=576, BLOCK_D=512, HAS_SINK=False, HAS_KV_SCALE=False, RETURN_LSE=True,
            BS=16, K_X=576, K_SPLIT=False, K_LO_ONE=True, V_LO_ONE=True, BLOCK_N=mbn,
            ONE_BLOCK=True, ONE_PASS=mode == "one_pass", MULTI=False,
            LAZY_L=DC._lazy_rowsum(16, mbn), PDL=False, PPP=1, CAUSAL=False, HAS_WINDOW=False,
            HAS_CAP=False, HAS_ALIBI=False, IEEE=False, F16_DOT=False, BLOCK_M=16, NB=8,
            FILL_N=9, SLOTS=1, FINE=1, BAL=mode == "balance", NB_BLOCK=256, PART=512, DV=512,
            BLOCK_DV=512, HAS_TAIL=True, BLOCK_DT=64, V_IS_K=True, HSPLIT=8, **guard),
            mwarps, mstages)
    unroll, cw, dsplit, cstages = DC._combine_config(128, 64)
    for bal in (False, True):
        build(f"combine_bal{int(bal)}", _combine_kernel,
              dict(G=4, R=4, D=128, BLOCK_D=128, HAS_SINK=False, HAS_KV_SCALE=False,
                   RETURN_LSE=True, UNROLL=unroll, DSPLIT=dsplit, C_STAGES=cstages, PDL=False,
                   NB=8, FILL_N=9, SLOTS=1, FINE=1, BAL=bal, NB_BLOCK=256, GUARD=True,
                   HSPLIT=1), cw)
    # extend: the gfx9 defaults of every head dim, each loop the launcher picks
    for d in (64, 128, 256):
        cfg = EC._DEFAULTS["gfx9"][d]
        for loop, new_from_cache, has_mask in (("onepass", True, False),
                                               ("onepass_knew", False, False),
                                               ("twostage_mask", True, True)):
            one = loop.startswith("onepass")
            c = EL.tile_config(cfg, "gfx9") if one else cfg
            cst = dict(K_X=8, K_SPLIT=False, K_LO_ONE=True, V_LO_ONE=True, GROUP=4, GROUP_P=4,
                       HEAD_DIM=d, HEAD_DIM_P=d, PAGE=16, CAUSAL=True,
                       NEW_FROM_CACHE=new_from_cache, HAS_MASK=has_mask, HAS_WINDOW=False,
                       HAS_CAP=False, HAS_ALIBI=False, HAS_SINKS=False, KV_FP8=False,
                       RETURN_LSE=True, IEEE=False, ONE_LOOP=one, BLOCK_M=c.block_m,
                       BLOCK_N=c.block_n, BLOCK_NM=EC.masked_tile(c), HEAD_DIM_V=d,
                       HEAD_DIM_VP=d, VN_SAME=True, **guard)
            build(f"extend_d{d}_{loop}", _extend_fwd, cst, c.num_warps, c.num_stages,
                  extra=dict(waves_per_eu=c.waves_per_eu,
                             matrix_instr_nonkdim=c.matrix_instr_nonkdim))
    for kv, dup in ((torch.bfloat16, False), (torch.float8_e4m3fn, True)):
        is8 = kv != torch.bfloat16
        mbits, emin = _FP8_GRID.get(kv, (0, 0))
        kvt = fp8.get(kv, "*bf16")
        build(f"store_kv_{str(kv)[6:]}_dup{int(dup)}", _store_kv_kernel,
              dict(D=128, BS=16, BLOCK_D=128, K_X=8, K_SPLIT=True, K_LO_ONE=True, V_LO_ONE=True,
                   FP8=is8, FMAX=float(torch.finfo(kv).max) if is8 else 0.0, MBITS=mbits,
                   EMIN=emin, DUP_MASK=dup, BLOCK_T=KS.BLOCK_T, DV=128, BLOCK_DV=128,
                   HAS_V=True, **guard), 1,
              ptrs={"k_cache_ptr": kvt, "v_cache_ptr": kvt, "dup_ptr": "*u8",
                    "errors_ptr": "*i32"})
    for flat, mask in ((True, False), (False, True)):
        build(f"copy_blocks_flat{int(flat)}_mask{int(mask)}", _copy_blocks_kernel,
              dict(N2=16, N3=8, N4=16, FLAT=flat, BLOCK=4096, CLASH_MASK=mask,
                   BLOCK_P=BC.BLOCK_P, **guard), 4,
              ptrs={"cache_ptr": "*i16", "block_mapping_ptr": "*i64", "clash_ptr": "*u8",
                    "errors_ptr": "*i32"})


@pytest.mark.parametrize("arch", ["gfx90a", "gfx942"])
def test_triton_kernels_compile_for_amd_without_scratch(arch):
    _targets()
    here = os.path.dirname(os.path.abspath(__file__))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(here), here, env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c",
                        f"import test_triton_amd_compile as t; t._compile_all({arch!r})"],
                       capture_output=True, text=True, env=env, cwd=here, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    rows = [line.split() for line in r.stdout.splitlines() if len(line.split()) == 5]
    assert len(rows) >= 25, r.stdout
    bad = [f"{name}: vgpr {v}, spills {s}, scratch {p} B, LDS {lds} B"
           for name, v, s, p, lds in rows
           if int(s) != 0 or int(p) != 0 or not 0 <= int(lds) <= LDS_BYTES]
    assert not bad, "\n".join(bad)
