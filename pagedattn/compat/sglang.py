"""SGLang-shaped Triton attention ops over pagedattn's ops.

Mirrors ``decode_attention_fwd`` (``sglang/kernels/ops/attention/decode_attention.py``) and
``extend_attention_fwd`` (``.../extend_attention.py``) of **sglang 0.5.23**: the same positional
arguments, keywords and defaults; outputs are written into the given ``o`` / ``o_extend``.
docs/compat.md lists every argument as honoured, accepted and unused (SGLang's split-KV
workspace: ``attn_logits``, ``attn_lse``, ``num_kv_splits``, ``max_kv_splits``), or refused
with ``NotImplementedError`` naming it.

KV buffers are SGLang's token pool: ``[num_slots, num_kv_heads, head_dim]`` (or a
``[num_pages, page_size, num_kv_heads, head_dim]`` view), addressed by token slots in
``kv_indices``. They become a pagedattn ``bshd`` cache: of block size 1, or of ``page_size``
when it divides the pool, with one table entry per page (SGLang's paged pool keeps a page's
slots consecutive; with ``PAGEDATTN_VALIDATE=1`` every slot is checked against that).

The block table needs a host-known width: the longest request. SGLang's arguments carry none, so
each call reads it from ``kv_indptr`` (one host sync), unless :func:`set_max_context_len` gave a
bound. Under CUDA-graph capture a bound is required.
"""
from typing import Optional

import torch

from pagedattn import validation as V
from pagedattn.api import extend_attention, paged_decode
from pagedattn.compat._common import (csr_lengths, csr_table, fp8, is_unit, number, out_factor,
                                      refuse)

PEER = "sglang"
PEER_VERSION = "0.5.23"

__all__ = ["decode_attention_fwd", "extend_attention_fwd", "set_max_context_len", "PEER",
           "PEER_VERSION"]

_MAX_CONTEXT_LEN: Optional[int] = None


def set_max_context_len(n: Optional[int]) -> None:
    """Bound every request's KV length (tokens) for the ops of this module, or ``None`` to read
    the longest one from ``kv_indptr`` per call.

    With a bound, calls do no host sync (CUDA-graph capturable) and the block table is
    ``ceil(n / page_size)`` entries wide for every request. A request longer than the bound
    reads only its first ``n`` tokens' pages and fails the kernels' bounds guards (caught with
    ``PAGEDATTN_VALIDATE=1``): set the engine's context length.
    """
    global _MAX_CONTEXT_LEN
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ValueError(f"n: expected a positive int or None, got {n!r}")
    _MAX_CONTEXT_LEN = n


def _width(indptr: torch.Tensor) -> int:
    """The longest request in tokens: the bound, else one host read of indptr."""
    if _MAX_CONTEXT_LEN is not None:
        return _MAX_CONTEXT_LEN
    if indptr.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("pagedattn.compat.sglang: under CUDA-graph capture the longest "
                           "request cannot be read from kv_indptr; call "
                           "set_max_context_len(context_len) first")
    if indptr.numel() < 2:
        return 0
    return int((indptr[1:] - indptr[:-1]).max())


def _as_cache(k_buffer, v_buffer, page_size):
    """(k, v, block size) as a bshd cache: [num_slots/ps, ps, H, D] when ps divides the pool,
    else [num_slots, 1, H, D]."""
    for name, t in (("k_buffer", k_buffer), ("v_buffer", v_buffer)):
        if not isinstance(t, torch.Tensor) or t.dim() not in (3, 4):
            raise ValueError(f"{name}: expected [num_slots, num_kv_heads, head_dim] or "
                             f"[num_pages, page_size, num_kv_heads, head_dim], got "
                             f"{getattr(t, 'shape', type(t).__name__)}")
    if k_buffer.dim() == 4:
        if k_buffer.shape[1] != page_size:
            raise ValueError(f"k_buffer: page dim {k_buffer.shape[1]} differs from page_size "
                             f"{page_size}")
        return k_buffer, v_buffer, page_size
    if page_size > 1 and k_buffer.shape[0] % page_size == 0:
        n = k_buffer.shape[0] // page_size
        return k_buffer.unflatten(0, (n, page_size)), v_buffer.unflatten(0, (n, page_size)), \
            page_size
    return k_buffer.unsqueeze(1), v_buffer.unsqueeze(1), 1


def _table(kv_indptr, kv_indices, block_size, identity=False):
    w = -(-_width(kv_indptr) // block_size)
    table = csr_table(kv_indptr, None if identity else kv_indices, w, page_size=block_size)
    if block_size > 1 and not identity and V.validate_enabled(None, ""):
        _check_pages(kv_indptr, kv_indices, table, block_size)
    return table


def _check_pages(kv_indptr, kv_indices, table, ps):
    """Every token slot equals page * ps + offset of its table entry (host read)."""
    ip, idx, t = kv_indptr.cpu().to(torch.int64), kv_indices.cpu().to(torch.int64), table.cpu()
    for b in range(ip.numel() - 1):
        s = idx[int(ip[b]):int(ip[b + 1])]
        pos = torch.arange(s.numel())
        want = t[b, pos // ps].to(torch.int64) * ps + pos % ps
        if not torch.equal(s, want):
            j = int(torch.nonzero(s != want)[0])
            raise ValueError(f"kv_indices: request {b} token {j} is slot {int(s[j])}, not "
                             f"{int(want[j])}: page_size {ps} needs each page's slots "
                             "consecutive and page-aligned (pass page_size=1 otherwise)")


def _no_score_mod(score_mod, aux_tensors):
    if score_mod is not None:
        refuse("score_mod", score_mod, "custom score modifiers are Triton functions of SGLang's "
               "kernels; express the bias through pagedattn's options or use SGLang's kernel")
    if aux_tensors is not None:
        refuse("aux_tensors", "<tensors>", "they feed a score_mod, which is not provided")


def _scales(k_scale, v_scale, buf_dtype):
    """SGLang multiplies the logit scale by k_scale and the output by v_scale. For an fp8 pool
    those are pagedattn's dequantisation scales; otherwise (scale factor, output factor)."""
    if fp8(buf_dtype):
        return 1.0, (1.0 if k_scale is None else k_scale), \
            (1.0 if v_scale is None else v_scale), None
    mult = 1.0 if k_scale is None else number("k_scale", k_scale)
    return mult, None, None, out_factor("v_scale", v_scale)


def decode_attention_fwd(q, k_buffer, v_buffer, o, kv_indptr, kv_indices, attn_logits, attn_lse,
                         num_kv_splits, max_kv_splits, sm_scale, k_scale, v_scale,
                         logit_cap=0.0, sinks=None, xai_temperature_len=-1, has_mla=False,
                         use_pdl=False, page_size: int = 1, score_mod=None, aux_tensors=None,
                         enable_lean=None, lean_Mp=None, lean_Lp=None, lean_Op=None,
                         lean_locks=None, uneven_batch=None):
    """Decode attention of one new token per request over SGLang's token pool; writes ``o``.

    Parameters
    ----------
    q : torch.Tensor
        ``[batch, num_q_heads, head_dim]``, fp16/bf16/fp32.
    k_buffer, v_buffer : torch.Tensor
        ``[num_slots, num_kv_heads, head_dim]`` in q's dtype or fp8 (with k_scale/v_scale).
    o : torch.Tensor
        ``[batch, num_q_heads, head_dim]``: the output, written in place.
    kv_indptr, kv_indices : torch.Tensor
        int32 ``[>= batch + 1]`` and the token slots of request b at
        ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]`` (its whole KV, the new token included).
    attn_logits, attn_lse, num_kv_splits, max_kv_splits
        SGLang's split-KV workspace: accepted, unused.
    sm_scale : float
        softmax scale; ``k_scale`` multiplies it and ``v_scale`` the output (for an fp8 pool
        they dequantise K and V, the same products).
    logit_cap : float
        soft-cap ``cap * tanh(s / cap)``; 0 disables it.
    sinks : torch.Tensor, optional
        float ``[num_q_heads]`` sink logits joining the softmax denominator.
    page_size : int
        the pool's page size (see the module docstring).

    Raises
    ------
    NotImplementedError
        ``xai_temperature_len > 0``, ``score_mod``/``aux_tensors``.

    MLA (``has_mla``, DeepSeek's absorbed decode): ``k_buffer`` is the latent pool
    ``[num_slots, 1, 576]`` and ``v_buffer`` its first 512 columns (``k_buffer[..., :512]``),
    as SGLang's MLA backends pass them; ``o`` is ``[batch, num_q_heads, 512]``. Any V width
    runs (``v_buffer.shape[-1]``), with or without ``has_mla``.
    ValueError, TypeError
        from pagedattn's checks, naming the argument.

    Examples
    --------
    >>> import torch
    >>> from pagedattn.compat.sglang import decode_attention_fwd
    >>> k_pool, v_pool = torch.randn(64, 2, 64), torch.randn(64, 2, 64)   # 64 token slots
    >>> q, o = torch.randn(2, 4, 64), torch.empty(2, 4, 64)
    >>> kv_indptr = torch.tensor([0, 3, 8], dtype=torch.int32)
    >>> kv_indices = torch.tensor([9, 4, 33, 5, 6, 7, 60, 1], dtype=torch.int32)
    >>> decode_attention_fwd(q, k_pool, v_pool, o, kv_indptr, kv_indices, None, None, None, 8,
    ...                      64 ** -0.5, 1.0, 1.0)
    >>> bool(o.isfinite().all())
    True
    """
    if xai_temperature_len is not None and xai_temperature_len > 0:
        refuse("xai_temperature_len", xai_temperature_len, "position-dependent logit "
               "temperature is not provided")
    _no_score_mod(score_mod, aux_tensors)
    batch = q.shape[0]
    indptr = kv_indptr[: batch + 1]
    k, v, bs = _as_cache(k_buffer, v_buffer, page_size)
    table = _table(indptr, kv_indices, bs)
    mult, ks, vs, post = _scales(k_scale, v_scale, k_buffer.dtype)
    paged_decode(q, k, v, table, csr_lengths(indptr), layout="bshd",
                 scale=number("sm_scale", sm_scale) * mult, k_scale=ks, v_scale=vs,
                 logit_cap=logit_cap or None, sinks=sinks, out=o)
    if post is not None:
        o.mul_(post)


def extend_attention_fwd(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, qo_indptr,
                         kv_indptr, kv_indices, custom_mask, is_causal, mask_indptr,
                         max_len_extend, k_scale, v_scale, sm_scale=None, logit_cap=0.0,
                         skip_prefix_custom_mask=True, sliding_window_size=-1, sinks=None,
                         window_kv_offsets=None, xai_temperature_len=-1, lse_extend=None,
                         skip_prefix=False, skip_extend=False, page_size: int = 1,
                         score_mod=None, aux_tensors=None, extend_seq_lens_cpu=None,
                         identity_kv_indices: bool = False):
    """Extend (prefix + new tokens) attention over SGLang's pool; writes ``o_extend``.

    Request b's new tokens are rows ``qo_indptr[b]:qo_indptr[b+1]`` of ``q_extend`` /
    ``k_extend`` / ``v_extend`` (``[tokens, heads, head_dim]``); its cached prefix is the token
    slots ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]`` of ``k_buffer``/``v_buffer`` (rows
    ``kv_indptr[b]..`` of the pool with ``identity_kv_indices``). Query i of a request sees the
    whole prefix and, when ``is_causal``, new keys ``<= i``. ``custom_mask`` (flat, request b's
    ``[Lq, prefix + Lq]`` row-major block at ``mask_indptr[b]``) replaces the causal rule; with
    ``skip_prefix_custom_mask`` (the default) its prefix columns are not read.
    ``sliding_window_size`` W lets a query see the W keys before it and itself.
    ``lse_extend``: float32 ``[tokens, num_q_heads]`` receives the natural-log LSE (sinks
    included, as SGLang's). ``skip_prefix`` attends to the new tokens only.

    Raises
    ------
    NotImplementedError
        ``skip_extend``, ``window_kv_offsets``, ``xai_temperature_len > 0``, ``score_mod``,
        non-causal attention with a sliding window, scales != 1 on a 16-bit pool, or a custom
        mask with ``skip_prefix``.
    """
    if skip_extend:
        refuse("skip_extend", True, "attention over the prefix alone is not provided; attend "
               "to prefix and new tokens in one call")
    if window_kv_offsets is not None:
        refuse("window_kv_offsets", "<tensor>", "a custom mask wider than the window is not "
               "read; pass the mask of the attended keys")
    if xai_temperature_len is not None and xai_temperature_len > 0:
        refuse("xai_temperature_len", xai_temperature_len, "position-dependent logit "
               "temperature is not provided")
    _no_score_mod(score_mod, aux_tensors)
    window = sliding_window_size + 1 if sliding_window_size is not None \
        and sliding_window_size > 0 else None
    if window is not None and not is_causal:
        refuse("sliding_window_size", sliding_window_size, "with is_causal=False SGLang's "
               "window bounds later keys too; pagedattn's window is left-only")
    if custom_mask is not None and skip_prefix:
        refuse("skip_prefix", True, "with a custom_mask, attend to prefix and new tokens in "
               "one call")
    k_cache, v_cache, bs = _as_cache(k_buffer, v_buffer, page_size)
    if fp8(k_buffer.dtype):
        ks = 1.0 if k_scale is None else k_scale
        vs = 1.0 if v_scale is None else v_scale
    else:
        for name, val in (("k_scale", k_scale), ("v_scale", v_scale)):
            if not is_unit(val):
                refuse(name, val, "SGLang scales only the cached prefix; on a 16-bit pool "
                       "pass 1.0")
        ks = vs = None
    ext_lens = csr_lengths(qo_indptr)
    if skip_prefix:
        prefix = torch.zeros_like(ext_lens)
        table = torch.zeros((ext_lens.numel(), 1), dtype=torch.int32, device=q_extend.device)
    else:
        prefix = csr_lengths(kv_indptr)
        table = _table(kv_indptr, kv_indices, bs, identity=identity_kv_indices)
    seq_lens = prefix + ext_lens
    mask = custom_mask
    if mask is not None:
        if mask_indptr is None:
            raise ValueError("mask_indptr: required with custom_mask")
        mask = mask.view(torch.uint8) if mask.dtype == torch.int8 else mask
        if skip_prefix_custom_mask and seq_lens.numel():
            mask = _open_prefix(mask, mask_indptr, seq_lens, prefix)
    lq = q_extend.shape[-1]
    res = extend_attention(
        q_extend, k_cache, v_cache, table, qo_indptr, seq_lens, layout="bshd",
        causal=bool(is_causal), k_new=k_extend, v_new=v_extend, custom_mask=mask,
        mask_indptr=None if mask is None else mask_indptr, max_q_len=max_len_extend,
        scale=sm_scale or lq ** -0.5, k_scale=ks, v_scale=vs, sliding_window=window,
        logit_cap=logit_cap or None, sinks=sinks, out=o_extend,
        return_lse=lse_extend is not None)
    if lse_extend is not None:
        lse = res[1]
        if sinks is not None:  # SGLang's denominator includes the sink
            lse = torch.logaddexp(lse, sinks.to(torch.float32).view(1, -1))
        lse_extend.copy_(lse)


def _open_prefix(mask, mask_indptr, seq_lens, prefix):
    """The flat mask with every prefix column visible (device ops, no host sync)."""
    pos = torch.arange(mask.numel(), device=mask.device)
    req = torch.searchsorted(mask_indptr[1:].to(torch.int64), pos, right=True)
    req = req.clamp(max=seq_lens.numel() - 1)
    width = seq_lens.to(torch.int64)[req].clamp(min=1)
    col = (pos - mask_indptr.to(torch.int64)[req]) % width
    return mask.to(torch.bool) | (col < prefix.to(torch.int64)[req])
