"""The decode kernels compiled offline for a real target (no GPU needed).

The interpreter never runs Triton's compiler, so it cannot catch what only the compiler rejects,
nor a loop whose K/V copies stop overlapping. NOTE: the sm_90 loop must wait with num > 0: when
a tile's block ids were loaded in the same iteration as the K/V they address, every copy was
drained per tile (async_wait num = 0) and small-batch decode paid the full memory latency per
tile (docs/performance.md).
"""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

SCRIPT = r"""
import re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from pagedattn.triton_kernels import _decode_configs as D
from pagedattn.triton_kernels.decode import _combine_kernel, _decode_kernel
from gluon_offline import resource_usage

INT_PTRS = ("block_table_ptr", "seq_lens_ptr", "err_ptr")
I64_PTRS = ()
DATA_PTRS = ("q_ptr", "k_ptr", "v_ptr", "out_ptr")
KV_TYPE = "bf16"


def compile_one(fn, cst, floats, num_warps=4, num_stages=3, **options):
    names = fn.arg_names

    def ty(n):
        if n in cst:
            return "constexpr"
        if n.endswith("_ptr"):
            if n in ("k_ptr", "v_ptr"):
                return "*" + KV_TYPE
            return ("*i32" if n in INT_PTRS else "*i64" if n in I64_PTRS
                    else "*bf16" if n in DATA_PTRS else "*fp32")
        if n.startswith("stride"):
            return "i64"
        return "fp32" if n in floats else "i32"
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if n.endswith("_ptr") or n.startswith("stride")}
    src = ASTSource(fn, {n: ty(n) for n in names},
                    constexprs={(names.index(k),): v for k, v in cst.items()}, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=num_warps, num_stages=num_stages, **options))


def spills_in_loops(sass):
    # local-memory loads/stores (spills) inside a loop (a backward branch's range) of SASS
    lines = sass.split("\n")
    labels = {m.group(1): i for i, ln in enumerate(lines)
              if (m := re.match(r"\s*(\.?L\w+):", ln))}
    loops = [(labels[m.group(1)], i) for i, ln in enumerate(lines)
             if (m := re.search(r"BRA\s+(\.?L\w+)", ln)) and labels.get(m.group(1), i) < i]
    return [ln.strip() for i, ln in enumerate(lines) if re.search(r"\b(LDL|STL)\b", ln)
            and any(a <= i <= b for a, b in loops)]


bs = int(sys.argv[1])
common = dict(G=4, R=4, D=128, BLOCK_D=128, HAS_SINK=False, HAS_KV_SCALE=False,
              RETURN_LSE=True)
# K and V 128 wide, one tile each, one program per KV head
HEADS = dict(DV=128, BLOCK_DV=128, HAS_TAIL=False, BLOCK_DT=16, V_IS_K=False, HSPLIT=1)
bn, warps, stages = D._CONFIGS["nvidia"][(128, 16)]  # the launcher's tiles for 32/8, D 128
fp8_bn, fp8_warps, fp8_stages = D._FP8_CONFIGS[("nvidia", (128, 16))]
# a small stack at most: the fp8 balanced loop holds 255 registers and up to 16 bytes of
# stack under triton 3.6 (the H200's), 56 under 3.9 (its register allocation differs)
MAX_STACK = 16 if triton.__version__.startswith("3.6.") else 64


def compile_decode(kv, one_pass, multi, bal, opts=False, **options):
    # the decode kernel on the launcher's tiles for kv; opts: sinks, window, soft-cap and ALiBi
    global KV_TYPE
    KV_TYPE = kv
    fp8 = kv != "bf16"
    tile = fp8_bn if fp8 else bn
    return compile_one(_decode_kernel, dict(
        common, HAS_SINK=opts, BS=bs, K_X=128, K_SPLIT=False, K_LO_ONE=True, V_LO_ONE=True,
        BLOCK_M=16, BLOCK_N=tile, PART=512, ONE_BLOCK=bs % tile == 0, ONE_PASS=one_pass,
        MULTI=multi, LAZY_L=D._lazy_rowsum(16, tile), PDL=not one_pass, CAUSAL=False, BAL=bal,
        NB_BLOCK=256, HAS_WINDOW=opts, HAS_CAP=opts, HAS_ALIBI=opts, IEEE=False, F16_DOT=fp8,
        HAS_KV_SCALE=fp8, GUARD=True, HAS_ERR=True, **HEADS), ("scale", "cap"),
        num_warps=fp8_warps if fp8 else warps, num_stages=fp8_stages if fp8 else stages,
        **options)


# bf16 caches in all three launch shapes (BAL: the balanced split launch); an e4m3 cache
# one-pass and balanced with fp16 dots (F16_DOT) on the launcher's fp8 tiles
for kv, one_pass, multi, bal in (("bf16", False, False, False), ("bf16", True, False, False),
                                 ("bf16", False, True, False), ("fp8e4nv", True, False, False),
                                 ("bf16", False, False, True), ("fp8e4nv", False, False, True)):
    fp8 = kv != "bf16"
    k = compile_decode(kv, one_pass, multi, bal)
    waits = [int(n) for n in re.findall(r"async_wait[^\n]*?num = (\d+)", k.asm["ttgir"])]
    assert waits and max(waits) >= 1, f"{kv}: K/V copies never overlap across tiles: {waits}"
    if fp8:  # the dots take fp16 operands (F16_DOT), not bf16 (more conversion instructions)
        assert "xf16" in k.asm["ttgir"], "fp8 cache: the dots do not run in fp16"
    res = resource_usage(k)
    print(kv, one_pass, multi, bal, res)
    if res is not None:
        assert int(re.search(r"STACK:(\d+)", res).group(1)) <= MAX_STACK, res
# The balanced 16-bit launch at its register cap (D._BAL_MAXNREG, where this triton has one): as
# many programs resident per SM as decode._slots plans from shared memory and warps, and nothing
# spilled inside a tile loop, plain and with every option.
cap = D.bal_maxnreg(128, 4, 2)
smem = stages * bn * 128 * 2 * 2 + 16 * 128 * 2            # decode.run's count for the plan
per_sm = min(228 * 1024 // smem, 64 // warps)
assert cap is None or cap * 32 * warps * per_sm <= 65536, (cap, per_sm)
for opts in (False, True) if cap else ():
    k = compile_decode("bf16", False, False, True, opts, maxnreg=cap)
    res = resource_usage(k)
    print("balanced at its cap", opts, res)
    if res is not None:
        regs = int(re.search(r"REG:(\d+)", res).group(1))
        stack = int(re.search(r"STACK:(\d+)", res).group(1))
        assert regs <= cap and stack <= MAX_STACK, res
    try:
        sass = k.asm["sass"]
    except (KeyError, RuntimeError, OSError):   # no nvdisasm with this triton
        sass = ""
    assert not spills_in_loops(sass), spills_in_loops(sass)[:4]
KV_TYPE = "bf16"
unroll, warps, dsplit, c_stages = D.SPLIT_COMBINE
for bal in (False, True):
    k = compile_one(_combine_kernel, dict(common, UNROLL=unroll, DSPLIT=dsplit,
                                          C_STAGES=c_stages, PDL=True, BAL=bal, NB_BLOCK=256,
                                          GUARD=True, HSPLIT=1), (),
                    num_warps=warps)
    assert "griddepcontrol.wait" in k.asm["ptx"]
# MLA's absorbed decode on the launcher's tiles (decode.head_tiles, _head_split, the (1024, 16)
# config): K 576 = a 512-column tile + a 64-column tail, V the K tile's 512 columns, 16 of the
# group's rows per program; one-pass, split and balanced
mla_bn, mla_warps, mla_stages = D._CONFIGS["nvidia"][(1024, 16)]
for one_pass, multi, bal in ((True, False, False), (False, True, False), (False, False, True)):
    k = compile_one(_decode_kernel, dict(
        common, G=128, R=16, D=576, BLOCK_D=512, DV=512, BLOCK_DV=512, HAS_TAIL=True,
        BLOCK_DT=64, V_IS_K=True, HSPLIT=8, BS=bs, K_X=576, K_SPLIT=False, K_LO_ONE=True,
        V_LO_ONE=True, BLOCK_M=16, BLOCK_N=mla_bn, PART=512, ONE_BLOCK=bs % mla_bn == 0,
        ONE_PASS=one_pass, MULTI=multi, LAZY_L=D._lazy_rowsum(16, mla_bn), PDL=not one_pass,
        CAUSAL=False, BAL=bal, NB_BLOCK=256, HAS_WINDOW=False, HAS_CAP=False,
        HAS_ALIBI=False, IEEE=False, F16_DOT=False, GUARD=True, HAS_ERR=True),
        ("scale", "cap"), num_warps=mla_warps, num_stages=mla_stages)
    res = resource_usage(k)
    print("mla", one_pass, multi, bal, res, "smem", k.metadata.shared)
    assert k.metadata.shared <= 228 * 1024, k.metadata.shared
print("DECODE_COMPILES_OK")
"""


@pytest.mark.parametrize("block_size", [16, 64], ids=["per-token-ids", "one-id-per-tile"])
def test_decode_compiles_for_sm90_with_overlapping_copies(block_size):
    triton = pytest.importorskip("triton")
    if "nvidia" not in getattr(triton.backends, "backends", {}):
        pytest.skip("this triton build has no nvidia backend")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(HERE), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(block_size)], env=env, cwd=HERE,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "DECODE_COMPILES_OK" in r.stdout, r.stderr[-3000:]


GLUON_SCRIPT = r"""
import re, sys
from gluon_offline import compile_sm90, resource_usage
from pagedattn.triton_kernels import _decode_gluon as G

one_pass, multi, d, group, lq, page, bal = (int(x) for x in sys.argv[1:8])
block_n, ns = G.TILE
cst = dict(G=group, R=group * lq, D=d, PAGE=page, PART=512, BLOCK_N=block_n, NS=ns,
           ONE_PASS=bool(one_pass), MULTI=bool(multi), CAUSAL=lq > 1, RETURN_LSE=True,
           PDL=not one_pass, BAL=bool(bal), NB_BLOCK=256, GUARD=True, HAS_ERR=True,
           num_warps=G.NUM_WARPS)
rows = group * lq
kernel, smem = G.decode_sm90, G.smem_bytes(d, block_n, ns, rows=rows, bal=bool(bal))
if G.form(rows, block_n) == "swap":  # keys on the wgmma's M side: N = the rows padded to 8+
    from pagedattn.triton_kernels import _decode_gluon_swap as S
    cst["NQ"] = S.rows_padded(rows)
    kernel = S.decode_sm90_swap
ck = compile_sm90(kernel, cst, {"bt_ptr": "*i32", "lens_ptr": "*i32", "lse_ptr": "*fp32",
                                "ws_ml_ptr": "*fp32", "ws_o_ptr": "*fp32", "err_ptr": "*i32"},
                 G.NUM_WARPS)
n = cst.get("NQ", 64)
assert f"wgmma.mma_async.sync.aligned.m64n{n}k16" in ck.asm["ptx"] and "cp.async" in ck.asm["ptx"]
assert ("griddepcontrol.launch_dependents" in ck.asm["ptx"]) == (not one_pass)
assert ck.metadata.shared == smem, (ck.metadata.shared, smem)  # the planner's count, exact
# two programs per SM (228 KB, 1 KB reserved per block) at D 128
assert 2 * (ck.metadata.shared + 1024) <= 233472, ck.metadata.shared
res = resource_usage(ck)
if res is not None:
    assert re.search(r"STACK:0\b", res), f"the kernel spills: {res}"
    regs = int(re.search(r"REG:(\d+)", res).group(1))
    assert regs <= 255, regs
print("GLUON_DECODE_COMPILES_OK")
"""


@pytest.mark.parametrize("form", ["1,0,128,4,1,16,0", "0,0,128,4,1,16,0", "0,1,128,4,1,64,0",
                                  "1,0,64,64,1,1,0", "1,0,128,8,4,256,0", "0,0,128,1,1,16,0",
                                  "1,0,128,1,1,16,0", "0,1,128,1,1,16,0", "0,0,64,1,1,1,0",
                                  "0,0,128,4,1,64,1", "0,0,128,8,4,16,1", "0,0,128,1,1,16,1",
                                  "0,0,64,1,1,1,1"],
                         ids=["one-pass", "split", "split-multi", "mqa-d64-page1",
                              "spec-decode-page256", "swap-split", "swap-one-pass",
                              "swap-split-multi", "swap-mha-d64-page1", "balanced",
                              "balanced-spec-decode", "swap-balanced", "swap-balanced-d64-page1"])
def test_gluon_decode_compiles_for_sm90(form):
    """The Gluon decode kernel (triton 3.6 only: Gluon's API moves between releases) for sm_90:
    async wgmma and cp.async, the shared memory the launcher plans with, no spills."""
    triton = pytest.importorskip("triton")
    if not triton.__version__.startswith("3.6."):
        pytest.skip("the Gluon decode kernel is written for triton 3.6")
    if "nvidia" not in getattr(triton.backends, "backends", {}):
        pytest.skip("this triton build has no nvidia backend")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(HERE), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", GLUON_SCRIPT, *form.split(",")], env=env, cwd=HERE,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "GLUON_DECODE_COMPILES_OK" in r.stdout, r.stderr[-3000:]
