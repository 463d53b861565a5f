"""The hip backend (CUDA, ROCm and DTK builds alike) vs the float64 oracle.

The oracle and its tolerances (tests/attn_utils.py), the grid (dtypes, layouts, GQA, head dims,
block sizes, seq_len 1 / exact multiples / empty rows, ragged extend with prefix 0 and
non-multiples), and the address checks (poisoned caches everywhere; element offsets past 2^31).
The first test JIT-compiles the extension (minutes; the time is printed); later runs reuse
~/.cache/pagedattn/hip-<hash>.
"""
import itertools
import time

import pytest
import torch

import pagedattn as pa
from attn_utils import (assert_attn_close, assert_lse_close, dense_attention, dense_kv,
                        make_paged_batch, tol_key)

pytestmark = pytest.mark.gpu

HEADS = [(8, 8), (16, 4), (32, 4)]  # GQA 1, 4, 8
DTYPES = [(q, kv) for q in (torch.float16, torch.bfloat16)
          for kv in (q, torch.float8_e4m3fn, torch.float8_e5m2)]
LAYOUTS = ["bhsd", "bshd", "hcu"]
DIM_BLOCK = [(128, 16), (64, 64), (128, 64), (64, 16)]  # (head_dim, block_size), cycled
# seq_len 1, a whole KV tile, empty, one past a page, several partitions (256 with group > 15)
# and an exact multiple of the 512 partition.
LENS = [1, 64, 0, 65, 700, 1024]


def _id(x):
    return str(x).replace("torch.", "").replace("float8_", "")


DECODE_CASES = [(q, kv, lay, heads) + DIM_BLOCK[i % len(DIM_BLOCK)]
                for i, ((q, kv), lay, heads) in enumerate(itertools.product(DTYPES, LAYOUTS, HEADS))]


@pytest.fixture(scope="module", autouse=True)
def built():
    """Build (or load) the extension once and report how long it took."""
    from pagedattn.hip_kernels import build
    t0 = time.time()
    try:
        build.load()
    except Exception as e:  # a broken toolchain is a failure here, not a skip
        pytest.fail(f"hip backend build failed: {e}")
    print(f"\nhip backend ready in {time.time() - t0:.1f} s")


def _check_decode(b, q, out, lse, lens, kv):
    key = tol_key(q.dtype, kv)
    d = q.shape[-1]
    for i, n in enumerate(lens):
        if n == 0:
            assert torch.all(out[i] == 0), "empty sequence: output not exactly zero"
            if lse is not None:
                assert torch.all(torch.isneginf(lse[i])), "empty sequence: lse not -inf"
            continue
        k, v = dense_kv(b, i, n)
        ro, rl = dense_attention(q[i:i + 1].cpu(), k.cpu(), v.cpu(), [n - 1], scale=d ** -0.5)
        assert_attn_close(out[i:i + 1], ro, key, what=f"seq {i} (len {n})",
                          magnitude_guard=False)
        if lse is not None:
            assert_lse_close(lse[i:i + 1], rl, key)


def _decode_poisoned(b, q, layout, part, rows=slice(None), **kw):
    """hip_kernels.decode_raw on rows of the batch into NaN-poisoned out and lse."""
    from pagedattn import hip_kernels as H
    out = torch.full_like(q[rows], float("nan"))
    lse = torch.full(out.shape[:-1], float("nan"), device="cuda")
    H.decode_raw(q[rows], b.k_cache, b.v_cache, b.block_table[rows], b.seq_lens[rows], out,
                 layout=layout, k_scale=b.k_scale, v_scale=b.v_scale, partition_size=part,
                 lse=lse, **kw)
    return out, lse


def _batch(lens, hkv, d, bs, layout, kv, seed=0, **kw):
    gen = torch.Generator().manual_seed(seed)
    return make_paged_batch(lens, num_kv_heads=hkv, head_dim=d, block_size=bs, layout=layout,
                            dtype=kv, device="cuda", gen=gen, **kw), gen


@pytest.mark.parametrize("dtype,kv,layout,heads,d,bs", DECODE_CASES, ids=_id)
def test_decode_vs_oracle(dtype, kv, layout, heads, d, bs):
    hq, hkv = heads
    b, gen = _batch(LENS, hkv, d, bs, layout, kv)
    q = torch.randn(len(LENS), hq, d, generator=gen).to("cuda", dtype)
    out, lse = pa.paged_decode(q, b.k_cache, b.v_cache, b.block_table, b.seq_lens, layout=layout,
                               k_scale=b.k_scale, v_scale=b.v_scale, backend="hip",
                               return_lse=True)
    _check_decode(b, q, out, lse, LENS, kv)


@pytest.mark.parametrize("partition_size", [64, 128, 2048])
def test_decode_partitions(partition_size):
    """Split-KV with many partitions / a single pass. 8300 keys at partition 64 make 130
    partitions: the combine's third round of 64 (combine.cuh)."""
    from pagedattn import hip_kernels as H
    lens = [1, 300, 1500, 0, 8300]
    b, gen = _batch(lens, 2, 128, 16, "bhsd", torch.bfloat16, seed=1)
    q = torch.randn(len(lens), 16, 128, generator=gen).to("cuda", torch.bfloat16)
    out = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:-1], float("nan"), device="cuda")
    H.decode_raw(q, b.k_cache, b.v_cache, b.block_table, b.seq_lens, out, layout="bhsd",
                 partition_size=partition_size, lse=lse)
    _check_decode(b, q, out, lse, lens, torch.bfloat16)


# (layout, (Hq, Hkv), partition_size): GQA 4, MHA with the V^T (hcu) copies, a group of 32
# (two row tiles) on 64-key partitions.
INVARIANCE_CASES = [("bhsd", (32, 8), 512), ("hcu", (16, 16), 128), ("bshd", (64, 2), 64)]


@pytest.mark.parametrize("layout,heads,part", INVARIANCE_CASES, ids=_id)
def test_decode_batch_invariance(layout, heads, part):
    """Each sequence alone gives the bits it gets in the batch (split points depend on the
    sequence only), over empty, exact-multiple and ragged lengths; the batch matches the oracle."""
    hq, hkv = heads
    lens = [1, 0, 1500, 512, 64, 2049, 3]
    b, gen = _batch(lens, hkv, 128, 16, layout, torch.bfloat16, seed=4)
    q = torch.randn(len(lens), hq, 128, generator=gen).to("cuda", torch.bfloat16)
    out, lse = _decode_poisoned(b, q, layout, part)
    _check_decode(b, q, out, lse, lens, torch.bfloat16)
    for i in range(len(lens)):
        o, l = _decode_poisoned(b, q, layout, part, rows=slice(i, i + 1))
        assert torch.equal(o, out[i:i + 1]) and torch.equal(l, lse[i:i + 1]), \
            f"sequence {i} alone differs from the batch"


# (layout, (Hq, Hkv), head_dim, q dtype, partition_size, KV dtype): the column-split kernel
# (groups <= 16) in every layout and head dim, and attn_kernel (fp8; a group of 32), whose
# launcher always splits one partition per block.
SHAPE_CASES = [("bhsd", (32, 8), 128, torch.bfloat16, 512, None),
               ("hcu", (16, 16), 128, torch.float16, 128, None),
               ("bshd", (8, 2), 64, torch.bfloat16, 64, None),
               ("hcu", (4, 4), 64, torch.float16, 256, None),
               ("bhsd", (8, 2), 128, torch.bfloat16, 128, torch.float8_e5m2),
               ("bshd", (64, 2), 128, torch.float16, 64, None)]
LAUNCH_SHAPES = [("one_pass", None), ("split", 2), ("split", 3), ("split", 64), ("auto", None)]


@pytest.mark.parametrize("layout,heads,d,dtype,part,kv", SHAPE_CASES, ids=_id)
def test_decode_launch_shapes_same_bits(layout, heads, d, dtype, part, kv):
    """One pass (each block folds all its sequence's partitions), split with 1, 2, 3 or all
    partitions per block (parked states, the combine folds them) and the automatic choice give
    the same bits: the fold order and arithmetic never depend on the launch shape, which is what
    lets the launcher choose it by batch size. 65 partitions take the combine two rounds."""
    hq, hkv = heads
    lens = [1, 0, 1500, 512, 64, 2049, 3, part, part + 1, 64 * part + 1]  # last: 65 partitions
    b, gen = _batch(lens, hkv, d, 16, layout, kv or dtype, seed=5)
    q = torch.randn(len(lens), hq, d, generator=gen).to("cuda", dtype)
    out, lse = _decode_poisoned(b, q, layout, part, mode="split", parts_per_block=1)
    _check_decode(b, q, out, lse, lens, kv or dtype)
    for mode, ppp in LAUNCH_SHAPES:
        o, l = _decode_poisoned(b, q, layout, part, mode=mode, parts_per_block=ppp)
        assert torch.equal(o, out) and torch.equal(l, lse), f"{mode} x{ppp} differs from split x1"


@pytest.mark.parametrize("heads", [(64, 1), (80, 1), (48, 2)], ids=_id)
def test_decode_large_groups(heads):
    """REUSE_KV_TIMES 64 and 48, and a group larger than 64 (two head groups per KV head)."""
    hq, hkv = heads
    lens = [37, 513]
    b, gen = _batch(lens, hkv, 64, 16, "bshd", torch.float16, seed=2)
    q = torch.randn(len(lens), hq, 64, generator=gen).to("cuda", torch.float16)
    out = pa.paged_decode(q, b.k_cache, b.v_cache, b.block_table, b.seq_lens, layout="bshd",
                          backend="hip")
    _check_decode(b, q, out, None, lens, torch.float16)


def test_decode_noncontiguous_cache_and_q_slice():
    """A padded cache view and q as a slice of a fused qkv tensor (strided inputs)."""
    lens = [17, 200]
    b, gen = _batch(lens, 2, 128, 16, "bhsd", torch.float16, seed=3, contiguous=False)
    qkv = torch.randn(len(lens), 8 + 2 * 2, 128, generator=gen).to("cuda", torch.float16)
    q = qkv[:, :8]
    out = pa.paged_decode(q, b.k_cache, b.v_cache, b.block_table, b.seq_lens, backend="hip")
    _check_decode(b, q, out, None, lens, torch.float16)


EXTEND_CASES = [(dt, lay, heads, d) for dt in (torch.float16, torch.bfloat16)
                for lay in ("bhsd", "bshd") for heads in HEADS for d in (64, 128)]


@pytest.mark.parametrize("dtype,layout,heads,d", EXTEND_CASES, ids=_id)
def test_extend_vs_oracle(dtype, layout, heads, d):
    hq, hkv = heads
    lq = [1, 70, 5, 130, 64]
    lens = [1, 70, 100, 300, 64 + 128]  # prefix 0, 0, 95, 170, 128
    bs = 16 if d == 128 else 64
    b, gen = _batch(lens, hkv, d, bs, layout, dtype, seed=4)
    q = torch.randn(sum(lq), hq, d, generator=gen).to("cuda", dtype)
    cu = torch.tensor([0] + list(itertools.accumulate(lq)), dtype=torch.int32, device="cuda")
    out, lse = pa.extend_attention(q, b.k_cache, b.v_cache, b.block_table, cu, b.seq_lens,
                                   layout=layout, backend="hip", return_lse=True)
    key = tol_key(dtype, dtype)
    for i, (m, n) in enumerate(zip(lq, lens)):
        rows = slice(int(cu[i]), int(cu[i + 1]))
        k, v = dense_kv(b, i, n)
        ro, rl = dense_attention(q[rows].cpu(), k.cpu(), v.cpu(), range(n - m, n), scale=d ** -0.5)
        assert_attn_close(out[rows], ro, key, what=f"request {i}", magnitude_guard=False)
        assert_lse_close(lse[rows], rl, key)


def test_decode_int32_overflow():
    """64-bit offsets: the pages used sit past element offset 2^31 of the K and V caches."""
    bs, hkv, d, hq = 16, 8, 128, 32
    num_blocks = 140_000
    stride = bs * hkv * d
    assert (num_blocks - 1) * stride > 2 ** 31  # the test's own threshold arithmetic
    try:
        k = torch.full((num_blocks, hkv, bs, d), float("nan"), dtype=torch.float16, device="cuda")
        v = torch.full_like(k, float("nan"))
    except torch.cuda.OutOfMemoryError:
        pytest.skip("not enough GPU memory for a 2^31-element cache")
    gen = torch.Generator().manual_seed(5)
    lens = [1000, 33]
    pages = [(n + bs - 1) // bs for n in lens]
    top = torch.arange(num_blocks - sum(pages), num_blocks)
    top = top[torch.randperm(top.numel(), generator=gen)]
    table = torch.full((2, max(pages)), -1, dtype=torch.int32)
    table[0, :pages[0]] = top[:pages[0]].int()
    table[1, :pages[1]] = top[pages[0]:].int()
    for i, n in enumerate(lens):
        for t in range(0, n, bs):
            blk = int(table[i, t // bs])
            cnt = min(bs, n - t)
            k[blk, :, :cnt] = torch.randn(hkv, cnt, d, generator=gen).to("cuda", torch.float16)
            v[blk, :, :cnt] = torch.randn(hkv, cnt, d, generator=gen).to("cuda", torch.float16)
    table, seq_lens = table.cuda(), torch.tensor(lens, dtype=torch.int32, device="cuda")
    q = torch.randn(2, hq, d, generator=gen).to("cuda", torch.float16)
    out = pa.paged_decode(q, k, v, table, seq_lens, backend="hip")
    for i, n in enumerate(lens):
        blk = table[i, :pages[i]].long()
        kk = k[blk].permute(0, 2, 1, 3).reshape(-1, hkv, d)[:n].cpu().double()
        vv = v[blk].permute(0, 2, 1, 3).reshape(-1, hkv, d)[:n].cpu().double()
        ro, _ = dense_attention(q[i:i + 1].cpu(), kk, vv, [n - 1], scale=d ** -0.5)
        assert_attn_close(out[i:i + 1], ro, torch.float16, magnitude_guard=False)
    del k, v
    torch.cuda.empty_cache()


# One well-formed raw-op batch.
HOST_CHECK_SETUP = r"""
import sys, torch
from attn_utils import make_paged_batch
from pagedattn.hip_kernels import build
ops = build.load()
gen = torch.Generator().manual_seed(0)
b = make_paged_batch([20], num_kv_heads=2, head_dim=64, block_size=16, layout="bhsd",
                     dtype=torch.float16, device="cuda", gen=gen)
q = torch.randn(1, 4, 64, generator=gen).to("cuda", torch.float16)
out = torch.empty_like(q)
"""
HOST_CHECK_SCRIPT = HOST_CHECK_SETUP + r"""
ops.paged_decode(q, b.k_cache, b.v_cache, b.block_table, b.seq_lens, out, None, None, None,
                 0, 0.125, 512, -1, 0)  # the well-formed call runs
bad = {
    "block_table": lambda: ops.paged_decode(q, b.k_cache, b.v_cache, b.block_table.long(),
                                            b.seq_lens, out, None, None, None, 0, 0.125, 512, -1, 0),
    "out": lambda: ops.paged_decode(q, b.k_cache, b.v_cache, b.block_table, b.seq_lens,
                                    out[:, :2], None, None, None, 0, 0.125, 512, -1, 0),
    "num_q_heads": lambda: ops.paged_decode(q[:, :3], b.k_cache, b.v_cache, b.block_table,
                                            b.seq_lens, out[:, :3], None, None, None, 0, 0.125,
                                            512, -1, 0),
}
for word, fn in bad.items():
    print("case", word, flush=True)
    try:
        fn()
    except RuntimeError as e:
        assert word in str(e), (word, str(e)[:200])
    else:
        sys.exit(f"no error for bad {word}")
print("HOST_CHECKS_OK")
"""


def test_host_checks_reject_bad_inputs():
    """The C++ entry validates on its own (direct op calls bypass the Python checks).

    NOTE: run in a subprocess: a crash in the host checks (a SIGSEGV inside a TORCH_CHECK message
    with torch 2.11, see bindings.cpp) must fail this test, not kill the GPU tier.
    """
    import os
    import subprocess
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([here, os.path.dirname(here),
                                                         os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-X", "faulthandler", "-c", HOST_CHECK_SCRIPT],
                       capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0 and "HOST_CHECKS_OK" in r.stdout, \
        f"rc {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=_id)
def test_mma_probe_matches_torch(dtype):
    """The matrix-unit probe: C = A B^T through pk_mma.h's lane maps on this device, against a
    float64 product of the same 16-bit tiles; a transposed or permuted layout fails here."""
    from pagedattn import hip_kernels as H
    gen = torch.Generator().manual_seed(6)
    a, b = (torch.randn(16, 16, generator=gen).to(dtype) for _ in range(2))
    c = H.mma_probe(a.cuda(), b.cuda())
    ref = a.double() @ b.double().T
    torch.testing.assert_close(c.cpu().double(), ref, atol=1e-4, rtol=1e-5)
    assert not torch.allclose(c.cpu().double(), ref.T, atol=1e-2), "probe output transposed"
