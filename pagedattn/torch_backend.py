"""The ``torch`` backend: the float32 reference run on the call's device (any device).

The public ops validate the device data for this backend by default. Called with
``validate=False``, the attention ops still check it (the reference reads every length and block
id on the host anyway, and a negative id would index from the end of the cache), and store_kv
and copy_blocks apply the Triton kernels' guards (skip and count a slot past the cache or given
twice, a pair with an id out of range, a repeated destination or a destination that is also a
source).
"""
import torch

from pagedattn import reference as R
from pagedattn import validation as V
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
    if not c.validate:
        V.check_decode_data(c.opts, c.block_table, c.seq_lens, c.geom, c.q_len)
    _, lse = R.paged_decode(c.q, c.k_cache, c.v_cache, c.block_table, c.seq_lens, layout=c.layout,
                            out=c.out, return_lse=True, **_opts(c))
    return lse if c.return_lse else None


def _check_extend_data(c: ExtendCall):
    """The device-data checks of an extend call that was not validated (as the public op's)."""
    cu = V.check_indptr("cu_seqlens_q", c.cu_seqlens_q, c.q.shape[0], c.num_seqs)
    lq, lens = cu[1:] - cu[:-1], c.seq_lens.to(torch.int64).cpu()
    if (c.causal or c.k_new is not None) and bool((lq > lens).any()):
        raise ValueError("seq_lens: a request has more new tokens than seq_len (negative prefix)")
    V.check_table_data(c.block_table, c.seq_lens, c.geom.block_size, c.geom.num_blocks,
                       need=lens if c.k_new is None else lens - lq)
    if c.custom_mask is not None:
        mi = V.check_indptr("mask_indptr", c.mask_indptr, c.custom_mask.shape[0], c.num_seqs)
        if bool(((mi[1:] - mi[:-1]) != lq * lens).any()):
            raise ValueError("mask_indptr: request b's block must hold Lq*Lk entries")


def extend_attention(c: ExtendCall):
    if not c.validate:
        _check_extend_data(c)
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
