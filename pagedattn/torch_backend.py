"""The ``torch`` backend: the float32 reference run on the call's device (any device)."""
from pagedattn import reference as R
from pagedattn.validation import DecodeCall, ExtendCall

OPS = ("paged_decode", "extend_attention", "store_kv", "copy_blocks")


def supports(op: str, **facts) -> list:
    """Reasons this backend cannot serve the call (none: it serves everything)."""
    return [] if op in OPS else [f"unknown op {op!r}"]


def _opts(o):
    return dict(scale=o.scale, k_scale=o.k_scale, v_scale=o.v_scale,
                sliding_window=o.sliding_window, logit_cap=o.logit_cap,
                alibi_slopes=o.alibi_slopes, sinks=o.sinks)


def paged_decode(c: DecodeCall):
    _, lse = R.paged_decode(c.q, c.k_cache, c.v_cache, c.block_table, c.seq_lens, layout=c.layout,
                            out=c.out, return_lse=True, **_opts(c.opts))
    return lse if c.return_lse else None


def extend_attention(c: ExtendCall):
    _, lse = R.extend_attention(c.q, c.k_cache, c.v_cache, c.block_table, c.cu_seqlens_q,
                                c.seq_lens, layout=c.layout, causal=c.causal, k_new=c.k_new,
                                v_new=c.v_new, custom_mask=c.custom_mask,
                                mask_indptr=c.mask_indptr, out=c.out, return_lse=True,
                                **_opts(c.opts))
    return lse if c.return_lse else None


def store_kv(k, v, k_cache, v_cache, slot_mapping, *, layout, geom, k_scale, v_scale):
    R.store_kv(k, v, k_cache, v_cache, slot_mapping, layout=layout, k_scale=k_scale,
               v_scale=v_scale)


def copy_blocks(caches, block_mapping):
    R.copy_blocks(caches, block_mapping)
