"""vLLM-shaped attention entry points over pagedattn's ops.

* ``unified_attention``: vLLM's portable Triton backend
  (``vllm/v1/attention/ops/triton_unified_attention.py``) as in **vllm 0.34.0**: ragged query
  batches (prefill, chunked prefill, decode, speculative decode) over caches
  ``[num_blocks, block_size, num_kv_heads, head_dim]`` (pagedattn's ``bshd``) whose blocks
  already hold the new tokens. A batch of one query token per request runs pagedattn's decode
  kernels, any other batch its extend kernels.
* ``paged_attention_v1`` / ``paged_attention_v2``: the legacy CUDA ops of ``vllm/_custom_ops.py``
  as in **vllm 0.24.0**, their last release, over the x-split key layout
  ``[num_blocks, num_kv_heads, head_dim / x, block_size, x]`` and values
  ``[num_blocks, num_kv_heads, head_dim, block_size]`` (pagedattn's ``vllm`` layout).

Outputs are written into ``out``. docs/compat.md lists every argument as honoured, accepted and
unused (vLLM's split-softmax scratch, launch hints), or refused with ``NotImplementedError``
naming it.
"""
from enum import IntEnum

import torch

from pagedattn.api import extend_attention, paged_decode
from pagedattn.compat._common import fp8, refuse

PEER = "vllm"
PEER_VERSION = "0.34.0"
LEGACY_PEER_VERSION = "0.24.0"  # paged_attention_v1/v2 were removed in 0.25.0

__all__ = ["unified_attention", "paged_attention_v1", "paged_attention_v2", "KVQuantMode",
           "PEER", "PEER_VERSION", "LEGACY_PEER_VERSION"]


class KVQuantMode(IntEnum):
    """vLLM's ``vllm.v1.kv_cache_interface.KVQuantMode`` values this module knows; pagedattn
    honours NONE (a 16-bit cache, or fp8 read unscaled) and FP8_PER_TENSOR."""

    NONE = 0
    FP8_PER_TENSOR = 1
    INT8_PER_TOKEN_HEAD = 2
    FP8_PER_TOKEN_HEAD = 3
    INT4_PER_TOKEN_HEAD = 4
    NVFP4 = 5


def _first(scale):
    """Element 0 of a scale tensor as a 1-element view (vLLM's kernels load one scalar; callers
    may pass an expanded ``[num_seqs, num_kv_heads]`` view of it)."""
    if isinstance(scale, torch.Tensor) and scale.numel() >= 1:
        return scale.as_strided((1,), (1,), scale.storage_offset())
    return scale


def unified_attention(q, k, v, out, cu_seqlens_q, max_seqlen_q, seqused_k, max_seqlen_k,
                      softmax_scale, causal, window_size, block_table, softcap, q_descale,
                      k_descale, v_descale, seq_threshold_3D=None, num_par_softmax_segments=None,
                      softmax_segm_output=None, softmax_segm_max=None, softmax_segm_expsum=None,
                      alibi_slopes=None, output_scale=None, qq_bias=None, sinks=None,
                      mm_prefix_range=None, rswa_prefix_lens=None, rswa_window=None,
                      use_alibi_sqrt=False, kv_quant_mode: KVQuantMode = KVQuantMode.NONE,
                      k_scale_cache=None, v_scale_cache=None, chunk_lookback=-1, use_td=False,
                      mm_prefix_clamp_sliding_window=False):
    """Attention of a ragged query batch over vLLM's paged cache; writes ``out``.

    Parameters
    ----------
    q, out : torch.Tensor
        ``[num_tokens, num_q_heads, head_dim]``; fp16/bf16/fp32.
    k, v : torch.Tensor
        ``[num_blocks, block_size, num_kv_heads, head_dim]``; q's dtype, or fp8.
    cu_seqlens_q : torch.Tensor
        int32 ``[num_seqs + 1]``: request b's queries are rows ``cu[b]:cu[b+1]``.
    max_seqlen_q : int
        the longest request's query count (host int).
    seqused_k : torch.Tensor
        int32 ``[num_seqs]``: KV length of each request, its new tokens included.
    max_seqlen_k : int
        accepted, unused (the table's width bounds the KV length).
    softmax_scale : float
    causal : bool
        the shifted causal mask ``j <= i + seqused_k - query_len``.
    window_size : (int, int)
        ``(left, right)``; ``left >= 0`` lets a query at position p see keys ``j >= p - left``.
    block_table : torch.Tensor
        int32 ``[>= num_seqs, max_blocks]``.
    softcap : float
        ``cap * tanh(s / cap)`` when > 0.
    q_descale, k_descale, v_descale : torch.Tensor or None
        with ``kv_quant_mode=FP8_PER_TENSOR`` K and V are dequantised by element 0 of
        k_descale/v_descale; q_descale applies to fp8 queries only, which pagedattn does not take.
    alibi_slopes, sinks : torch.Tensor, optional
        float ``[num_q_heads]``.

    Raises
    ------
    NotImplementedError
        per-sequence ``causal`` tensors, ``output_scale``, ``qq_bias``, ``mm_prefix_range``,
        R-SWA, ``use_alibi_sqrt``, chunked windows, and quantisation modes other than NONE and
        FP8_PER_TENSOR, each named.

    Examples
    --------
    >>> import torch
    >>> from pagedattn.compat.vllm import unified_attention
    >>> k, v = torch.randn(8, 16, 2, 64), torch.randn(8, 16, 2, 64)  # 8 blocks of 16 tokens
    >>> q, out = torch.randn(5, 4, 64), torch.empty(5, 4, 64)        # 4 + 1 new tokens
    >>> cu_seqlens_q = torch.tensor([0, 4, 5], dtype=torch.int32)
    >>> seqused_k = torch.tensor([4, 20], dtype=torch.int32)
    >>> block_table = torch.tensor([[3, 0], [5, 1]], dtype=torch.int32)
    >>> unified_attention(q, k, v, out, cu_seqlens_q, 4, seqused_k, 20, 64 ** -0.5, True,
    ...                   (-1, -1), block_table, 0.0, None, None, None)
    >>> bool(out.isfinite().all())
    True
    """
    if isinstance(causal, torch.Tensor):
        refuse("causal", "<tensor>", "per-sequence causality is not provided; split the batch")
    for name, val, how in (
            ("output_scale", output_scale, "the output takes q's dtype; quantise after the call"),
            ("qq_bias", qq_bias, "query-query bias is not provided"),
            ("mm_prefix_range", mm_prefix_range, "bidirectional multimodal prefixes are not "
             "provided; pass a custom mask through pagedattn.extend_attention"),
            ("rswa_window", rswa_window, "R-SWA is not provided"),
            ("rswa_prefix_lens", rswa_prefix_lens, "R-SWA is not provided")):
        if val is not None:
            refuse(name, "<tensor>" if isinstance(val, torch.Tensor) else val, how)
    if use_alibi_sqrt:
        refuse("use_alibi_sqrt", True, "ALiBi is linear in the distance in pagedattn")
    if alibi_slopes is not None and sinks is not None and max_seqlen_q > 1:
        refuse("alibi_slopes", "<tensor>", "vLLM measures ALiBi from the end of the cached "
               "prefix, pagedattn from the query's position; the two agree up to a per-row "
               "constant, which sinks expose: run queries of more than one token without one "
               "of the two")
    left = int(window_size[0]) if window_size is not None else -1
    if chunk_lookback is not None and chunk_lookback > -1 and left >= 0:
        refuse("chunk_lookback", chunk_lookback, "chunked sliding windows are not provided")
    mode = int(kv_quant_mode)
    if mode not in (KVQuantMode.NONE, KVQuantMode.FP8_PER_TENSOR):
        refuse("kv_quant_mode", kv_quant_mode, "use a 16-bit cache or an fp8 cache with "
               "per-tensor scales (FP8_PER_TENSOR)")
    ks = vs = None
    if fp8(k.dtype):  # NONE reads fp8 as it is (vLLM's kernel casts it)
        ks = _first(k_descale) if mode == KVQuantMode.FP8_PER_TENSOR else 1.0
        vs = _first(v_descale) if mode == KVQuantMode.FP8_PER_TENSOR else 1.0
    elif mode == KVQuantMode.FP8_PER_TENSOR:
        refuse("kv_quant_mode", kv_quant_mode, f"the cache is {k.dtype}, not fp8")
    common = dict(layout="bshd", scale=softmax_scale, k_scale=ks, v_scale=vs,
                  sliding_window=left + 1 if left >= 0 else None,
                  logit_cap=softcap if softcap and softcap > 0 else None,
                  alibi_slopes=alibi_slopes, sinks=sinks, out=out)
    num_seqs = seqused_k.shape[0]
    if max_seqlen_q == 1 and q.shape[0] == num_seqs:  # one token per request: decode
        paged_decode(q, k, v, block_table, seqused_k, **common)
    else:
        extend_attention(q, k, v, block_table, cu_seqlens_q, seqused_k, causal=bool(causal),
                         max_q_len=max_seqlen_q, **common)


_FP8_NAMES = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn,
              "fp8_e5m2": torch.float8_e5m2}


def _legacy(out, query, key_cache, value_cache, num_kv_heads, scale, block_tables, seq_lens,
            block_size, alibi_slopes, kv_cache_dtype, k_scale, v_scale,
            blocksparse_vert_stride):
    if blocksparse_vert_stride is not None and blocksparse_vert_stride > 1:
        refuse("blocksparse_vert_stride", blocksparse_vert_stride, "block-sparse attention is "
               "not provided")
    if kv_cache_dtype == "auto":
        ks = vs = None
    elif kv_cache_dtype in _FP8_NAMES:
        want = _FP8_NAMES[kv_cache_dtype]
        if key_cache.dtype == torch.uint8:  # vLLM keeps fp8 caches as bytes
            key_cache, value_cache = key_cache.view(want), value_cache.view(want)
        ks, vs = k_scale, v_scale
    else:
        refuse("kv_cache_dtype", kv_cache_dtype, "use 'auto', 'fp8', 'fp8_e4m3' or 'fp8_e5m2'")
    if key_cache.dim() != 5 or key_cache.shape[1] != num_kv_heads \
            or key_cache.shape[3] != block_size:
        raise ValueError(f"key_cache: expected [num_blocks, num_kv_heads={num_kv_heads}, "
                         f"head_dim/x, block_size={block_size}, x], got "
                         f"{tuple(key_cache.shape)}")
    paged_decode(query, key_cache, value_cache, block_tables, seq_lens, layout="vllm",
                 scale=scale, k_scale=ks, v_scale=vs, alibi_slopes=alibi_slopes, out=out)


def paged_attention_v1(out, query, key_cache, value_cache, num_kv_heads, scale, block_tables,
                       seq_lens, block_size, max_seq_len, alibi_slopes, kv_cache_dtype, k_scale,
                       v_scale, tp_rank=0, blocksparse_local_blocks=0, blocksparse_vert_stride=0,
                       blocksparse_block_size=64, blocksparse_head_sliding_step=0) -> None:
    """vLLM's PagedAttention v1 decode: one query token per sequence; writes ``out``.

    ``query``/``out`` ``[num_seqs, num_q_heads, head_dim]``; ``key_cache``
    ``[num_blocks, num_kv_heads, head_dim / x, block_size, x]`` with ``x = 16 / element size``;
    ``value_cache`` ``[num_blocks, num_kv_heads, head_dim, block_size]``; ``block_tables``
    int32 ``[num_seqs, max_blocks]``; ``seq_lens`` int32. ``kv_cache_dtype`` ``"auto"`` (the
    query's dtype; scales unused) or ``"fp8"``/``"fp8_e4m3"``/``"fp8_e5m2"`` (uint8 or float8
    caches, dequantised by ``k_scale``/``v_scale``). pagedattn picks one-pass or split-KV
    itself: v1 and v2 run the same op.
    """
    _legacy(out, query, key_cache, value_cache, num_kv_heads, scale, block_tables, seq_lens,
            block_size, alibi_slopes, kv_cache_dtype, k_scale, v_scale, blocksparse_vert_stride)


def paged_attention_v2(out, exp_sum, max_logits, tmp_out, query, key_cache, value_cache,
                       num_kv_heads, scale, block_tables, seq_lens, block_size, max_seq_len,
                       alibi_slopes, kv_cache_dtype, k_scale, v_scale, tp_rank=0,
                       blocksparse_local_blocks=0, blocksparse_vert_stride=0,
                       blocksparse_block_size=64, blocksparse_head_sliding_step=0) -> None:
    """vLLM's PagedAttention v2 (split-KV) decode; ``exp_sum``, ``max_logits`` and ``tmp_out``
    (its partition scratch) are accepted and unused. Otherwise as :func:`paged_attention_v1`."""
    _legacy(out, query, key_cache, value_cache, num_kv_heads, scale, block_tables, seq_lens,
            block_size, alibi_slopes, kv_cache_dtype, k_scale, v_scale, blocksparse_vert_stride)
