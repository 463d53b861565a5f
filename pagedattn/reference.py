"""Float32 (or float64) torch implementations of every op: the oracle and the ``torch`` backend.

Semantics shared by all backends (docs/layout.md states them for users):

* logits ``s = scale * q.k``; then soft-cap ``s = cap * tanh(s / cap)``; then ALiBi
  ``s += slope[h] * (j - p)`` where p is the query's absolute position and j the key's.
* visibility of key j for a query at absolute position p: causal ``j <= p`` (decode queries sit at
  the end of their sequence: the shifted mask ``j <= i + (Lk - Lq)``), sliding window
  ``j > p - window``, or a custom boolean mask in place of the causal rule.
* sinks: a per-query-head logit that joins the softmax denominator and has no value row.
* lse: natural-log sum of exp over the visible keys' logits (sinks excluded). A row with no visible
  key gives out 0 and lse -inf.
* fp8 caches hold ``value / scale``; reads multiply by the per-tensor or per-KV-head scale.
"""
from typing import Optional, Sequence, Tuple, Union

import torch

from pagedattn import layouts as L

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in FP8_DTYPES


def _per_head(scale, num_heads: int, device, dtype) -> Optional[torch.Tensor]:
    """A scale (None, float, 0-d, [1] or [num_heads]) as a [num_heads] tensor, or None."""
    if scale is None:
        return None
    t = torch.as_tensor(scale, dtype=dtype, device=device).reshape(-1)
    return t.expand(num_heads) if t.numel() == 1 else t


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor, *,
           scale: float, causal: bool = True, sliding_window: Optional[int] = None,
           logit_cap: Optional[float] = None, alibi_slopes: Optional[torch.Tensor] = None,
           sinks: Optional[torch.Tensor] = None, mask: Optional[torch.Tensor] = None,
           ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Dense attention of one sequence in the dtype of its inputs.

    q: [Lq, Hq, D]; k: [Lk, Hkv, D]; v: [Lk, Hkv, Dv]; q_pos: [Lq] absolute positions of the
    queries; mask: optional bool [Lq, Lk] (True = visible) replacing the causal rule.
    Returns out [Lq, Hq, Dv] and lse [Lq, Hq].
    """
    lq, hq, _ = q.shape
    lk, hkv, _ = k.shape
    group = hq // hkv
    ke = k.repeat_interleave(group, dim=1)
    ve = v.repeat_interleave(group, dim=1)
    s = torch.einsum("qhd,khd->hqk", q, ke) * scale  # [Hq, Lq, Lk]
    if logit_cap is not None and logit_cap > 0:
        s = logit_cap * torch.tanh(s / logit_cap)
    j = torch.arange(lk, device=q.device).view(1, -1)
    p = q_pos.to(torch.int64).view(-1, 1)
    if alibi_slopes is not None:
        s = s + alibi_slopes.to(s.dtype).view(-1, 1, 1) * (j - p).to(s.dtype)
    visible = torch.ones((lq, lk), dtype=torch.bool, device=q.device)
    if mask is not None:
        visible &= mask.to(torch.bool)
    elif causal:
        visible &= j <= p
    if sliding_window is not None and sliding_window > 0:
        visible &= j > p - sliding_window
    s = s.masked_fill(~visible.unsqueeze(0), float("-inf"))
    m = s.amax(dim=-1, keepdim=True)  # [Hq, Lq, 1]
    if sinks is not None:
        m = torch.maximum(m, sinks.to(s.dtype).view(-1, 1, 1))
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m_safe)
    denom = e.sum(-1, keepdim=True)
    lse = (torch.log(denom) + m_safe).squeeze(-1)  # -inf where nothing is visible
    if sinks is not None:
        denom = denom + torch.exp(sinks.to(s.dtype).view(-1, 1, 1) - m_safe)
    out = torch.einsum("hqk,khd->qhd", e / torch.where(denom > 0, denom, torch.ones_like(denom)), ve)
    return out, lse.transpose(0, 1).contiguous()


def _dequant(x: torch.Tensor, scale: Optional[torch.Tensor], cd: torch.dtype) -> torch.Tensor:
    x = x.to(cd)
    return x * scale.to(cd).view(1, -1, 1) if scale is not None else x


def _gather_seq(k_cache, v_cache, table_row, length, layout, k_scale, v_scale, cd):
    k, v = L.gather_kv(k_cache, v_cache, table_row, length, layout)
    g = L.cache_geometry(k_cache, layout)
    ks = _per_head(k_scale, g.num_kv_heads, k.device, cd)
    vs = _per_head(v_scale, g.num_kv_heads, k.device, cd)
    return _dequant(k, ks, cd), _dequant(v, vs, cd)


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 block_table: torch.Tensor, seq_lens: torch.Tensor, *, layout: str = "bhsd",
                 scale: Optional[float] = None, k_scale=None, v_scale=None,
                 sliding_window: Optional[int] = None, logit_cap: Optional[float] = None,
                 alibi_slopes: Optional[torch.Tensor] = None, sinks: Optional[torch.Tensor] = None,
                 out: Optional[torch.Tensor] = None, return_lse: bool = False,
                 compute_dtype: torch.dtype = torch.float32):
    """Reference paged decode. q: [B, Hq, D] or [B, Lq, Hq, D] (Lq query tokens that sit at the
    end of each sequence: the shifted causal mask). Returns out (q's dtype) [and lse float32]."""
    cd = compute_dtype
    q4 = q.unsqueeze(1) if q.dim() == 3 else q
    b, lq, hq, d = q4.shape
    dv = L.v_geometry(v_cache, layout).head_dim
    scale = d ** -0.5 if scale is None else scale
    o = torch.zeros((b, lq, hq, dv), dtype=cd, device=q.device)
    lse = torch.full((b, lq, hq), float("-inf"), dtype=cd, device=q.device)
    for i in range(b):
        n = int(seq_lens[i])
        if n == 0:
            continue
        k, v = _gather_seq(k_cache, v_cache, block_table[i], n, layout, k_scale, v_scale, cd)
        q_pos = torch.arange(n - lq, n, device=q.device)
        o[i], lse[i] = attend(q4[i].to(cd), k, v, q_pos, scale=scale, causal=True,
                              sliding_window=sliding_window, logit_cap=logit_cap,
                              alibi_slopes=alibi_slopes, sinks=sinks)
    o = o.reshape(q.shape[:-1] + (dv,))
    lse = lse.reshape(q.shape[:-1])
    return _finish(o, lse, q.dtype, out, return_lse)


def extend_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     block_table: torch.Tensor, cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor,
                     *, layout: str = "bhsd", causal: bool = True,
                     k_new: Optional[torch.Tensor] = None, v_new: Optional[torch.Tensor] = None,
                     custom_mask: Optional[torch.Tensor] = None,
                     mask_indptr: Optional[torch.Tensor] = None, scale: Optional[float] = None,
                     k_scale=None, v_scale=None, sliding_window: Optional[int] = None,
                     logit_cap: Optional[float] = None, alibi_slopes: Optional[torch.Tensor] = None,
                     sinks: Optional[torch.Tensor] = None, out: Optional[torch.Tensor] = None,
                     return_lse: bool = False, compute_dtype: torch.dtype = torch.float32):
    """Reference extend attention over a ragged batch.

    Request b owns query rows [cu_seqlens_q[b], cu_seqlens_q[b+1]) (Lq of them) and Lk =
    seq_lens[b] keys; its prefix is Lk - Lq (negative for a non-causal request with more queries
    than keys: its queries sit at positions Lk - Lq ... Lk - 1, and all Lk keys are visible). Keys [0, prefix) come from the paged cache; the new
    keys from the cache too, or from k_new/v_new rows (same rows as q) when given.
    custom_mask: flat bool, request b's [Lq, Lk] row-major block at mask_indptr[b].
    """
    cd = compute_dtype
    t, hq, d = q.shape
    dv = L.v_geometry(v_cache, layout).head_dim
    scale = d ** -0.5 if scale is None else scale
    o = torch.zeros((t, hq, dv), dtype=cd, device=q.device)
    lse = torch.full((t, hq), float("-inf"), dtype=cd, device=q.device)
    g = L.cache_geometry(k_cache, layout)
    for b in range(seq_lens.numel()):
        q0, q1 = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
        lq, lk = q1 - q0, int(seq_lens[b])
        if lq == 0 or lk == 0:
            continue
        prefix = lk - lq
        if k_new is None:
            k, v = _gather_seq(k_cache, v_cache, block_table[b], lk, layout, k_scale, v_scale, cd)
        else:
            kp, vp = _gather_seq(k_cache, v_cache, block_table[b], prefix, layout, k_scale,
                                 v_scale, cd)
            k = torch.cat([kp, k_new[q0:q1].to(cd)])
            v = torch.cat([vp, v_new[q0:q1].to(cd)])
        mask = None
        if custom_mask is not None:
            m0 = int(mask_indptr[b])
            mask = custom_mask[m0:m0 + lq * lk].view(lq, lk)
        q_pos = torch.arange(prefix, lk, device=q.device)
        o[q0:q1], lse[q0:q1] = attend(q[q0:q1].to(cd), k, v, q_pos, scale=scale, causal=causal,
                                      sliding_window=sliding_window, logit_cap=logit_cap,
                                      alibi_slopes=alibi_slopes, sinks=sinks, mask=mask)
    del g
    return _finish(o, lse, q.dtype, out, return_lse)


def _finish(o, lse, dtype, out, return_lse):
    if out is not None:
        out.copy_(o.to(out.dtype))
        o = out
    else:
        o = o.to(dtype)
    return (o, lse.to(torch.float32)) if return_lse else o


def quantize(x: torch.Tensor, dtype: torch.dtype, scale: Optional[torch.Tensor]) -> torch.Tensor:
    """x [L, H, D] -> cache dtype; fp8 stores x / scale[h], saturated to the format's range."""
    if not is_fp8(dtype):
        return x.to(dtype)
    xf = x.to(torch.float32)
    if scale is not None:
        xf = xf / _per_head(scale, x.shape[1], x.device, torch.float32).view(1, -1, 1)
    fmax = torch.finfo(dtype).max
    return xf.clamp(-fmax, fmax).to(dtype)


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor, *, layout: str = "bhsd", k_scale=None, v_scale=None):
    """Write k [T, Hkv, D], v [T, Hkv, Dv] to slots ``block * block_size + offset``; slots < 0
    are skipped. v None (an MLA latent cache): K only."""
    g = L.cache_geometry(k_cache, layout)
    slots = slot_mapping.to(torch.int64)
    keep = slots >= 0
    slots = slots[keep]
    blocks, toks = slots // g.block_size, slots % g.block_size
    L.scatter_tokens(k_cache, L.k_strides(k_cache, layout), blocks, toks,
                     quantize(k[keep], k_cache.dtype, k_scale))
    if v is not None:  # None: an MLA latent cache, K only
        L.scatter_tokens(v_cache, L.v_strides(v_cache, layout), blocks, toks,
                         quantize(v[keep], v_cache.dtype, v_scale))


def copy_blocks(caches: Union[torch.Tensor, Sequence[torch.Tensor]], block_mapping: torch.Tensor):
    """cache[dst] = cache[src] for every (src, dst) row of block_mapping, for every cache given.

    All sources are read before any destination is written.
    """
    if isinstance(caches, torch.Tensor):
        caches = [caches]
    pairs = block_mapping.to(torch.int64).reshape(-1, 2)
    if pairs.numel() == 0:
        return
    src, dst = pairs[:, 0].to(caches[0].device), pairs[:, 1].to(caches[0].device)
    for c in caches:
        c[dst] = c[src].clone()
