"""The decode kernels compiled offline for a real target (no GPU needed).

The interpreter never runs Triton's compiler, so it cannot catch what only the compiler rejects,
nor a loop whose K/V copies stop overlapping. NOTE: the sm_90 loop must wait with num > 0: when
a tile's block ids were loaded in the same iteration as the K/V they address, every copy was
drained per tile (async_wait num = 0) and small-batch decode paid the full memory latency per
tile (bench/NOTES.md).
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

INT_PTRS = ("block_table_ptr", "seq_lens_ptr", "cnt_ptr")
I64_PTRS = ("tl_ptr",)
DATA_PTRS = ("q_ptr", "k_ptr", "v_ptr", "out_ptr")
KV_TYPE = "bf16"


def compile_one(fn, cst, floats, num_warps=4, num_stages=3):
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
                          options=dict(num_warps=num_warps, num_stages=num_stages))


bs = int(sys.argv[1])
common = dict(G=4, R=4, D=128, BLOCK_D=128, HAS_SINK=False, HAS_KV_SCALE=False,
              RETURN_LSE=True)
bn, warps, stages = D._CONFIGS["nvidia"][(128, 16)]  # the launcher's tiles for 32/8, D 128
fp8_bn, fp8_warps, fp8_stages = D._FP8_CONFIGS[("nvidia", (128, 16))]
# bf16 caches in all three launch shapes; an e4m3 cache one-pass with fp16 dots (F16_DOT) on the
# launcher's fp8 tiles
# (PAGEDATTN_DECODE_FOLD=last: the split launches merging in the kernel, the launcher's group)
fold_r, fold_u = D._fold_tile(4, 128, warps, 64)
# (TIMELINE: decode_timeline.py's stamps; BAL: the balanced split launch)
for kv, one_pass, multi, fold, stamps, bal in (
        ("bf16", False, False, False, False, False), ("bf16", True, False, False, False, False),
        ("bf16", False, True, False, False, False), ("fp8e4nv", True, False, False, False, False),
        ("bf16", False, False, True, False, False), ("bf16", False, True, True, False, False),
        ("bf16", False, True, False, True, False), ("bf16", False, False, False, False, True),
        ("fp8e4nv", False, False, False, False, True)):
    KV_TYPE = kv
    fp8 = kv != "bf16"
    tile = fp8_bn if fp8 else bn
    k = compile_one(_decode_kernel, dict(
        common, BS=bs, K_X=128, K_SPLIT=False, K_LO_ONE=True, V_LO_ONE=True, BLOCK_M=16,
        BLOCK_N=tile, PART=512, ONE_BLOCK=bs % tile == 0, ONE_PASS=one_pass, MULTI=multi,
        SUB=1, LAZY_L=D._lazy_rowsum(16, tile), FOLD=fold, FOLD_R=fold_r if fold else 1,
        FOLD_UNROLL=fold_u if fold else 1, PDL=not (one_pass or fold), CAUSAL=False,
        TIMELINE=stamps, BAL=bal, NB_BLOCK=256,
        HAS_WINDOW=False, HAS_CAP=False, HAS_ALIBI=False,
        IEEE=False, F16_DOT=fp8, HAS_KV_SCALE=fp8), ("scale", "cap"),
        num_warps=fp8_warps if fp8 else warps, num_stages=fp8_stages if fp8 else stages)
    waits = [int(n) for n in re.findall(r"async_wait[^\n]*?num = (\d+)", k.asm["ttgir"])]
    assert waits and max(waits) >= 1, f"{kv}: K/V copies never overlap across tiles: {waits}"
    if fp8:  # the dots take fp16 operands (F16_DOT), not bf16 (more conversion instructions)
        assert "xf16" in k.asm["ttgir"], "fp8 cache: the dots do not run in fp16"
    assert ("atom.global.gpu.acq_rel.add" in k.asm["ptx"]) == fold
    assert ("%globaltimer" in k.asm["ptx"]) == stamps
    res = resource_usage(k)
    print(kv, one_pass, multi, fold, stamps, bal, res)
    if fold and res is not None:  # the merge's group stays in registers: 4 programs per SM
        regs = int(re.search(r"REG:(\d+)", res).group(1))
        assert re.search(r"STACK:0\b", res) and regs <= 128, res
KV_TYPE = "bf16"
unroll, warps, dsplit, c_stages = D.SPLIT_COMBINE
for bal in (False, True):
    k = compile_one(_combine_kernel, dict(common, UNROLL=unroll, DSPLIT=dsplit,
                                          C_STAGES=c_stages, PDL=True, BAL=bal, NB_BLOCK=256), (),
                    num_warps=warps)
    assert "griddepcontrol.wait" in k.asm["ptx"]
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

one_pass, multi, d, group, lq, page, early, stamps, form, bal = (int(x) for x in sys.argv[1:11])
ROWS, SWAP, WS, PIPE = range(4)  # form: decode_sm90, decode_sm90_swap, decode_sm90_ws, PIPE
block_n, ns = G.TILE
cst = dict(G=group, R=group * lq, D=d, PAGE=page, PART=512, BLOCK_N=block_n, NS=ns,
           ONE_PASS=bool(one_pass), MULTI=bool(multi), CAUSAL=lq > 1, RETURN_LSE=True,
           EARLY=bool(early), PDL=not one_pass, TIMELINE=bool(stamps),
           num_warps=G.NUM_WARPS)
if form != WS:  # the balanced launch (BAL: one-pass and MULTI off)
    cst.update(BAL=bool(bal), NB_BLOCK=256)
if form == PIPE:  # decode_sm90 with its P V wgmma in flight (PIPE: three ring slots)
    cst.update(PIPE=True, NS=3)
    ns = 3
elif form == ROWS:
    cst["PIPE"] = False
kernel, smem = G.decode_sm90, G.smem_bytes(d, block_n, ns, bal=bool(bal))
if form in (SWAP, WS):  # keys on the wgmma's M side: N = the rows padded to a power of 2 >= 8
    from pagedattn.triton_kernels import _decode_gluon_swap as S
    from pagedattn.triton_kernels import _decode_gluon_ws as W
    cst["NQ"] = S.rows_padded(group * lq)
    kernel, smem = S.decode_sm90_swap, S.smem_bytes(d, block_n, ns, group * lq)
    if form == WS:
        kernel, smem = W.decode_sm90_ws, W.smem_bytes(d, block_n, ns, group * lq)
ck = compile_sm90(kernel, cst, {"bt_ptr": "*i32", "lens_ptr": "*i32", "tl_ptr": "*i64",
                                "lse_ptr": "*fp32", "ws_ml_ptr": "*fp32",
                                "ws_o_ptr": "*fp32"}, G.NUM_WARPS)
n = cst.get("NQ", 64)
if form == PIPE:
    assert "wgmma.wait_group.sync.aligned 1;" in ck.asm["ptx"]  # S_t waited, P V in flight
assert f"wgmma.mma_async.sync.aligned.m64n{n}k16" in ck.asm["ptx"] and "cp.async" in ck.asm["ptx"]
assert ("griddepcontrol.launch_dependents" in ck.asm["ptx"]) == (not one_pass)
assert ("globaltimer" in ck.asm["ptx"]) == bool(stamps) == ("%smid" in ck.asm["ptx"])
if form in (ROWS, PIPE):  # decode_sm90 also counts its loop's cycles
    assert ("%clock64" in ck.asm["ptx"]) == bool(stamps)
# the planner's count: exact, or for ws an upper bound within 256 bytes
assert ck.metadata.shared == smem or form == WS and smem - 256 <= ck.metadata.shared <= smem, \
    (ck.metadata.shared, smem)
# two programs per SM (228 KB, 1 KB reserved per block) at D 128
assert 2 * (ck.metadata.shared + 1024) <= 233472, ck.metadata.shared
res = resource_usage(ck)
if res is not None:
    assert re.search(r"STACK:0\b", res), f"the kernel spills: {res}"
    regs = int(re.search(r"REG:(\d+)", res).group(1))
    assert regs <= 255, regs
print("GLUON_DECODE_COMPILES_OK")
"""


@pytest.mark.parametrize("form", ["1,0,128,4,1,16,1,0,0,0", "0,0,128,4,1,16,1,0,0,0",
                                  "0,1,128,4,1,64,1,0,0,0", "1,0,64,64,1,1,1,0,0,0",
                                  "1,0,128,8,4,256,1,0,0,0", "0,0,128,1,1,16,0,0,0,0",
                                  "0,1,128,4,1,16,1,1,0,0", "1,0,128,4,1,16,1,0,1,0",
                                  "0,1,128,8,4,256,0,1,1,0", "0,0,64,1,1,1,1,0,1,0",
                                  "0,1,128,4,1,16,1,0,2,0", "1,0,128,8,4,256,1,1,2,0",
                                  "0,1,128,4,1,16,1,0,3,0", "1,0,128,8,4,256,1,1,3,0",
                                  "0,0,128,4,1,64,1,0,0,1", "0,0,128,8,4,16,1,1,0,1",
                                  "0,0,128,1,1,16,1,0,1,1", "0,0,64,1,1,1,0,1,1,1",
                                  "0,0,128,4,1,64,1,0,3,1"],
                         ids=["one-pass", "split", "split-multi", "mqa-d64-page1",
                              "spec-decode-page256", "split-mha-late", "split-timeline",
                              "swap-one-pass", "swap-spec-decode-late-timeline",
                              "swap-mha-d64-page1", "ws-split-multi", "ws-one-pass-spec-timeline",
                              "pipe-split-multi", "pipe-one-pass-spec-timeline",
                              "balanced", "balanced-spec-decode-timeline", "swap-balanced",
                              "swap-balanced-d64-page1-late-timeline", "pipe-balanced"])
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
