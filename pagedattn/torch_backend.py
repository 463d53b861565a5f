"""The ``torch`` backend: the float32 reference run on the call's device (any device).

The public ops validate the device data for this backend by default. Called with
``validate=False``, store_kv and copy_blocks apply the Triton kernels' guards (skip and count a
slot past the cache or given twice, a pair with an id out of range, a repeated destination or a
destination that is also a source).
"""
import torch

from pagedattn import reference as R
from pagedattn.validation import DecodeCall, ExtendCall

OPS = ("paged_decode", "extend_attention", "store_kv", "copy_blocks")


def supports(op: str, **facts) -> list:
    """Reasons this backend cannot serve the call (none: it serves everything)."""
    return [] if op in OPS else [f"unknown op {op!r}"]


def _opts(c):
    """The reference's keyword options of an attention call. k_scale/v_scale dequantise fp8
    caches only: other caches hold the values themselves (as in every backend)."""
    o = c.opts
    fp8 = R.is_fp8(c.k_cache.dtype)
    return dict(scale=o.scale, k_scale=o.k_scale if fp8 else None,
                v_scale=o.v_scale if fp8 else None, sliding_window=o.sliding_window,
                logit_cap=o.logit_cap, alibi_slopes=o.alibi_slopes, sinks=o.sinks)


def paged_decode(c: DecodeCall):
    _, lse = R.paged_decode(c.q, c.k_cache, c.v_cache, c.block_table, c.seq_lens, layout=c.layout,
                            out=c.out, return_lse=True, **_opts(c))
    return lse if c.return_lse else None


def extend_attention(c: ExtendCall):
    _, lse = R.extend_attention(c.q, c.k_cache, c.v_cache, c.block_table, c.cu_seqlens_q,
                                c.seq_lens, layout=c.layout, causal=c.causal, k_new=c.k_new,
                                v_new=c.v_new, custom_mask=c.custom_mask,
                                mask_indptr=c.mask_indptr, out=c.out, return_lse=True,
                                **_opts(c))
    return lse if c.return_lse else None


def _count(values, keys):
    """Occurrences of each of keys in values (1-D int64 tensors)."""
    ordered = torch.sort(values).values
    return torch.searchsorted(ordered, keys, right=True) - torch.searchsorted(ordered, keys)


def store_kv(k, v, k_cache, v_cache, slot_mapping, *, layout, geom, k_scale, v_scale,
             errors=None):
    slots = slot_mapping.to(torch.int64)
    bad = (slots >= 0) & ((slots >= geom.num_blocks * geom.block_size) | (_count(slots, slots) > 1))
    if errors is not None:
        errors.add_(bad.sum().to(errors.dtype))
    R.store_kv(k, v, k_cache, v_cache, torch.where(bad, -1, slots), layout=layout,
               k_scale=k_scale, v_scale=v_scale)


def copy_blocks(caches, block_mapping, errors=None):
    pairs = block_mapping.to(torch.int64).reshape(-1, 2)
    src, dst = pairs[:, 0].contiguous(), pairs[:, 1].contiguous()
    n = caches[0].shape[0]
    keep = (pairs >= 0).all(1) & (pairs < n).all(1) & (_count(dst, dst) == 1) \
        & (_count(src, dst) == 0)
    if errors is not None:
        errors.add_((~keep).sum().to(errors.dtype))
    R.copy_blocks(caches, pairs[keep])
