"""Triton store_kv and copy_blocks vs the torch reference (bit-exact) for every layout/dtype."""
import pytest
import torch

import pagedattn as pa
from pagedattn import reference as R
from attn_utils import FP8, nan_tensor

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
    pa.copy_blocks(kc, vc, torch.zeros((0, 2), dtype=torch.int64), backend="triton")
