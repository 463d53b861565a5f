"""Public ops: validate once, pick a backend (pagedattn.dispatch), run it."""
import operator
from typing import Optional, Sequence, Union

import torch

from pagedattn import config, dispatch
from pagedattn import validation as V
from pagedattn.aliasing import check_disjoint, check_no_self_overlap
from pagedattn.layouts import check_layout


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: Optional[torch.Tensor],
                 block_table: torch.Tensor, seq_lens: torch.Tensor, *, layout: str = "bhsd",
                 head_dim_v: Optional[int] = None,
                 scale: Optional[float] = None, k_scale=None, v_scale=None,
                 sliding_window: Optional[int] = None, logit_cap: Optional[float] = None,
                 alibi_slopes: Optional[torch.Tensor] = None, sinks: Optional[torch.Tensor] = None,
                 partition_size: Optional[int] = None, backend: str = "auto",
                 out: Optional[torch.Tensor] = None, return_lse: bool = False,
                 validate: Optional[bool] = None, errors: Optional[torch.Tensor] = None):
    """Attention of each sequence's newest query token(s) over its paged KV cache.

    Parameters
    ----------
    q : torch.Tensor
        shape ``[num_seqs, num_q_heads, head_dim]`` (one token per sequence) or
        ``[num_seqs, q_len, num_q_heads, head_dim]`` (speculative decoding: the q_len tokens are
        the last q_len positions of the sequence, shifted causal mask); fp16, bf16 or fp32.
        head_dim: 1 to 576, K's width.
    k_cache, v_cache : torch.Tensor
        the paged cache in ``layout`` (docs/layout.md); q's dtype, or fp8 e4m3/e5m2 with scales.
        V's head dim ``head_dim_v`` may differ from K's (1 to 576). ``v_cache=None`` (MLA): V is
        k_cache's first ``head_dim_v`` columns (bhsd/bshd; DeepSeek: one KV head of 576, V 512).
    head_dim_v : int, optional
        V's head dim (the output's): required with ``v_cache=None``; with a v_cache, checked
        against it.
    block_table : torch.Tensor
        int32 ``[num_seqs, max_blocks]``; row i maps sequence i's logical blocks to physical ids.
        Entries past ``ceil(seq_lens[i] / block_size)`` are never read.
    seq_lens : torch.Tensor
        int32 ``[num_seqs]``: KV length of each sequence including the query tokens. 0 gives a
        zero output row and lse -inf.
    layout : str
        ``"bhsd"``, ``"bshd"``, ``"vllm"`` or ``"hcu"``.
    scale : float, optional
        softmax scale, default ``head_dim ** -0.5``.
    k_scale, v_scale : float or torch.Tensor, optional
        dequantisation scales of an fp8 cache: a float or float32 tensor of 1 or num_kv_heads
        elements. Required for fp8, ignored otherwise.
    sliding_window : int, optional
        a query at position p sees keys j with ``p - sliding_window < j <= p``.
    logit_cap : float, optional
        soft-cap: ``s = cap * tanh(s / cap)`` on the scaled logits.
    alibi_slopes, sinks : torch.Tensor, optional
        float32 ``[num_q_heads]``: ALiBi bias ``slope * (j - p)``; per-head sink logits that join
        the softmax denominator.
    partition_size : int, optional
        split-KV partition (tokens); default 512, 256 when the GQA group exceeds 15;
        ``PAGEDATTN_PARTITION_SIZE`` overrides the default.
    backend : str
        ``"auto"``, ``"triton"``, ``"hip"`` or ``"torch"``; ``PAGEDATTN_BACKEND`` overrides auto.
    out : torch.Tensor, optional
        preallocated output shaped and typed like q.
    return_lse : bool
        also return the float32 natural-log LSE, shape ``q.shape[:-1]``.
    validate : bool, optional
        run the device-data checks on the host (one sync) and raise on the first bad entry.
        Default: on for the torch backend, and for GPU backends when ``PAGEDATTN_VALIDATE=1``.
        Without it the GPU kernels guard the device data themselves (docs/layout.md,
        "Malformed metadata"): a sequence whose length, block ids or query count are invalid
        gets NaN rows (out and lse) and nothing outside the given tensors is read or written.
    errors : torch.Tensor, optional
        int32 ``[1]`` on q's device: the kernels add a positive count to it when they guard
        something (the Triton kernels: the NaN rows; the HIP kernels: the programs that found
        bad metadata), with no host sync; it stays as it was when all metadata is valid.

    Returns
    -------
    torch.Tensor or (torch.Tensor, torch.Tensor)
        out (q's shape with the last dim head_dim_v, q's dtype) [, lse].

    Raises
    ------
    TypeError, ValueError
        on any malformed argument, naming it, before any kernel launches.

    Examples
    --------
    >>> import torch, pagedattn as pa
    >>> k, v = pa.make_kv_cache(8, 16, 2, 64, layout="bhsd", dtype=torch.float32)
    >>> _ = k.normal_(), v.normal_()
    >>> q = torch.randn(2, 4, 64)
    >>> table = torch.tensor([[3, 1], [5, 0]], dtype=torch.int32)
    >>> out = pa.paged_decode(q, k, v, table, torch.tensor([20, 7], dtype=torch.int32))
    >>> out.shape
    torch.Size([2, 4, 64])
    """
    check_layout(layout)
    v_cache = V.resolve_v_cache(k_cache, v_cache, layout, head_dim_v)
    g = V.check_cache(k_cache, v_cache, layout)
    V.check_q_and_heads(q, g, k_cache.dtype, k_cache.device, dims=(3, 4), layout=layout)
    V.check_table(block_table, seq_lens, q.shape[0], q.device)
    opts = V.attn_options(q=q, g=g, kv_dtype=k_cache.dtype, scale=scale, k_scale=k_scale,
                          v_scale=v_scale, sliding_window=sliding_window, logit_cap=logit_cap,
                          alibi_slopes=alibi_slopes, sinks=sinks)
    partition_size = V.check_partition_size(partition_size)
    out = V.check_out(out, q, g.head_dim_v)
    name, impl = _decode_route(backend, q, k_cache, layout, g, opts, return_lse, block_table,
                               partition_size)
    val = V.validate_enabled(validate, name)
    if val:
        V.check_decode_data(opts, block_table, seq_lens, g, 1 if q.dim() == 3 else q.shape[1])
    call = V.DecodeCall(q, k_cache, v_cache, block_table, seq_lens, layout, g, opts,
                        partition_size, out, return_lse, val, V.check_errors(errors, q.device))
    if q.shape[0] == 0:
        lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
        return (out, lse) if return_lse else out
    lse = impl.paged_decode(call)
    return (out, lse) if return_lse else out


_ROUTES = {}  # backend choices of GPU calls by metadata (_route)
_ROUTE_ENV = config.names("PAGEDATTN_BACKEND", "PAGEDATTN_PARTITION_SIZE", "TRITON_INTERPRET")


def _route(op, backend, key, **facts):
    """``dispatch.resolve``, remembered per call metadata on a GPU (``key``: None = not
    remembered).

    The choice is a function of what the key holds with the op and backend: the tensors' shapes,
    strides, dtypes, device and 16-byte alignment (backends' ``supports()`` read no data), the
    option kinds, and here the environment dispatch reads. On a GPU eager decode call resolve
    takes ~40 us of the ~60 that the public checks and the choice take together. Tests start from an empty memo (conftest); ``dispatch.cache_clear`` empties it.
    """
    if key is None:
        return dispatch.resolve(op, backend, **facts)
    key = (op, backend, key, config.values(_ROUTE_ENV), dispatch.generation())
    route = _ROUTES.get(key)
    if route is None:
        route = dispatch.resolve(op, backend, **facts)
        if len(_ROUTES) >= 512:
            _ROUTES.clear()
        _ROUTES[key] = route
    return route


def _decode_route(backend, q, k_cache, layout, g, opts, return_lse, block_table, partition_size):
    key = None
    if q.device.type == "cuda":
        key = (q.shape, q.stride(), q.dtype, q.device, q.data_ptr() % 16, k_cache.shape,
               k_cache.stride(), k_cache.dtype, k_cache.data_ptr() % 16, layout, g.head_dim_v,
               opts.sliding_window is None, opts.logit_cap, opts.alibi_slopes is None,
               opts.sinks is None, opts.k_scale is None, return_lse, block_table.shape,
               partition_size)
    return _route("paged_decode", backend, key, q=q, k_cache=k_cache, layout=layout, geom=g,
                  opts=opts, return_lse=return_lse, block_table=block_table,
                  partition_size=partition_size)


def extend_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: Optional[torch.Tensor],
                     block_table: torch.Tensor, cu_seqlens_q: torch.Tensor,
                     seq_lens: torch.Tensor, *, layout: str = "bhsd", causal: bool = True,
                     head_dim_v: Optional[int] = None,
                     k_new: Optional[torch.Tensor] = None, v_new: Optional[torch.Tensor] = None,
                     custom_mask: Optional[torch.Tensor] = None,
                     mask_indptr: Optional[torch.Tensor] = None, max_q_len: Optional[int] = None,
                     scale: Optional[float] = None, k_scale=None, v_scale=None,
                     sliding_window: Optional[int] = None, logit_cap: Optional[float] = None,
                     alibi_slopes: Optional[torch.Tensor] = None,
                     sinks: Optional[torch.Tensor] = None, backend: str = "auto",
                     out: Optional[torch.Tensor] = None, return_lse: bool = False,
                     validate: Optional[bool] = None, errors: Optional[torch.Tensor] = None):
    """Extend (prefix-prefill) attention over a ragged batch and the paged cache.

    Request b owns query rows ``[cu_seqlens_q[b], cu_seqlens_q[b+1])`` (Lq of them) and
    ``seq_lens[b]`` = Lk keys: a cached prefix of Lk - Lq tokens plus its Lq new tokens. Query i
    (0-based within the request) sees key j iff ``j <= i + (Lk - Lq)`` when causal. Non-causal
    without k_new, every query sees all Lk keys and Lq may exceed Lk (FlashInfer's rule: query i
    sits at position ``i + Lk - Lq`` for ALiBi and windows).

    Parameters
    ----------
    q : torch.Tensor
        ``[total_new_tokens, num_q_heads, head_dim]``; fp16, bf16 or fp32; head_dim 1 to 576.
    k_cache, v_cache : torch.Tensor
        the paged cache in ``layout``; q's dtype or fp8 with ``k_scale``/``v_scale``. V's head
        dim may differ from K's (MLA prefill: K 192, V 128); ``v_cache=None`` with
        ``head_dim_v`` reads V from k_cache's first head_dim_v columns (MLA, as in
        :func:`paged_decode`).
    block_table : torch.Tensor
        int32 ``[num_seqs, max_blocks]``. Covers positions [0, Lk) when ``k_new`` is None (the
        new tokens were written by :func:`store_kv` first), else [0, Lk - Lq).
    cu_seqlens_q : torch.Tensor
        int32 ``[num_seqs + 1]`` (SGLang's qo_indptr); last entry equals ``q.shape[0]``.
    seq_lens : torch.Tensor
        int32 ``[num_seqs]``: full KV length (prefix + new).
    causal : bool
        the shifted causal mask; False lets every query see all Lk keys.
    k_new, v_new : torch.Tensor, optional
        ``[total_new_tokens, num_kv_heads, head_dim]`` and ``[..., head_dim_v]`` in q's dtype:
        the new tokens' K/V, read directly (no gather) instead of from the cache.
    custom_mask, mask_indptr : torch.Tensor, optional
        tree mask for speculative decoding (SGLang form): flat bool/uint8; request b's
        ``[Lq, Lk]`` row-major block starts at ``mask_indptr[b]`` (int32 ``[num_seqs + 1]``).
        Replaces the causal rule.
    max_q_len : int, optional
        an upper bound on Lq, to skip a host sync in GPU backends.
    scale, k_scale, v_scale, sliding_window, logit_cap, alibi_slopes, sinks, backend, out,
    return_lse, validate, errors
        as in :func:`paged_decode`. Without validation the kernels guard the device data: a
        request whose query range (cu_seqlens_q non-monotone or outside q), length (Lq > Lk,
        beyond the table, beyond the grid's query blocks that max_q_len sizes), block ids or
        mask range are invalid gets NaN rows; when cu_seqlens_q itself is invalid every row of
        q is NaN. An Lq above max_q_len that still fits the grid's last query block computes
        exactly.

    Returns
    -------
    torch.Tensor or (torch.Tensor, torch.Tensor)
        out ``[total_new_tokens, num_q_heads, head_dim_v]`` [, float32 lse
        ``[total_new_tokens, num_q_heads]``].

    Examples
    --------
    >>> import torch, pagedattn as pa
    >>> k, v = pa.make_kv_cache(8, 4, 1, 64, dtype=torch.float32)
    >>> _ = k.normal_(), v.normal_()
    >>> q = torch.randn(3, 2, 64)                       # request 0: 2 new tokens, request 1: 1
    >>> cu = torch.tensor([0, 2, 3], dtype=torch.int32)
    >>> lens = torch.tensor([6, 5], dtype=torch.int32)  # prefixes 4 and 4
    >>> table = torch.tensor([[1, 2], [3, 4]], dtype=torch.int32)
    >>> pa.extend_attention(q, k, v, table, cu, lens).shape
    torch.Size([3, 2, 64])
    """
    check_layout(layout)
    v_cache = V.resolve_v_cache(k_cache, v_cache, layout, head_dim_v)
    g = V.check_cache(k_cache, v_cache, layout)
    V.check_q_and_heads(q, g, k_cache.dtype, k_cache.device, layout=layout)
    dev = q.device
    V.check_tensor("cu_seqlens_q", cu_seqlens_q, dim=1, dtypes=(torch.int32,), device=dev)
    nseq = cu_seqlens_q.shape[0] - 1
    if nseq < 0:
        raise ValueError("cu_seqlens_q: expected num_seqs + 1 >= 1 entries, got 0")
    V.check_table(block_table, seq_lens, nseq, dev)
    if (k_new is None) != (v_new is None):
        raise ValueError("k_new, v_new: give both or neither")
    if k_new is not None:
        for name, t, w in (("k_new", k_new, g.head_dim), ("v_new", v_new, g.head_dim_v)):
            V.check_tensor(name, t, dim=3, dtypes=(q.dtype,), device=dev)
            V.check_shape(name, t, (q.shape[0], g.num_kv_heads, w))
    if (custom_mask is None) != (mask_indptr is None):
        raise ValueError("custom_mask, mask_indptr: give both or neither")
    if custom_mask is not None:
        V.check_tensor("custom_mask", custom_mask, dim=1, dtypes=(torch.bool, torch.uint8),
                       device=dev)
        V.check_tensor("mask_indptr", mask_indptr, dim=1, dtypes=(torch.int32,), device=dev)
        V.check_shape("mask_indptr", mask_indptr, (nseq + 1,))
    if not isinstance(causal, bool):
        raise TypeError(f"causal: expected a bool, got {type(causal).__name__}")
    if max_q_len is not None:
        try:
            max_q_len = operator.index(max_q_len)
        except TypeError:
            raise TypeError(f"max_q_len: expected an int, got {type(max_q_len).__name__}") from None
        if max_q_len < 1 and q.shape[0] > 0:
            raise ValueError(f"max_q_len: expected >= 1 (q has {q.shape[0]} rows), got "
                             f"{max_q_len}")
    opts = V.attn_options(q=q, g=g, kv_dtype=k_cache.dtype, scale=scale, k_scale=k_scale,
                          v_scale=v_scale, sliding_window=sliding_window, logit_cap=logit_cap,
                          alibi_slopes=alibi_slopes, sinks=sinks)
    out = V.check_out(out, q, g.head_dim_v)
    name, impl = dispatch.resolve("extend_attention", backend, q=q, k_cache=k_cache,
                                  layout=layout, geom=g, opts=opts, causal=causal,
                                  k_new=k_new, custom_mask=custom_mask, return_lse=return_lse,
                                  block_table=block_table)
    val = V.validate_enabled(validate, name)
    # Without max_q_len the grid needs the longest query count: one host sync, which also checks
    # cu_seqlens_q whole (a clear error). With max_q_len and validation off (CUDA-graph capture)
    # nothing is read on the host: the kernels guard cu_seqlens_q themselves. Validation checks
    # an empty batch's cu_seqlens_q too (it must be [0] with q empty).
    if val or (max_q_len is None and nseq):
        cu = V.check_indptr("cu_seqlens_q", cu_seqlens_q, q.shape[0], nseq)
        lq = cu[1:] - cu[:-1]
        if max_q_len is None and nseq:
            max_q_len = int(lq.max())
    if val:
        V._check_scale_values("k_scale", opts.k_scale)
        V._check_scale_values("v_scale", opts.v_scale)
        lens = seq_lens.to(torch.int64).cpu()
        bad = torch.nonzero(lq > lens) if causal or k_new is not None else torch.zeros(0)
        if bad.numel():
            i = int(bad[0])
            raise ValueError(f"seq_lens: request {i} has {int(lq[i])} new tokens but seq_len "
                             f"{int(lens[i])} (query_len > seq_len: negative prefix)")
        need = lens if k_new is None else lens - lq
        V.check_table_data(block_table, seq_lens, g.block_size, g.num_blocks, need=need)
        if custom_mask is not None:
            V.check_indptr("mask_indptr", mask_indptr, custom_mask.shape[0], nseq)
            mi = mask_indptr.to(torch.int64).cpu()
            if bool(((mi[1:] - mi[:-1]) != lq * lens).any()):
                raise ValueError("mask_indptr: request b's block must hold Lq*Lk entries")
        if max_q_len is not None and nseq and int(lq.max()) > max_q_len:
            raise ValueError(f"max_q_len: {max_q_len} is below the longest request {int(lq.max())}")
    call = V.ExtendCall(q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, layout, g, opts,
                        causal, k_new, v_new, custom_mask, mask_indptr, max_q_len, out,
                        return_lse, val, V.check_errors(errors, dev))
    if q.shape[0] == 0 or nseq == 0:
        out.zero_()
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=torch.float32, device=dev)
        return (out, lse) if return_lse else out
    lse = impl.extend_attention(call)
    return (out, lse) if return_lse else out


def store_kv(k: torch.Tensor, v: Optional[torch.Tensor], k_cache: torch.Tensor,
             v_cache: Optional[torch.Tensor], slot_mapping: torch.Tensor, *, layout: str = "bhsd",
             k_scale=None, v_scale=None,
             backend: str = "auto", validate: Optional[bool] = None,
             errors: Optional[torch.Tensor] = None) -> None:
    """Write new tokens' K/V into the paged cache, quantising to fp8 when the cache is fp8.

    Parameters
    ----------
    k, v : torch.Tensor
        ``[num_tokens, num_kv_heads, head_dim]`` and ``[..., head_dim_v]`` (the caches' widths),
        fp16/bf16/fp32. ``v=None`` with ``v_cache=None``: an MLA latent cache, which holds K
        only (its first head_dim_v columns are V: :func:`pagedattn.make_mla_cache`).
    k_cache, v_cache : torch.Tensor
        the cache in ``layout``; same dtype as k, or fp8 (stores ``value / scale``, saturated).
    slot_mapping : torch.Tensor
        int32/int64 ``[num_tokens]``: ``block * block_size + offset``; negative = skip (padding).
    k_scale, v_scale : float or torch.Tensor, optional
        fp8 quantisation scales (per tensor or per KV head).
    backend, validate : as in :func:`paged_decode`. Without validation the kernel skips a slot
        past the cache and every token of a slot given twice, and writes nothing else.
    errors : torch.Tensor, optional
        int32 ``[1]``: the number of skipped tokens is added to it (no host sync).

    Raises
    ------
    TypeError, ValueError
        on a malformed argument, a stride-0 (expanded) cache among them: its writes would alias;
        and when k_cache and v_cache share memory (one tensor, or views whose elements meet), as
        V would overwrite K. Disjoint views of one storage, such as ``kv[:, 0]`` and
        ``kv[:, 1]`` of a ``[num_blocks, 2, ...]`` tensor, are fine.

    Examples
    --------
    >>> import torch, pagedattn as pa
    >>> kc, vc = pa.make_kv_cache(4, 16, 2, 64, dtype=torch.float16)
    >>> k = torch.randn(3, 2, 64, dtype=torch.float16); v = torch.randn_like(k)
    >>> pa.store_kv(k, v, kc, vc, torch.tensor([17, 18, -1]))
    """
    check_layout(layout)
    if (v is None) != (v_cache is None):
        raise ValueError("v, v_cache: give both, or neither (an MLA latent cache holds K only)")
    g = V.check_cache(k_cache, k_cache if v_cache is None else v_cache, layout)
    dev = k_cache.device
    V.check_tensor("k", k, dim=3, dtypes=V.Q_DTYPES, device=dev)
    V.check_shape("k", k, (k.shape[0], g.num_kv_heads, g.head_dim))
    if v is not None:
        V.check_tensor("v", v, dim=3, dtypes=V.Q_DTYPES, device=dev)
        V.check_shape("v", v, (k.shape[0], g.num_kv_heads, g.head_dim_v))
        if v.dtype != k.dtype:
            raise TypeError(f"v: expected dtype {k.dtype} (k's), got {v.dtype}")
    if k_cache.dtype not in V.FP8_DTYPES and k_cache.dtype != k.dtype:
        raise TypeError(f"k_cache: dtype {k_cache.dtype} must equal k's {k.dtype} or be fp8")
    V.check_tensor("slot_mapping", slot_mapping, dim=1, dtypes=(torch.int32, torch.int64),
                   device=dev)
    V.check_shape("slot_mapping", slot_mapping, (k.shape[0],))
    errors = V.check_errors(errors, dev)
    check_no_self_overlap(k_cache=k_cache, **({} if v_cache is None else {"v_cache": v_cache}))
    check_disjoint("v_cache", v_cache, "k_cache", k_cache)
    ks = V._norm_kv_scale("k_scale", k_scale, k_cache.dtype, g.num_kv_heads, dev)
    vs = None if v is None else V._norm_kv_scale("v_scale", v_scale, k_cache.dtype,
                                                 g.num_kv_heads, dev)
    key = None
    if dev.type == "cuda":
        key = (k.shape[1:], k.stride(), k.dtype, k.data_ptr() % 16, k_cache.shape,
               k_cache.stride(), k_cache.dtype, k_cache.data_ptr() % 16, dev, layout)
    name, impl = _route("store_kv", backend, key, q=k, k_cache=k_cache, layout=layout, geom=g)
    if V.validate_enabled(validate, name):
        V._check_scale_values("k_scale", ks)
        V._check_scale_values("v_scale", vs)
        s = slot_mapping.to(torch.int64).cpu()
        cap = g.num_blocks * g.block_size
        if s.numel() and int(s.max()) >= cap:
            raise ValueError(f"slot_mapping: slot {int(s.max())} out of range [0, {cap})")
        used = s[s >= 0]
        if used.numel() != torch.unique(used).numel():
            raise ValueError("slot_mapping: duplicate slots (two tokens written to one slot)")
    if k.shape[0] == 0:
        return
    impl.store_kv(k, v, k_cache, v_cache, slot_mapping, layout=layout, geom=g, k_scale=ks,
                  v_scale=vs, errors=errors)


def copy_blocks(k_cache: Union[torch.Tensor, Sequence[torch.Tensor]],
                v_cache: Union[torch.Tensor, Sequence[torch.Tensor]],
                block_mapping, *, backend: str = "auto", validate: Optional[bool] = None,
                errors: Optional[torch.Tensor] = None) -> None:
    """Copy whole physical blocks: the copy-on-write copies of ``BlockManager.append_slot``.

    Parameters
    ----------
    k_cache, v_cache : torch.Tensor or list of torch.Tensor
        caches (one per layer when lists), physical block id on dim 0; any layout.
    block_mapping : torch.Tensor or list of (src, dst)
        int64/int32 ``[num_copies, 2]``. Destinations are distinct and never also a source.
    backend, validate : as in :func:`paged_decode`. Without validation the kernel skips a pair
        with a block id outside the cache, a destination given twice, or a destination that is
        also a source, and copies the rest.
    errors : torch.Tensor, optional
        int32 ``[1]``: the number of skipped pairs is added to it (no host sync).

    Raises
    ------
    TypeError, ValueError
        on a malformed argument, a stride-0 (expanded) cache among them: its writes would alias.

    Examples
    --------
    >>> import torch, pagedattn as pa
    >>> kc, vc = pa.make_kv_cache(4, 16, 2, 64)
    >>> pa.copy_blocks(kc, vc, [(1, 3)])
    """
    ks = [k_cache] if isinstance(k_cache, torch.Tensor) else list(k_cache)
    vs = [v_cache] if isinstance(v_cache, torch.Tensor) else list(v_cache)
    if not ks or len(ks) != len(vs):
        raise ValueError(f"k_cache, v_cache: expected equally many caches, got {len(ks)} and "
                         f"{len(vs)}")
    dev = ks[0].device
    caches = ks + vs
    for i, c in enumerate(caches):
        V.check_tensor(f"cache[{i}]", c, dtypes=V.KV_DTYPES, device=dev, last_contig=False)
        if c.shape[0] != ks[0].shape[0]:
            raise ValueError(f"cache[{i}]: num_blocks {c.shape[0]} differs from {ks[0].shape[0]}")
        check_no_self_overlap(**{f"cache[{i}]": c})
    if not isinstance(block_mapping, torch.Tensor):
        block_mapping = torch.tensor(list(block_mapping), dtype=torch.int64).reshape(-1, 2)
    V.check_tensor("block_mapping", block_mapping, dtypes=(torch.int32, torch.int64),
                   last_contig=False)
    if block_mapping.numel() and (block_mapping.dim() != 2 or block_mapping.shape[1] != 2):
        raise ValueError(f"block_mapping: expected [num_copies, 2], got "
                         f"{tuple(block_mapping.shape)}")
    block_mapping = block_mapping.reshape(-1, 2).to(device=dev, dtype=torch.int64)
    name, impl = dispatch.resolve("copy_blocks", backend, q=None, k_cache=ks[0], layout=None,
                                  geom=None)
    errors = V.check_errors(errors, dev)
    if V.validate_enabled(validate, name) and block_mapping.numel():
        m = block_mapping.cpu()
        n = ks[0].shape[0]
        if bool(((m < 0) | (m >= n)).any()):
            raise ValueError(f"block_mapping: block id out of range [0, {n})")
        dst = m[:, 1]
        if dst.numel() != torch.unique(dst).numel():
            raise ValueError("block_mapping: duplicate destination blocks")
        if bool(torch.isin(dst, m[:, 0]).any()):
            raise ValueError("block_mapping: a destination block is also a source")
    if block_mapping.numel() == 0:
        return
    impl.copy_blocks(caches, block_mapping, errors=errors)

