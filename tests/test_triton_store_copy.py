"""Triton store_kv and copy_blocks vs the torch reference (bit-exact) for every layout/dtype, and
their guards in the default mode: bad entries skipped and counted, nothing outside the caches
written (the caches are views inside sentinel-filled buffers)."""
import os
import subprocess
import sys

import pytest
import torch

import pagedattn as pa
from pagedattn import reference as R
from attn_utils import FP8, nan_tensor
from pagedattn.triton_kernels import block_copy, kv_store

LAYOUTS = ["bhsd", "bshd", "vllm", "hcu"]
# (source dtype, cache dtype): plain caches store unchanged, fp8 quantises x / scale
DTYPES = [(torch.float16, torch.float16), (torch.float32, torch.float32),
          (torch.float16, torch.float8_e4m3fn), (torch.float32, torch.float8_e5m2)]


def _bits(t):
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dt", range(len(DTYPES)))
def test_store_kv_matches_reference(layout, dt, device):
    src, cdt = DTYPES[dt]
    gen = torch.Generator().manual_seed(dt * 10 + LAYOUTS.index(layout))
    nb, bs, h, d = 6, 4, 2, 64
    shapes = pa.layouts.kv_cache_shapes(nb, bs, h, d, layout, cdt)
    kc, vc = nan_tensor(shapes[0], cdt, device), nan_tensor(shapes[1], cdt, device)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    t = 7
    k = (torch.randn(t, h, d, generator=gen) * 4).to(device=device, dtype=src)
    v = (torch.randn(t, h, d, generator=gen) * 4).to(device=device, dtype=src)
    k[0, 0, 0] = 1e4  # saturates in e4m3 (max 448) after / 0.37
    slots = torch.tensor([5, -1, 0, 23, 9, -3, 14], dtype=torch.int64, device=device)
    fp8 = cdt in FP8
    ks = torch.tensor([0.37, 1.7], device=device) if fp8 else None
    vs = torch.tensor([3.1, 0.9], device=device) if fp8 else None
    pa.store_kv(k, v, kc, vc, slots, layout=layout, k_scale=ks, v_scale=vs, backend="triton")
    R.store_kv(k, v, kc_ref, vc_ref, slots, layout=layout, k_scale=ks, v_scale=vs)
    assert torch.equal(_bits(kc), _bits(kc_ref)), "k_cache differs from the reference"
    assert torch.equal(_bits(vc), _bits(vc_ref)), "v_cache differs from the reference"


@pytest.mark.parametrize("contiguous", [True, False])
@pytest.mark.parametrize("cdt", [torch.float16, torch.float8_e4m3fn])
def test_copy_blocks_matches_reference(contiguous, cdt, device):
    gen = torch.Generator().manual_seed(3)
    caches = []
    for layout in ("bhsd", "vllm"):  # two "layers" of different layouts in one call
        shapes = pa.layouts.kv_cache_shapes(7, 4, 2, 64, layout, cdt)
        for shp in shapes:
            c = torch.randn(shp, generator=gen).to(cdt).to(device)
            if not contiguous:  # block not contiguous: a view that skips part of dim 1
                big = torch.randn([shp[0], shp[1] + 1] + list(shp[2:]), generator=gen)
                c = big.to(cdt).to(device)[:, 1:]
                assert not c[0].is_contiguous() or not c.is_contiguous()
            caches.append(c)
    mapping = torch.tensor([[1, 4], [2, 0], [6, 5]], dtype=torch.int64, device=device)
    ref = [c.clone() for c in caches]
    R.copy_blocks(ref, mapping)
    pa.copy_blocks(caches[0::2], caches[1::2], mapping, backend="triton")
    for c, r in zip(caches, ref):
        assert torch.equal(_bits(c.contiguous()), _bits(r.contiguous()))


def test_copy_blocks_empty_mapping(device):
    kc, vc = pa.make_kv_cache(4, 4, 1, 64, device=device)
    kc.normal_(), vc.normal_()
    kc[1, 0, 2] = float("nan")  # poison: NaN bits must survive too
    k0, v0 = kc.clone(), vc.clone()
    errors = torch.zeros(1, dtype=torch.int32, device=device)
    pa.copy_blocks(kc, vc, torch.zeros((0, 2), dtype=torch.int64), backend="triton",
                   errors=errors)
    assert torch.equal(_bits(kc), _bits(k0)) and torch.equal(_bits(vc), _bits(v0))
    assert int(errors) == 0


SENTINEL = 0x3C  # fp8 bytes of the border (1.5 in e4m3, 1.0 in e5m2); 1234.5 in fp16/fp32


def _in_sentinel(shape, dtype, device, gen):
    """Random N(0,1) values of ``shape`` as a view inside a larger buffer (one block more on each
    side of dim 0, one more entry in dim 1) whose other elements hold a sentinel: returns
    (view, buffer). Writes outside the view change the sentinel."""
    big = [shape[0] + 2, shape[1] + 1] + list(shape[2:])
    if dtype in FP8:
        buf = torch.full(big, SENTINEL, dtype=torch.uint8, device=device).view(dtype)
    else:
        buf = torch.full(big, 1234.5, dtype=dtype, device=device)
    view = buf[1:-1, 1:]
    view.copy_(torch.randn(shape, generator=gen).to(dtype))
    return view, buf


def _model_store(slots, cap):
    """Which tokens a guarded store writes (0 <= slot < cap, named once) and how many it skips
    (>= 0 but past the cache or named twice)."""
    s = slots.tolist()
    keep = [0 <= x < cap and s.count(x) == 1 for x in s]
    return torch.tensor(keep), sum(1 for x, k in zip(s, keep) if x >= 0 and not k)


# bad slots: past the cache (20, 25, int32 max), duplicated (3 three times, 7 twice);
# padding (-1, -5) is skipped without counting
BAD_SLOTS = [3, 19, 20, -1, 7, 3, 25, 7, 11, -5, 0, 2 ** 31 - 1, 3, 16]
GUARD_CASES = [("triton", "in-kernel"), ("triton", "sorted"), ("torch", None)]


@pytest.mark.parametrize("case", GUARD_CASES, ids=lambda c: "-".join(filter(None, c)))
@pytest.mark.parametrize("sdt", [torch.int32, torch.int64])
@pytest.mark.parametrize("layout", ["bshd", "vllm"])
def test_store_kv_skips_and_counts_bad_slots(case, sdt, layout, device, monkeypatch):
    backend, dup_check = case
    if dup_check == "sorted":  # the prefill path: duplicates from a device-side sort
        monkeypatch.setattr(kv_store, "PAIRWISE_MAX_TOKENS", 0)
    gen = torch.Generator().manual_seed(17)
    nb, bs, h, d, cdt = 5, 4, 2, 32, torch.float16
    shapes = pa.layouts.kv_cache_shapes(nb, bs, h, d, layout, cdt)
    (kc, kbuf), (vc, vbuf) = (_in_sentinel(shp, cdt, device, gen) for shp in shapes)
    slots = torch.tensor(BAD_SLOTS, dtype=sdt, device=device)
    t = slots.numel()
    k = torch.randn(t, h, d, generator=gen).to(device=device, dtype=cdt)
    v = torch.randn(t, h, d, generator=gen).to(device=device, dtype=cdt)
    keep, skipped = _model_store(slots.cpu(), nb * bs)
    assert skipped == 8  # the case holds what it claims
    want_k, want_v = kbuf.clone(), vbuf.clone()
    R.store_kv(k[keep], v[keep], want_k[1:-1, 1:], want_v[1:-1, 1:], slots[keep], layout=layout)
    before = kbuf.clone()
    with pytest.raises(ValueError, match="slot_mapping"):  # validation mode raises first
        pa.store_kv(k, v, kc, vc, slots, layout=layout, backend=backend, validate=True)
    assert torch.equal(_bits(kbuf), _bits(before))
    errors = torch.full((1,), 5, dtype=torch.int32, device=device)
    pa.store_kv(k, v, kc, vc, slots, layout=layout, backend=backend, validate=False,
                errors=errors)
    assert int(errors) == 5 + skipped
    assert torch.equal(_bits(kbuf), _bits(want_k)), "k buffer differs (cache or sentinel)"
    assert torch.equal(_bits(vbuf), _bits(want_v)), "v buffer differs (cache or sentinel)"


def test_store_kv_duplicates_across_scan_steps(device):
    """The in-kernel scan over several BLOCK_T steps: duplicates far apart, no counter."""
    gen = torch.Generator().manual_seed(4)
    t = 2 * kv_store.BLOCK_T + 44
    assert t <= kv_store.PAIRWISE_MAX_TOKENS
    nb, bs = 80, 4
    (kc, kbuf), (vc, vbuf) = (_in_sentinel((nb, 1, bs, 32), torch.float32, device, gen)
                              for _ in range(2))
    slots = torch.randperm(nb * bs, generator=gen)[:t]
    slots[t - 1] = slots[3]  # last step vs first step
    slots[kv_store.BLOCK_T] = slots[kv_store.BLOCK_T - 1]  # across a step boundary
    slots[7] = nb * bs
    slots = slots.to(device)
    k = torch.randn(t, 1, 32, generator=gen).to(device)
    v = torch.randn(t, 1, 32, generator=gen).to(device)
    keep, skipped = _model_store(slots.cpu(), nb * bs)
    assert skipped == 5
    want_k, want_v = kbuf.clone(), vbuf.clone()
    R.store_kv(k[keep], v[keep], want_k[1:-1, 1:], want_v[1:-1, 1:], slots[keep])
    pa.store_kv(k, v, kc, vc, slots, backend="triton", validate=False)
    assert torch.equal(kbuf, want_k) and torch.equal(vbuf, want_v)


def _model_copy(pairs, nb):
    """Which pairs a guarded copy_blocks performs: ids in range, dst named once as a dst and
    never as a src."""
    src = [s for s, _ in pairs]
    dst = [d for _, d in pairs]
    return [0 <= s < nb and 0 <= d < nb and dst.count(d) == 1 and d not in src
            for s, d in pairs]


# with 9 blocks: (1, 4) and (2, 7) are fine; -1, 9 and 2**40 are out of range, 6 and 3 are dsts
# twice, 5 and 3 are dsts that are also srcs, (0, 0) copies a block onto itself
BAD_PAIRS = [(1, 4), (-1, 3), (2, 9), (5, 6), (0, 6), (3, 5), (2, 7), (6, 3), (0, 0),
             (2 ** 40, 1)]


@pytest.mark.parametrize("case", GUARD_CASES, ids=lambda c: "-".join(filter(None, c)))
def test_copy_blocks_skips_and_counts_bad_pairs(case, device, monkeypatch):
    backend, clash_check = case
    if clash_check == "sorted":
        monkeypatch.setattr(block_copy, "PAIRWISE_MAX_PAIRS", 0)
    gen = torch.Generator().manual_seed(9)
    nb = 9
    ok = _model_copy(BAD_PAIRS, nb)
    assert ok == [True, False, False, False, False, False, True, False, False, False]
    views, bufs = [], []
    # three layers; the first one's blocks (5,120 elements) take two programs per pair
    for layout, bs, cdt in (("bhsd", 16, torch.float16), ("bhsd", 4, torch.float32),
                            ("vllm", 4, torch.float8_e4m3fn)):
        for shp in pa.layouts.kv_cache_shapes(nb, bs, 2, 160 if bs == 16 else 32, layout, cdt):
            view, buf = _in_sentinel(shp, cdt, device, gen)
            views.append(view)
            bufs.append(buf)
    want = [b.clone() for b in bufs]
    for (s, d), keep in zip(BAD_PAIRS, ok):
        for w in want:
            if keep:
                w[1 + d, 1:] = w[1 + s, 1:]
    mapping = torch.tensor(BAD_PAIRS, dtype=torch.int64, device=device)
    errors = torch.zeros(1, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="block_mapping"):
        pa.copy_blocks(views[0::2], views[1::2], mapping, backend=backend, validate=True)
    pa.copy_blocks(views[0::2], views[1::2], mapping, backend=backend, validate=False,
                   errors=errors)
    assert int(errors) == ok.count(False)  # once per pair, not per cache
    for b, w in zip(bufs, want):
        assert torch.equal(_bits(b), _bits(w)), "buffer differs (cache or sentinel)"


def test_copy_blocks_clashes_across_scan_steps(device):
    """The in-kernel scan over several BLOCK_P steps: a clash between far-apart pairs."""
    n = block_copy.BLOCK_P + 40
    assert n <= block_copy.PAIRWISE_MAX_PAIRS
    nb = 2 * n + 2
    ids = torch.randperm(nb, generator=torch.Generator().manual_seed(2)).tolist()
    pairs = [(ids[2 * i], ids[2 * i + 1]) for i in range(n)]
    pairs[n - 1] = (pairs[n - 1][0], pairs[0][1])  # dst given twice: first and last step
    pairs[5] = (pairs[5][0], pairs[n - 3][0])  # a dst that a later step's pair reads
    ok = _model_copy(pairs, nb)
    assert ok.count(False) == 3
    kc = torch.randn(nb, 1, 4, 32, device=device)
    vc = torch.randn(nb, 1, 4, 32, device=device)
    want = [kc.clone(), vc.clone()]
    for (s, d), keep in zip(pairs, ok):
        for w in want:
            if keep:
                w[d] = w[s]
    errors = torch.zeros(1, dtype=torch.int32, device=device)
    pa.copy_blocks(kc, vc, pairs, backend="triton", validate=False, errors=errors)
    assert int(errors) == 3
    assert torch.equal(kc, want[0]) and torch.equal(vc, want[1])


@pytest.mark.parametrize("which", ["k", "v"])
def test_stride0_write_targets_rejected(which, device):
    kc, vc = pa.make_kv_cache(4, 4, 2, 32, dtype=torch.float32, device=device)
    expanded = torch.zeros(1, 2, 4, 32, device=device).expand(4, 2, 4, 32)
    if which == "k":
        kc = expanded
    else:
        vc = expanded
    k = torch.randn(2, 2, 32, device=device)
    with pytest.raises(ValueError, match=f"{which}_cache.*stride-0"):
        pa.store_kv(k, k, kc, vc, torch.tensor([1, 5], device=device), backend="triton")
    with pytest.raises(ValueError, match="stride-0"):
        pa.copy_blocks(kc, vc, [(1, 2)], backend="triton")


COMPILE_SCRIPT = r"""
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from pagedattn.triton_kernels import block_copy, kv_store

target = {"sm_90": GPUTarget("cuda", 90, 32), "gfx942": GPUTarget("hip", "gfx942", 64)}[sys.argv[1]]


def compile_one(fn, cst, types, num_warps):
    names = fn.arg_names
    ty = {n: "constexpr" if n in cst else types.get(n, "i64" if n.startswith("stride") else "i32")
          for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if n.endswith("_ptr") or n.startswith("stride") or n == "numel"}
    src = ASTSource(fn, ty, constexprs={(names.index(k),): v for k, v in cst.items()}, attrs=attrs)
    return triton.compile(src, target=target, options=dict(num_warps=num_warps))


for guard, mask in ((False, False), (True, False), (True, True)):
    flags = dict(GUARD=guard, HAS_ERR=guard)
    compile_one(kv_store._store_kv_kernel, dict(
        D=128, BS=16, BLOCK_D=128, K_X=128, K_SPLIT=False, K_LO_ONE=True, V_LO_ONE=True,
        FP8=False, FMAX=0.0, MBITS=0, EMIN=0, DUP_MASK=mask, BLOCK_T=kv_store.BLOCK_T, DV=128,
        BLOCK_DV=128, HAS_V=True, **flags),
        dict(k_ptr="*bf16", v_ptr="*bf16", k_cache_ptr="*bf16", v_cache_ptr="*bf16",
             slot_mapping_ptr="*i32", k_scale_ptr="*fp32", v_scale_ptr="*fp32", dup_ptr="*u8",
             errors_ptr="*i32"), 1)
    ck = compile_one(block_copy._copy_blocks_kernel, dict(
        N2=16, N3=128, N4=1, FLAT=True, BLOCK=4096, CLASH_MASK=mask,
        BLOCK_P=block_copy.BLOCK_P, **flags),
        dict(cache_ptr="*i16", block_mapping_ptr="*i64", clash_ptr="*u8", errors_ptr="*i32"), 4)
    asm = ck.asm.get("ptx", "") + ck.asm.get("amdgcn", "")
    # the guard leaves the flat copy's 16-byte accesses vectorised
    assert "ld.global.v4" in asm or "global_load_dwordx4" in asm, (guard, mask)
print("STORE_COPY_COMPILES_OK")
"""


@pytest.mark.parametrize("target", ["sm_90", "gfx942"])
def test_guarded_kernels_compile(target):
    """The guarded kernels through the real compiler (the interpreter runs no compiler): both
    duplicate checks, with and without the guards; the flat copy stays vectorised."""
    triton = pytest.importorskip("triton")
    backend = "nvidia" if target == "sm_90" else "amd"
    if backend not in getattr(triton.backends, "backends", {}):
        pytest.skip(f"this triton build has no {backend} backend")
    here = os.path.dirname(os.path.abspath(__file__))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(here), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", COMPILE_SCRIPT, target], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "STORE_COPY_COMPILES_OK" in r.stdout, r.stderr[-3000:]
