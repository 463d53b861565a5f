"""Shared test machinery: random paged batches with poisoned caches, an independent dense oracle,
and the comparator with its per-dtype tolerances.

The dense oracle here imports nothing from pagedattn: it indexes each layout directly.
"""
import math
from dataclasses import dataclass
from typing import List, Optional

import torch

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)

# (atol, rtol, max rel-L2) per compute dtype of the kernel under test
TOL = {
    torch.float32: (1e-5, 1e-5, 1e-5),
    torch.float16: (2e-3, 2e-3, 2e-3),
    torch.bfloat16: (1.5e-2, 1e-2, 1e-2),
    "fp8": (1e-1, 1e-1, 5e-2),
}
LSE_TOL = {torch.float32: 1e-3, torch.float16: 1e-3, torch.bfloat16: 1e-2, "fp8": 1e-2}


def tol_key(q_dtype, kv_dtype):
    return "fp8" if kv_dtype in FP8 else q_dtype


def assert_attn_close(out: torch.Tensor, ref: torch.Tensor, key, *, what: str = "out",
                      magnitude_guard: bool = True):
    """out vs ref (both any dtype) with the per-dtype tolerances; NaN never passes."""
    atol, rtol, rl2 = TOL[key]
    o, r = out.detach().double().cpu(), ref.detach().double().cpu()
    assert o.shape == r.shape, f"{what}: shape {tuple(o.shape)} vs reference {tuple(r.shape)}"
    assert not torch.isnan(o).any(), f"{what}: NaN in output at {torch.nonzero(torch.isnan(o))[:5].tolist()}"
    # Vacuity guard: the reference must stand clear of atol. Attention outputs
    # average ~seq_len random rows (|o| ~ 1/sqrt(n)), so the bar is 1x atol; the rel-L2 bound
    # below is what makes a zeroed output fail at any magnitude (its rel-L2 is 1).
    if magnitude_guard and r.numel():
        assert r.abs().mean() > atol or r.abs().max() == 0, \
            f"{what}: reference magnitude {r.abs().mean():.3g} too small for atol {atol}: vacuous case"
    diff = (o - r).abs()
    bad = diff > atol + rtol * r.abs()
    denom = r.norm().item()
    rel = (o - r).norm().item() / denom if denom > 0 else (o - r).norm().item()
    if bad.any() or rel > rl2:
        idx = torch.nonzero(bad)[:1].tolist() if bad.any() else [[]]
        raise AssertionError(
            f"{what}: max_abs {diff.max().item():.3g} at {idx[0]}, rel-L2 {rel:.3g} (limit {rl2}),"
            f" {bad.float().mean().item():.2%} out of tol (atol {atol}, rtol {rtol})")


def assert_lse_close(lse: torch.Tensor, ref: torch.Tensor, key):
    """Finite entries within tol; -inf exactly where the reference is -inf."""
    atol = LSE_TOL[key]
    l, r = lse.detach().double().cpu(), ref.detach().double().cpu()
    assert l.shape == r.shape, f"lse: shape {tuple(l.shape)} vs {tuple(r.shape)}"
    assert not torch.isnan(l).any(), "lse: NaN"
    empty = torch.isneginf(r)
    assert torch.equal(torch.isneginf(l), empty), "lse: -inf pattern differs from the reference"
    if (~empty).any():
        d = (l[~empty] - r[~empty]).abs()
        assert (d <= atol + 1e-5 * r[~empty].abs()).all(), f"lse: max_abs {d.max().item():.3g}"


# ----------------------------------------------------------------------------------------------
# random paged batches
# ----------------------------------------------------------------------------------------------

@dataclass
class PagedBatch:
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_table: torch.Tensor  # int32, scattered unique pages, poisoned slack
    seq_lens: torch.Tensor  # int32
    layout: str
    block_size: int
    k_scale: Optional[torch.Tensor] = None
    v_scale: Optional[torch.Tensor] = None


def poison_value(dtype):
    return float("nan") if dtype not in FP8 else None


def _cache_shapes(n, b, h, d, layout, dtype, dv=None):
    x = 16 // torch.empty((), dtype=dtype).element_size()
    dv = d if dv is None else dv
    return {
        "bhsd": ((n, h, b, d), (n, h, b, dv)),
        "bshd": ((n, b, h, d), (n, b, h, dv)),
        "vllm": ((n, h, d // x, b, x), (n, h, dv, b)),
        "hcu": ((n, h, b, d), (n, h, dv, b)),
    }[layout]


def nan_tensor(shape, dtype, device):
    """A tensor of NaNs (fp8: the 0x7F pattern, NaN in both e4m3fn and e5m2)."""
    if dtype in FP8:
        return torch.full(shape, 0x7F, dtype=torch.uint8, device=device).view(dtype)
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def dense_set(cache, layout, which, blk, off, val):
    """cache[tokens (blk, off)] = val [L, H, D] (or [H, D] for one token) by direct indexing."""
    if layout == "bshd":
        cache[blk, off] = val
    elif which == "k" and layout in ("bhsd", "hcu"):
        cache[blk, :, off, :] = val
    elif which == "k":  # vllm K [n, h, D/x, b, x]
        x = cache.shape[4]
        cache[blk, :, :, off, :] = val.reshape(val.shape[:-1] + (val.shape[-1] // x, x))
    elif layout == "bhsd":
        cache[blk, :, off, :] = val
    else:  # vllm / hcu V [n, h, D, b]
        cache[blk, :, :, off] = val


def dense_get(cache, layout, which, blk, off):
    """Tokens (blk, off) as [L, H, D] (or [H, D] for scalar indices)."""
    if layout == "bshd":
        return cache[blk, off]
    if which == "k" and layout in ("bhsd", "hcu"):
        return cache[blk, :, off, :]
    if which == "k":
        t = cache[blk, :, :, off, :]
        return t.reshape(t.shape[:-2] + (t.shape[-2] * t.shape[-1],))
    if layout == "bhsd":
        return cache[blk, :, off, :]
    return cache[blk, :, :, off]


def make_paged_batch(seq_lens: List[int], *, num_kv_heads: int, head_dim: int, block_size: int,
                     layout: str, dtype, device, gen: torch.Generator, exact_capacity=True,
                     extra_blocks: int = 3, kv_scales=None, fill_upto=None,
                     contiguous=True, head_dim_v: Optional[int] = None) -> PagedBatch:
    """Caches full of NaN except the tokens [0, fill_upto[i]) of each sequence (default
    seq_lens), on scattered unique pages (block 0 reserved as the null block). The table's slack
    entries are poisoned with -1 and num_blocks + 7.

    For fp8 dtypes the cache holds quantised N(0,1)/scale values; kv_scales = (k, v) floats or
    per-head lists. head_dim_v: V's width (default head_dim).
    """
    dv = head_dim if head_dim_v is None else head_dim_v
    fill_upto = seq_lens if fill_upto is None else fill_upto
    pages = [max(1, math.ceil(s / block_size)) if s else 0 for s in seq_lens]
    width = max(pages + [1]) + (0 if exact_capacity else 2)
    num_blocks = 1 + sum(pages) + extra_blocks
    perm = torch.randperm(num_blocks - 1, generator=gen) + 1
    ks, vs = _cache_shapes(num_blocks, block_size, num_kv_heads, head_dim, layout, dtype, dv)
    k_cache, v_cache = nan_tensor(ks, dtype, "cpu"), nan_tensor(vs, dtype, "cpu")
    table = torch.full((len(seq_lens), width), -1, dtype=torch.int32)
    k_scale = v_scale = None
    if dtype in FP8:
        ksc, vsc = kv_scales if kv_scales is not None else (0.37, 3.1)
        k_scale = torch.tensor(ksc, dtype=torch.float32).reshape(-1).expand(num_kv_heads).clone()
        v_scale = torch.tensor(vsc, dtype=torch.float32).reshape(-1).expand(num_kv_heads).clone()
    used = 0
    for i, s in enumerate(seq_lens):
        ids = perm[used:used + pages[i]]
        used += pages[i]
        table[i, :pages[i]] = ids.to(torch.int32)
        if pages[i] < width:
            table[i, pages[i]:] = torch.tensor([-1, num_blocks + 7], dtype=torch.int32).repeat(
                width)[: width - pages[i]]
        n = fill_upto[i]
        if n:
            t = torch.arange(n)
            blk, off = ids[t // block_size], t % block_size
            for cache, which, sc, w in ((k_cache, "k", k_scale, head_dim),
                                        (v_cache, "v", v_scale, dv)):
                val = torch.randn(n, num_kv_heads, w, generator=gen)
                if dtype in FP8:
                    val = (val / sc.view(1, -1, 1)).clamp(-torch.finfo(dtype).max,
                                                          torch.finfo(dtype).max)
                dense_set(cache, layout, which, blk, off, val.to(dtype))
    k_cache, v_cache = k_cache.to(device), v_cache.to(device)
    if not contiguous:  # same layout, storage with gaps: a view of a wider buffer
        k_cache, v_cache = _strided_copy(k_cache), _strided_copy(v_cache)
    return PagedBatch(k_cache, v_cache, table.to(device),
                      torch.tensor(seq_lens, dtype=torch.int32, device=device), layout, block_size,
                      None if k_scale is None else k_scale.to(device),
                      None if v_scale is None else v_scale.to(device))


def _strided_copy(c):
    """A non-contiguous view equal to c (padding on dim 0's stride)."""
    shape = list(c.shape)
    big = nan_tensor([shape[0], shape[1] + 1] + shape[2:], c.dtype, c.device)
    view = big[:, : shape[1]]
    view.copy_(c)
    return view


def dense_kv(batch: PagedBatch, i: int, length: int, *, which_dtype=torch.float64):
    """Sequence i's first `length` tokens as dequantised [length, H, D] K and V (float64)."""
    t = torch.arange(length, device=batch.block_table.device)
    blk = batch.block_table[i, t // batch.block_size].to(torch.int64)
    off = t % batch.block_size
    k = dense_get(batch.k_cache, batch.layout, "k", blk, off).to(which_dtype)
    v = dense_get(batch.v_cache, batch.layout, "v", blk, off).to(which_dtype)
    if batch.k_scale is not None:
        k = k * batch.k_scale.to(which_dtype).view(1, -1, 1).to(k.device)
        v = v * batch.v_scale.to(which_dtype).view(1, -1, 1).to(v.device)
    return k, v


def dense_attention(q, k, v, q_pos, *, scale, causal=True, window=None, cap=None, alibi=None,
                    sinks=None, mask=None):
    """Explicit masked softmax in float64. q [Lq,Hq,D], k [Lk,Hkv,D], v [Lk,Hkv,Dv] -> out
    [Lq,Hq,Dv], lse (natural)."""
    q, k, v = q.double(), k.double(), v.double()
    lq, hq, d = q.shape
    lk, hkv = k.shape[0], k.shape[1]
    g = hq // hkv
    out = torch.zeros(lq, hq, v.shape[-1], dtype=torch.float64, device=q.device)
    lse = torch.full((lq, hq), float("-inf"), dtype=torch.float64, device=q.device)
    j = torch.arange(lk, device=q.device).view(1, -1)
    p = torch.as_tensor(q_pos, device=q.device).to(torch.int64).view(-1, 1)
    if mask is not None:
        vis = mask.to(torch.bool).clone()
    else:
        vis = (j <= p) if causal else torch.ones(lq, lk, dtype=torch.bool, device=q.device)
    if window:
        vis &= j > p - window
    for h in range(hq):
        kh, vh = k[:, h // g], v[:, h // g]
        logits = (q[:, h] @ kh.T) * scale  # [Lq, Lk]
        if cap:
            logits = cap * torch.tanh(logits / cap)
        if alibi is not None:
            logits = logits + float(alibi[h]) * (j - p).double()
        logits = torch.where(vis, logits, torch.full_like(logits, float("-inf")))
        rows = vis.any(dim=1)  # rows with a visible key; the others stay out 0 / lse -inf
        m = logits.amax(dim=1, keepdim=True)
        if sinks is not None:
            m = torch.maximum(m, torch.full_like(m, float(sinks[h])))
        m = torch.where(rows.view(-1, 1), m, torch.zeros_like(m))
        e = torch.exp(logits - m)
        den = e.sum(dim=1, keepdim=True)
        lse_h = torch.log(den) + m
        if sinks is not None:
            den = den + torch.exp(float(sinks[h]) - m)
        out[:, h] = torch.where(rows.view(-1, 1), (e / torch.where(den > 0, den, 1.0)) @ vh, 0.0)
        lse[:, h] = torch.where(rows, lse_h.squeeze(1), float("-inf"))
    return out, lse


def capture_graph(step):
    """``step()`` captured in a CUDA graph, after one call on a side stream (the allocator's
    warm-up for the capture), as torch documents."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph


def replay_in_cuda_graph(step, out: torch.Tensor):
    """Capture ``step()`` in a CUDA graph and replay it once over a NaN-poisoned ``out``."""
    graph = capture_graph(step)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
